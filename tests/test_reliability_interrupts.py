"""A run interrupted at the worst moments of its checkpoints: killed while an old checkpoint is deleted, and
Ctrl-C pressed twice (or three times) while a checkpoint is saved or a step runs.

* Rotation deletes by renaming first: a kill in the middle of ``shutil.rmtree`` leaves a hidden
  ``.deleting-stepN-<pid>`` folder, never a ``stepN`` holding a part of a checkpoint; the next start removes it,
  and names and removes a ``stepN`` folder without ``trainer_state.json`` left by an older version. The run then
  resumes, finishes and exports.
* A second Ctrl-C while a checkpoint is written waits for the save with one line; a second one between saves (or a
  third during a save) stops at once; every way ends in one line and exit code 130, never a ``KeyboardInterrupt``
  traceback, and the last complete checkpoint is kept.

The runs go through the launcher in a long-lived worker (``helpers_train.LauncherWorker``) with the faults of
``tests/faults.py``: a deletion that dies after one file, and SIGINTs sent to the process itself at a chosen point.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaponder.train.checkpoint import TAG_RE
from helpers_train import tiny_train_config, write_config

pytestmark = pytest.mark.integration  # every run goes through the launcher worker, a process of its own


def _config(tmp: Path, name: str, data, **sections) -> Path:
    sections = {"eval": {"at_end": False}, **sections}
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp / name, **sections)
    return write_config(tmp / f"{name}.yaml", cfg)


def _step_folders(ck: Path) -> dict[str, bool]:
    """Every folder named like a checkpoint, with whether it is complete (holds trainer_state.json)."""
    return {p.name: (p / "trainer_state.json").is_file() for p in ck.iterdir() if TAG_RE.match(p.name)}


@pytest.mark.integration
def test_a_kill_while_rotating_leaves_no_folder_named_like_a_checkpoint(data, launcher, tmp_path, capsys):
    from adaponder.cli.export_hf import main as export_main

    cfg = _config(tmp_path, "run", data, train={"steps": 6}, checkpoint={"every": 2, "keep": 1})
    code, out = launcher.run("--config", cfg, faults={"crash_in_rotation": True})
    ck = tmp_path / "run" / "checkpoints"
    assert code == -1 and "simulated crash in the middle of deleting" in out, out[-2000:]
    # step 4 is saved and named; step 2's deletion died after removing trainer_state.json
    assert (ck / "latest").read_text().strip() == "step00000004"
    assert _step_folders(ck) == {"step00000004": True}
    hidden = [p.name for p in ck.iterdir() if p.name.startswith(".deleting-step00000002-")]
    assert len(hidden) == 1 and not (ck / hidden[0] / "trainer_state.json").exists()

    # A leftover of an older version: a folder named like a checkpoint, holding only config.json.
    (ck / "step00000001").mkdir()
    (ck / "step00000001" / "config.json").write_text("{}")
    code, out = launcher.run("--config", cfg, "--resume", "auto")
    assert code == 0, out[-2000:]
    assert (f"removed {ck / 'step00000001'}: an incomplete checkpoint folder (trainer_state.json is missing; it held "
            "config.json), left by a deletion that was interrupted") in out
    assert f"resumed from {ck / 'step00000004'} at step 4" in out
    assert _step_folders(ck) == {"step00000006": True}
    assert not [p.name for p in ck.iterdir() if p.name.startswith(".") and p.is_dir()]  # no hidden leftover

    assert export_main([str(ck), str(tmp_path / "hf")]) == 0, capsys.readouterr().err
    assert f"exported {ck / 'step00000006'}" in capsys.readouterr().out
    assert (tmp_path / "hf" / "config.json").is_file()


def test_an_incomplete_checkpoint_that_holds_weights_is_moved_aside_and_an_export_names_it(data, launcher,
                                                                                            tmp_path, capsys):
    from adaponder.cli.export_hf import main as export_main

    cfg = _config(tmp_path, "run", data, train={"steps": 4, "stop_at": 2}, checkpoint={"every": 2})
    code, out = launcher.run("--config", cfg)
    assert code == 0, out[-2000:]
    ck = tmp_path / "run" / "checkpoints"
    # an older version's interrupted deletion: the weights are left, trainer_state.json is gone
    import shutil

    shutil.copytree(ck / "step00000002", ck / "step00000001")
    (ck / "step00000001" / "trainer_state.json").unlink()
    assert export_main([str(ck / "step00000001"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {ck / 'step00000001'}: an incomplete checkpoint folder "
                          "(trainer_state.json is missing") and "complete ones beside it: step00000002" in err, err
    code, out = launcher.run("--config", cfg, "--resume", "auto")
    assert code == 0, out[-2000:]
    aside = [p for p in ck.iterdir() if p.name.startswith(".incomplete-step00000001-")]
    assert len(aside) == 1 and (aside[0] / "mp_rank_00_model_states.pt").is_file()  # kept, under a hidden name
    assert f"moved {ck / 'step00000001'} aside to {aside[0]}: an incomplete checkpoint" in out
    assert _step_folders(ck) == {"step00000002": True, "step00000004": True}


@pytest.mark.parametrize("where, count, said, latest", [
    ("save", 2, "received SIGINT: saved {ck}/step00000005 at step 5; continue with --resume auto", "step00000005"),
    ("save", 3, "stopped at once by Ctrl-C at step 4, without saving it: the last checkpoint is {ck}/step00000002 "
                "(step 2); continue with --resume auto", "step00000002"),
    ("step", 2, "stopped at once by Ctrl-C at step 3, without saving it: the last checkpoint is {ck}/step00000002 "
                "(step 2); continue with --resume auto", "step00000002"),
], ids=["twice-while-saving-waits", "three-times-while-saving-stops", "twice-between-saves-stops"])
@pytest.mark.slow
def test_ctrl_c_again_ends_in_one_line_never_a_traceback(data, launcher, tmp_path, where, count, said, latest):
    cfg = _config(tmp_path, "run", data, train={"steps": 8}, checkpoint={"every": 2})
    code, out = launcher.run("--config", cfg, faults={"sigints": {"where": where, "step": 4, "count": count}})
    ck = tmp_path / "run" / "checkpoints"
    assert code == 130, out[-2000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-2000:]
    assert said.format(ck=ck) in out, out[-2000:]
    waiting = out.count("a checkpoint is being saved: waiting for it to finish, then stopping")
    assert waiting == (1 if where == "save" else 0), out[-2000:]
    assert (ck / "latest").read_text().strip() == latest
    assert all(_step_folders(ck).values())  # no part of a checkpoint under a checkpoint's name
    # the run goes on from the last complete checkpoint (the cut-off save's temporary folder is cleared)
    code, out = launcher.run("--config", cfg, "--resume", "auto")
    assert code == 0 and f"resumed from {ck / latest}" in out, out[-2000:]
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp-")]
