"""Paths that lead elsewhere: a checkpoint folder's ``latest`` must name a folder inside it (never another run's
checkpoint through ``../``), and an export to a symbolic link writes into the link's target, keeps the link and
leaves no ``.NAME.old-*`` / ``.NAME.tmp-*`` folders behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaponder.cli import export_hf
from adaponder.train.checkpoint import STATE_FILE, CheckpointError, find_resume, read_latest, resolve_checkpoint
from adaponder.train.export import write_atomically


def _run(root: Path, latest: str) -> Path:
    """A checkpoint folder with one complete-looking checkpoint and ``latest`` as given."""
    ckpt = root / "checkpoints"
    (ckpt / "step00000004").mkdir(parents=True)
    (ckpt / "step00000004" / STATE_FILE).write_text("{}")
    (ckpt / "latest").write_text(latest)
    return ckpt


@pytest.mark.parametrize("latest", ["../../other_run/checkpoints/step00000008", "..", "/abs/step00000008",
                                    "sub/step00000004"])
def test_latest_must_name_a_folder_inside_its_checkpoint_folder(latest, tmp_path, capsys):
    other = tmp_path / "other_run" / "checkpoints" / "step00000008"
    other.mkdir(parents=True)
    (other / STATE_FILE).write_text("{}")
    ckpt = _run(tmp_path / "runs" / "mine", latest)
    expected = f"{ckpt / 'latest'} names {latest!r}, which is not a checkpoint folder inside {ckpt}"
    for call in (lambda: resolve_checkpoint(ckpt), lambda: find_resume("auto", ckpt), lambda: read_latest(ckpt)):
        with pytest.raises(CheckpointError) as info:
            call()
        assert expected in str(info.value) and "complete ones: step00000004" in str(info.value)
    assert export_hf.main([str(ckpt), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_latest_naming_a_folder_inside_still_resolves(tmp_path):
    ckpt = _run(tmp_path, "step00000004\n")
    assert resolve_checkpoint(ckpt) == ckpt / "step00000004"


def _leftovers(*folders: Path) -> list[str]:
    return sorted(p.name for f in folders for p in f.iterdir() if ".old-" in p.name or ".tmp-" in p.name)


@pytest.mark.parametrize("content", [[], ["stale.bin"]], ids=["empty-target", "non-empty-target-overwrite"])
def test_export_through_a_symlink_writes_into_the_target_and_keeps_the_link(content, tmp_path):
    target = tmp_path / "storage" / "export"
    target.mkdir(parents=True)
    for name in content:
        (target / name).write_text("old")
    link = tmp_path / "runs" / "hf"
    link.parent.mkdir()
    link.symlink_to(target, target_is_directory=True)

    out = write_atomically(link, lambda folder: (folder / "config.json").write_text("{}"), overwrite=bool(content))
    assert link.is_symlink() and link.resolve() == target.resolve() and out == target.resolve()
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]  # the old files went with the old folder
    assert _leftovers(link.parent, target.parent) == []
