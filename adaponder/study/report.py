"""``docs/study.md`` and its PNGs from the stored per-arm results: tables, the claims of the paper checked
against the numbers, and plots (Pareto front, NLL by exit pass, exit histograms, training curves).

The verdicts are computed, not written by hand: a difference counts only when it exceeds the spread between
the two seeds of the repeated arms. A hand-written analysis (``<results_dir>/analysis.md``) is included as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .arms import arm_id  # noqa: E402
from .config import StudyConfig  # noqa: E402

_MARKERS = {"vanilla": "o", "ponderlm": "s", "loop": "D", "pause": "P", "adaponder": "*"}
#: The Pareto plot's hollow marker of each fixed-pruning control (a rule of FIXED_RULES).
_PRUNING_MARKERS = {"uniform": "^", "geometric": "v"}


def _pruning_markers() -> list[tuple[str, str]]:
    """``(rule, marker)`` for every fixed-pruning rule; a rule without a marker is an error, not a silent gap."""
    from adaponder.evaluation.pruning import FIXED_RULES  # loads torch: only when a report is drawn

    missing = [rule for rule in FIXED_RULES if rule not in _PRUNING_MARKERS]
    if missing:
        raise LookupError(f"no Pareto-plot marker for fixed-pruning rule(s) {', '.join(missing)} "
                          "(add them to _PRUNING_MARKERS)")
    return [(rule, _PRUNING_MARKERS[rule]) for rule in FIXED_RULES]


def _gated(res: Mapping) -> bool:
    return res.get("mode") == "adaponder"


def _ppl(res: Mapping) -> float:
    return float(res["heldout"]["ppl"])


def _mflops(res_or_row: Mapping) -> float:
    return float(res_or_row["flops"]["total"]) / 1e6


def seed_spread(results: Sequence[Mapping]) -> float:
    """Largest |ppl(seed 1) − ppl(seed 2)| over the repeated arms: the noise floor for comparisons."""
    by_arm: dict[str, list[float]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(_ppl(r))
    spreads = [max(v) - min(v) for v in by_arm.values() if len(v) > 1]
    return max(spreads) if spreads else float("nan")


def _mean_ppl(results: Sequence[Mapping], arm: str) -> float | None:
    vals = [_ppl(r) for r in results if r["arm"] == arm]
    return sum(vals) / len(vals) if vals else None


# -- claims ------------------------------------------------------------------------------------------------
def check_claims(results: Sequence[Mapping]) -> list[dict[str, str]]:
    """The paper's claims (1)–(4) against the numbers; each row: claim, numbers, verdict."""
    noise = seed_spread(results)
    noise_txt = f"seed spread {noise:.2f}" if math.isfinite(noise) else "no repeated seed"
    rows = []
    van, pon = _mean_ppl(results, "vanilla"), _mean_ppl(results, "ponderlm")
    if van is not None and pon is not None:
        diff = van - pon
        verdict = ("holds" if diff > (noise if math.isfinite(noise) else 0) else
                   "does not hold" if diff < -(noise if math.isfinite(noise) else 0) else "within noise")
        rows.append({"claim": "(1) PonderLM-style pondering beats vanilla at the same parameters and tokens",
                     "numbers": f"ppl vanilla {van:.2f} vs ponderlm {pon:.2f} (mean over seeds; {noise_txt})",
                     "verdict": verdict})
    k1 = _mean_ppl(results, "ponderlm-k1")
    if k1 is not None and pon is not None:
        diff = k1 - pon
        tol = noise if math.isfinite(noise) else 0
        rows.append({"claim": "(1, control) the gain comes from the extra passes: PonderLM (K passes) beats the same "
                              "input scale and init with one pass (ponderlm-k1)",
                     "numbers": f"ppl ponderlm-k1 {k1:.2f} vs ponderlm {pon:.2f} ({noise_txt})",
                     "verdict": "holds" if diff > tol else "does not hold" if diff < -tol else "within noise"})
    gated = [r for r in results if _gated(r)]
    if pon is not None and gated:
        pon_flops = sum(_mflops(r["heldout"]) for r in results if r["arm"] == "ponderlm") / \
            len([r for r in results if r["arm"] == "ponderlm"])
        parts, ok_any = [], False
        for arm in dict.fromkeys(r["arm"] for r in gated):
            ppl = _mean_ppl(results, arm)
            fl = [_mflops(r["heldout"]) for r in gated if r["arm"] == arm]
            change = (sum(fl) / len(fl)) / pon_flops - 1
            keeps = ppl - pon <= (noise if math.isfinite(noise) else 0)
            ok_any |= keeps and change <= -0.05
            parts.append(f"{arm}: ppl {ppl:.2f} ({ppl - pon:+.2f} vs ponderlm), FLOPs/token {change:+.1%} vs ponderlm")
        rows.append({"claim": "(2) the gated model keeps PonderLM's perplexity with ~10 % fewer inference FLOPs",
                     "numbers": "; ".join(parts) + f" ({noise_txt})",
                     "verdict": "holds" if ok_any else "does not hold"})
    for r in gated:
        if r["seed"] != min(x["seed"] for x in gated if x["arm"] == r["arm"]):
            continue
        nll = [row for row in r.get("nll_by_exit_pass", []) if row["tokens"]]
        if len(nll) >= 2:
            first, deeper = nll[0], nll[1:]
            deeper_mean = sum(x["mean_nll"] * x["tokens"] for x in deeper) / sum(x["tokens"] for x in deeper)
            holds = deeper_mean > first["mean_nll"]
            rows.append({"claim": f"(3) gates give more passes to high-NLL tokens ({arm_id(r['arm'], r['seed'])})",
                         "numbers": ", ".join(f"D={x['exit_pass']}: NLL {x['mean_nll']:.2f} ({x['fraction']:.1%})"
                                              for x in nll),
                         "verdict": "holds" if holds else "does not hold"})
        else:
            rows.append({"claim": f"(3) gates give more passes to high-NLL tokens ({arm_id(r['arm'], r['seed'])})",
                         "numbers": f"all tokens exit at pass {nll[0]['exit_pass'] if nll else '?'}",
                         "verdict": "cannot be tested (no halting)"})
        learned = _ppl(r)
        fp = r.get("fixed_pruning") or {}
        if fp:
            seeds = {k: v.get("ppl_seeds") or [v["ppl"]] for k, v in fp.items()}
            better = all(learned < min(v) for v in seeds.values())
            worse = any(learned > max(v) for v in seeds.values())
            rows.append({"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({arm_id(r['arm'], r['seed'])})",
                         "numbers": f"learned {learned:.2f} at mean exit {r['heldout']['mean_exit']:.3f}; " + ", ".join(
                             f"{k} {_seed_range(v)} over {len(v)} pruning seeds" for k, v in seeds.items()),
                         "verdict": "holds" if better else "does not hold" if worse else "within the pruning noise"})
        else:
            rows.append({"claim": f"(4) learned halting beats fixed pruning at equal FLOPs ({arm_id(r['arm'], r['seed'])})",
                         "numbers": f"mean exit pass {r['heldout']['mean_exit']:.3f}: nothing to prune against",
                         "verdict": "cannot be tested (no halting)"})
    return rows


def _seed_range(vals: Sequence[float]) -> str:
    mean = sum(vals) / len(vals)
    return f"{mean:.2f}" if len(vals) == 1 else f"{mean:.2f} ({min(vals):.2f}–{max(vals):.2f})"


# -- plots -------------------------------------------------------------------------------------------------
def _color(i: int) -> str:
    return plt.get_cmap("tab10")(i % 10)


def pareto_png(results: Sequence[Mapping], path: Path, data_note) -> Path:
    """Held-out perplexity vs inference FLOPs/token: every arm and seed, each gated arm's τ dial (line)
    and its fixed-pruning controls (hollow markers, drawn on top)."""
    fig, ax = plt.subplots(figsize=(8.0, 5.6))
    arms = list(dict.fromkeys(r["arm"] for r in results))
    first_seed = min(r["seed"] for r in results)
    for i, arm in enumerate(arms):
        for r in (x for x in results if x["arm"] == arm):
            h = r["heldout"]
            # Arms of equal cost share an x position: distinct shapes, a repeat seed hollow, all translucent,
            # so a marker under another stays visible.
            filled = r["seed"] == first_seed
            ax.scatter(_mflops(h), h["ppl"], marker=_MARKERS.get(r["mode"], "o"), s=110 if filled else 150,
                       facecolors=_color(i) if filled else "none", edgecolors=_color(i) if not filled else "black",
                       linewidths=0.6 if filled else 1.6, alpha=0.75, zorder=3,
                       label=f"{arm_id(arm, r['seed'])}")
            if _gated(r):
                dial = r.get("tau_dial") or []
                if dial:
                    ax.plot([_mflops(d) for d in dial], [d["ppl"] for d in dial], "-", color=_color(i), alpha=0.6,
                            lw=1.2, marker=".", zorder=2, label=f"{arm_id(arm, r['seed'])} τ dial "
                            f"({dial[0]['tau']:g} … {dial[-1]['tau']:g})")
                for rule, mk in _pruning_markers():
                    fp = (r.get("fixed_pruning") or {}).get(rule)
                    if fp:
                        ax.scatter(_mflops(fp), fp["ppl"], marker=mk, s=110, facecolors="none",
                                   edgecolors=_color(i), linewidths=1.6, zorder=4,
                                   label=f"{arm_id(arm, r['seed'])} fixed pruning, {rule}")
    ax.set_xlabel("inference MFLOPs per token (A17 convention, held-out windows)")
    ax.set_ylabel("held-out perplexity (log scale)")
    ax.set_yscale("log")  # one weak arm must not flatten the differences between the others
    ax.set_title("Perplexity vs inference compute (lower left is better)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.text(0.01, 0.01, data_note(results), fontsize=7, ha="left", va="bottom", wrap=True)
    return _save(fig, path, bottom=0.14)


def nll_by_exit_png(results: Sequence[Mapping], path: Path, data_note) -> Path | None:
    gated = [r for r in results if _gated(r) and r.get("nll_by_exit_pass")]
    if not gated:
        return None
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    width = 0.8 / len(gated)
    for j, r in enumerate(gated):
        rows = r["nll_by_exit_pass"]
        xs = [row["exit_pass"] + (j - (len(gated) - 1) / 2) * width for row in rows]
        ys = [row["mean_nll"] if row["tokens"] else 0.0 for row in rows]
        bars = ax.bar(xs, ys, width=width * 0.95, color=_color(j), label=arm_id(r["arm"], r["seed"]))
        for b, row in zip(bars, rows):
            if row["tokens"]:
                ax.annotate(f"{row['fraction']:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=6)
    K = max(len(r["nll_by_exit_pass"]) for r in gated)
    ax.set_xticks(range(1, K + 1))
    ax.set_xlabel("exit pass D (labels: share of tokens)")
    ax.set_ylabel("mean held-out NLL (nats)")
    ax.set_title("Mean NLL of tokens by exit pass (learned gates, τ as trained)", fontsize=11)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.text(0.01, 0.01, data_note(gated), fontsize=7, ha="left", va="bottom", wrap=True)
    return _save(fig, path, bottom=0.16)


def exit_histograms_png(results: Sequence[Mapping], path: Path, data_note) -> Path | None:
    gated = [r for r in results if _gated(r)]
    if not gated:
        return None
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    series = []
    for r in gated:
        series.append((arm_id(r["arm"], r["seed"]) + " learned", r["heldout"]["exit_histogram"]))
        for rule, fp in (r.get("fixed_pruning") or {}).items():
            if r["seed"] == min(x["seed"] for x in gated if x["arm"] == r["arm"]):
                series.append((arm_id(r["arm"], r["seed"]) + f" {rule}", fp["exit_histogram"]))
    width = 0.8 / len(series)
    for j, (label, counts) in enumerate(series):
        total = max(sum(counts), 1)
        xs = [k + 1 + (j - (len(series) - 1) / 2) * width for k in range(len(counts))]
        ax.bar(xs, [c / total for c in counts], width=width * 0.95, color=_color(j), label=label)
    K = max(len(c) for _, c in series)
    ax.set_xticks(range(1, K + 1))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("exit pass D")
    ax.set_ylabel("fraction of held-out tokens")
    ax.set_title("Exit-pass histograms: learned gates and the fixed-pruning controls", fontsize=11)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.text(0.01, 0.01, data_note(gated), fontsize=7, ha="left", va="bottom", wrap=True)
    return _save(fig, path, bottom=0.16)


def training_curves_png(results: Sequence[Mapping], path: Path, data_note) -> Path:
    fig, ax = plt.subplots(figsize=(8.0, 4.8))
    arms = list(dict.fromkeys(r["arm"] for r in results))
    seeds = sorted({r["seed"] for r in results})
    for i, arm in enumerate(arms):
        for r in (x for x in results if x["arm"] == arm):
            curve = [c for c in r["train"]["curve"] if c.get("lm_loss") is not None]
            ax.plot([c["tokens"] / 1e6 for c in curve], [c["lm_loss"] for c in curve],
                    ls="-" if r["seed"] == seeds[0] else "--", color=_color(i), lw=1.2,
                    label=arm_id(arm, r["seed"]))
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("training LM loss (nats, logged steps)")
    ax.set_title("Training curves (dashed: second seed)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.text(0.01, 0.01, data_note(results), fontsize=7, ha="left", va="bottom", wrap=True)
    return _save(fig, path, bottom=0.14)


def _save(fig, path: Path, bottom: float = 0.1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
             f"and seed for every arm; seed {cfg.study.seed} (all arms)"
             + (f" and {cfg.study.repeat_seed} ({', '.join(cfg.study.repeat_arms)})." if cfg.study.repeat_seed is not None
                else "."))
    shown_arms = dict.fromkeys(a for a, _ in cfg.arm_runs())
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
    L.append(f"\nSeed-to-seed spread of held-out perplexity (largest over the repeated arms): {_f(noise)}. "
             "Differences smaller than this are not distinguishable from noise here.\n")
    changed = [(arm_id(r["arm"], r["seed"]), r["greedy_changed_by_later_passes"]) for r in results
               if r.get("greedy_changed_by_later_passes") is not None]
    if changed:
        L.append("Share of held-out positions where passes 2..K change the greedy token (the output's argmax against "
                 "pass 1's): " + ", ".join(f"{a} {x:.2%}" for a, x in changed) + ".\n")
    total_wall = sum((r["train"].get("wall_s") or 0) + (r.get("eval_wall_s") or 0) for r in results)
    L.append(f"Total compute of the stored results: {total_wall / 60:.1f} min (training + evaluation, this "
             "2-core CPU machine).\n")
    return L


def _halting_detail(r: Mapping) -> list[str]:
    """A gated arm's exit passes with their NLL, its learned policy against fixed pruning, and its τ dial."""
    L: list[str] = []
    L.append(f"### {arm_id(r['arm'], r['seed'])}: halting in detail\n")
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


def write_report(cfg: StudyConfig, results: Sequence[Mapping], data_meta: Mapping, command: str,
                 pending: Sequence[str] = ()) -> Path:
    out = Path(cfg.study.report)
    figs = Path(cfg.study.results_dir)
    rel = lambda p: Path(p).resolve().relative_to(out.parent.resolve()).as_posix() if p else None  # noqa: E731
    corpus = ", ".join(cfg.data.corpus)

    def data_note(shown: Sequence[Mapping]) -> str:
        ckpts = ", ".join(sorted({r["checkpoint"] for r in shown}))
        if data_meta.get("task"):
            return (f"Data: {data_meta['task']['name']} task, {data_meta.get('val_documents')} held-out documents. "
                    f"Checkpoints: {ckpts}")
        return (f"Data: {corpus} ({data_meta.get('documents')} documents; held out whole: "
                f"{data_meta.get('val_documents')}, first {cfg.eval.max_tokens_per_doc or 'all'} tokens of each). "
                f"Checkpoints: {ckpts}")

    plots = {
        "pareto": pareto_png(results, figs / "pareto.png", data_note) if results else None,
        "nll": nll_by_exit_png(results, figs / "nll_by_exit_pass.png", data_note),
        "hist": exit_histograms_png(results, figs / "exit_histograms.png", data_note),
        "curves": training_curves_png(results, figs / "training_curves.png", data_note) if results else None,
    }
    L = []
    L.append(f"# Study: AdaPonderLM and its baselines at CPU scale ({cfg.study.name}, profile {cfg.profile})\n")
    L.append("Generated by `launch/study.py` from the per-arm results in "
             f"`{figs.as_posix()}/*.json`; do not edit by hand (the analysis section comes from "
             f"`{(figs / 'analysis.md').as_posix()}`).\n")
    L.append("## How to reproduce\n")
    L.append(f"```bash\n{command}\n```\n")
    L.append("The study resumes arm by arm: a finished arm (its JSON exists with the same configuration "
             "fingerprint) is never retrained, and an interrupted arm continues from its last checkpoint.\n")
    if pending:
        L.append(f"**Incomplete:** {len(pending)} arm(s) not finished yet: {', '.join(pending)}.\n")
    L += _setup_section(cfg, data_meta)
    L += _results_section(results)
    from .difficulty_report import section

    from . import trend

    L += section(results, figs, rel, data_note(results) if results else "")
    L += trend.section(results, cfg.study.compare_results, cfg.study.seed, seed_spread, figs, rel,
                       data_note(results) if results else "")
    if plots["pareto"]:
        L.append(f"![Pareto plot]({rel(plots['pareto'])})\n")
    L.append("## The paper's claims at this scale\n")
    L.append("| claim | numbers | verdict |")
    L.append("|---|---|---|")
    for c in check_claims(results):
        L.append(f"| {c['claim']} | {c['numbers']} | **{c['verdict']}** |")
    L.append("")
    gated = [r for r in results if _gated(r)]
    for r in gated:
        L += _halting_detail(r)
    for key, caption in (("nll", "NLL by exit pass"), ("hist", "Exit histograms"), ("curves", "Training curves")):
        if plots[key]:
            L.append(f"![{caption}]({rel(plots[key])})\n")
    from . import gate_report

    L += gate_report.section(results, figs, rel, data_note)
    analysis = figs / "analysis.md"
    if analysis.is_file():
        L.append(analysis.read_text(encoding="utf-8").rstrip() + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L), encoding="utf-8")
    return out


__all__ = ["check_claims", "seed_spread", "write_report"]
