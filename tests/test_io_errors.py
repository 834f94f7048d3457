"""A full disk (``OSError(ENOSPC)``, injected with monkeypatch) while a checkpoint, the prepared data or the run's
metrics are written: one ``error:`` line naming the path and what was written, a non-zero exit, and nothing
saved before damaged — the temporary is removed and ``latest`` unchanged."""

import errno
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers_train import REPO, cpu_env, read_metrics, tiny_train_config, write_config

ENOSPC = "No space left on device"


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, ENOSPC)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class _Engine:
    """What CheckpointManager.save needs of a DeepSpeed engine: its module (whose weights are checked for
    non-finite values) and its files, written with torch.save."""

    module = torch.nn.Linear(2, 2)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.ones(4), **client_state}, Path(save_dir) / tag / "mp_rank_00_model_states.pt")


def _manager_with_one_checkpoint(tmp_path):
    from adaponder.train.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path / "ck", keep=3, rank=0, world_size=1)
    mgr.save(_Engine(), 2, rank_state={"step": 2}, trainer_state={}, model_config={"x": 1})
    return mgr, tmp_path / "ck"


@pytest.mark.parametrize("where", ["deepspeed-files", "rank-state", "trainer-state"])
def test_checkpoint_save_on_a_full_disk_keeps_the_last_good_one(tmp_path, monkeypatch, where):
    from adaponder.train import checkpoint as C

    mgr, ck = _manager_with_one_checkpoint(tmp_path)
    before = _digest(ck / "step00000002")
    real_save = torch.save
    if where == "trainer-state":
        real_open = open
        monkeypatch.setattr("builtins.open", lambda f, *a, **k: _enospc() if str(f).endswith(
            f".{C.STATE_FILE}.tmp-{__import__('os').getpid()}") else real_open(f, *a, **k))
    else:
        target = "mp_rank_00" if where == "deepspeed-files" else "rank00000"
        monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: _enospc() if target in str(f)
                            else real_save(obj, f, *a, **k))
    with pytest.raises(C.CheckpointError) as err:
        mgr.save(_Engine(), 4, rank_state={"step": 4}, trainer_state={}, model_config={"x": 1})
    assert str(err.value) == (f"could not write checkpoint {ck / 'step00000004'} ({ENOSPC}); the last good "
                              f"checkpoint {ck / 'step00000002'} is untouched")
    assert (ck / "latest").read_text() == "step00000002"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step00000002"]  # no temporary, no step 4
    assert _digest(ck / "step00000002") == before


def test_a_full_disk_when_latest_is_replaced_leaves_no_temporary(tmp_path, monkeypatch):
    from adaponder.train import checkpoint as C

    mgr, ck = _manager_with_one_checkpoint(tmp_path)
    real_replace = C.os.replace
    monkeypatch.setattr(C.os, "replace", lambda a, b: _enospc() if Path(b).name == "latest" else real_replace(a, b))
    with pytest.raises(C.CheckpointError) as err:
        mgr.save(_Engine(), 4, rank_state={"step": 4}, trainer_state={}, model_config={"x": 1})
    assert f"could not write {ck / 'latest'} ({ENOSPC})" in str(err.value)
    assert f"--resume {ck / 'step00000004'}" in str(err.value)
    assert (ck / "latest").read_text() == "step00000002"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step00000002", "step00000004"]
    assert not C.integrity_problems(ck / "step00000004")  # the new checkpoint itself is complete


_RUN_WITH_A_FULL_DISK = r"""
import errno, sys, torch
real = torch.save
def save(obj, f, *a, **k):
    if "step00000004" in str(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(obj, f, *a, **k)
torch.save = save
sys.path.insert(0, sys.argv[1])
from pretrain import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.integration
def test_a_run_whose_checkpoint_hits_a_full_disk_exits_2_with_one_line(data, tmp_path):
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp_path / "run", train={"steps": 6, "stop_at": 4},
                            checkpoint={"every": 2}, eval={"at_end": False})
    path = write_config(tmp_path / "run.yaml", cfg)
    res = subprocess.run([sys.executable, "-c", _RUN_WITH_A_FULL_DISK, str(REPO / "launch"), "--config", str(path)],
                         env=cpu_env(), capture_output=True, text=True, timeout=600)
    ck = tmp_path / "run" / "checkpoints"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2, res.stderr[-3000:]
    assert errors == [f"error: could not write checkpoint {ck / 'step00000004'} ({ENOSPC}); the last good "
                      f"checkpoint {ck / 'step00000002'} is untouched"]
    assert "Traceback" not in res.stderr
    assert (ck / "latest").read_text() == "step00000002"
    assert [p.name for p in ck.iterdir() if "step" in p.name] == ["step00000002"]  # no .tmp-step00000004 left
    (event,) = [e for e in read_metrics(tmp_path / "run", "event") if e["event"] == "checkpoint_failed"]
    assert event["step"] == 4 and ENOSPC in event["message"]


def test_prepare_on_a_full_disk_names_its_output_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from adaponder.cli.prepare import main
    from adaponder.data import prepare as P

    (tmp_path / "a.txt").write_text("Some text to tokenize. " * 50)
    (tmp_path / "b.txt").write_text("Other text, also tokenized. " * 50)
    monkeypatch.setattr(P._ShardWriter, "write", _enospc)
    out = tmp_path / "out"
    rc = main([str(tmp_path / "*.txt"), "-o", str(out), "-j", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"error: could not write the prepared data {out} ({ENOSPC}, "), err
    assert err[0].endswith(f"the temporary folder was removed and {out} is not created")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # no .out.tmp-* left


def test_metrics_log_on_a_full_disk_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from adaponder.errors import OutputError, is_user_error
    from adaponder.train import trainer as T
    from adaponder.train.harness import RunHarness
    from adaponder.train.metrics import MetricsSink

    cfg = SimpleNamespace(jsonl=True, wandb=False, console=False)
    sink = MetricsSink(tmp_path, cfg, 0, None, {})
    sink.log({"kind": "train", "step": 1})
    monkeypatch.setattr(sink, "jsonl", SimpleNamespace(write=_enospc, flush=lambda: None, close=lambda: None))
    with pytest.raises(OutputError) as err:
        sink.log({"kind": "train", "step": 2})
    assert str(err.value) == f"could not write the metrics log {tmp_path / 'metrics.jsonl'} ({ENOSPC})"
    assert is_user_error(err.value)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]

    # The training run turns it into one line and exit code 2 (not a traceback).
    def setup(self):
        raise err.value

    monkeypatch.setattr(RunHarness, "setup", setup)
    assert T.run(SimpleNamespace()) == 2
    assert capsys.readouterr().err.strip() == f"error: could not write the metrics log {tmp_path / 'metrics.jsonl'} " \
                                              f"({ENOSPC})"


class _BigEngine(_Engine):
    """Checkpoint files of ~1 MB, so a small file system fills within the second save."""

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.ones(256 * 1024), **client_state}, Path(save_dir) / tag / "mp_rank_00_model_states.pt")


@pytest.fixture
def small_disk(tmp_path):
    """A 1.6 MB tmpfs (root only; skipped elsewhere): a real full disk, not an injected error."""
    import os

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.integration
def test_a_really_full_disk_under_torch_save_is_one_error_and_keeps_the_last_good_checkpoint(small_disk):
    """torch.save's zip writer reports a full disk as a RuntimeError, not an OSError."""
    from adaponder.train.checkpoint import CheckpointError, CheckpointManager

    ck = small_disk / "ck"
    mgr = CheckpointManager(ck, keep=3, rank=0, world_size=1)
    mgr.save(_BigEngine(), 2, rank_state={"step": 2}, trainer_state={})
    before = _digest(ck / "step00000002")
    with pytest.raises(CheckpointError) as err:
        mgr.save(_BigEngine(), 4, rank_state={"step": 4}, trainer_state={})
    assert str(err.value).startswith(f"could not write checkpoint {ck / 'step00000004'} (No space left on device ")
    assert str(err.value).endswith(f"the last good checkpoint {ck / 'step00000002'} is untouched")
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step00000002"]
    assert _digest(ck / "step00000002") == before


@pytest.mark.parametrize("free, reason", [(0, "No space left on device (0 bytes free)"),
                                          (10 << 30, "write error: [enforce fail at inline_container.cc:672] .")])
def test_torch_writer_failures_are_named_by_the_space_left(tmp_path, monkeypatch, free, reason):
    import shutil

    from adaponder.train import checkpoint as C

    mgr, ck = _manager_with_one_checkpoint(tmp_path)
    failure = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 387840 vs 387728")
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: (_ for _ in ()).throw(failure)
                        if "mp_rank_00" in str(f) else real_save(obj, f, *a, **k))
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: SimpleNamespace(total=1 << 40, used=0, free=free))
    with pytest.raises(C.CheckpointError) as err:
        mgr.save(_Engine(), 4, rank_state={"step": 4}, trainer_state={})
    assert f"could not write checkpoint {ck / 'step00000004'} ({reason}" in str(err.value)
    assert (ck / "latest").read_text() == "step00000002"


def test_other_runtime_errors_in_a_save_are_not_dressed_as_write_failures(tmp_path, monkeypatch):
    mgr, _ = _manager_with_one_checkpoint(tmp_path)
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="^a bug$"):
        mgr.save(_Engine(), 4, rank_state={"step": 4}, trainer_state={})


def test_an_export_on_a_full_disk_is_one_error_and_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    from adaponder.errors import OutputError
    from adaponder.train import export as E

    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("earlier export")

    def fill_disk(folder):
        (folder / "config.json").write_text("{}")
        _enospc()

    with pytest.raises(OutputError) as err:
        E.write_atomically(out, fill_disk, overwrite=True)
    assert str(err.value) == f"could not write the export {out} ({ENOSPC}); {out} was left as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (out / "keep.txt").read_text() == "earlier export"
