"""Metrics: statistics vector, JSONL after a resume, report files, checkpoint helpers, wandb offline."""

import json
import math

import pytest
import torch

from adaponder.train import metrics as M
from adaponder.train.checkpoint import CheckpointError, find_resume, rng_state, set_rng_state, validate
from adaponder.train.config import LoggingConfig
from adaponder.train.report import text_histogram, write_report


def test_stats_vector_means_histogram_and_active_fraction():
    vec = M.stats_vector(4, "cpu")
    d1 = torch.tensor([[1, 4, 4, 2]])
    d2 = torch.tensor([[3, 4, 1, 1]])
    assert M.add_micro_batch(vec, torch.tensor(2.0), torch.tensor(1.5), torch.tensor(1.0), d1, 4)
    assert M.add_micro_batch(vec, torch.tensor(4.0), torch.tensor(3.5), torch.tensor(3.0), d2, 4)
    assert not M.add_micro_batch(vec, torch.tensor(float("nan")), torch.tensor(1.0), None, d2, 4)
    s = M.summarize(vec, 4)
    assert s["loss"] == 3.0 and s["lm_loss"] == 2.5 and s["ponder_loss"] == 2.0
    assert s["exit_hist"] == [3, 1, 1, 3] and s["mean_exit_pass"] == 20 / 8
    assert s["active_fraction"] == [1.0, 5 / 8, 4 / 8, 3 / 8]
    assert vec[M.NONFINITE] == 1


def test_throughput_and_mfu():
    t = M.Throughput(train_flops_per_token=1e9, peak_flops_per_device=1e12, world_size=2)
    t.add(2.0, 1000)
    s = t.summary()
    assert s["tokens_per_s"] == 500 and s["flops_per_s"] == 5e11 and s["mfu_pct"] == 25.0  # a percentage
    assert "MFU 25.0 %" in M.train_line(1, 2, {"loss": 1.0, **s})


def test_mfu_above_100_percent_is_not_reported_and_unknown_peak_gives_none():
    notes = []
    t = M.Throughput(train_flops_per_token=1e9, peak_flops_per_device=1e11, world_size=1, warn=notes.append)
    t.add(1.0, 1000)  # 1e12 FLOP/s against a 1e11 peak
    assert "mfu_pct" not in t.summary() and "mfu_pct" not in t.summary()
    assert len(notes) == 1 and "exceeds the peak" in notes[0]
    t = M.Throughput(train_flops_per_token=1e9, peak_flops_per_device=None, world_size=1)
    t.add(1.0, 10)
    assert set(t.summary()) == {"tokens_per_s", "flops_per_s"}


def test_peak_table_and_cpu_measurement():
    from adaponder.train.peak import cuda_peak, measure_cpu_peak, resolve_peak

    assert cuda_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12 and cuda_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert cuda_peak("NVIDIA A100-SXM4-80GB", "fp32") == 19.5e12 and cuda_peak("NVIDIA L40S", "fp16") == 362e12
    assert cuda_peak("NVIDIA L4", "bf16") == 121e12 and cuda_peak("NVIDIA H200", "bf16") == 989e12
    assert cuda_peak("Some Future GPU", "bf16") is None
    peak = measure_cpu_peak(seconds=0.1, n=256)
    assert 1e8 < peak < 1e14
    assert resolve_peak(5e11, torch.device("cpu"), "fp32") == (5e11, "logging.peak_flops")
    measured, how = resolve_peak(None, torch.device("cpu"), "fp32")
    assert measured > 1e8 and how.startswith("measured on this CPU")


def test_metrics_jsonl_drops_records_after_the_resumed_step(tmp_path):
    cfg = LoggingConfig(console=False)
    sink = M.MetricsSink(tmp_path, cfg, 0, None, {})
    for step in range(1, 7):
        sink.log({"kind": "train", "step": step, "loss": float(step)})
    sink.close()
    (tmp_path / "metrics.jsonl").open("a").write('{"kind": "train", "step": 7, "lo')  # cut short by a crash
    sink = M.MetricsSink(tmp_path, cfg, 0, 4, {})
    sink.log({"kind": "train", "step": 5, "loss": 50.0})
    sink.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def test_report_files(tmp_path):
    summary = {"val_loss": 2.0, "val_ppl": math.exp(2.0), "val_tokens": 100, "mean_exit_pass": 2.5,
               "exit_hist": [10, 20, 30, 40], "flops_saved": 0.25}
    text = write_report(tmp_path, summary, details={"steps": 10})
    assert "mean exit pass | 2.500 of K = 4" in text and "25.0%" in text
    assert (tmp_path / "report.md").read_text() == text
    assert (tmp_path / "exit_pass_hist.png").stat().st_size > 1000
    assert "40.0%" in text_histogram(summary["exit_hist"])


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(2))
    set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_resume_target_errors(tmp_path):
    assert find_resume("auto", tmp_path / "none")[0] is None  # nothing to resume: a fresh start
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        find_resume(str(tmp_path / "missing"), tmp_path)[0]
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("step00000009")
    with pytest.raises(CheckpointError, match="does not exist"):
        find_resume("auto", tmp_path / "ck")[0]
    (tmp_path / "ck" / "step00000009").mkdir()
    tag = find_resume("auto", tmp_path / "ck")[0]
    with pytest.raises(CheckpointError, match="trainer_state.json is missing"):
        validate(tag, {})
    (tag / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        validate(tag, {})


@pytest.mark.integration
def test_wandb_runs_offline_without_a_key(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    sink = M.MetricsSink(tmp_path / "run", LoggingConfig(wandb=True, console=False), 0, None, {"x": 1})
    assert sink.wandb is not None and sink.wandb.settings.mode == "offline"
    sink.log({"kind": "train", "step": 1, "loss": 1.0, "active_fraction": [1.0, 0.5]})
    sink.close()
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
