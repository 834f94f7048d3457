"""Two DeepSpeed ranks on the CPU (gloo), started by the real ``deepspeed`` launcher: ZeRO 1, 2 and 3 train
(the loss falls, the ranks read disjoint data, a non-finite loss on one rank skips the step on both), and
resuming equals continuing, bit for bit.

Kept to five short launches; each costs ~10-20 s, mostly process start-up.
"""

import glob
import json

import pytest

from helpers_train import deepspeed_launch, read_metrics, tiny_train_config, write_config

pytestmark = pytest.mark.deepspeed

PORTS = {"z1": 29731, "z2": 29732, "z3": 29733, "b": 29734, "c": 29735}


def _cfg(tmp, name, data, stage, **sections):
    sections.setdefault("train", {}).update(steps=8, micro_batch=2, grad_accum=2)
    sections.setdefault("deepspeed", {}).update(zero_stage=stage)
    sections.setdefault("debug", {}).update(trace_batches=True)
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp / name, **sections)
    return write_config(tmp / f"{name}.yaml", cfg)


def _trace(out_dir, rank):
    lines = (out_dir / "trace" / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def _losses(out_dir):
    return [(r["step"], r["loss"], r["lm_loss"], r["ponder_loss"], r["grad_norm"]) for r in read_metrics(out_dir)]


@pytest.fixture(scope="module")
def zero_runs(data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero")
    runs = {}
    for stage in (1, 2, 3):
        extra = {"checkpoint": {"every": 4, "export_hf": stage == 3}}
        # stage 2: a non-finite loss on rank 1 only: both ranks must skip the step
        faults = {"nonfinite_steps": [5], "nonfinite_rank": 1} if stage == 2 else None
        if stage == 3:  # 3 validation micro-batches on 2 ranks: rank 1 runs a discarded one (ZeRO-3 gathers)
            extra["eval"] = {"max_batches": 3}
        cfg = _cfg(tmp, f"z{stage}", data, stage, **extra)
        code, out = deepspeed_launch(cfg, 2, PORTS[f"z{stage}"], faults=faults)
        assert code == 0, out[-5000:]
        runs[stage] = tmp / f"z{stage}"
    return tmp, runs


def test_cpu_launches_leave_no_shared_memory_behind(zero_runs):
    """DeepSpeed's CPU all-reduce names a 69 MB /dev/shm segment per rank and never unlinks it (see
    distributed._release_shm_name)."""
    left = [f for stage in (1, 2, 3) for f in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{PORTS[f'z{stage}']}_*")]
    assert left == []


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_train_on_two_ranks_with_disjoint_data(zero_runs, data, stage):
    _, runs = zero_runs
    out = runs[stage]
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == list(range(1, 9))
    finite = [r["lm_loss"] for r in recs if r["lm_loss"] == r["lm_loss"]]
    assert finite[-1] < finite[0]  # the loss falls
    r0, r1 = _trace(out, 0), _trace(out, 1)
    assert [t["step"] for t in r0] == [t["step"] for t in r1] == [s for s in range(1, 9) for _ in range(2)]
    rows0 = [h for t in r0 for h in t["rows"]]
    rows1 = [h for t in r1 for h in t["rows"]]
    assert len(rows0) == len(rows1) == 8 * 2 * 2
    assert not set(rows0) & set(rows1)  # the ranks read disjoint samples
    assert (out / "checkpoints" / "step00000008" / "trainer_state.json").is_file()
    files = {p.name for p in (out / "checkpoints" / "step00000008").iterdir()}
    assert {"rank00000.pt", "rank00001.pt"} <= files
    if stage == 2:
        events = read_metrics(out, "event")
        assert [e["step"] for e in events if e["event"] == "skipped_step"] == [5]
        assert recs[4]["skipped"] == 1
    if stage == 3:  # the HF export consolidates the ZeRO-3 shards: same validation loss as the 2-rank engine
        from transformers import AutoModelForCausalLM

        from adaponder.data.loader import iter_eval_batches
        from adaponder.train.report import evaluate_model

        model = AutoModelForCausalLM.from_pretrained(out / "hf", trust_remote_code=True)
        engine_eval = read_metrics(out, "eval")[-1]
        # eval.max_batches counts all ranks' micro-batches: 3 x 2 samples = the first 6 samples
        mine = evaluate_model(model, iter_eval_batches(data["data"], 32, 2, max_batches=3))
        assert mine["val_tokens"] == engine_eval["val_tokens"] == 6 * 32
        assert mine["val_loss"] == pytest.approx(engine_eval["val_loss"], abs=1e-5)


def test_resume_equals_continue_bit_for_bit_two_ranks(zero_runs, data):
    tmp, runs = zero_runs
    straight = _losses(runs[1])
    cfg = _cfg(tmp, "b", data, 1, checkpoint={"every": 4})
    code, out = deepspeed_launch(cfg, 2, PORTS["b"], "--set", "train.stop_at=3")
    assert code == 0, out[-5000:]
    code, out = deepspeed_launch(cfg, 2, PORTS["c"], "--resume", "auto")
    assert code == 0, out[-5000:]
    assert "resumed from" in out
    assert _losses(tmp / "b") == straight
    # both ranks resumed their own loader position: the samples after the restart are the same as before
    for rank in (0, 1):
        assert [t["rows"] for t in _trace(tmp / "b", rank)] == [t["rows"] for t in _trace(runs[1], rank)]
