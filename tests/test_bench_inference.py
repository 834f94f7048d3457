"""The inference benchmark's verdict lines (eval/bench_inference.py ``target_summary``) on rows of known ratios."""

import importlib.util

import pytest

from conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_inference", REPO / "eval" / "bench_inference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _row(batch, skip, pre, dec, schedule="depth-batched", depth_bytes=0.0, lock_bytes=0.0, cached=None):
    """A row whose prefill and decode FLOP savings are 0.5 and wall savings ``pre`` / ``dec`` × 0.5."""
    row = {"dtype": "fp32", "batch": batch, "target_saving": skip, "decode_schedule": schedule,
           "prefill_flop_saving": 0.5, "prefill_wall_saving": 0.5 * pre,
           "decode_flop_saving": 0.5, "decode_wall_saving": 0.5 * dec,
           "depth_bytes_saving": depth_bytes, "decode_bytes_saving": lock_bytes}
    if cached is not None:
        row["cached_vs_recompute"] = cached
    return row


def test_rows_are_judged_against_the_targets_with_the_bytes_bound_of_a_short_decode():
    lines = _bench().target_summary([
        _row(1, 0.0, 0, 0, cached=34.0),
        _row(8, 0.0, 0, 0),  # no reference measured at this batch: no line
        _row(1, 0.5, 0.9, 0.85),
        _row(8, 0.25, 1.4, 0.42, depth_bytes=0.345),  # bound 0.69
        _row(8, 0.5, 0.94, 0.66, schedule="lockstep", depth_bytes=0.1, lock_bytes=0.45),  # bound 0.90 (lockstep's)
        _row(1, 0.0, 0, 0, cached=12.0),
    ])
    assert lines == [
        "fp32 batch  1   0%: cached decode 34× the no-cache reference (meets 20×)",
        "fp32 batch  1  50%: prefill 0.90 meets; decode 0.85 meets",
        "fp32 batch  8  25%: prefill 1.40 meets; decode 0.42 SHORT (bytes bound 0.69, out of reach where "
        "bandwidth-bound)",
        "fp32 batch  8  50%: prefill 0.94 meets; decode 0.66 SHORT (bytes bound 0.90)",
        "fp32 batch  1   0%: cached decode 12× the no-cache reference (SHORT of 20×)",
    ]


@pytest.mark.slow
def test_the_speculative_benchmark_runs_and_checks_its_tokens(tmp_path, capsys):
    """``--speculative`` (and ``--pipelined``) on a random tiny model: every row decodes the ordinary run's tokens and
    reports its acceptance, tokens per cycle (per tick) and the bandwidth model's ratio."""
    import json

    out = tmp_path / "rows.json"
    rows = _bench().main(["--speculative", "--shapes", "tiny:adaponder", "--batches", "1,2", "--dtypes", "fp32",
                          "--new-tokens", "6", "--context", "8", "--gammas", "1,3", "--repeats", "1",
                          "--pipelined", "--prompts", "2", "--json", str(out)])
    assert len(rows) == 12 and all(r["same_tokens"] for r in rows)  # 2 batch sizes × 3 rows × 2 prompts
    assert {r["prompt"] for r in rows} == {0, 1}
    assert json.loads(out.read_text())[0]["model"] == "Pythia-tiny adaponder (random)"
    by_gamma = {r["gamma"]: r for r in rows if r["batch"] == 1 and r["prompt"] == 0}
    assert 0 <= by_gamma[3]["acceptance"] <= 1 and by_gamma[3]["tokens_per_cycle"] >= 1
    pipe = by_gamma["P"]  # at most a token per tick; at least one per K ticks once the pipeline is full
    K = pipe["K"]
    assert pipe["ticks"] >= 6 - 1 and 1 / K <= pipe["tokens_per_cycle"] <= 1
    assert by_gamma[1]["tokens_per_cycle"] == 1  # γ = 1: one token per cycle whatever is accepted
    assert all(r["bandwidth_speedup"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "bytes×" in printed and "over 2 prompts: median ×" in printed
