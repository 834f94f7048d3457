"""Non-finite weights (docs/reliability.md, section B): rotation keeps the newest checkpoint whose weights were
finite; resume, export and evaluation refuse NaN weights by name; ``--resume auto`` falls back past them; a NaN
perplexity is an error, not a number."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from helpers_train import poison_checkpoint as _poison, tiny_train_config, write_config

from adaponder.train.checkpoint import (CheckpointError, CheckpointManager, find_resume, list_tags,
                                        read_state, validate)


class _Engine:
    """Writes what DeepSpeed's ``save_checkpoint`` writes for ZeRO-0 (the module's weights under the tag), so
    the manager's own logic (manifest, finite flag, rotation) runs without a DeepSpeed engine."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True)
        torch.save({"module": self.module.state_dict(), **client_state}, folder / "mp_rank_00_model_states.pt")


def _save(manager: CheckpointManager, engine: _Engine, step: int) -> Path:
    return manager.save(engine, step, rank_state={"step": step}, trainer_state={})


@pytest.mark.parametrize("keep", [1, 2])
def test_rotation_never_deletes_the_newest_checkpoint_with_finite_weights(tmp_path, keep):
    engine = _Engine(torch.nn.Linear(4, 3))
    manager = CheckpointManager(tmp_path, keep=keep, rank=0, world_size=1)
    _save(manager, engine, 2)
    with torch.no_grad():
        engine.module.weight[0, 0] = float("nan")
    for step in (4, 6, 8):
        _save(manager, engine, step)
    tags = list_tags(tmp_path)
    assert tags[0] == "step00000002" and tags[-1] == "step00000008"
    assert len(tags) == keep + 1  # the finite one kept on top of ``keep``
    assert read_state(tmp_path / "step00000002")["weights_finite"] is True
    assert read_state(tmp_path / "step00000008")["weights_finite"] is False
    # --resume auto passes over the non-finite ones, saying so; an explicit one is an error naming it.
    lines: list[str] = []
    chosen, verified = find_resume("auto", tmp_path, notify=lines.append)
    assert chosen == tmp_path / "step00000002" and verified
    more = f" (and {keep - 1} more unusable)" if keep > 1 else ""
    assert lines == [f"checkpoint {tmp_path / 'step00000008'} cannot be resumed from: its weights were not all "
                     f"finite when it was saved (NaN or inf){more}; resuming from {tmp_path / 'step00000002'} instead"]
    with pytest.raises(CheckpointError, match=re.escape(f"cannot resume from {tmp_path / 'step00000008'}: its "
                                                        "weights were not all finite")):
        validate(tmp_path / "step00000008", {})


@pytest.fixture(scope="module")
def run(data, launcher, tmp_path_factory):
    """A ZeRO-0 run of 4 steps with checkpoints at steps 2 and 4 and a Hugging Face export."""
    root = tmp_path_factory.mktemp("lastgood")
    cfg = write_config(root / "run.yaml", tiny_train_config(
        data["data"], data["tokenizer"], root / "run", train={"steps": 4}, checkpoint={"every": 2, "export_hf": True},
        deepspeed={"zero_stage": 0}, eval={"at_end": False}))
    code, out = launcher.run("--config", cfg)
    assert code == 0, out
    return {"cfg": cfg, "out": root / "run", "ck": root / "run" / "checkpoints"}


@pytest.mark.integration
def test_nonfinite_checkpoint_resume_explicit_errors_auto_falls_back(run, launcher):
    ck = run["ck"]
    step4 = ck / "step00000004"
    name = _poison(step4)
    code, out = launcher.run("--config", run["cfg"], "--resume", step4)
    assert code == 2 and (f"error: cannot resume from {step4}: its weights are not all finite ({name} holds NaN in "
                          "mp_rank_00_model_states.pt); resume from an older checkpoint") in out, out

    code, out = launcher.run("--config", run["cfg"], "--resume", "auto")
    assert code == 0, out
    assert (f"checkpoint {step4} cannot be resumed from: its weights are not all finite ({name} holds NaN in "
            f"mp_rank_00_model_states.pt); resuming from {ck / 'step00000002'} instead") in out
    assert f"resumed from {ck / 'step00000002'} at step 2" in out
    assert read_state(step4)["weights_finite"] is True  # step 4 trained again, from finite weights


@pytest.mark.integration
def test_export_refuses_nonfinite_weights_with_one_line(run, tmp_path, capsys):
    from adaponder.cli.export_hf import main as export_main

    ck = tmp_path / "ck"
    shutil.copytree(run["ck"] / "step00000002", ck / "step00000002")
    name = _poison(ck / "step00000002")
    assert export_main([str(ck / "step00000002"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: cannot export {ck / 'step00000002'}: its weights are not all finite ({name} holds NaN); "
                   "export an earlier checkpoint (the newest one with finite weights is kept by rotation)")
    assert not (tmp_path / "hf").exists()


def _edit_export(src: Path, dst: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    edit(weights)
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.integration
def test_perplexity_refuses_nonfinite_weights_and_fails_on_a_nonfinite_result(run, data, tmp_path, capsys):
    from adaponder.cli.perplexity import main as ppl_main

    text = next(Path(data["corpus"]).glob("*.txt"))
    args = ["--data", str(text), "--window", "32", "--stride", "32", "--max-tokens", "256"]
    hf = run["out"] / "hf"
    assert ppl_main([str(hf), *args]) == 0
    capsys.readouterr()

    def nan_weight(w):
        key = sorted(w)[0]
        w[key].view(-1)[0] = float("nan")

    nan_dir = _edit_export(hf, tmp_path / "nan", nan_weight)
    assert ppl_main([str(nan_dir), *args]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]  # (not the load's bar)
    assert len(err) == 1 and err[0].startswith(f"error: {nan_dir / 'model.safetensors'}: the weights are not all "
                                               "finite (") and "holds NaN" in err[0], err

    def huge_head(w):  # finite weights whose logits overflow: the scores are NaN
        key = "lm_head.weight"
        w[key].fill_(3e38)

    huge = _edit_export(hf, tmp_path / "huge", huge_head)
    assert ppl_main([str(huge), *args, "--json", str(tmp_path / "r.json")]) == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and err[0].startswith(f"error: the perplexity of {text} is nan (a non-finite loss; expected "
                                               f"a finite number): {huge} produced NaN or inf scores"), err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.integration
def test_adaponder_eval_refuses_nonfinite_weights_and_fails_on_nonfinite_logits(run, tmp_path, capsys):
    from conftest import SHARED_DATA

    if not (SHARED_DATA / "eval" / "lambada_openai").is_dir():
        pytest.skip(f"eval data not found under {SHARED_DATA}")
    from adaponder.cli.lm_eval import main as eval_main

    args = ["--tasks", "adaponder_lambada_openai", "--limit", "2", "--batch_size", "2", "--device", "cpu"]
    hf = run["out"] / "hf"
    nan_dir = _edit_export(hf, tmp_path / "nan", lambda w: w["lm_head.weight"].view(-1).__setitem__(0, float("nan")))
    assert eval_main([str(nan_dir), *args]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert err == [f"error: {nan_dir / 'model.safetensors'}: the weights are not all finite (lm_head.weight holds "
                   "NaN); nothing can be evaluated with them (export an earlier training checkpoint)"]
    huge = _edit_export(hf, tmp_path / "huge", lambda w: w["lm_head.weight"].fill_(3e38))
    assert eval_main([str(huge), *args]) == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and err[0].startswith(f"error: {huge}: 2 scored request(s) had non-finite logits"), err
