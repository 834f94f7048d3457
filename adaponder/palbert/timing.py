"""Timing of online early exit for a fine-tuned PALBERT classifier (B9: passes after the exit are not computed):
each rule's time per example against always-last, within a time budget, with the spread over repeated rounds.

Every batch runs one untimed warm-up round, then timed rounds; within a round the rules are interleaved, so a
stall caused by other processes hits no rule more than another. Round r gives each rule the speed-up
Σ_b t_last(b, r) / Σ_b t_rule(b, r) over the timed batches b; the result is the median over rounds, with the
interquartile range and the extremes. The ideal speed-up is N / mean exit pass of the same examples. A median
above the ideal cannot come from early exit (a pass costs as much whatever exits): it is timing noise, and it is
flagged as such (``above_ideal``, ``note``), never reported as a plain result.

Budget: each batch size gets an equal share of ``budget_seconds`` (time an earlier one leaves unused passes on).
The first batch runs timed rounds until ``repeats`` or until its share is spent (at least one); the following
batches run as many, and a batch size stops at the first batch boundary past its share, having timed its first
``examples_timed`` examples. The whole budget is a hard limit: no model call starts that is expected to end past it
(expected from the calls timed so far: the same rule at the same batch size, else the dearest time per token seen,
times the call's tokens — a larger batch costs less per token, so this errs on the safe side; always-last, the
dearest rule, runs first in every round, so each batch size's first call bounds the others'); only the very first
call of the phase has nothing to go by. A round or batch cut short is dropped, and a batch size with no whole round
is listed in ``not_timed`` instead of given a figure (what was measured is reported, nothing is measured past the
budget). ``budget_seconds=None``: every example, ``repeats`` rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from adaponder.palbert.classifier import AdaPonderForSequenceClassification
from adaponder.palbert.rule_evaluation import _device_of, _generator, _sync, padded_batches

__all__ = ["ABOVE_IDEAL_NOTE", "timing_units", "time_rules", "speedup_summary"]

ABOVE_IDEAL_NOTE = "above ideal: timing noise"


def timing_units(n_examples: int, batch_sizes: Sequence[int], repeats: int) -> int:
    """How many ``progress`` ticks :func:`time_rules` makes at most: one per batch and round (warm-up included);
    fewer when the budget runs out."""
    return sum(-(-n_examples // bs) for bs in batch_sizes) * (repeats + 1)


def speedup_summary(ratios: Sequence[float], ideal: float) -> dict[str, Any]:
    """The speed-up of a rule from its per-round measurements: median, interquartile range, extremes, and the
    flag for a median above ``ideal``."""
    q1, median, q3 = (float(x) for x in np.percentile(np.asarray(ratios, dtype=float), [25, 50, 75]))
    above = median > ideal * (1 + 1e-9)  # (beyond the rounding of summed times)
    return {"measured_speedup": median, "speedup_iqr": [q1, q3], "speedup_range": [float(min(ratios)), float(max(ratios))],
            "rounds": len(ratios), "ideal_speedup": ideal, "ratio_to_ideal": median / ideal,
            "above_ideal": above, "note": ABOVE_IDEAL_NOTE if above else None}


class _BudgetSpent(Exception):
    """The whole time budget ran out in the middle of a round."""


class _CallTimes:
    """The model calls timed so far, from which the time of the next one is expected (see the module doc)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, float]] = []  # (rule, rows, seconds per token)

    def record(self, rule: str, rows: int, tokens: int, seconds: float) -> None:
        self.seen.append((rule, rows, seconds / max(tokens, 1)))

    def expected(self, rule: str, rows: int, tokens: int) -> float:
        for keep in (lambda r, n: r == rule and n == rows, lambda r, n: n == rows, lambda r, n: True):
            rates = [rate for r, n, rate in self.seen if keep(r, n)]
            if rates:
                return max(rates) * tokens
        return 0.0


def _time_batch(model, batch, rules: list[str], rounds: int, deadline: float | None, seed: int, *, q: float,
                patience: int, clock: Callable[[], float], progress, end: float | None = None,
                calls: _CallTimes | None = None) -> tuple[dict[str, list[float]], dict]:
    """A warm-up round (which records the exit passes), then up to ``rounds`` timed rounds; with a ``deadline``
    it stops after the first timed round that ends past it. A call expected to end past ``end`` (the whole budget;
    ``calls`` knows the calls so far) is not started: the whole timed rounds are kept; :class:`_BudgetSpent` when
    not one was complete."""
    device = _device_of(model)
    calls = _CallTimes() if calls is None else calls
    rows, tokens = int(batch["input_ids"].shape[0]), int(batch["input_ids"].numel())
    times: dict[str, list[float]] = {r: [] for r in rules}
    exits: dict[str, torch.Tensor] = {}
    order = sorted(rules, key=lambda r: r != "last")  # the dearest first: its time bounds the others'
    for rep in range(rounds + 1):
        if rep >= 1 and end is not None and clock() >= end:
            if not times[rules[0]]:
                raise _BudgetSpent
            break
        for rule in order:
            if end is not None and clock() + calls.expected(rule, rows, tokens) > end:
                # a round cut short: its times are not comparable
                for r in rules:
                    del times[r][max(rep - 1, 0):]
                if not times[rules[0]]:
                    raise _BudgetSpent
                return times, exits
            gen = _generator(device, seed)
            _sync(device)
            t0 = clock()
            res = model.predict(batch["input_ids"], batch["attention_mask"], rule, q=q, patience=patience,
                                generator=gen)
            _sync(device)
            dt = clock() - t0
            calls.record(rule, rows, tokens, dt)
            if rep == 0:
                exits[rule] = res.exit_pass.cpu()
            else:
                times[rule].append(dt)
        if progress is not None:
            progress(1)
        if rep >= 1 and deadline is not None and clock() >= deadline:
            break
    return times, exits


def _time_batch_size(model, batches: list[dict], rules: list[str], repeats: int, deadline: float | None,
                     **kw) -> tuple[dict[str, Any], int, int]:
    """(entry per rule, examples timed, timed rounds) of one batch size."""
    clock = kw["clock"]
    n = model.config.palbert_passes
    per_batch: list[dict[str, list[float]]] = []
    exits: dict[str, list[torch.Tensor]] = {r: [] for r in rules}
    end = kw.pop("end", None)
    rounds, timed = repeats, 0
    for bi, batch in enumerate(batches):
        # The first batch settles how many rounds fit; the others repeat as often, so every round covers the
        # same examples.
        try:
            times, ex = _time_batch(model, batch, rules, rounds, deadline if bi == 0 else None, bi, end=end, **kw)
        except _BudgetSpent:
            if bi == 0:
                raise
            break
        if bi > 0 and len(times[rules[0]]) < rounds:
            break  # cut short by the end of the budget: fewer rounds than the batches before it
        rounds = len(times[rules[0]])
        per_batch.append(times)
        for rule in rules:
            exits[rule].append(ex[rule])
        timed += int(batch["input_ids"].shape[0])
        if deadline is not None and clock() >= deadline:
            break
    totals = {r: [sum(t[r][k] for t in per_batch) for k in range(rounds)] for r in rules}
    entry: dict[str, Any] = {}
    for rule in rules:
        mean_exit = float(torch.cat(exits[rule]).float().mean())
        ratios = [last / max(own, 1e-12) for last, own in zip(totals["last"], totals[rule])]
        entry[rule] = {"sec_per_example": float(np.median(totals[rule])) / timed, "mean_exit_pass": mean_exit,
                       **speedup_summary(ratios, n / mean_exit)}
    return entry, timed, rounds


def time_rules(model: AdaPonderForSequenceClassification, ids: Sequence[Sequence[int]], pad_id: int, *,
               rules: Sequence[str], batch_sizes: Sequence[int], repeats: int, q: float, patience: int,
               threads: int = 0, budget_seconds: float | None = None, clock: Callable[[], float] = time.perf_counter,
               progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Measured time per example of online inference with each rule vs always-last (see the module doc).

    ``threads`` (0 = unchanged) sets torch's intra-op threads meanwhile; 1 is the most stable on a shared machine.
    ``clock``: seconds (the tests give a fake one). ``progress(1)`` after each batch and round (at most
    :func:`timing_units` in all); it may raise to stop the measurement. Returns ``batch_<b>``: per rule
    ``sec_per_example`` (median round), ``mean_exit_pass``, ``measured_speedup`` (median), ``speedup_iqr``,
    ``speedup_range``, ``rounds``, ``ideal_speedup``, ``ratio_to_ideal``, ``above_ideal``, ``note``; and
    ``examples_timed`` / ``rounds`` per batch size, ``not_timed`` (the batch sizes the budget left no whole round
    for), ``budget_seconds``, ``seconds`` spent.
    """
    rules = list(dict.fromkeys([*rules, "last"]))
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    model.eval()
    device = _device_of(model)
    start = clock()
    out: dict[str, Any] = {"examples": len(ids), "threads": torch.get_num_threads(), "repeats": repeats,
                           "device": str(device), "budget_seconds": budget_seconds, "examples_timed": {},
                           "rounds": {}, "not_timed": []}
    end = None if budget_seconds is None else start + budget_seconds
    calls = _CallTimes()
    try:
        for i, bs in enumerate(batch_sizes):
            deadline = None if budget_seconds is None else start + budget_seconds * (i + 1) / len(batch_sizes)
            if end is not None and clock() >= end:
                out["not_timed"].append(bs)
                continue
            batches = [{k: v.to(device) for k, v in b.items()}
                       for b in padded_batches(ids, [0] * len(ids), bs, pad_id)]
            try:
                entry, timed, rounds = _time_batch_size(model, batches, rules, repeats, deadline, q=q,
                                                        patience=patience, clock=clock, progress=progress, end=end,
                                                        calls=calls)
            except _BudgetSpent:
                out["not_timed"].append(bs)
                continue
            out[f"batch_{bs}"] = entry
            out["examples_timed"][f"batch_{bs}"] = timed
            out["rounds"][f"batch_{bs}"] = rounds
    finally:
        torch.set_num_threads(old_threads)
    out["seconds"] = clock() - start
    return out
