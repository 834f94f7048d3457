"""The study report's section for a corpus with known per-token difficulty (:mod:`adaponder.data.reasoning`):
answer accuracy by difficulty for every arm, where the gates spend their passes (by difficulty and on filler),
learned halting against fixed pruning and the τ dial by difficulty, the reasoning goals checked against the
numbers, and two plots (accuracy vs difficulty; exit pass vs difficulty with filler apart).

A difference counts only when it exceeds the seed spread: the largest accuracy difference between the two seeds
of a repeated arm at any difficulty level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import mean

from adaponder.plotting import LINE_MARKERS, arm_color, figure, footer, legend_outside, save

from .arms import result_id

LOOPED = ("ponderlm", "loop", "adaponder")
SEPARATION = 0.20   # a looped arm must beat vanilla by this much at some level
AD_TOLERANCE = 0.03  # adaponder within this of ponderlm at every level ...
AD_BUDGET = 0.70     # ... at no more than this share of its answer-token passes
RHO_GOAL = 0.5
WARM_TOLERANCE = 0.05  # the warm-up goal: some AdaPonder arm within this of ponderlm where ponderlm solves ...
WARM_BUDGET = 0.80     # ... at no more than this share of its answer-token passes, with ρ >= RHO_GOAL
SOLVED = 0.05          # a level ponderlm "solves": accuracy at least this (chance is 1 / symbols)


def _levels(res: Mapping) -> dict[int, float]:
    return {lv["difficulty"]: lv["accuracy"] for lv in res["difficulty"]["levels"]}


def _by_arm(results: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    out: dict[str, list[Mapping]] = {}
    for r in results:
        out.setdefault(r["arm"], []).append(r)
    return out


def accuracy_spread(results: Sequence[Mapping]) -> float:
    """Largest |accuracy(seed 1) − accuracy(seed 2)| over repeated arms and difficulty levels."""
    spreads = []
    for runs in _by_arm(results).values():
        if len(runs) > 1:
            for h in _levels(runs[0]):
                vals = [_levels(r)[h] for r in runs]
                spreads.append(max(vals) - min(vals))
    return max(spreads) if spreads else float("nan")


def mean_accuracy(runs: Sequence[Mapping]) -> dict[int, float]:
    return {h: mean(_levels(r)[h] for r in runs) for h in _levels(runs[0])}


def _answer_exit(res: Mapping) -> float:
    return float(res["difficulty"]["classes"]["answer"]["mean_exit"])


def check_goals(results: Sequence[Mapping]) -> list[dict[str, str]]:
    """The reasoning study's acceptance and goals against the numbers; rows: goal, numbers, verdict."""
    arms = _by_arm(results)
    noise = accuracy_spread(results)
    noise_txt = f"seed spread {noise:.3f}" if math.isfinite(noise) else "no repeated seed"
    rows = []
    van = mean_accuracy(arms["vanilla"]) if "vanilla" in arms else None
    looped = [a for a, runs in arms.items() if runs[0].get("mode") in LOOPED and runs[0].get("passes", 1) > 1]
    if van and looped:
        # Beyond the seed spread: the arm's worst seed against vanilla's best seed at that level.
        def worst_gap(a: str, h: int) -> float:
            return min(_levels(r)[h] for r in arms[a]) - max(_levels(r)[h] for r in arms["vanilla"])

        a, h = max(((a, h) for a in looped for h in van), key=lambda t: worst_gap(*t))
        gap = worst_gap(a, h)
        deep = mean_accuracy(arms["vanilla-deep"])[h] if "vanilla-deep" in arms else None
        rows.append({"goal": f"the arms separate: a looped arm beats same-parameter vanilla by ≥ {SEPARATION * 100:.0f} points "
                             "at some difficulty, beyond the seed spread (its worst seed against vanilla's best)",
                     "numbers": f"largest: {a} at H={h}: worst of {len(arms[a])} seed(s) "
                                f"{min(_levels(r)[h] for r in arms[a]):.3f} vs vanilla's best "
                                f"{max(_levels(r)[h] for r in arms['vanilla']):.3f} (+{gap:.3f}; largest spread of any "
                                f"arm: {noise_txt})"
                                + (f"; vanilla-deep (depth reference) {deep:.3f}" if deep is not None else ""),
                     "verdict": "holds" if gap >= SEPARATION else "does not hold"})
    if van and "ponderlm" in arms:
        pl = mean_accuracy(arms["ponderlm"])
        hard = sorted(pl)[-2:]
        gaps = [pl[h] - van[h] for h in hard]
        rows.append({"goal": f"ponderlm ≥ {SEPARATION * 100:.0f} points above vanilla at the two hardest levels",
                     "numbers": "; ".join(f"H={h}: {pl[h]:.3f} vs {van[h]:.3f}" for h in hard) + f" ({noise_txt})",
                     "verdict": "met" if all(g >= SEPARATION for g in gaps) else "not met"})
    if "ponderlm" in arms:
        pl = mean_accuracy(arms["ponderlm"])
        K = arms["ponderlm"][0].get("passes", 4)
        for a in (x for x in arms if arms[x][0].get("mode") == "adaponder"):
            ad = mean_accuracy(arms[a])
            share = mean(_answer_exit(r) for r in arms[a]) / K
            worst = min(ad[h] - pl[h] for h in pl)
            ok = worst >= -AD_TOLERANCE and share <= AD_BUDGET
            rows.append({"goal": f"{a} within {AD_TOLERANCE * 100:.0f} points of ponderlm at every level at ≤ {AD_BUDGET:.0%} of its "
                                 "answer-token passes (FLOPs ∝ passes)",
                         "numbers": "; ".join(f"H={h}: {ad[h]:.3f} vs {pl[h]:.3f}" for h in pl)
                                    + f"; answer passes {share:.0%} of ponderlm's",
                         "verdict": "met" if ok else "not met"})
    if "ponderlm" in arms and any(runs[0].get("mode") == "adaponder" for runs in arms.values()):
        rows.append(_warmup_goal(arms))
    for r in (x for x in results if x.get("mode") == "adaponder"):
        d = r["difficulty"]
        rho = d["spearman_difficulty_exit"]
        c = d["classes"]
        rows.append({"goal": f"{result_id(r)}: Spearman(difficulty, exit pass) ≥ {RHO_GOAL} on answers; "
                             "the share of passes spent on filler",
                     "numbers": f"ρ = {_fmt(rho, '.3f')}; filler: {c['filler']['token_share']:.1%} of tokens, "
                                f"{c['filler']['pass_share']:.1%} of token-passes (mean exit {c['filler']['mean_exit']:.2f}, "
                                f"NLL {c['filler']['mean_nll']:.2f}); answers: {c['answer']['token_share']:.1%} of "
                                f"tokens, {c['answer']['pass_share']:.1%} of token-passes",
                     "verdict": "met" if rho is not None and math.isfinite(rho) and rho >= RHO_GOAL else "not met"})
    return rows


def _warmup_goal(arms: Mapping[str, Sequence[Mapping]]) -> dict[str, str]:
    """Whether any AdaPonder arm keeps ponderlm's accuracy (within WARM_TOLERANCE where ponderlm solves a level)
    at ≤ WARM_BUDGET of its answer-token passes with Spearman(difficulty, exit) ≥ RHO_GOAL (mean over seeds)."""
    pl = mean_accuracy(arms["ponderlm"])
    K = arms["ponderlm"][0].get("passes", 4)
    solved = [h for h in pl if pl[h] >= SOLVED]
    parts, met = [], []
    for a, runs in arms.items():
        if runs[0].get("mode") != "adaponder":
            continue
        ad = mean_accuracy(runs)
        share = mean(_answer_exit(r) for r in runs) / K
        rhos = [r["difficulty"]["spearman_difficulty_exit"] for r in runs]
        rho = mean(rhos) if all(x is not None and math.isfinite(x) for x in rhos) else float("nan")
        worst = min(((ad[h] - pl[h], h) for h in solved), default=(0.0, None))
        ok = worst[0] >= -WARM_TOLERANCE and share <= WARM_BUDGET and math.isfinite(rho) and rho >= RHO_GOAL
        met += [a] if ok else []
        parts.append(f"{a}: worst {worst[0]:+.3f}" + (f" at H={worst[1]}" if worst[1] else "")
                     + f", passes {share:.0%}, ρ {_fmt(rho, '.2f')}")
    return {"goal": f"an AdaPonder arm within {WARM_TOLERANCE * 100:.0f} points of ponderlm at every level ponderlm "
                    f"solves (H = {', '.join(map(str, solved)) or 'none'}), at ≤ {WARM_BUDGET:.0%} of its answer-token "
                    f"passes, with Spearman ≥ {RHO_GOAL}",
            "numbers": "; ".join(parts), "verdict": f"met by {', '.join(met)}" if met else "not met"}


def _fmt(x, spec: str = ".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _acc_cells(levels: Sequence[Mapping]) -> str:
    return " | ".join(_fmt(lv["accuracy"]) for lv in levels)


# -- plots -------------------------------------------------------------------------------------------------
def _seeds_label(arm: str, runs: Sequence) -> str:
    return f"{arm} ({len(runs)} run{'s' if len(runs) > 1 else ''})"


def _dodge(i: int, n: int, width: float = 0.3) -> float:
    """A small x offset per arm: arms with equal values at a level sit side by side, none under another."""
    return 0.0 if n < 2 else (i / (n - 1) - 0.5) * width


def _seed_errorbar(ax, xs: Sequence[float], per_x: Sequence[Sequence[float]], **kw) -> None:
    """The mean over seeds at each x, with the seed range as the error bar."""
    mid = [mean(v) for v in per_x]
    ax.errorbar(xs, mid, yerr=[[m - min(v) for m, v in zip(mid, per_x)], [max(v) - m for m, v in zip(mid, per_x)]],
                capsize=3, ms=5, mfc="none", **kw)


def _finish(fig, ax, note: str):
    """Grid, the legend outside the axes, the data note."""
    ax.grid(alpha=0.3)
    legend_outside(ax, *ax.get_legend_handles_labels())
    footer(fig, note)
    return fig


def draw_accuracy(results: Sequence[Mapping], note: str):
    """Held-out answer accuracy vs difficulty, one line per arm (mean over seeds, bars: seed range)."""
    fig = figure(10.0, 5.0)
    ax = fig.add_subplot()
    arms = _by_arm(results)
    for i, (arm, runs) in enumerate(arms.items()):
        hs = sorted(_levels(runs[0]))
        _seed_errorbar(ax, [h + _dodge(i, len(arms)) for h in hs], [[_levels(r)[h] for r in runs] for h in hs],
                       color=arm_color(arm), marker=LINE_MARKERS[i % len(LINE_MARKERS)],
                       ls="--" if arm.startswith("vanilla") else "-", label=_seeds_label(arm, runs))
    ax.set_xticks(sorted({h for r in results for h in _levels(r)}))
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("difficulty H (hops of f composed)")
    ax.set_ylabel("held-out answer accuracy (greedy)")
    ax.set_title("Where the passes pay: accuracy on held-out compositions", fontsize=11)
    return _finish(fig, ax, note)


def accuracy_png(results: Sequence[Mapping], path: Path, note: str) -> Path:
    return save(draw_accuracy(results, note), path)


def draw_exit(results: Sequence[Mapping], note: str):
    """Mean exit pass of answer tokens vs difficulty for each gated arm (mean over seeds; bars: seed range), and
    the mean exit pass of prompt and filler tokens apart on the right."""
    gated = _by_arm([r for r in results if r.get("mode") == "adaponder"])
    if not gated:
        return None
    fig = figure(11.0, 5.0)
    ax = fig.add_subplot()
    first = next(iter(gated.values()))[0]
    hs = sorted(_levels(first))
    apart = {"prompt": max(hs) + 1.2, "filler": max(hs) + 2.0}
    for i, (arm, runs) in enumerate(gated.items()):
        dx = _dodge(i, len(gated))
        _seed_errorbar(ax, [h + dx for h in hs],
                       [[run["difficulty"]["levels"][j]["mean_exit"] for run in runs] for j in range(len(hs))],
                       color=arm_color(arm), marker=LINE_MARKERS[i % len(LINE_MARKERS)], label=_seeds_label(arm, runs))
        for name, x in apart.items():
            vals = [v for v in (run["difficulty"]["classes"][name]["mean_exit"] for run in runs) if v is not None]
            if vals:
                ax.scatter([x + dx], [mean(vals)], marker=LINE_MARKERS[i % len(LINE_MARKERS)], s=30,
                           facecolors="none", edgecolors=arm_color(arm), zorder=3)
    ax.plot(hs, hs, ":", color="gray", label="ideal: exit at pass H")
    ax.axvline(max(hs) + 0.6, color="gray", lw=0.8)
    ax.set_xticks(hs + list(apart.values()))
    ax.set_xticklabels([f"H={h}" for h in hs] + list(apart))
    K = max(runs[0].get("passes", 4) for runs in gated.values())
    ax.set_ylim(0.8, K + 0.2)
    ax.set_ylabel("mean exit pass (mean over seeds)")
    ax.set_title("Passes spent by difficulty (answers) and on unpredictable tokens (right)", fontsize=11)
    return _finish(fig, ax, note)


def exit_png(results: Sequence[Mapping], path: Path, note: str) -> Path | None:
    fig = draw_exit(results, note)
    return save(fig, path) if fig is not None else None


# -- Markdown ----------------------------------------------------------------------------------------------
def section(results: Sequence[Mapping], figs: Path, rel: Callable[[Path], str], note: str,
            verdicts: bool = True) -> list[str]:
    """The report's lines for the labelled results (empty when none carries ``difficulty``); without
    ``verdicts`` (a pipeline check) the goals are not judged."""
    shown = [r for r in results if r.get("difficulty")]
    if not shown:
        return []
    hs = [lv["difficulty"] for lv in shown[0]["difficulty"]["levels"]]
    head = " | ".join(f"H={h}" for h in hs)
    L = ["## Accuracy by difficulty\n",
         "Held-out answers: every query asks a symbol whose compositions (H ≥ 2) never appear in training, so only "
         "composing f answers them; H = 1 asks f itself (trained). Greedy accuracy over "
         f"{shown[0]['difficulty']['levels'][0]['tokens']:,} answers per level; the exit pass of an answer is that "
         "of the position predicting it.\n",
         f"| arm | seeds | {head} | mean exit pass (answers) | parameters |",
         "|---|---|" + "---:|" * len(hs) + "---:|---:|"]
    for arm, runs in _by_arm(shown).items():
        accs = [[_levels(r)[h] for r in runs] for h in hs]
        cells = " | ".join(f"{mean(a):.3f}" + (f" ({min(a):.3f}–{max(a):.3f})" if len(a) > 1 else "") for a in accs)
        L.append(f"| {arm} | {', '.join(result_id(r).removeprefix(arm + '-') for r in runs)} | {cells} | "
                 f"{mean(_answer_exit(r) for r in runs):.2f} | {runs[0]['parameters']['total'] / 1e6:.2f}M |")
    spread = accuracy_spread(shown)
    L.append(f"\nSeed spread of accuracy (largest over repeated arms and levels): {_fmt(spread)}.\n")
    L.append(f"![Accuracy by difficulty]({rel(accuracy_png(shown, figs / 'accuracy_by_difficulty.png', note))})\n")
    if verdicts and not all((r.get("difficulty") or {}).get("per_symbol") for r in shown):
        # results stored before per-symbol outcomes: goals against the seed spread (the decided goals need them)
        L.append("### Goals\n")
        L.append("| goal | numbers | verdict |\n|---|---|---|")
        L += [f"| {g['goal']} | {g['numbers']} | **{g['verdict']}** |" for g in check_goals(shown)]
        L.append("")
    gated = [r for r in shown if r.get("mode") == "adaponder"]
    if gated:
        L.append("### Where the gates spend passes\n")
        L.append(f"| run | exit pass {head} | prompt | filler | structure | ρ(H, exit) | passes on filler | "
                 "passes on answers |")
        L.append("|---|" + "---:|" * (len(hs) + 6))
        for r in gated:
            d = r["difficulty"]
            c = d["classes"]
            L.append(f"| {result_id(r)} | " + " | ".join(_fmt(lv["mean_exit"], ".2f") for lv in d["levels"])
                     + f" | {_fmt(c['prompt']['mean_exit'], '.2f')} | {_fmt(c['filler']['mean_exit'], '.2f')} | "
                     f"{_fmt(c['structure']['mean_exit'], '.2f')} | {_fmt(d['spearman_difficulty_exit'])} | "
                     f"{_fmt(c['filler']['pass_share'], '.1%')} | {_fmt(c['answer']['pass_share'], '.1%')} |")
        png = exit_png(shown, figs / "exit_by_difficulty.png", note)
        L.append(f"\n![Exit pass by difficulty]({rel(png)})\n")
        L.append("### Learned halting, fixed pruning and the τ dial, by difficulty\n")
        L.append(f"| run | policy | mean exit pass | {head} |")
        L.append("|---|---|---:|" + "---:|" * len(hs))
        for r in gated:
            name, d = result_id(r), r["difficulty"]
            L.append(f"| {name} | learned | {d['mean_exit']:.2f} | {_acc_cells(d['levels'])} |")
            for rule, runs in (d.get("fixed_pruning") or {}).items():
                accs = [mean(run["levels"][i]["accuracy"] for run in runs) for i in range(len(hs))]
                L.append(f"| {name} | fixed pruning, {rule} (mean of {len(runs)} seeds) | "
                         f"{mean(run['mean_exit'] for run in runs):.2f} | " + " | ".join(f"{a:.3f}" for a in accs) + " |")
            if r.get("difficulty_no_halting"):
                nh = r["difficulty_no_halting"]
                L.append(f"| {name} | no halting (all K passes) | {nh['mean_exit']:.2f} | {_acc_cells(nh['levels'])} |")
            for row in r.get("difficulty_tau") or []:
                L.append(f"| {name} | τ = {row['tau']:g} | {row['mean_exit']:.2f} | {_acc_cells(row['levels'])} |")
        L.append("")
    return L


__all__ = ["accuracy_png", "accuracy_spread", "check_goals", "draw_accuracy", "draw_exit", "exit_png", "mean_accuracy",
           "section"]
