"""A resume never lies: other data and other optimizer hyper-parameters are refused (naming old and new) or,
when explicitly allowed, applied and logged; the recorded ``config.yaml`` is what runs.

One short run stops at step 2 with a checkpoint; each case resumes a copy of it through the real launcher.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers_train import read_metrics, tiny_train_config, write_config


@pytest.fixture(scope="module")
def stopped(data, launcher, tmp_path_factory):
    """A run stopped at step 2 of 4 (checkpoint step00000002) and its config file."""
    tmp = tmp_path_factory.mktemp("resume_checks")
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp / "run", train={"steps": 4, "stop_at": 2},
                            checkpoint={"every": 2}, eval={"max_batches": 2})
    path = write_config(tmp / "run.yaml", cfg)
    code, out = launcher.run("--config", path)
    assert code == 0, out[-3000:]
    return tmp, path


def _copy(stopped, name: str) -> Path:
    tmp, _ = stopped
    dest = tmp / name
    shutil.copytree(tmp / "run", dest)
    return dest


def _resume(launcher, stopped, run_dir: Path, *sets: str) -> tuple[int, str]:
    argv = ["--config", str(stopped[1]), "--resume", "auto", "--set", f"train.out_dir={run_dir}"]
    for s in sets:
        argv += ["--set", s]
    return launcher.run(*argv)


def _events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_metrics(run_dir, "event") if e.get("event") == name]


def _other_data(src: Path, dest: Path) -> Path:
    """The same tokenizer and size as ``src``, other content: one train shard's tokens reversed (every id stays
    a valid one), its hash in meta.json updated as adaponder-prepare would have written it."""
    shutil.copytree(src, dest)
    meta = json.loads((dest / "meta.json").read_text())
    shard = meta["splits"]["train"]["shards"][0]
    f = dest / shard["file"]
    tokens = np.fromfile(f, dtype=meta["dtype"])
    tokens[::-1].tofile(f)
    shard["sha256"] = __import__("hashlib").sha256(f.read_bytes()).hexdigest()
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def test_data_fingerprints_follow_the_content_not_the_folder(data, tmp_path, monkeypatch):
    from adaponder.data import fingerprint as F
    from adaponder.data.indexed import write_indexed

    docs = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    write_indexed(tmp_path / "a", docs)
    (tmp_path / "moved").mkdir()
    write_indexed(tmp_path / "moved" / "a", docs)
    write_indexed(tmp_path / "b", [[1, 2, 3, 4], [5, 6, 7], [8, 10]])  # same sizes, one token differs
    fa, fb = F.indexed_fingerprint(tmp_path / "a"), F.indexed_fingerprint(tmp_path / "b")
    assert fa == F.indexed_fingerprint(tmp_path / "moved" / "a") and fa != fb
    write_indexed(tmp_path / "c", [[9, 2, 3, 4], [5, 6, 7], [8, 9]])  # the same .idx, the first token differs
    monkeypatch.setattr(F, "_BLOCK", 1)  # a .bin above 16 blocks: 16 sampled blocks (here single bytes)
    assert F.indexed_fingerprint(tmp_path / "a") != F.indexed_fingerprint(tmp_path / "c")
    assert (tmp_path / "a.idx").read_bytes() == (tmp_path / "c.idx").read_bytes()
    moved = tmp_path / "prepared"
    shutil.copytree(data["data"], moved)
    assert F.packed_fingerprint(moved, "train") == F.packed_fingerprint(data["data"], "train")
    assert F.packed_fingerprint(moved, "val") != F.packed_fingerprint(moved, "train")


@pytest.mark.integration
def test_resume_on_other_data_is_refused_unless_allowed_and_then_logged(stopped, data, launcher, tmp_path):
    from adaponder.data.fingerprint import packed_fingerprint

    other = _other_data(data["data"], tmp_path / "other")
    old_fp, new_fp = packed_fingerprint(data["data"], "train"), packed_fingerprint(other, "train")
    assert old_fp != new_fp
    run = _copy(stopped, "data_refused")
    config_before = (run / "config.yaml").read_text()
    code, out = _resume(launcher, stopped, run, f"data.path={other}")
    assert code == 2, out[-3000:]
    assert "the data differs from the checkpoint's" in out
    assert (f"train data: {old_fp} ({data['data']}, split train) in the checkpoint, "
            f"{new_fp} ({other}, split train) now") in out
    assert "val data:" not in out  # (the validation shards are the same)
    assert "--set train.allow_data_change=true" in out
    assert (run / "config.yaml").read_text() == config_before  # nothing written
    assert [r["step"] for r in read_metrics(run)] == [1, 2]

    code, out = _resume(launcher, stopped, run, f"data.path={other}", "train.allow_data_change=true")
    assert code == 0, out[-3000:]
    assert "data changed on resume (train.allow_data_change): train data: " in out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    (event,) = _events(run, "data_changed")
    assert old_fp in event["changes"] and new_fp in event["changes"] and event["step"] == 2
    state = json.loads((run / "checkpoints" / "step00000004" / "trainer_state.json").read_text())
    assert state["data"]["train"]["fingerprint"] == new_fp  # the next checkpoint records the data it ran on


@pytest.mark.integration
def test_a_checkpoint_without_a_data_fingerprint_resumes_with_a_notice(stopped, launcher):
    run = _copy(stopped, "old_checkpoint")
    state_file = run / "checkpoints" / "step00000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["data"]["train"]["fingerprint"] and state["data"]["val"]["split"] == "val"
    del state["data"]
    state_file.write_text(json.dumps(state))
    code, out = _resume(launcher, stopped, run)
    assert code == 0, out[-3000:]
    assert out.count("records no data fingerprint") == 1
    assert len(_events(run, "data_unchecked")) == 1


def _param_groups(tag_dir: Path) -> list[dict]:
    optim = torch.load(next(tag_dir.glob("*optim_states.pt")), map_location="cpu", weights_only=False)
    return optim["optimizer_state_dict"]["base_optimizer_state"]["param_groups"]


@pytest.mark.integration
def test_other_optimizer_values_are_refused_unless_allowed_and_then_applied(stopped, launcher):
    run = _copy(stopped, "optim")
    config_before = (run / "config.yaml").read_text()
    code, out = _resume(launcher, stopped, run, "optim.weight_decay=0.1", "optim.betas=[0.8,0.9]")
    assert code == 2, out[-3000:]
    assert "optimizer's hyper-parameters would change (optim.weight_decay 0.01 → 0.1; optim.betas [0.9, 0.95] → " \
           "[0.8, 0.9])" in out
    assert "--set train.allow_optim_change=true" in out
    assert (run / "config.yaml").read_text() == config_before

    code, out = _resume(launcher, stopped, run, "optim.weight_decay=0.1", "optim.betas=[0.8,0.9]",
                        "train.allow_optim_change=true", "logging.every=2")
    assert code == 0, out[-3000:]
    assert ("resumed with optim.weight_decay 0.01 → 0.1; optim.betas [0.9, 0.95] → [0.8, 0.9] "
            "(train.allow_optim_change): applied to the optimizer from step 2") in out
    assert "resumed with changed settings: logging.every 1 → 2" in out  # honoured, and said so
    assert len(_events(run, "optimizer_changed")) == 1
    # What runs is what config.yaml says: the optimizer of the step-4 checkpoint holds the new values.
    recorded = yaml.safe_load((run / "config.yaml").read_text())["optim"]
    assert recorded["weight_decay"] == 0.1 and recorded["betas"] == [0.8, 0.9]
    groups = _param_groups(run / "checkpoints" / "step00000004")
    assert {g["name"]: g["weight_decay"] for g in groups} == {
        g["name"]: (0.1 if not g["name"].endswith("_no_decay") else 0.0) for g in groups}
    assert all(tuple(g["betas"]) == (0.8, 0.9) for g in groups)
    # (the step-2 checkpoint's optimizer held the old values: the change was real)
    assert all(tuple(g["betas"]) == (0.9, 0.95) for g in _param_groups(run / "checkpoints" / "step00000002"))


@pytest.mark.integration
def test_finetuning_records_its_glue_data_and_refuses_other_data_unless_allowed(shared_data, tmp_path):
    from helpers_finetune import FinetuneWorker, finetune_argv

    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    shutil.copy(shared_data / "glue" / "SST-2" / "dev.tsv", glue / "dev.tsv")
    rows = (shared_data / "glue" / "SST-2" / "train.tsv").read_text().splitlines(keepends=True)
    text, label = rows[1].rstrip("\n").split("\t")
    rows[1] = f"{text}\t{1 - int(label)}\n"  # one label flipped: same task, size and tokenizer
    (glue / "train.tsv").write_text("".join(rows))
    out, recipe = tmp_path / "ft", FINETUNE_STOPPED_AT_1
    worker = FinetuneWorker()
    try:
        _finetune_ok(worker, out, recipe)
        state = json.loads((out / "checkpoints" / "step00000001" / "trainer_state.json").read_text())
        assert state["data"]["train"]["split"] == "train" and state["data"]["val"]["split"] == "dev"
        old_fp = state["data"]["train"]["fingerprint"]
        resume = ["--resume", "auto", "--data-dir", str(glue.parent)]
        code, log = worker.run(finetune_argv("sst2", out, *recipe) + resume)
        assert code == 2, log[-3000:]
        assert "the data differs from the checkpoint's (train data: " + old_fp in log
        assert f"{glue.parent} (sst2), split train) now" in log and "val data" not in log
        code, log = worker.run(finetune_argv("sst2", out, *recipe, "train.allow_data_change=true") + resume)
        assert code == 0, log[-3000:]
        assert "data changed on resume (train.allow_data_change): train data: " + old_fp in log
    finally:
        worker.close()


#: a GLUE fine-tuning that stops after its first step (no timing phase)
FINETUNE_STOPPED_AT_1 = ["timing.enabled=false", "train.stop_at=1"]


def _finetune_ok(worker, out: Path, recipe: list[str], *args: str) -> str:
    from helpers_finetune import finetune_argv

    code, log = worker.run(finetune_argv("sst2", out, *recipe) + list(args))
    assert code == 0, log[-3000:]
    return log


def _finetuning_param_groups(tag_dir: Path) -> dict[str, dict]:
    """The optimizer's parameter groups by name, as a fine-tuning checkpoint holds them (without ZeRO DeepSpeed
    keeps the optimizer in the model-states file)."""
    files = list(tag_dir.glob("*optim_states.pt"))
    if files:
        groups = torch.load(files[0], map_location="cpu", weights_only=False)["optimizer_state_dict"]["param_groups"]
    else:
        states = torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        groups = states["optimizer"]["param_groups"]
    return {g["name"]: g for g in groups}


@pytest.mark.integration
def test_finetuning_refuses_other_optimizer_values_unless_allowed_and_then_applies_them(shared_data, tmp_path):
    """The checkpoint's optimizer state carries train.weight_decay (and the learning rates); a resume with another
    value is refused naming both, and when allowed the optimizer runs with the new one, as config.yaml says."""
    from helpers_finetune import FinetuneWorker, finetune_argv

    out, recipe = tmp_path / "ft", FINETUNE_STOPPED_AT_1
    worker = FinetuneWorker()
    try:
        _finetune_ok(worker, out, recipe)
        config_before = (out / "config.yaml").read_text()
        assert yaml.safe_load(config_before)["train"]["weight_decay"] == 0.0
        before = _finetuning_param_groups(out / "checkpoints" / "step00000001")  # (the resume rewrites step 1)
        resume = ["--resume", "auto"]
        code, log = worker.run(finetune_argv("sst2", out, *recipe, "train.weight_decay=0.1") + resume)
        assert code == 2, log[-3000:]
        assert "optimizer's hyper-parameters would change (train.weight_decay 0.0 → 0.1)" in log
        assert "--set train.allow_optim_change=true" in log
        assert (out / "config.yaml").read_text() == config_before
        assert not (out / "checkpoints" / "step00000002").exists()

        code, log = worker.run(finetune_argv("sst2", out, *recipe, "train.weight_decay=0.1",
                                             "train.allow_optim_change=true") + resume)
        assert code == 0, log[-3000:]
        assert ("resumed with train.weight_decay 0.0 → 0.1 (train.allow_optim_change): applied to the optimizer "
                "from step 1") in log
    finally:
        worker.close()
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["weight_decay"] == 0.1
    # What ran is what config.yaml says: the optimizer of the step-2 checkpoint holds the new value, the stopped
    # run's step-1 checkpoint held the old one; the learning rates are untouched.
    after = _finetuning_param_groups(out / "checkpoints" / "step00000002")
    assert {n: g["weight_decay"] for n, g in after.items()} == {"main": 0.1, "lambda": 0.1}
    assert {n: g["weight_decay"] for n, g in before.items()} == {"main": 0.0, "lambda": 0.0}
    assert {n: g["lr"] for n, g in after.items()} == {n: g["lr"] for n, g in before.items()}
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [e["changes"] for e in events if e.get("event") == "optimizer_changed"] == ["train.weight_decay 0.0 → 0.1"]

