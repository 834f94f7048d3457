"""Numbers that must not depend on how a run is launched or resumed.

* a 2-rank ZeRO-1 checkpoint resumes on 1 rank, and a 1-rank one on 2 ranks: the same samples in the same
  micro-batches, and losses within fp32 tolerance of the uninterrupted run (the loader's position is one global
  sample stream; the optimizer state, Adam moments included, is re-sharded through DeepSpeed's universal
  checkpoint);
* validation covers the same tokens on any number of ranks: one checkpoint validated on 2 ranks and on 1 rank
  gives the same loss (``eval.max_batches`` counts micro-batches of all ranks together; 3 here, so the last
  round is short on 2 ranks);
* resuming with another ``train.steps`` (which rebuilds the learning-rate and ponder schedules) is refused,
  naming the keys and both values, unless ``train.allow_schedule_change``, which logs the change; another
  global batch (another data order) is refused.

Two 2-rank launches; the 1-rank runs share one in-process launcher.
"""

import json
import shutil

import pytest

from helpers_train import deepspeed_launch, free_port, read_metrics, tiny_train_config, write_config

pytestmark = pytest.mark.deepspeed
RTOL = 1e-4


def _config(tmp, name, data, **train):
    # global_batch (not grad_accum) fixed: 1 rank × accumulation 2 and 2 ranks × 1 read the same micro-batches
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp / name,
                            train={"steps": 4, "grad_accum": None, "global_batch": 8, **train},
                            eval={"max_batches": 3}, debug={"trace_batches": True})
    return write_config(tmp / f"{name}.yaml", cfg)


def _one(launcher, *argv):
    code, out = launcher.run(*[str(a) for a in argv])
    assert code == 0, out[-4000:]
    return out


def _two(cfg, *argv):
    code, out = deepspeed_launch(cfg, 2, free_port(), *argv)
    assert code == 0, out[-4000:]
    return out


def _samples(out_dir):
    """step -> the digests of its samples, micro-batch by micro-batch (rank 0's, then rank 1's: the global order)."""
    steps: dict[int, list[str]] = {}
    for f in sorted((out_dir / "trace").glob("rank*.jsonl")):
        for rec in map(json.loads, f.read_text().splitlines()):
            steps.setdefault(rec["step"], []).extend(rec["rows"])
    return steps


def _losses(out_dir):
    return {r["step"]: r["loss"] for r in read_metrics(out_dir)}


@pytest.fixture(scope="module")
def runs(data, launcher, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launch")
    ref = _config(tmp, "ref", data)
    _one(launcher, "--config", ref)  # 4 steps on 1 rank, uninterrupted
    down = _config(tmp, "down", data, stop_at=2)
    _two(down)  # 2 ranks to step 2 ...
    out_down = _one(launcher, "--config", down, "--resume", "auto", "--set", "train.stop_at=null")  # ... 1 rank on
    up = _config(tmp, "up", data, stop_at=2)
    _one(launcher, "--config", up)  # 1 rank to step 2 ...
    out_up = _two(up, "--resume", "auto", "--set", "train.stop_at=null")  # ... 2 ranks on, validated on 2 ranks
    return tmp, {"down": out_down, "up": out_up}


@pytest.mark.parametrize("name, before, after", [("down", 2, 1), ("up", 1, 2)])
def test_resume_on_another_number_of_ranks_continues_the_run(runs, name, before, after):
    tmp, outs = runs
    out = outs[name]
    assert (f"step00000002 was written by {before} rank(s), this run has {after}: re-sharding the ZeRO-1 "
            "optimizer state") in out
    assert "at step 2" in out
    ref, got = _samples(tmp / "ref"), _samples(tmp / name)
    assert sorted(got) == [1, 2, 3, 4] and got == ref  # the same samples in the same micro-batches, every step
    ref_loss, loss = _losses(tmp / "ref"), _losses(tmp / name)
    assert sorted(loss) == [1, 2, 3, 4]
    for step in loss:
        assert loss[step] == pytest.approx(ref_loss[step], rel=RTOL), (step, loss, ref_loss)
    assert not list((tmp / name / "checkpoints").glob(".reshard-*"))  # the conversion is gone after the load


def test_validation_covers_the_same_tokens_on_any_number_of_ranks(runs, launcher):
    tmp, _ = runs
    two = read_metrics(tmp / "up", "eval")[-1]  # the step-4 checkpoint validated by 2 ranks
    copy = tmp / "up-eval"
    shutil.copytree(tmp / "up", copy)
    _one(launcher, "--config", tmp / "up.yaml", "--resume", "auto", "--set", f"train.out_dir={copy}",
         "--set", "train.stop_at=null")  # the same checkpoint (step 4 of 4): only the final validation runs
    one = read_metrics(copy, "eval")[-1]
    assert one["step"] == two["step"] == 4
    assert one["val_tokens"] == two["val_tokens"] == 3 * 4 * 32  # eval.max_batches × micro-batch × seq_len
    assert one["val_loss"] == pytest.approx(two["val_loss"], rel=1e-6)
    assert one["val_ppl"] == pytest.approx(two["val_ppl"], rel=1e-6)
    assert one["exit_hist"] == two["exit_hist"]


def test_resume_refuses_a_schedule_change_unless_allowed(runs, launcher):
    tmp, _ = runs
    copy = tmp / "sched"
    shutil.copytree(tmp / "ref", copy)
    base = ["--config", tmp / "ref.yaml", "--resume", "auto", "--set", f"train.out_dir={copy}", "--set",
            "train.steps=6"]
    code, out = launcher.run(*[str(a) for a in base])
    assert code == 2, out[-3000:]
    assert "the schedule would change" in out and "train.steps (steps): 4 in the checkpoint, 6 now" in out
    assert "schedule.s1 (steps): 2 in the checkpoint, 3 now" in out  # s1 = 0.5 of the steps
    assert "--set train.allow_schedule_change=true" in out
    assert [r["step"] for r in read_metrics(copy)] == [1, 2, 3, 4]  # nothing trained, nothing written
    code, out = launcher.run(*[str(a) for a in base[:-2]], "--set", "train.global_batch=16")  # another data order
    assert code == 2 and "global_batch is 8 in the checkpoint but 16 in this run" in out, out[-3000:]

    out = _one(launcher, *base, "--set", "train.allow_schedule_change=true")
    assert ("schedule changed on resume (train.allow_schedule_change): train.steps (steps): 4 in the checkpoint, "
            "6 now") in out
    assert [r["step"] for r in read_metrics(copy)] == [1, 2, 3, 4, 5, 6]
    assert any(e["event"] == "schedule_changed" for e in read_metrics(copy, "event"))
