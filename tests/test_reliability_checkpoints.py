"""Damaged and unsafe checkpoints, and the offline export's output folder.

* every file of a checkpoint has its SHA-256 in the manifest; ``--resume auto`` skips a damaged newest
  checkpoint (one line names it and the one used), an explicit ``--resume PATH`` to it and the export exit 2;
* a ``.pt`` whose unpickling would run code is refused (before DeepSpeed or ``zero_to_fp32`` unpickle it) by
  resume and export, and ``adaponder-train-report`` never runs the modeling code saved in a folder;
* ``launch/export_hf.py`` refuses a non-empty output folder unless ``--overwrite``, and writes atomically.

One tiny training run (ZeRO-1, 6 steps, checkpoints at 2, 4, 6) is shared; each test works on a copy.
"""

import importlib.util
import json
import pathlib
import shutil
import sys
from pathlib import Path

import pytest
import torch

from adaponder.train.checkpoint import (FORMAT, HASH_KEY, STATE_FILE, file_sha256, integrity_problems,
                                        read_state, safe_torch_load)
from helpers_train import REPO, read_metrics, tiny_train_config, write_config

MODEL_STATES = "mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def trained(data, launcher, tmp_path_factory):
    """A finished run: checkpoints step00000002/4/6 (ZeRO-1), no HF export."""
    tmp = tmp_path_factory.mktemp("reliability")
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp / "run", train={"steps": 6},
                            checkpoint={"every": 2, "keep": 5}, eval={"max_batches": 2})
    path = write_config(tmp / "run.yaml", cfg)
    code, out = launcher.run("--config", path)
    assert code == 0, out
    return tmp / "run", path


def _copy_run(trained, dest: Path) -> tuple[Path, list[str]]:
    """A copy of the trained run folder and the launcher arguments that train into it."""
    run, cfg = trained
    shutil.copytree(run, dest)
    return dest / "checkpoints", ["--config", str(cfg), "--set", f"train.out_dir={dest}"]


def _export_main():
    spec = importlib.util.spec_from_file_location("adaponder_export_hf_cli", REPO / "launch" / "export_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _export(capsys, *argv) -> tuple[int, str]:
    code = _export_main()([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _damage(f: Path, offset_fraction: float = 0.5, n: int = 4096) -> None:
    """Overwrite ``n`` bytes in the middle of ``f`` with garbage (same size: only the hash can tell)."""
    raw = bytearray(f.read_bytes())
    assert len(raw) > 2 * n
    at = int(len(raw) * offset_fraction)
    raw[at:at + n] = bytes((i * 131 + 7) % 256 for i in range(n))
    f.write_bytes(bytes(raw))


def _rehash(tag_dir: Path, rel: str) -> None:
    """Record the current size and SHA-256 of ``rel`` in the manifest (a forger who also edits the manifest)."""
    f = tag_dir / STATE_FILE
    state = json.loads(f.read_text())
    state["manifest"][rel] = (tag_dir / rel).stat().st_size
    state[HASH_KEY][rel] = file_sha256(tag_dir / rel)
    f.write_text(json.dumps(state, indent=2, sort_keys=True))


# -- A: content hashes ---------------------------------------------------------------------------------------
@pytest.mark.integration
def test_manifest_records_size_and_sha256_of_every_file(trained):
    run, _ = trained
    tag = run / "checkpoints" / "step00000006"
    state = read_state(tag)
    on_disk = sorted(str(p.relative_to(tag)) for p in tag.rglob("*") if p.is_file() and p.name != STATE_FILE)
    assert sorted(state["manifest"]) == on_disk and sorted(state[HASH_KEY]) == on_disk
    assert MODEL_STATES in on_disk and "rank00000.pt" in on_disk and any("optim_states" in n for n in on_disk)
    for rel in on_disk:
        assert state["manifest"][rel] == (tag / rel).stat().st_size
        assert state[HASH_KEY][rel] == file_sha256(tag / rel)
    assert integrity_problems(tag) == []


@pytest.mark.integration
def test_damaged_newest_checkpoint_auto_falls_back_explicit_and_export_exit_2(trained, launcher, tmp_path, capsys):
    ck, argv = _copy_run(trained, tmp_path / "run")
    bad, good = ck / "step00000006", ck / "step00000004"
    _damage(bad / MODEL_STATES)
    damaged_bytes = (bad / MODEL_STATES).read_bytes()
    assert integrity_problems(good) == [] and len(integrity_problems(bad)) == 1

    # An explicit path to the damaged checkpoint: exit 2, one line naming the file and the expected hash.
    code, out = launcher.run(*argv, "--resume", bad)
    assert code == 2, out
    line = next(x for x in out.splitlines() if x.startswith("error:"))
    assert f"cannot resume from {bad}: file {MODEL_STATES} has sha256" in line
    assert line.endswith("as recorded at save (corrupt)") and "expected" in line
    assert "resumed from" not in out
    # The checkpoint folder itself (uses its 'latest', which names the damaged one): also strict.
    code, out = launcher.run(*argv, "--resume", ck)
    assert code == 2 and MODEL_STATES in out and "sha256" in out, out

    # The export refuses it too, whether named directly or as the folder's newest.
    for source in (bad, ck):
        code, out = _export(capsys, source, tmp_path / "hf")
        assert code == 2, out
        assert f"cannot export {bad}: file {MODEL_STATES} has sha256" in out
        assert not (tmp_path / "hf").exists()
    assert (bad / MODEL_STATES).read_bytes() == damaged_bytes  # nothing touched the damaged file

    # --resume auto: one line names the damaged checkpoint and the one used; training continues from step 4.
    first = [r["loss"] for r in read_metrics(tmp_path / "run")]
    code, out = launcher.run(*argv, "--resume", "auto")
    assert code == 0, out
    notes = [x for x in out.splitlines() if "is damaged" in x]
    assert len(notes) == 1, out
    assert notes[0].startswith(f"checkpoint {bad} is damaged: file {MODEL_STATES} has sha256")
    assert notes[0].endswith(f"resuming from {good} instead")
    assert f"resumed from {good} at step 4" in out
    # The same steps 5 and 6 again (deterministic), and step 6 is rewritten intact.
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in read_metrics(tmp_path / "run")] == first
    assert integrity_problems(bad) == [] and (ck / "latest").read_text().strip() == "step00000006"


@pytest.mark.integration
def test_checkpoints_without_hashes_are_checked_by_size(trained, tmp_path):
    """A checkpoint written before the hashes existed still resumes: its sizes are checked."""
    ck, _ = _copy_run(trained, tmp_path / "run")
    tag = ck / "step00000004"
    state = json.loads((tag / STATE_FILE).read_text())
    del state[HASH_KEY]
    (tag / STATE_FILE).write_text(json.dumps(state))
    assert integrity_problems(tag) == []
    f = tag / MODEL_STATES
    f.write_bytes(f.read_bytes()[:-10])
    assert integrity_problems(tag) == [f"file {MODEL_STATES} has {f.stat().st_size} bytes, "
                                       f"{state['manifest'][MODEL_STATES]} were written (truncated or corrupt)"]


# -- C: no code execution on load ----------------------------------------------------------------------------
class Payload:
    """Unpickling this object touches a marker file (a harmless stand-in for arbitrary code)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _plant_payload(tag_dir: Path, marker: Path) -> Path:
    """Replace the model-states file with the real states plus a payload, with a matching manifest entry."""
    f = tag_dir / MODEL_STATES
    states = safe_torch_load(f)
    states["payload"] = Payload(marker)
    torch.save(states, f)
    _rehash(tag_dir, MODEL_STATES)
    assert integrity_problems(tag_dir) == []  # the hash check alone does not catch it
    return f


def test_the_payload_is_live(tmp_path):
    """Guard against a vacuous test: an unrestricted torch.load of such a file does run the payload."""
    marker = tmp_path / "ran"
    torch.save({"x": Payload(marker)}, tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.integration
def test_pickle_payload_is_refused_by_resume_and_export(trained, launcher, tmp_path, capsys):
    ck, argv = _copy_run(trained, tmp_path / "run")
    tag = ck / "step00000006"
    marker = tmp_path / "PAYLOAD_RAN"
    f = _plant_payload(tag, marker)

    for resume in (str(tag), "auto"):  # auto too: the file is intact by its hash, and refused, not skipped
        code, out = launcher.run(*argv, "--resume", resume)
        assert code == 2, out
        line = next(x for x in out.splitlines() if x.startswith("error:"))
        assert line == (f"error: {f}: refused to load: unpickling it would call `getattr`, which is neither a "
                        "tensor nor one of DeepSpeed's checkpoint types (a tampered or foreign file; nothing in it "
                        "was run)")
        assert not marker.exists()
        assert "resumed from" not in out

    code, out = _export(capsys, tag, tmp_path / "hf")  # ZeRO-1: before zero_to_fp32 unpickles anything
    assert code == 2 and f"{f}: refused to load" in out, out
    assert not marker.exists() and not (tmp_path / "hf").exists()
    # Any .pt in the folder is checked, e.g. a rank file.
    tag4 = ck / "step00000004"
    rank_file = tag4 / "rank00000.pt"
    torch.save({**safe_torch_load(rank_file, deepspeed_types=False), "p": Payload(marker)}, rank_file)
    _rehash(tag4, "rank00000.pt")
    code, out = launcher.run(*argv, "--resume", tag4)
    assert code == 2 and f"{rank_file}: refused to load" in out and not marker.exists(), out


@pytest.mark.integration
def test_pickle_payload_is_refused_by_a_zero_0_export(trained, tmp_path, capsys):
    """ZeRO-0 checkpoints are read by the export itself (no zero_to_fp32): weights-only as well."""
    ck, _ = _copy_run(trained, tmp_path / "run")
    tag = ck / "step00000006"
    state = json.loads((tag / STATE_FILE).read_text())
    assert state["format"] == FORMAT
    state["compat"]["zero_stage"] = 0
    (tag / STATE_FILE).write_text(json.dumps(state))
    marker = tmp_path / "PAYLOAD_RAN"
    f = _plant_payload(tag, marker)
    code, out = _export(capsys, tag, tmp_path / "hf")
    assert code == 2 and f"{f}: refused to load" in out and "`getattr`" in out, out
    assert not marker.exists()


@pytest.mark.integration
def test_deepspeed_checkpoint_types_are_allowed(trained):
    """The optimizer files hold DeepSpeed's loss scaler, ZeRO stage enum and fragment addresses."""
    tag = trained[0] / "checkpoints" / "step00000006"
    optim = safe_torch_load(next(tag.glob("*optim_states.pt")))
    assert type(optim["optimizer_state_dict"]["loss_scaler"]).__name__ == "LossScaler"
    with pytest.raises(Exception, match="refused to load"):
        safe_torch_load(next(tag.glob("*optim_states.pt")), deepspeed_types=False)


@pytest.mark.integration
def test_report_never_runs_the_modeling_code_saved_with_a_model(trained, data, tmp_path, capsys, one_thread):
    from adaponder.cli.train_report import main as report_main

    run, _ = trained
    code, out = _export(capsys, run / "checkpoints", tmp_path / "hf")
    assert code == 0, out
    marker = tmp_path / "REMOTE_CODE_RAN"
    code_file = tmp_path / "hf" / "modeling_adaponder.py"
    assert code_file.is_file()
    code_file.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" + code_file.read_text())
    assert report_main(["--model", str(tmp_path / "hf"), "--data", str(data["data"]), "--seq-len", "32",
                        "--micro-batch", "4", "--max-batches", "2", "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file()
    assert not marker.exists()


# -- D: the export's output folder ---------------------------------------------------------------------------
def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


@pytest.mark.integration
def test_export_refuses_a_non_empty_folder_unless_overwrite_and_writes_atomically(trained, tmp_path, capsys,
                                                                                 one_thread):
    ck = trained[0] / "checkpoints"
    out = tmp_path / "hf"
    code, text = _export(capsys, ck, out)  # a new folder
    assert code == 0, text
    assert (out / "config.json").is_file() and _siblings(out) == []
    weights = (out / "model.safetensors").read_bytes()

    # Non-empty, no --overwrite: exit 2, one line, the folder untouched.
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, text = _export(capsys, ck / "step00000004", out)
    assert code == 2
    assert text.strip() == (f"error: {out}: the output folder is not empty; expected an empty or new folder "
                            "(pass --overwrite to replace it)")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _siblings(out) == []

    # --overwrite: replaced as a whole (the old files are gone), nothing left beside it.
    code, text = _export(capsys, ck / "step00000004", out, "--overwrite")
    assert code == 0, text
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").read_bytes() != weights
    assert json.loads((out / "adaponder_training.json").read_text())["step"] == 4
    assert _siblings(out) == []

    # An empty folder is fine without --overwrite.
    (tmp_path / "empty").mkdir()
    code, text = _export(capsys, ck, tmp_path / "empty")
    assert code == 0 and (tmp_path / "empty" / "config.json").is_file(), text

    # A folder that holds the checkpoint is never replaced, even with --overwrite.
    code, text = _export(capsys, ck, trained[0], "--overwrite")
    assert code == 2 and "must lie outside the checkpoint" in text and (ck / "latest").is_file(), text


@pytest.mark.integration
def test_export_failing_midway_leaves_the_old_folder_and_no_temporary(trained, tmp_path, monkeypatch, one_thread):
    import adaponder.train.export as E

    ck = trained[0] / "checkpoints"
    out = tmp_path / "hf"
    E.export_checkpoint(ck / "step00000006", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    seen = {}

    def failing_save_hf(model, state_dict, folder, *args, **kwargs):
        seen["folder"] = Path(folder)
        (Path(folder) / "config.json").write_text("{half")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(E, "save_hf", failing_save_hf)
    from adaponder.errors import OutputError

    with pytest.raises(OutputError, match=f"could not write the export {out} \\(disk full \\(simulated\\)\\); "):
        E.export_checkpoint(ck / "step00000004", out, overwrite=True)
    assert seen["folder"].name.startswith(".hf.tmp-") and seen["folder"].parent == out.parent
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _siblings(out) == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
