"""``docs/study.md`` and its PNGs from the stored per-arm results: tables, the claims of the paper checked
against the numbers, and plots (Pareto front, NLL by exit pass, exit histograms, training curves).

The verdicts are computed, not written by hand, from intervals: a perplexity difference between two arms counts only
when the 95 % bootstrap interval of the difference of their run means (each arm's runs resampled) excludes 0 — with
one run of an arm there is no interval and the claim says so; on a labelled task the perplexity is the test split's
without the query symbols (whose NLL a run that never composes inflates by orders of magnitude). A hand-written
analysis (``<results_dir>/analysis.md``) is included as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaponder.plotting import short_path

from . import decide, difficulty_report, exits_report, gate_report, intervals, trend
from .arms import result_id
from .config import StudyConfig
from .plots import exit_histograms_png, nll_by_exit_png, pareto_png, training_curves_png


def _gated(res: Mapping) -> bool:
    return res.get("mode") == "adaponder"


def _ppl(res: Mapping) -> float:
    return float(res["heldout"]["ppl"])


def _mflops(res_or_row: Mapping) -> float:
    return float(res_or_row["flops"]["total"]) / 1e6


def _scores_last_pass_partly(res: Mapping) -> bool:
    """Trained by PonderNet's expected loss alone (A21): its last pass is scored only as much as tokens exit there,
    so its all-passes perplexity is not what it was trained for."""
    return (res.get("overrides") or {}).get("schedule.per_pass") == "pondernet"


def arm_spreads(results: Sequence[Mapping]) -> dict[str, float]:
    """|ppl(seed 1) − ppl(seed 2)| of every repeated arm."""
    by_arm: dict[str, list[float]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(_ppl(r))
    return {arm: max(v) - min(v) for arm, v in by_arm.items() if len(v) > 1}


def seed_spread(results: Sequence[Mapping]) -> float:
    """Largest |ppl(seed 1) − ppl(seed 2)| over the repeated arms trained for their all-passes perplexity: the noise
    floor for comparisons (an arm trained by A21's expected loss alone is read at its exits, and its all-passes
    spread is reported beside, not used)."""
    spreads = arm_spreads([r for r in results if not _scores_last_pass_partly(r)])
    return max(spreads.values()) if spreads else float("nan")


def _mean_ppl(results: Sequence[Mapping], arm: str) -> float | None:
    vals = [_ppl(r) for r in results if r["arm"] == arm]
    return sum(vals) / len(vals) if vals else None


# -- claims ------------------------------------------------------------------------------------------------
def _claim_ppl(res: Mapping) -> float:
    """The perplexity a claim reads: on a labelled task the test split's without the query symbols, else the
    held-out perplexity."""
    value = (res.get("difficulty") or {}).get("ppl_without_query_symbols")
    return float(value) if value is not None else _ppl(res)


def ppl_difference(results: Sequence[Mapping], arm: str, reference: str, resamples: int = intervals.RESAMPLES,
                   seed: int = 0) -> intervals.Interval | None:
    """Mean claim perplexity of ``arm`` minus ``reference``'s over their runs, with the percentile interval of the
    difference when each arm's runs are resampled with replacement; None with fewer than two runs of either."""
    a = np.array([_claim_ppl(r) for r in results if r["arm"] == arm])
    b = np.array([_claim_ppl(r) for r in results if r["arm"] == reference])
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(seed)
    draws = a[rng.integers(0, len(a), (resamples, len(a)))].mean(1) - b[rng.integers(0, len(b), (resamples, len(b)))].mean(1)
    lo, hi = np.quantile(draws, [(1 - intervals.LEVEL) / 2, (1 + intervals.LEVEL) / 2])
    return intervals.Interval(float(a.mean() - b.mean()), float(lo), float(hi), int(min(len(a), len(b))))


def _ppl_verdict(diff: intervals.Interval | None) -> str:
    """A perplexity difference (the other arm minus the better-claimed one) judged on its interval."""
    if diff is None:
        return "cannot be judged (one run of an arm: no interval)"
    return "holds" if diff.low > 0 else "does not hold" if diff.high < 0 else "not distinguishable (the interval contains 0)"


def _ppl_numbers(results: Sequence[Mapping], arm: str, reference: str, diff: intervals.Interval | None) -> str:
    n_a = sum(r["arm"] == arm for r in results)
    n_b = sum(r["arm"] == reference for r in results)
    what = "without query symbols" if any((r.get("difficulty") or {}).get("ppl_without_query_symbols") is not None
                                          for r in results) else "held-out"
    mean_a = sum(_claim_ppl(r) for r in results if r["arm"] == arm) / n_a
    mean_b = sum(_claim_ppl(r) for r in results if r["arm"] == reference) / n_b
    return (f"ppl ({what}) {arm} {mean_a:.2f} ({n_a} runs) vs {reference} {mean_b:.2f} ({n_b} runs); difference "
            + (str(diff) if diff is not None else "without interval"))


def _answers_accuracy(t: dict, w: np.ndarray) -> np.ndarray:
    """Answer accuracy over every difficulty (weighted per-symbol counts, :mod:`.intervals`)."""
    n = w @ t["answers"].sum(1)
    return np.divide(w @ t["correct"].sum(1), n, out=np.full_like(n, np.nan), where=n > 0)


def _pruning_claim(results: Sequence[Mapping], arm: str) -> dict[str, str] | None:
    """Claim (4) on a labelled task: the arm's answer accuracy under its learned halting against the fixed-pruning
    control at the same mean exit pass (the difficulty evaluation's), runs × query symbols resampled."""
    runs = [r for r in results if r["arm"] == arm and (r.get("difficulty") or {}).get("fixed_pruning")]
    if not runs:
        return None
    learned = [r["difficulty"]["per_symbol"] for r in runs]
    parts, verdicts = [], []
    for rule in runs[0]["difficulty"]["fixed_pruning"]:
        fixed = [r["difficulty"]["fixed_pruning"][rule][0]["per_symbol"] for r in runs
                 if r["difficulty"]["fixed_pruning"].get(rule)]
        diff = intervals.difference(learned, fixed, _answers_accuracy)
        parts.append(f"{rule}: learned − fixed {diff}")
        verdicts.append("holds" if diff.low > 0 else "does not hold" if diff.high < 0 else "not distinguishable")
    exit_mean = sum(r["difficulty"]["mean_exit"] for r in runs) / len(runs)
    verdict = "holds" if all(v == "holds" for v in verdicts) else "does not hold" if any(
        v == "does not hold" for v in verdicts) else "not distinguishable (the interval contains 0)"
    return {"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({arm}, answer accuracy)",
            "numbers": f"{len(runs)} runs, mean exit {exit_mean:.2f}; " + "; ".join(parts), "verdict": verdict}


def check_claims(results: Sequence[Mapping]) -> list[dict[str, str]]:
    """The paper's claims (1)–(4) against the numbers; each row: claim, numbers, verdict."""
    rows = []
    van, pon = _mean_ppl(results, "vanilla"), _mean_ppl(results, "ponderlm")
    if van is not None and pon is not None:
        diff = ppl_difference(results, "vanilla", "ponderlm")
        rows.append({"claim": "(1) PonderLM-style pondering beats vanilla at the same parameters and tokens",
                     "numbers": _ppl_numbers(results, "vanilla", "ponderlm", diff), "verdict": _ppl_verdict(diff)})
    k1 = _mean_ppl(results, "ponderlm-k1")
    if k1 is not None and pon is not None:
        diff = ppl_difference(results, "ponderlm-k1", "ponderlm")
        rows.append({"claim": "(1, control) the gain comes from the extra passes: PonderLM (K passes) beats the same "
                              "input scale and init with one pass (ponderlm-k1)",
                     "numbers": _ppl_numbers(results, "ponderlm-k1", "ponderlm", diff), "verdict": _ppl_verdict(diff)})
    gated = [r for r in results if _gated(r)]
    if pon is not None and gated:
        pon_flops = sum(_mflops(r["heldout"]) for r in results if r["arm"] == "ponderlm") / \
            len([r for r in results if r["arm"] == "ponderlm"])
        parts, ok_any, judged = [], False, True
        for arm in dict.fromkeys(r["arm"] for r in gated):
            fl = [_mflops(r["heldout"]) for r in gated if r["arm"] == arm]
            change = (sum(fl) / len(fl)) / pon_flops - 1
            diff = ppl_difference(results, arm, "ponderlm")
            judged &= diff is not None
            keeps = diff is not None and diff.low <= 0  # not distinguishably worse than ponderlm
            ok_any |= keeps and change <= -0.05
            parts.append(f"{arm}: ppl difference to ponderlm {diff if diff is not None else '(one run: no interval)'}, "
                         f"FLOPs/token {change:+.1%} vs ponderlm")
        rows.append({"claim": "(2) the gated model keeps PonderLM's perplexity with ~10 % fewer inference FLOPs",
                     "numbers": "; ".join(parts),
                     "verdict": "holds" if ok_any else "does not hold" if judged else
                     "cannot be judged (one run of an arm: no interval)"})
    pruning_done = set()
    for r in gated:
        if r["seed"] != min(x["seed"] for x in gated if x["arm"] == r["arm"]):
            continue
        nll = [row for row in r.get("nll_by_exit_pass", []) if row["tokens"]]
        if len(nll) >= 2:
            first, deeper = nll[0], nll[1:]
            deeper_mean = sum(x["mean_nll"] * x["tokens"] for x in deeper) / sum(x["tokens"] for x in deeper)
            holds = deeper_mean > first["mean_nll"]
            rows.append({"claim": f"(3) gates give more passes to high-NLL tokens ({result_id(r)})",
                         "numbers": ", ".join(f"D={x['exit_pass']}: NLL {x['mean_nll']:.2f} ({x['fraction']:.1%})"
                                              for x in nll),
                         "verdict": "holds" if holds else "does not hold"})
        else:
            rows.append({"claim": f"(3) gates give more passes to high-NLL tokens ({result_id(r)})",
                         "numbers": f"all tokens exit at pass {nll[0]['exit_pass'] if nll else '?'}",
                         "verdict": "cannot be tested (no halting)"})
        learned = _ppl(r)
        fp = r.get("fixed_pruning") or {}
        if fp:
            seeds = {k: v.get("ppl_seeds") or [v["ppl"]] for k, v in fp.items()}
            better = all(learned < min(v) for v in seeds.values())
            worse = any(learned > max(v) for v in seeds.values())
            rows.append({"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({result_id(r)})",
                         "numbers": f"learned {learned:.2f} at mean exit {r['heldout']['mean_exit']:.3f}; " + ", ".join(
                             f"{k} {_seed_range(v)} over {len(v)} pruning seeds" for k, v in seeds.items()),
                         "verdict": "holds" if better else "does not hold" if worse else "within the pruning noise"})
        elif (claim := _pruning_claim(results, r["arm"])) is not None:
            if r["arm"] not in pruning_done:  # judged once per arm, over its runs
                pruning_done.add(r["arm"])
                rows.append(claim)
        elif 1.0 < float(r["heldout"]["mean_exit"]) < float(r.get("passes", 4)):
            rows.append({"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({result_id(r)})",
                         "numbers": f"mean exit pass {r['heldout']['mean_exit']:.3f}",
                         "verdict": "not tested: fixed pruning was not run on this evaluation "
                                    "(eval.perplexity_controls: false)"})
        else:
            rows.append({"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({result_id(r)})",
                         "numbers": f"mean exit pass {r['heldout']['mean_exit']:.3f}: nothing to prune against",
                         "verdict": "cannot be tested (no halting)"})
    return rows


def _seed_range(vals: Sequence[float]) -> str:
    mean = sum(vals) / len(vals)
    return f"{mean:.2f}" if len(vals) == 1 else f"{mean:.2f} ({min(vals):.2f}–{max(vals):.2f})"


# -- Markdown ----------------------------------------------------------------------------------------------
def _f(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _setup_section(cfg: StudyConfig, data_meta: Mapping) -> list[str]:
    """Data, model, training and arms of the study, and how it evaluates."""
    L: list[str] = []
    corpus = ", ".join(cfg.data.corpus)
    base = cfg.base
    model = base.get("model", {})
    train = base.get("train", {})
    L.append("## Set-up\n")
    task = data_meta.get("task")
    if task:
        opts = ", ".join(f"{k} {v}" for k, v in task.items() if k not in ("name", "token_labels"))
        L.append(f"- Data: the `{task['name']}` task of `adaponder.data.reasoning` ({opts}); "
                 f"{data_meta.get('train_tokens', 0):,} training and {data_meta.get('val_tokens', 0):,} held-out "
                 "tokens; word-level tokenizer, one token per symbol.")
    else:
        L.append(f"- Data: {corpus}; byte-level BPE tokenizer with {cfg.data.vocab} entries trained on the train "
                 f"split only; {data_meta.get('val_documents')} of {data_meta.get('documents')} documents held out "
                 f"whole (seed {cfg.data.split_seed}); {data_meta.get('train_tokens', 0):,} training tokens available.")
    L.append(f"- Model: Pythia layout, {model.get('hidden_size')} wide, {model.get('num_hidden_layers')} layers, "
             f"{model.get('num_attention_heads')} heads, vocabulary {model.get('vocab_size')}, "
             f"init `{model.get('init', 'hf')}`; K = {model.get('passes', 4)} passes for the looped arms, "
             f"P = K−1 pauses for `pause`.")
    L.append(f"- Training: {train.get('tokens') or train.get('steps')} {'tokens' if train.get('tokens') else 'steps'} "
             f"per arm, sequence length {base.get('data', {}).get('seq_len')}, global batch "
             f"{train.get('global_batch')}, AdamW lr {base.get('optim', {}).get('lr')} (cosine), same data order "
             f"and seed for every arm; "
             + (f"training seeds {', '.join(map(str, cfg.study.seeds))} for every arm" if cfg.study.seeds is not None
                else f"seed {cfg.study.seed} (all arms)"
                + (f" and {cfg.study.repeat_seed} ({', '.join(cfg.study.repeat_arms)})" if cfg.study.repeat_seed is not None
                   else ""))
             + (f", each on data draws {', '.join(map(str, cfg.study.data_seeds))} (the task's seed: permutation, "
                "held-out symbols, documents)." if cfg.study.data_seeds else "."))
    shown_arms = dict.fromkeys(a for a, *_ in cfg.arm_runs())
    L.append("- Arms (overrides of the base config): " + "; ".join(
        f"`{a}` " + ", ".join(f"{k}={v}" for k, v in cfg.arms[a].items()) for a in shown_arms) + ".")
    L.append("- Evaluation: held-out windows of the training length, not overlapping; FLOPs per token by the A17 "
             "convention (docs/method.md) with each window's length as context; \"× vanilla\" divides by the "
             "vanilla arm's FLOPs/token.\n")
    return L


def _results_section(results: Sequence[Mapping]) -> list[str]:
    """One row per arm and seed, the seed spread, the greedy-token share of later passes, the compute spent."""
    L: list[str] = []
    van = [r for r in results if r["arm"] == "vanilla"]
    van_flops = _mflops(van[0]["heldout"]) if van else None
    L.append("## Results\n")
    L.append("| arm | seed | params | train tokens | train tok/s | train wall | held-out ppl | bits/byte | "
             "mean exit pass | MFLOPs/token | × vanilla |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        h, t = r["heldout"], r["train"]
        L.append(f"| {r['arm']} | {r['seed']} | {r['parameters']['total'] / 1e6:.2f}M | {t['tokens']:,} | "
                 f"{_f(t['tokens_per_s'], '.0f')} | {_f(t['wall_s'] / 60 if t.get('wall_s') else None, '.1f')} min | "
                 f"{h['ppl']:.2f} | {h['bpb']:.4f} | {h['mean_exit']:.3f} | {_mflops(h):.2f} | "
                 f"{_f(_mflops(h) / van_flops if van_flops else None, '.2f')} |")
    noise = seed_spread(results)
    aside = {a: x for a, x in arm_spreads(results).items()
             if any(r["arm"] == a and _scores_last_pass_partly(r) for r in results)}
    L.append(f"\nSeed-to-seed spread of held-out perplexity (largest over the repeated arms, for reference): {_f(noise)}. "
             "Perplexity differences are read on the bootstrap interval of the difference of the two "
             "arms' run means, not on this spread."
             + (" Not counted: " + ", ".join(f"{a} {x:.2f}" for a, x in aside.items()) + " (trained by PonderNet's "
                "expected loss alone, A21: its last pass is scored only as much as tokens exit there, so its "
                "all-passes perplexity is not its operating point; its exits are read in the section below)"
                if aside else "") + "\n")
    changed = [(result_id(r), r["greedy_changed_by_later_passes"]) for r in results
               if r.get("greedy_changed_by_later_passes") is not None]
    if changed:
        L.append("Share of held-out positions where passes 2..K change the greedy token (the output's argmax against "
                 "pass 1's): " + ", ".join(f"{a} {x:.2%}" for a, x in changed) + ".\n")
    total_wall = sum((r["train"].get("wall_s") or 0) + (r.get("eval_wall_s") or 0) for r in results)
    L.append(f"Total compute of the stored results: {total_wall / 60:.1f} min (training + evaluation, this "
             "2-core CPU machine).\n")
    return L


def _pass_heads_section(results: Sequence[Mapping]) -> list[str]:
    """Arms with pass heads on a text corpus (docs/method.md A21, A23): token-level Q-exit and the calibrated
    consistency exit, against the arm's own all-passes perplexity."""
    rows = [r for r in results if (r.get("q_exit") or r.get("consistency_exit")) and not r.get("difficulty")]
    if not rows:
        return []
    L = ["## Exits on the pass heads\n",
         "Token-level Q-exit (A21, q = 0.5) and the consistency exit (A23) calibrated on every other held-out window "
         "to the tolerance δ at the stated confidence, then read on the other windows: the share of positions whose "
         "greedy token differs from the full model's, and the passes saved.\n",
         "| arm | seed | ppl, all passes | Q-exit ppl | Q-exit mean exit | consistency θ (δ, confidence) | "
         "disagreement, calibration / test | mean exit (test) | passes saved (test) |",
         "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        q, c = r.get("q_exit") or {}, r.get("consistency_exit") or {}
        test = c.get("test") or {}
        L.append(f"| {r['arm']} | {r['seed']} | {r['heldout']['ppl']:.2f} | {_f(q.get('ppl'))} | "
                 f"{_f(q.get('mean_exit'), '.3f')} | "
                 + (f"{c['threshold']:g} ({c['delta']:g}, {c['confidence']:g}) | "
                    f"{c['calibration_disagreement']:.4f} / {_f(test.get('disagreement'), '.4f')} | "
                    f"{_f(test.get('mean_exit'), '.3f')} | {_f(100 * test['passes_saved'] if test else None, '.2f')} % |"
                    if c else "– | – | – | – |"))
    return L + [""]


def _halting_detail(r: Mapping) -> list[str]:
    """A gated arm's exit passes with their NLL, its learned policy against fixed pruning, and its τ dial."""
    L: list[str] = []
    L.append(f"### {result_id(r)}: halting in detail\n")
    L.append("| exit pass | tokens | share | mean NLL | ppl |")
    L.append("|---:|---:|---:|---:|---:|")
    for row in r.get("nll_by_exit_pass", []):
        L.append(f"| {row['exit_pass']} | {row['tokens']:,} | {row['fraction']:.1%} | {_f(row['mean_nll'], '.3f')} | "
                 f"{_f(row['ppl'])} |")
    L.append("")
    L.append("| policy | mean exit pass | MFLOPs/token | held-out ppl |")
    L.append("|---|---:|---:|---:|")
    L.append(f"| learned (τ as trained) | {r['heldout']['mean_exit']:.3f} | {_mflops(r['heldout']):.2f} | "
             f"{_ppl(r):.2f} |")
    for rule, fp in (r.get("fixed_pruning") or {}).items():
        seeds = fp.get("ppl_seeds") or [fp["ppl"]]
        L.append(f"| fixed pruning, {rule} (mean and range over {len(seeds)} seeds) | {fp['mean_exit']:.3f} | "
                 f"{_mflops(fp):.2f} | {_seed_range(seeds)} |")
    if r.get("no_halting"):
        nh = r["no_halting"]
        L.append(f"| no halting (all K passes) | {nh['mean_exit']:.3f} | {_mflops(nh):.2f} | {nh['ppl']:.2f} |")
    L.append("")
    if r.get("tau_dial"):
        L.append("| τ | mean exit pass | MFLOPs/token | held-out ppl |")
        L.append("|---:|---:|---:|---:|")
        for d in r["tau_dial"]:
            L.append(f"| {d['tau']:g} | {d['mean_exit']:.3f} | {_mflops(d):.2f} | {d['ppl']:.2f} |")
        L.append("")
    return L


def data_note(cfg: StudyConfig, data_meta: Mapping, shown: Sequence[Mapping]) -> str:
    """A plot's footer: the data it was scored on and where its checkpoints are, without any machine's folders
    (absolute paths shortened) and without one entry per checkpoint (they follow one pattern)."""
    ckpts = f"Checkpoints: {short_path(cfg.study.runs_dir)}/<arm>-s<seed>/hf ({len(shown)} runs)."
    if data_meta.get("task"):
        return f"Data: {data_meta['task']['name']} task, {data_meta.get('val_documents')} held-out documents. {ckpts}"
    corpus = ", ".join(short_path(c) for c in cfg.data.corpus)
    return (f"Data: {corpus} ({data_meta.get('documents')} documents; held out whole: "
            f"{data_meta.get('val_documents')}, first {cfg.eval.max_tokens_per_doc or 'all'} tokens of each). {ckpts}")


PIPELINE_TITLE = "Pipeline check (quick profile) — not a result"


def _header(cfg: StudyConfig, figs: Path, command: str, pending: Sequence[str]) -> list[str]:
    """Title, provenance, how to reproduce; a pipeline check says at once that its numbers are no evidence."""
    if cfg.study.pipeline_check:
        L = [f"# {PIPELINE_TITLE} ({cfg.study.name}, profile {cfg.profile})\n",
             "This run checks that every stage of the study works end to end (data, training, evaluation, tables, "
             "plots) on a tiny model trained for a few steps. Its numbers are not evidence for or against the "
             "method: the arms are trained far too briefly to learn to halt, so it draws no conclusions.\n"]
    else:
        L = [f"# Study: AdaPonderLM and its baselines at CPU scale ({cfg.study.name}, profile {cfg.profile})\n"]
    L.append("Generated by `adaponder study` from the per-arm results in "
             f"`{figs.as_posix()}/*.json`; do not edit by hand (the analysis section comes from "
             f"`{(figs / 'analysis.md').as_posix()}`).\n")
    L.append("## How to reproduce\n")
    L.append(f"```bash\n{command}\n```\n")
    L.append("The study resumes arm by arm: a finished arm (its JSON exists with the same configuration "
             "fingerprint) is never retrained, and an interrupted arm continues from its last checkpoint.\n")
    if pending:
        L.append(f"**Incomplete:** {len(pending)} arm(s) not finished yet: {', '.join(pending)}.\n")
    return L


def _claims_section(results: Sequence[Mapping]) -> list[str]:
    L = ["## The paper's claims at this scale\n", "| claim | numbers | verdict |", "|---|---|---|"]
    L += [f"| {c['claim']} | {c['numbers']} | **{c['verdict']}** |" for c in check_claims(results)]
    return L + [""]


def write_report(cfg: StudyConfig, results: Sequence[Mapping], data_meta: Mapping, command: str,
                 pending: Sequence[str] = ()) -> Path:
    out = Path(cfg.study.report)
    figs = Path(cfg.study.results_dir)
    rel = lambda p: Path(p).resolve().relative_to(out.parent.resolve()).as_posix() if p else None  # noqa: E731
    verdicts = not cfg.study.pipeline_check

    def note(shown: Sequence[Mapping]) -> str:
        return data_note(cfg, data_meta, shown)

    plots = {
        "pareto": pareto_png(results, figs / "pareto.png", note) if results else None,
        "nll": nll_by_exit_png(results, figs / "nll_by_exit_pass.png", note),
        "hist": exit_histograms_png(results, figs / "exit_histograms.png", note),
        "curves": training_curves_png(results, figs / "training_curves.png", note) if results else None,
    }
    L = _header(cfg, figs, command, pending)
    L += _setup_section(cfg, data_meta)
    L += _results_section(results)
    L += decide.section(results, cfg.task_options() if cfg.data.task else None, cfg.study.data_seeds, verdicts=verdicts,
                        settings_note=cfg.study.settings_chosen_on)
    L += difficulty_report.section(results, figs, rel, note(results) if results else "", verdicts=verdicts)
    L += exits_report.section(results, verdicts=verdicts)
    L += _pass_heads_section(results)
    L += trend.section(results, cfg.study.compare_results, cfg.study.seed, seed_spread, figs, rel,
                       note(results) if results else "", verdicts=verdicts)
    if plots["pareto"]:
        L.append(f"![Pareto plot]({rel(plots['pareto'])})\n")
    L += _claims_section(results) if verdicts else []
    gated = [r for r in results if _gated(r)]
    for r in gated:
        L += _halting_detail(r)
    for key, caption in (("nll", "NLL by exit pass"), ("hist", "Exit histograms"), ("curves", "Training curves")):
        if plots[key]:
            L.append(f"![{caption}]({rel(plots[key])})\n")
    L += gate_report.section(results, figs, rel, note)
    analysis = figs / "analysis.md"
    if analysis.is_file():
        L.append(analysis.read_text(encoding="utf-8").rstrip() + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L), encoding="utf-8")
    return out


__all__ = ["PIPELINE_TITLE", "check_claims", "data_note", "seed_spread", "write_report"]
