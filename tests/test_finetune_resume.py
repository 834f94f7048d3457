"""PALBERT fine-tuning on the pretraining infrastructure: checkpoints, resume, signals, results per phase.

(a) one rank stopped mid-epoch (``train.stop_at``) and resumed equals the uninterrupted run, bit for bit;
(b) two ranks under the ``deepspeed`` launcher with ZeRO-3: evaluation on every rank, stop and resume;
(c) SIGTERM during training leaves a checkpoint that ``--resume auto`` continues;
(d) SIGTERM during the timing phase leaves ``results.json``/``results.md`` with the finished phases.

Every run uses the tiny smoke recipe (``SMOKE`` in tests/helpers_finetune.py) in other processes than
pytest's (see tests/helpers_finetune.py).
"""

import json
import signal
import time
from pathlib import Path

import pytest

from helpers_finetune import (FinetuneWorker, deepspeed_finetune, finetune_argv, free_port, read_jsonl,
                                       start_script)

pytestmark = pytest.mark.usefixtures("shared_data")


@pytest.fixture(scope="module")
def worker():
    w = FinetuneWorker()
    yield w
    w.close()


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _wait_for(proc, ready, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.2)
    tail = proc.stdout.read()[-3000:] if proc.poll() is not None else ""
    raise AssertionError(f"not ready in time (exit {proc.poll()}): {tail}")


def _phases(out: Path) -> list[str]:
    try:
        return _results(out)["phases"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return []


# -- (a) stop + resume == uninterrupted (one rank) -----------------------------------------------------------
@pytest.mark.integration
def test_stopped_and_resumed_equals_uninterrupted_one_rank(worker, tmp_path):
    # 96 examples, batch 32: 3 steps per epoch, 2 epochs; evaluations at steps 2, 4, 6. Stopping at step 4
    # (mid-epoch 2, before that step's evaluation) leaves the evaluation to the resumed run.
    recipe = ["train.max_examples=96", "train.epochs=2", "train.eval_every=2", "train.log_every=1",
              "timing.enabled=false", "checkpoint.keep=1", "train.early_stopping_patience=5"]
    a, b = tmp_path / "a", tmp_path / "b"
    code_a, out_a = worker.run(finetune_argv("sst2", a, *recipe))
    assert code_a == 0, out_a[-3000:]
    code_b, out_b = worker.run(finetune_argv("sst2", b, *recipe, "train.stop_at=4"))
    assert code_b == 0 and "stopped at step 4 (train.stop_at)" in out_b, out_b[-3000:]
    assert (b / "checkpoints" / "latest").read_text() == "step00000004"
    partial = _results(b)
    assert partial["phases"] == [] and [h["step"] for h in partial["train"]["history"]] == [2]
    code_b2, out_b2 = worker.run(finetune_argv("sst2", b, *recipe, "train.stop_at=4") + ["--resume", "auto"])
    assert code_b2 == 0, out_b2[-3000:]
    assert f"resumed from {b / 'checkpoints' / 'step00000004'} at step 4" in out_b2

    ra, rb = _results(a), _results(b)
    assert ra["complete"] and rb["complete"] and rb["phases"] == ["train", "dev", "online", "timing"]
    assert rb["train"]["history"] == ra["train"]["history"]  # train losses and dev metrics at 2, 4, 6
    assert [h["step"] for h in ra["train"]["history"]] == [2, 4, 6]
    for key in ("best_step", "best_dev_main", "steps", "stopped_early"):
        assert rb["train"][key] == ra["train"][key], key
    assert rb["dev"] == ra["dev"] and rb["online"] == ra["online"]
    train_a, train_b = read_jsonl(a / "metrics.jsonl", "train"), read_jsonl(b / "metrics.jsonl", "train")
    assert [r["step"] for r in train_b] == [1, 2, 3, 4, 5, 6] and train_b == train_a
    # keep=1: the newest checkpoint and the best one (its weights were evaluated)
    best = f"step{ra['train']['best_step']:08d}"
    assert {p.name for p in (b / "checkpoints").glob("step*")} == {"step00000006", best}
    assert (a / "results.md").read_text() == (b / "results.md").read_text()


# -- (b) two ranks, ZeRO-3 -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.deepspeed
def test_zero3_two_ranks_evaluates_on_every_rank_and_resumes(tmp_path):
    out = tmp_path / "z3"
    argv = finetune_argv("sst2", out, "deepspeed.zero_stage=3", "timing.batch_sizes=[4]", "train.log_every=1",
                         "logging.progress_bar=false")
    code, log = deepspeed_finetune(argv + ["--set", "train.stop_at=1"], 2, free_port())
    assert code == 0, log[-6000:]
    assert "stopped at step 1 (train.stop_at)" in log
    ck = out / "checkpoints" / "step00000001"
    assert (ck / "trainer_state.json").is_file() and len(list(ck.glob("rank*.pt"))) == 2

    code, log = deepspeed_finetune(argv + ["--resume", "auto"], 2, free_port())
    assert code == 0, log[-6000:]
    assert f"resumed from {ck} at step 1" in log
    res = _results(out)
    assert res["complete"] and res["train"]["world_size"] == 2 and res["train"]["steps"] == 2
    assert [h["step"] for h in res["train"]["history"]] == [1, 2]  # step 1's evaluation ran after the resume
    assert set(res["dev"]["rules"]) == {"q", "sample", "expectation", "last", "pabee"}
    assert sum(res["dev"]["rules"]["q"]["exit_histogram"]) == res["data"]["dev_examples"] == 48
    # the dev forward ran sharded on both ranks; the online check and timing on rank 0's gathered copy
    evals = read_jsonl(out / "metrics.jsonl", "eval")
    assert [e["examples_per_rank"] for e in evals] == [[24, 24], [24, 24]]
    assert res["online"]["exit_agreement"] >= 0.95 and res["timing"]["batch_4"]["q"]["sec_per_example"] > 0
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl", "train")] == [1, 2]


# -- (c) SIGTERM during training ---------------------------------------------------------------------------
@pytest.mark.integration
def test_sigterm_during_training_leaves_a_checkpoint_that_resume_continues(worker, tmp_path):
    out = tmp_path / "sig"
    # many steps, no evaluation before the signal: the only checkpoint is the one the signal writes
    long = ["train.epochs=100000", "train.eval_every=100000", "train.log_every=1", "timing.enabled=false"]
    proc = start_script(finetune_argv("sst2", out, *long))
    metrics = out / "metrics.jsonl"
    _wait_for(proc, lambda: metrics.is_file() and len(read_jsonl(metrics, "train")) >= 3)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert "received SIGTERM" in text
    ck = out / "checkpoints"
    tag = (ck / "latest").read_text().strip()
    step = int(tag.removeprefix("step"))
    assert step >= 3 and (ck / tag / "trainer_state.json").is_file()
    assert read_jsonl(metrics, "train")[-1]["step"] == step
    event = read_jsonl(metrics, "event")[-1]  # the same event, with the same fields, as a pretraining stop
    assert (event["event"], event["step"], event["signal"], event["launcher_gone"]) == \
        ("stopped_by_signal", step, "SIGTERM", False)
    assert event["message"] == f"received SIGTERM: saved {ck / tag} at step {step}; continue with --resume auto"
    assert not (out / "results.json").exists() or _results(out)["phases"] == []

    code, log = worker.run(finetune_argv("sst2", out, *long, f"train.max_steps={step + 2}") + ["--resume", "auto"])
    assert code == 0, log[-3000:]
    assert f"resumed from {ck / tag} at step {step}" in log
    assert [r["step"] for r in read_jsonl(metrics, "train")][-3:] == [step, step + 1, step + 2]
    res = _results(out)
    assert res["complete"] and res["train"]["steps"] == step + 2


# -- (d) an interrupted evaluation leaves the finished phases ------------------------------------------------
@pytest.mark.integration
def test_sigterm_during_timing_leaves_results_of_finished_phases(worker, tmp_path):
    out = tmp_path / "phases"
    slow_timing = ["timing.repeats=100000", "timing.batch_sizes=[1]"]
    proc = start_script(finetune_argv("sst2", out, *slow_timing))
    _wait_for(proc, lambda: "online" in _phases(out))
    time.sleep(1.0)  # inside the timing loop
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert "during the timing phase" in text
    event = read_jsonl(out / "metrics.jsonl", "event")[-1]
    assert (event["event"], event["phase"], event["signal"]) == ("stopped_by_signal", "timing", "SIGTERM")
    assert "during the timing phase" in event["message"]
    for bar in ("train", "dev eval @1", "dev (best weights)", "exit rules", "online Q-exit", "timing"):
        assert f"{bar}:" in text, bar  # a tqdm progress bar in every phase

    res = _results(out)
    assert res["phases"] == ["train", "dev", "online"] and not res["complete"] and "timing" not in res
    assert set(res["dev"]["rules"]) == {"q", "sample", "expectation", "last", "pabee"}
    assert res["online"]["exit_agreement"] == 1.0
    table = (out / "results.md").read_text()
    assert "Q-exit" in table and "phases not finished: timing" in table

    code, log = worker.run(finetune_argv("sst2", out) + ["--resume", "auto"])  # training done: evaluation only
    assert code == 0, log[-3000:]
    res2 = _results(out)
    assert res2["complete"] and res2["phases"] == ["train", "dev", "online", "timing"]
    assert res2["dev"] == res["dev"] and res2["train"]["history"] == res["train"]["history"]
    assert "incomplete" not in (out / "results.md").read_text()
