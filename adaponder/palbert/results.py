"""The fine-tuning run's results table (``results.md``) from its ``results.json`` content."""

from __future__ import annotations

import math
from typing import Any

from adaponder.palbert.rule_evaluation import RULE_NAMES

__all__ = ["PHASES", "results_markdown"]

#: The phases of a run, in order; ``results.json`` lists the finished ones under ``phases``.
PHASES = ("train", "dev", "online", "timing")


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def _speedup_cell(t: dict[str, Any]) -> str:
    """Median speed-up and its interquartile range; a median above the ideal says it is noise."""
    cell = _fmt(t["measured_speedup"], 2)
    if t.get("speedup_iqr"):
        cell += f" (IQR {_fmt(t['speedup_iqr'][0], 2)}–{_fmt(t['speedup_iqr'][1], 2)})"
    if t.get("above_ideal"):
        cell += f" **{t['note']}** (ideal {_fmt(t['ideal_speedup'], 2)})"
    return cell


def _timing_line(timing: dict[str, Any], batch_keys: list[str]) -> str:
    done = timing.get("examples_timed") or {}
    rounds = timing.get("rounds") or {}
    if not done and "not_timed" not in timing:  # (results written before the budget existed)
        return (f"timing: {timing['examples']} dev examples, {timing['threads']} thread(s), each batch the best of "
                f"{timing['repeats']} interleaved runs; speed-up measured against always-last")
    sizes = "; ".join(f"@{bk.split('_')[1]}: {done[bk]} of {timing['examples']} examples, {rounds[bk]} round(s)"
                      for bk in batch_keys)
    budget = timing.get("budget_seconds")
    spent = f"{timing['seconds']:.0f} s" + (f" of a {budget:g} s budget" if budget is not None else "")
    skipped = timing.get("not_timed") or []
    if skipped:
        sizes += ("; " if sizes else "") + (f"not timed: @{', @'.join(map(str, skipped))} (the budget was spent "
                                            "before a whole round)")
    return (f"timing ({spent}, {timing['threads']} thread(s)): {sizes}; speed-up against always-last, the "
            "median over rounds with its interquartile range (rules interleaved in every round)")


def results_markdown(results: dict[str, Any]) -> str:
    """The results table: metric per exit rule, mean exit pass, speed-up N / mean exit pass, and measured
    time per example (ms) at each timed batch size with the measured speed-up over always-last (median and
    interquartile range over rounds; flagged as timing noise when above the ideal). A run whose
    later phases did not finish says which ones are missing."""
    n = results["num_passes"]
    rules = results["dev"]["rules"]
    metric_names = list(next(iter(rules.values()))["metrics"])
    timing = results.get("timing") or {}
    batch_keys = [k for k in timing if k.startswith("batch_")]
    head = ["exit rule", *metric_names, "mean exit pass", f"speed-up (N={n} / mean)"]
    for bk in batch_keys:
        b = bk.split("_")[1]
        head += [f"ms/example @{b}", f"measured speed-up @{b}", f"ratio to ideal @{b}"]
    lines = [f"## {results['task']} — {results['method']} (N={n}, core {results['core_mode']}, "
             f"seed {results['seed']})",
             "",
             f"dev examples: {results['data']['dev_examples']}; train examples: {results['data']['train_examples']}; "
             f"best step {results['train']['best_step']} of {results['train']['steps']} "
             f"(selected on {results['main_metric']} with {RULE_NAMES[results['select_rule']]}); "
             f"q = {results['q']}, PABEE patience = {results['patience']}",
             "",
             "| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * len(head)) + "|"]
    for rule, st in rules.items():
        row = [RULE_NAMES[rule], *[_fmt(st["metrics"][k]) for k in metric_names], _fmt(st["mean_exit_pass"], 2),
               _fmt(st["speedup"], 2)]
        for bk in batch_keys:
            t = timing[bk].get(rule)
            row += ["—", "—", "—"] if t is None else [_fmt(1000 * t["sec_per_example"], 3), _speedup_cell(t),
                                                     _fmt(t["ratio_to_ideal"], 2)]
        lines.append("| " + " | ".join(row) + " |")
    per_pass = results["dev"].get("per_pass")
    if per_pass:
        lines += ["", f"{results['main_metric']} at each pass (no exit rule): "
                  + ", ".join(f"{i + 1}: {_fmt(v)}" for i, v in enumerate(per_pass))]
    if results["dev"].get("mean_p"):
        lines += ["mean exit distribution p (B4): " + ", ".join(f"{v:.3f}" for v in results["dev"]["mean_p"])]
    maj = results.get("majority_baseline")
    if maj:
        lines += ["", "majority class: " + ", ".join(f"{k} {_fmt(v)}" for k, v in maj.items())]
    on = results.get("online")
    if on and on["exit_agreement"] is not None:
        lines += [f"online {RULE_NAMES[on['rule']]} (examples leave the batch): {results['main_metric']} "
                  f"{_fmt(on['metrics'][results['main_metric']])}, exit agreement with offline "
                  f"{on['exit_agreement']:.4f}"]
    if timing:
        lines += [_timing_line(timing, batch_keys)]
    missing = [p for p in PHASES if p not in results.get("phases", PHASES)]
    if missing:
        lines += ["", f"**incomplete run**: phases not finished: {', '.join(missing)} (rerun with --resume auto)"]
    return "\n".join(lines) + "\n"
