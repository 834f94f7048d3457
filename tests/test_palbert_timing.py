"""The timing phase of PALBERT fine-tuning (``adaponder/palbert/timing.py``): its time budget, the spread of the
speed-up over rounds, and the flag on a speed-up above the ideal. A fake model advances a fake clock by the
passes it computes, so every number is known in advance."""

from types import SimpleNamespace

import pytest
import torch

from adaponder.palbert.results import results_markdown
from adaponder.palbert.timing import ABOVE_IDEAL_NOTE, speedup_summary, time_rules, timing_units

PASSES = 4
PASS_COST = 0.01  # fake seconds per example and pass


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeClassifier(torch.nn.Module):
    """Q-exit leaves every example after pass 2 (ideal speed-up 4 / 2 = 2); always-last runs all 4 passes.
    ``last_slowdown(call)`` multiplies the time of the always-last call number ``call`` (noise)."""

    def __init__(self, clock: FakeClock, last_slowdown=lambda call: 1.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(palbert_passes=PASSES)
        self.clock, self.last_slowdown, self.last_calls = clock, last_slowdown, 0

    def predict(self, input_ids, attention_mask, rule, *, q, patience, generator):
        rows = input_ids.shape[0]
        passes = PASSES if rule == "last" else 2
        cost = rows * passes * PASS_COST
        if rule == "last":
            cost *= self.last_slowdown(self.last_calls)
            self.last_calls += 1
        self.clock.now += cost
        return SimpleNamespace(exit_pass=torch.full((rows,), passes), outputs=torch.zeros(rows, 2))


IDS = [[5, 6, 7]] * 64


def _time(model, clock, **kw):
    args = dict(rules=["q", "last"], batch_sizes=[1, 8], repeats=5, q=0.5, patience=2, clock=clock)
    return time_rules(model, IDS, 0, **{**args, **kw})


def test_without_budget_every_example_and_round_is_timed_and_the_speedup_is_exact():
    clock = FakeClock()
    ticks = []
    out = _time(FakeClassifier(clock), clock, progress=ticks.append)
    assert out["examples_timed"] == {"batch_1": 64, "batch_8": 64} and out["rounds"] == {"batch_1": 5, "batch_8": 5}
    assert len(ticks) == timing_units(64, [1, 8], 5)
    for bk in ("batch_1", "batch_8"):
        q = out[bk]["q"]
        assert q["measured_speedup"] == pytest.approx(2.0) and q["ideal_speedup"] == 2.0
        assert q["speedup_iqr"] == pytest.approx([2.0, 2.0]) and q["rounds"] == 5
        assert q["sec_per_example"] == pytest.approx(2 * PASS_COST, rel=1e-9) and not q["above_ideal"] and q["note"] is None
    # one round of both batch sizes: 64 examples x (2 + 4) passes x 2 sizes, warm-up included = 6 rounds
    assert out["seconds"] == pytest.approx(6 * 64 * 6 * PASS_COST * 2)


def test_the_budget_is_respected():
    clock = FakeClock()
    budget = 10.0  # the full measurement takes 46 fake seconds
    out = _time(FakeClassifier(clock), clock, budget_seconds=budget)
    one_batch_at_8 = 6 * 8 * 6 * PASS_COST  # warm-up + 5 rounds of one batch of 8, both rules
    assert out["seconds"] <= budget + one_batch_at_8
    assert out["budget_seconds"] == budget
    assert 0 < out["examples_timed"]["batch_1"] < 64 and 0 < out["examples_timed"]["batch_8"] < 64
    assert out["batch_8"]["q"]["measured_speedup"] == pytest.approx(2.0)

    # the whole budget is a hard limit: past it, timing stops after the call under way
    assert out["seconds"] <= budget + 8 * PASSES * PASS_COST and out["not_timed"] == []

    # a budget shorter than one round: nothing is timed past it, and the result says what was not timed
    clock = FakeClock()
    tiny = _time(FakeClassifier(clock), clock, budget_seconds=0.05)
    assert tiny["examples_timed"] == {} and tiny["not_timed"] == [1, 8] and "batch_1" not in tiny
    assert tiny["seconds"] <= 0.05 + PASSES * PASS_COST  # (one call of one example past the budget at most)

    # a budget that covers batch size 1 only: its figures, and batch size 8 listed as not timed
    clock = FakeClock()
    part = _time(FakeClassifier(clock), clock, budget_seconds=0.5)
    assert part["examples_timed"]["batch_1"] > 0 and part["not_timed"] == [8]
    assert part["batch_1"]["q"]["measured_speedup"] == pytest.approx(2.0)
    assert part["seconds"] <= 0.5 + 8 * PASSES * PASS_COST
    results = {"task": "rte", "method": "palbert", "num_passes": PASSES, "core_mode": "ponderlm", "seed": 0,
               "data": {"dev_examples": 64, "train_examples": 8}, "train": {"best_step": 1, "steps": 1},
               "main_metric": "accuracy", "select_rule": "q", "q": 0.5, "patience": 2, "phases": [],
               "dev": {"rules": {r: {"metrics": {"accuracy": 0.5}, "mean_exit_pass": 2.0, "speedup": 2.0}
                                 for r in ("q", "last")}},
               "timing": {**part, "threads": 1}}
    line = next(ln for ln in results_markdown(results).splitlines() if ln.startswith("timing ("))
    assert "of a 0.5 s budget" in line and "not timed: @8 (the budget was spent before a whole round)" in line


def test_the_spread_over_rounds_is_reported():
    clock = FakeClock()
    # the always-last run of round k (one batch of 64, warm-up = call 0) is slowed by 0%, 10%, 20%, 30%, 40%
    model = FakeClassifier(clock, last_slowdown=lambda call: 1.0 + 0.1 * (call - 1) if call else 1.0)
    out = _time(model, clock, batch_sizes=[64])
    q = out["batch_64"]["q"]
    assert q["rounds"] == 5
    assert q["speedup_range"] == pytest.approx([2.0, 2.8])
    assert q["speedup_iqr"] == pytest.approx([2.2, 2.6]) and q["measured_speedup"] == pytest.approx(2.4)


def test_a_speedup_above_the_ideal_is_flagged_as_noise():
    clock = FakeClock()
    model = FakeClassifier(clock, last_slowdown=lambda call: 1.5 if call else 1.0)  # always-last slowed: noise
    out = _time(model, clock, batch_sizes=[64])
    q = out["batch_64"]["q"]
    assert q["measured_speedup"] == pytest.approx(3.0) and q["ideal_speedup"] == 2.0
    assert q["above_ideal"] and q["note"] == ABOVE_IDEAL_NOTE
    assert out["batch_64"]["last"]["measured_speedup"] == 1.0 and not out["batch_64"]["last"]["above_ideal"]

    results = {"num_passes": PASSES, "task": "sst2", "method": "palbert", "core_mode": "loop", "seed": 0,
               "data": {"dev_examples": 64, "train_examples": 64}, "train": {"best_step": 1, "steps": 1},
               "main_metric": "accuracy", "select_rule": "q", "q": 0.5, "patience": 2, "phases": [],
               "dev": {"rules": {r: {"metrics": {"accuracy": 0.5}, "mean_exit_pass": 2.0, "speedup": 2.0}
                                 for r in ("q", "last")}},
               "timing": {**out, "threads": 1}}
    table = results_markdown(results)
    row = next(line for line in table.splitlines() if line.startswith("| Q-exit"))
    assert "3.00 (IQR 3.00–3.00) **above ideal: timing noise** (ideal 2.00)" in row
    assert "timing (" in table and "median over rounds" in table


def test_speedup_summary():
    s = speedup_summary([1.0, 2.0, 3.0, 4.0, 10.0], ideal=2.5)
    assert s["measured_speedup"] == 3.0 and s["speedup_iqr"] == [2.0, 4.0] and s["speedup_range"] == [1.0, 10.0]
    assert s["above_ideal"] and s["ratio_to_ideal"] == pytest.approx(1.2)
    assert not speedup_summary([1.9, 2.0, 2.1], ideal=2.0)["above_ideal"]  # the median at the ideal is no noise


def test_no_call_starts_that_would_end_past_the_budget():
    """Calls far longer than the budget's remainder (the fine-tuning run that timed 1 of 256 examples and spent 30 s
    of a 20 s budget: batch 32's first call began just before the end): a call expected to end past the budget is
    not started, from the time per token of the calls before it; what was measured is reported."""
    clock = FakeClock()
    slow = 50 * PASS_COST  # one example: 1 s (Q-exit) or 2 s (always-last) a call; a batch of 32: 64 s always-last
    model = FakeClassifier(clock)
    model.predict = lambda input_ids, attention_mask, rule, **kw: (
        setattr(clock, "now", clock.now + input_ids.shape[0] * (PASSES if rule == "last" else 2) * slow)
        or SimpleNamespace(exit_pass=torch.full((input_ids.shape[0],), PASSES if rule == "last" else 2),
                           outputs=torch.zeros(input_ids.shape[0], 2)))
    out = time_rules(model, [[5, 6, 7]] * 256, 0, rules=["q", "last"], batch_sizes=[1, 32], repeats=5, q=0.5,
                     patience=2, clock=clock, budget_seconds=20.0)
    assert out["seconds"] <= 20.0
    assert out["examples_timed"]["batch_1"] >= 1 and out["batch_1"]["q"]["measured_speedup"] == pytest.approx(2.0)
    assert out["not_timed"] == [32] and "batch_32" not in out
    # within a round too: a budget that leaves room for always-last's call but not for Q-exit's after it
    clock = FakeClock()
    model = FakeClassifier(clock)
    out = time_rules(model, IDS, 0, rules=["q", "last"], batch_sizes=[1], repeats=5, q=0.5, patience=2, clock=clock,
                     budget_seconds=0.05)
    assert out["seconds"] <= 0.05 and out["not_timed"] == [1]
