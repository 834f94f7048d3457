"""The reasoning study's decision section: every figure with a two-level bootstrap interval (runs, then query
symbols within a run; :mod:`.intervals`), goals judged by intervals of differences, the full cost (gates and
every head counted, all tokens and answers), tables without the task's artefacts (perplexity without the
query-symbol positions, the chance floor of each level printed beside it), and learning separated from halting
(halting switched off, and gates trained alone on a frozen ``ponderlm``).

A goal *holds* when the whole interval is on its side of the margin, is *not met* when the whole interval is on
the other side, and is *undecided* otherwise: with the runs stored so far, the data cannot tell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import mean

import numpy as np

from adaponder.data.reasoning import MultiHopSpec, permutation, symbol_sets

from . import intervals as iv

SEPARATION = 0.20     # ponderlm must beat vanilla by this much at two hops
TOLERANCE = 0.03      # an adaptive arm within this of ponderlm at every level ...
BUDGET = 0.70         # ... at no more than this share of ponderlm's FLOPs per answer token
RHO_GOAL = 0.5


def _runs(results: Sequence[Mapping], arm: str, key: str = "difficulty") -> list[Mapping]:
    return [r[key]["per_symbol"] for r in results if r["arm"] == arm and (r.get(key) or {}).get("per_symbol")]


def _arms(results: Sequence[Mapping]) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in results if (r.get("difficulty") or {}).get("per_symbol")))


def _levels(results: Sequence[Mapping]) -> list[int]:
    r = next(r for r in results if (r.get("difficulty") or {}).get("per_symbol"))
    return [lv["difficulty"] for lv in r["difficulty"]["levels"]]


def chance_floor(task_options: Mapping, h: int) -> float:
    """Share of the test symbols ``x`` with ``f^h(x) = f(x)``: what a model that answers one hop scores at ``h``
    (held-out symbols on a short cycle of ``f``)."""
    spec = MultiHopSpec(**task_options)
    f, xs = permutation(spec), symbol_sets(spec)["test"]
    y = xs.copy()
    for _ in range(h):
        y = f[y]
    return float(np.mean(y == f[xs])) if len(xs) else float("nan")


def _flops(r: Mapping, cls: str = "answer") -> float:
    c = r["difficulty"]["classes"].get(cls) or {}
    return float((c.get("flops") or {}).get("total", float("nan")))


def _all_flops(r: Mapping) -> float:
    return float((r["difficulty"].get("flops") or {}).get("total", float("nan")))


def _verdict(d: iv.Interval, margin: float) -> str:
    if not math.isfinite(d.mean):
        return "no data"
    return "holds" if d.above(margin) else "not met" if d.below(margin) else "undecided"


def goals(results: Sequence[Mapping]) -> list[dict[str, str]]:
    arms, hs = _arms(results), _levels(results)
    rows = []
    if "ponderlm" in arms and "vanilla" in arms:
        for ref in ("vanilla", "vanilla-deep"):
            if ref not in arms:
                continue
            d = iv.difference(_runs(results, "ponderlm"), _runs(results, ref), iv.accuracy(2))
            margin = SEPARATION if ref == "vanilla" else 0.0
            rows.append({"goal": f"the passes pay: ponderlm − {ref} at H = 2 above {margin:.2f}",
                         "numbers": f"difference {d} ({d.runs} run(s) the fewer side)", "verdict": _verdict(d, margin)})
    if "ponderlm" in arms:
        pl = _runs(results, "ponderlm")
        pl_flops = mean(_flops(r) for r in results if r["arm"] == "ponderlm")
        for arm in arms:
            if not any(r["arm"] == arm and r.get("mode") == "adaponder" for r in results):
                continue
            diffs = {h: iv.difference(_runs(results, arm), pl, iv.accuracy(h)) for h in hs}
            verdicts = [_verdict(d, -TOLERANCE) for d in diffs.values()]
            acc = "not met" if "not met" in verdicts else "undecided" if "undecided" in verdicts else "holds"
            ratio = iv.run_values([r for r in results if r["arm"] == arm], lambda r: _flops(r) / pl_flops)
            cost = "holds" if ratio.below(BUDGET) else "not met" if ratio.above(BUDGET) else "undecided"
            verdict = "not met" if "not met" in (acc, cost) else "holds" if (acc, cost) == ("holds", "holds") else "undecided"
            rows.append({"goal": f"{arm} within {TOLERANCE * 100:.0f} points of ponderlm at every H, at ≤ "
                                 f"{BUDGET:.0%} of its FLOPs per answer token (gates and heads counted)",
                         "numbers": "; ".join(f"H={h}: {d}" for h, d in diffs.items())
                                    + f"; FLOPs per answer × ponderlm {ratio}",
                         "verdict": verdict})
            rho = iv.bootstrap(_runs(results, arm), iv.spearman)
            rows.append({"goal": f"{arm}: Spearman(difficulty, exit pass) ≥ {RHO_GOAL} on answers",
                         "numbers": f"ρ {rho}", "verdict": _verdict(rho, RHO_GOAL)})
    return rows


def _share(r: Mapping, cls: str) -> float:
    return float((r["difficulty"]["classes"].get(cls) or {}).get("pass_share", float("nan")))


def section(results: Sequence[Mapping], task_options: Mapping | None, data_seeds: Sequence[int] | None,
            verdicts: bool = True, settings_note: str | None = None) -> list[str]:
    """The decision section's Markdown lines (empty when no result carries per-symbol outcomes)."""
    if not _arms(results):
        return []
    arms, hs = _arms(results), _levels(results)
    head = " | ".join(f"H={h}" for h in hs)
    L = ["## Decided figures: intervals over runs and symbols\n",
         "Every figure is the mean over runs (training seeds × data draws) with its 95 % interval from a two-level "
         "bootstrap: runs with replacement, then each run's query symbols with replacement (every answer about one "
         f"symbol stands or falls together). {iv.RESAMPLES} resamples. The test split is read here once; the "
         "development split (its own symbols) is where a setting may be chosen.\n"]
    if settings_note:
        L.append(f"Settings and the splits they were chosen on: {settings_note.strip()}\n")
    floors = {}
    if task_options:
        seeds = list(data_seeds or [task_options.get("seed", 0)])
        floors = {h: mean(chance_floor({**task_options, "seed": s}, h) for s in seeds) for h in hs if h >= 2}
        L.append("Chance floor of a level (a model answering f(X) is right where f^H(X) = f(X), test symbols on a "
                 "short cycle of f; mean over data draws): "
                 + ", ".join(f"H={h}: {v:.3f}" for h, v in floors.items()) + ".\n")
    for split, key in (("test", "difficulty"), ("development", "difficulty_dev")):
        rows = [(a, _runs(results, a, key)) for a in arms]
        rows = [(a, runs) for a, runs in rows if runs]
        if not rows:
            continue
        L += [f"### Accuracy by difficulty, {split} split\n", f"| arm | runs | {head} |", "|---|---:|" + "---:|" * len(hs)]
        for a, runs in rows:
            L.append(f"| {a} | {len(runs)} | " + " | ".join(
                str(iv.bootstrap(runs, iv.accuracy(h))) + (f" (floor {floors[h]:.3f})" if h in floors and h == max(hs) else "")
                for h in hs) + " |")
        L.append("")
    gated = [a for a in arms if any(r["arm"] == a and r.get("mode") == "adaponder" for r in results)]
    if gated:
        L += ["### Learning and halting apart (test split)\n",
              "The same trained gated model with halting switched off (every token runs K passes) measures what the "
              "backbone learned; the gap to learned halting is what stopping cost. `adaponder-gates-alone` trains the "
              "gates alone on the frozen `ponderlm` of the same seeds: its gap to `ponderlm` is halting's cost on a "
              "backbone trained without gates.\n",
              f"| arm | policy | {head} | mean exit (answers) | ρ(H, exit) |", "|---|---|" + "---:|" * (len(hs) + 2)]
        for a in gated:
            runs = _runs(results, a)
            exits = iv.run_values([r for r in results if r["arm"] == a],
                                  lambda r: r["difficulty"]["classes"]["answer"]["mean_exit"])
            L.append(f"| {a} | learned | " + " | ".join(str(iv.bootstrap(runs, iv.accuracy(h))) for h in hs)
                     + f" | {exits} | {iv.bootstrap(runs, iv.spearman)} |")
            off = _runs(results, a, "difficulty_no_halting")
            if off:
                L.append(f"| {a} | halting off | " + " | ".join(str(iv.bootstrap(off, iv.accuracy(h))) for h in hs)
                         + " | 4.00 | – |")
        L.append("")
        L += ["Exit pass of the answers by difficulty:\n", f"| arm | {head} |", "|---|" + "---:|" * len(hs)]
        for a in gated:
            L.append(f"| {a} | " + " | ".join(str(iv.bootstrap(_runs(results, a), iv.mean_exit(h))) for h in hs) + " |")
        L.append("")
    L += ["### The full cost\n",
          "FLOPs per token by A17 with everything counted (backbone, every head product, pondering, gates), over all "
          "scored tokens and over answers; the share of all token-passes each kind of token takes (query symbols "
          "are random: no pass can predict them). Mean over runs [95 % interval over runs].\n",
          "| arm | parameters (gates) | MFLOPs/token, all | MFLOPs/answer | × ponderlm, answers | passes on query "
          "symbols | hop markers | filler | answers | ppl | ppl without query symbols |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pl = [r for r in results if r["arm"] == "ponderlm" and r.get("difficulty")]
    pl_flops = mean(_flops(r) for r in pl) if pl else float("nan")
    for a in arms:
        rs = [r for r in results if r["arm"] == a and r.get("difficulty")]
        p = rs[0]["parameters"]
        L.append(f"| {a} | {p['total'] / 1e6:.3f}M ({p.get('gates', 0) / 1e6:.3f}M) | "
                 f"{iv.run_values(rs, lambda r: _all_flops(r) / 1e6)} | {iv.run_values(rs, lambda r: _flops(r) / 1e6)} | "
                 f"{iv.run_values(rs, lambda r: _flops(r) / pl_flops)} | "
                 + " | ".join(f"{mean(_share(r, c) for r in rs):.1%}" for c in ("query_symbol", "hop_marker", "filler", "answer"))
                 + f" | {iv.run_values(rs, lambda r: r['difficulty']['ppl'])} | "
                 f"{iv.run_values(rs, lambda r: r['difficulty'].get('ppl_without_query_symbols', float('nan')))} |")
    L.append("")
    if gated:
        L += ["### The τ dial on accuracy (mean over runs; development split, then test)\n",
              f"| arm | split | τ | mean exit | {head} |", "|---|---|---:|---:|" + "---:|" * len(hs)]
        for a in gated:
            for split, key in (("dev", "difficulty_tau_dev"), ("test", "difficulty_tau")):
                rs = [r[key] for r in results if r["arm"] == a and r.get(key)]
                for i, row in enumerate(rs[0] if rs else []):
                    per = [x[i] for x in rs]
                    L.append(f"| {a} | {split} | {row['tau']:g} | {mean(x['mean_exit'] for x in per):.2f} | "
                             + " | ".join(f"{mean(x['levels'][j]['accuracy'] for x in per):.3f}" for j in range(len(hs)))
                             + " |")
        L.append("")
    if verdicts:
        L += ["### Goals, judged on intervals\n", "| goal | numbers (95 % intervals) | verdict |", "|---|---|---|"]
        L += [f"| {g['goal']} | {g['numbers']} | **{g['verdict']}** |" for g in goals(results)]
        L.append("")
    return L


__all__ = ["chance_floor", "goals", "section"]
