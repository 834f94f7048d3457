"""``adaponder-report``: one command, one Markdown report for a checkpoint.

Writes into ``--out``:

* ``report.md`` — pinned recurrence settings; perplexity and bits per byte; mean exit pass and FLOPs per token
  (× one pass); halting analysis (exit-pass histogram, mean NLL by exit pass); the iso-FLOPs control (learned
  gates vs uniform vs geometric fixed pruning at the learned mean exit pass, plus all-K and first-pass-only
  references); the τ dial; the lm-eval zero-/few-shot table with the mean exit pass of every run;
* ``exit_histogram.png``, ``nll_by_exit_pass.png``, ``ppl_vs_flops.png``;
* ``tokens.tsv`` (per-token dump: token, exit pass, NLL), ``results.json`` (every number), ``settings.json``.

Command line: ``adaponder-report`` (:mod:`adaponder.cli.report`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import adaponder
from adaponder.modeling.exit_rules import FirstPassOnly, NoHalting
from adaponder.modeling.run_settings import RunSettings
from adaponder.resources import task_dir

from .accounting import ONE_PASS_BASELINE
from .dial import dial_table
from .perplexity import score_documents, summarize
from .pruning import FIXED_RULES, FixedPruningPolicy, histogram_mean
from .tables import markdown_table

SUITE = ("adaponder_lambada_openai", "adaponder_piqa", "adaponder_arc_easy", "adaponder_arc_challenge",
         "adaponder_sciq", "adaponder_winogrande")
HELLASWAG = "adaponder_hellaswag"
METRICS = ("acc", "acc_norm", "perplexity")
DEFAULT_MAX_TOKENS = 8192  # per --data entry; --max-tokens 0 scores everything


def _repo_root() -> Path:
    return Path(adaponder.__file__).resolve().parents[1]


HELDOUT_ENV = "ADAPONDER_HELDOUT_DATA"


def default_data() -> list[str]:
    """``$ADAPONDER_HELDOUT_DATA`` (paths separated by ``os.pathsep``); nothing outside the checkout otherwise."""
    value = os.environ.get(HELDOUT_ENV, "")
    return [p for p in value.split(os.pathsep) if p]


def _eval_data_dir() -> Path | None:
    value = os.environ.get("ADAPONDER_EVAL_DATA")
    return Path(value) if value else None


def expand_tasks(spec: str | None) -> list[str]:
    """Task names from ``--tasks`` (comma-separated; groups ``adaponder_suite``/``adaponder_suite_full``)."""
    if spec is None or spec == "adaponder_suite":
        names = list(SUITE)
        eval_dir = _eval_data_dir()
        if eval_dir is not None and (eval_dir / "hellaswag" / "hellaswag_val.jsonl").is_file():
            names.append(HELLASWAG)
        return names
    out = []
    for t in (s.strip() for s in spec.split(",")):
        if t == "adaponder_suite":
            out += SUITE
        elif t == "adaponder_suite_full":
            out += [*SUITE, HELLASWAG]
        elif t:
            out.append(t)
    return list(dict.fromkeys(out))


# -- parts of the report ---------------------------------------------------------------------------
def iso_flops(model, docs, score_kw: dict, target: float, seed: int) -> dict[str, dict]:
    """Learned policy vs fixed pruning (uniform, geometric) at the learned mean exit pass, plus references."""
    K = model.config.num_passes
    out = {}
    for rule in FIXED_RULES:
        policy = FixedPruningPolicy.from_rule(rule, K, target, seed=seed)
        summary = summarize(score_documents(model, docs, settings=RunSettings(exit_rule=policy), **score_kw), docs,
                            model)
        summary["target_histogram"] = policy.histogram
        summary["target_mean_exit"] = histogram_mean(policy.histogram)
        summary["halting_rates"] = policy.rates
        out[rule] = summary
    out["no halting"] = summarize(score_documents(model, docs, settings=RunSettings(exit_rule=NoHalting()),
                                                  **score_kw), docs, model)
    out["first pass only"] = summarize(score_documents(model, docs, settings=RunSettings(exit_rule=FirstPassOnly()),
                                                       **score_kw), docs, model)
    return out


def task_manager(include_path: str | None = None):
    """lm-eval's ``TaskManager`` with ``include_path`` (default: the repo's ``eval/tasks``)."""
    from lm_eval.tasks import TaskManager  # lm-eval takes seconds to import: only the lm-eval section needs it

    include = include_path or (str(task_dir()) if task_dir() else None)
    return TaskManager(include_path=include) if include else TaskManager()


def unknown_tasks(tasks: Sequence[str], tm) -> list[str]:
    """The names in ``tasks`` that the ``TaskManager`` ``tm`` does not know."""
    known = set(tm.all_tasks)
    return [t for t in tasks if t not in known]


def run_lm_eval(checkpoint: str, settings, tasks: Sequence[str], shots: Sequence[int], limit: float | None,
                batch_size: int, include_path: str | None, seed: int, bootstrap_iters: int, tm=None) -> list[dict]:
    """One lm-eval run per (task, shots) with the ``adaponder`` model; rows with metrics and compute.

    A task whose data file is missing (the local tasks raise ``FileNotFoundError`` naming it) gives a row
    with ``error`` and the other tasks still run; every other exception propagates, so a bug fails the run
    instead of becoming a table row. ``tm``: a ``TaskManager`` (default: :func:`task_manager`)."""
    # lm-eval takes seconds to import (the model module imports it too): only the lm-eval section needs it
    from lm_eval import simple_evaluate

    from .lm_eval_model import AdaPonderLM

    tm = tm if tm is not None else task_manager(include_path)
    lm = AdaPonderLM(checkpoint=checkpoint, passes=settings.passes, tau=settings.tau,
                     batch_size=batch_size, dtype=settings.dtype, device=settings.device)
    rows = []
    for task in tasks:
        for n in shots:
            lm.reset_halting_stats()
            t0 = time.time()
            row = {"task": task, "num_fewshot": int(n), "limit": limit}
            try:
                res = simple_evaluate(model=lm, tasks=[task], num_fewshot=int(n), limit=limit, task_manager=tm,
                                      random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                      fewshot_random_seed=seed, bootstrap_iters=bootstrap_iters,
                                      verbosity="WARNING")
                r = res["results"][task]
                row["samples"] = r.get("sample_len") or res.get("n-samples", {}).get(task, {}).get("effective")
                row["metrics"] = {m: (r[f"{m},none"], r.get(f"{m}_stderr,none"))
                                  for m in METRICS if f"{m},none" in r}
                comp = lm.halting_summary().get("scored")
                if comp:
                    row["mean_exit_pass"] = comp["mean_exit_pass"]
                    row["x_one_pass"] = comp["flops_per_token"]["x_one_pass"]
                    row["scored_tokens"] = comp["tokens"]
            except FileNotFoundError as exc:  # the task's data is not here: report it, run the others
                row["error"] = f"{type(exc).__name__}: {exc}"
            row["seconds"] = round(time.time() - t0, 1)
            print(f"[adaponder-report] lm-eval {task} {n}-shot: "
                  f"{row.get('metrics', row.get('error'))} ({row['seconds']} s)", flush=True)
            rows.append(row)
    return rows


# -- Markdown ------------------------------------------------------------------------------------------------
def _f(x, fmt=".3f"):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _ppl_table(by_source: dict) -> str:
    return markdown_table(
        ["data", "documents", "tokens", "bytes", "perplexity", "bits/byte", "mean NLL (nats)", "mean exit pass"],
        ([name, s["documents"], s["tokens"], s["bytes"], _f(s["ppl"]), _f(s["bpb"], ".4f"), _f(s["nll"], ".4f"),
          _f(s["mean_exit"])] for name, s in by_source.items()))


def _compute_table(summary: dict, K: int) -> str:
    f = summary["flops"]
    full = summary.get("_full_flops")
    lines = ["| quantity | value |", "|---|---:|",
             f"| mean exit pass (papers' ×, of K = {K}) | {summary['mean_exit']:.3f}× |",
             f"| FLOPs per token, total | {f['total'] / 1e6:.3f} M |",
             f"| … backbone passes | {f['backbone'] / 1e6:.3f} M |",
             f"| … output head (one per pass run) | {f['head'] / 1e6:.3f} M |",
             f"| … pondering products softmax(z)·Ẽ | {f['pondering'] / 1e6:.3f} M |",
             f"| … gate MLPs | {f['gates'] / 1e6:.3f} M |",
             f"| one pass (backbone + head, vanilla) | {f['one_pass'] / 1e6:.3f} M |",
             f"| **FLOPs × one pass** | **{f['x_one_pass']:.3f}×** |"]
    if full is not None:
        lines.append(f"| all K passes, no halting (× one pass) | {full['x_one_pass']:.3f}× |")
    lines.append(f"| context used for attention FLOPs (window length, mean) | {f['context']:.0f} |")
    return "\n".join(lines)


def _halting_table(rows: list[dict]) -> str:
    return markdown_table(
        ["exit pass", "tokens", "fraction", "mean NLL (nats)", "perplexity of these tokens"],
        ([r["exit_pass"], r["tokens"], f"{r['fraction']:.4f}", _f(r["mean_nll"], ".4f"), _f(r["ppl"], ".2f")]
         for r in rows), align="rrrrr")


def _iso_table(learned: dict, iso: dict, target: float) -> str:
    lines = ["| policy | target mean exit | realised mean exit | deviation | exit histogram (fractions, passes 1..K) "
             "| MFLOPs/token | × one pass | perplexity | bits/byte |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]

    def row(name, s, tgt):
        hist = s["exit_histogram"]
        total = max(sum(hist), 1)
        fr = " / ".join(f"{c / total:.3f}" for c in hist)
        dev = f"{(s['mean_exit'] - tgt) / tgt:+.2%}" if tgt else "—"
        lines.append(f"| {name} | {_f(tgt) if tgt else '—'} | {s['mean_exit']:.3f} | {dev} | {fr} | "
                     f"{s['flops']['total'] / 1e6:.3f} | {s['flops']['x_one_pass']:.3f} | {_f(s['ppl'])} | "
                     f"{_f(s['bpb'], '.4f')} |")

    row("**learned gates**", learned, None)
    for rule in FIXED_RULES:
        row(f"{rule} fixed pruning", iso[rule], target)
    row("*reference:* all K passes (no halting)", iso["no halting"], None)
    row("*reference:* first pass only", iso["first pass only"], None)
    return "\n".join(lines)


def _lm_eval_table(rows: list[dict], shots: Sequence[int]) -> str:
    head = "| task | metric | " + " | ".join(f"{n}-shot" for n in shots) + " |"
    lines = [head, "|---|---|" + "---:|" * len(shots)]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    by = {(r["task"], r["num_fewshot"]): r for r in rows}
    for task in tasks:
        metrics = []
        for n in shots:
            metrics += [m for m in by.get((task, n), {}).get("metrics", {}) if m not in metrics]
        errors = {n: by[(task, n)]["error"] for n in shots if "error" in by.get((task, n), {})}
        for m in metrics:
            cells = []
            for n in shots:
                val = by.get((task, n), {}).get("metrics", {}).get(m)
                if val is None:
                    cells.append("—")
                else:
                    v, se = val
                    fmt = ".2f" if m == "perplexity" else ".4f"
                    cells.append(f"{v:{fmt}} ± {se:{fmt}}" if isinstance(se, float) and math.isfinite(se)
                                 else f"{v:{fmt}}")
            lines.append(f"| {task} | {m} | " + " | ".join(cells) + " |")
        cells = [_f(by.get((task, n), {}).get("mean_exit_pass")) for n in shots]
        lines.append(f"| {task} | mean exit pass (scored tokens) | " + " | ".join(cells) + " |")
        for n, err in errors.items():
            lines.append(f"| {task} | error ({n}-shot) | {err[:160]} |" + " |" * (len(shots) - 1))
    return "\n".join(lines)


def _halting_section(ctx: dict) -> list[str]:
    """Where the gates spend compute: the exit-pass table, plots, the hardest tokens."""
    K, lines = ctx["settings"].passes, []
    if ctx.get("halting") is not None:
        lines += [
            "## Halting: where the gates spend compute",
            "",
            _halting_table(ctx["halting"]),
            "",
            "![exit-pass histogram](exit_histogram.png)",
            "![mean NLL by exit pass](nll_by_exit_pass.png)",
            "",
            f"Per-token dump (document, position, token id, token, exit pass, NLL): `{ctx['dump']}`.",
            "",
        ]
        if ctx.get("hardest"):
            toks = ", ".join(f"`{json.dumps(h['token'], ensure_ascii=False)[1:-1]}` ({h['count']}, NLL "
                             f"{h['mean_nll']:.2f})" for h in ctx["hardest"])
            lines += [f"Most frequent tokens that ran all {K} passes: {toks}.", ""]
    return lines


def _iso_section(ctx: dict) -> list[str]:
    """Learned gates against fixed pruning at the same mean exit pass."""
    lines: list[str] = []
    if ctx.get("iso") is not None:
        lines += [
            "## Iso-FLOPs control: learned gates vs fixed pruning",
            "",
            f"Fixed pruning (docs/method.md (a), baselines): the same trained model, but after each pass a random subset "
            f"of the still-active tokens halts (seeded), with per-pass rates chosen so that the exit-pass histogram "
            f"is uniform or geometric with the learned policy's mean exit pass D = {ctx['target']:.4f}. "
            f"\"uniform\" puts equal mass on every early exit and the rest on the end (the same number of tokens "
            f"halts after each pass); \"geometric\" halts a constant fraction p of the active tokens after every "
            f"pass (p solved for the mean).",
            "",
            _iso_table(ctx["learned"], ctx["iso"], ctx["target"]),
            "",
            "![exit-pass histograms of the three policies](exit_histogram.png)",
            "",
        ]
    return lines


def _dial_section(ctx: dict) -> list[str]:
    """The τ sweep, or the note saying why there is none."""
    if ctx.get("dial") is not None:
        return [
            "## Compute dial (τ sweep)",
            "",
            "A token halts after pass i when its gate s^i < τ: larger τ, fewer passes, fewer FLOPs.",
            "",
            dial_table(ctx["dial"]),
            "",
            "![perplexity vs FLOPs](ppl_vs_flops.png)",
            "",
        ]
    return [ctx["no_gates_note"], ""] if ctx.get("no_gates_note") else []


def _lm_eval_section(ctx: dict) -> list[str]:
    """The lm-eval tasks' table."""
    lines: list[str] = []
    if ctx.get("lm_eval") is not None:
        limit = ctx["limit"]
        lines += [
            "## lm-eval (local offline tasks, `eval/tasks`)",
            "",
            f"Model `adaponder` (lm-eval `HFLM` subclass) with the settings above; "
            f"{'first ' + str(limit) + ' documents per task' if limit else 'full splits'}; "
            f"value ± bootstrap/standard error. Few-shot examples come from the evaluated split "
            f"(see `eval/tasks/README.md`). The model's context is {ctx['context']} tokens: lm-eval cuts longer "
            f"(few-shot) prompts from the left, so shots that do not fit are dropped.",
            "",
            _lm_eval_table(ctx["lm_eval"], ctx["shots"]),
            "",
        ]
    return lines


def write_markdown(path: Path, ctx: dict) -> None:
    s = ctx["settings"]
    K = s.passes
    lines = [
        f"# AdaPonder evaluation report: `{s.checkpoint}`",
        "",
        f"Generated {ctx['date']} by `{ctx['command']}` in {ctx['seconds']:.0f} s.",
        "",
        "## Recurrence settings (pinned)",
        "",
        *[f"- {line}" for line in s.lines()],
        f"- held-out data: {', '.join(f'`{d}`' for d in ctx['data'])} (at most {ctx['max_tokens'] or 'all'} "
        f"tokens per entry); sliding window {ctx['window']} tokens, stride {ctx['stride']}; each document is "
        "scored as `[EOD] + tokens`, every token exactly once",
        f"- fixed-pruning seed: {ctx['seed']}",
        "",
        "## Perplexity and bits per byte (learned gates)",
        "",
        _ppl_table(ctx["by_source"]),
        "",
        "Perplexity = exp(mean NLL per token); bits per byte = total NLL / ln 2 / UTF-8 bytes of the scored text.",
        "",
        "## Compute (A17)",
        "",
        _compute_table(ctx["learned"], K),
        "",
        "FLOPs convention (model's `flops_per_token`): 2 FLOPs per weight per token, attention 4·ctx·d per layer "
        "(no causal discount), layer norms/softmax not counted. A token with exit pass D costs D backbone passes, "
        "D head products, D−1 pondering products and min(D, K−1) gate MLPs. " + ONE_PASS_BASELINE + ".",
        "",
    ]
    lines += [*_halting_section(ctx), *_iso_section(ctx), *_dial_section(ctx), *_lm_eval_section(ctx)]
    lines += ["## Files", "", *[f"- `{f}`" for f in ctx["files"]], ""]
    path.write_text("\n".join(lines), encoding="utf-8")


# -- results.json ---------------------------------------------------------------------------------------
def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


__all__ = ["expand_tasks", "iso_flops", "run_lm_eval", "task_manager", "unknown_tasks", "write_markdown"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-report` (or `python -m adaponder.cli.report`)")
