"""The token-budget trend: the same arms at several training budgets (this study's results beside those of the
folders in ``study.compare_results``), as a table of held-out perplexity per budget, the passes' gain over the
one-pass control (``ponderlm-k1``) at each budget, and a plot of perplexity vs training tokens.

Only results of the study's first seed enter the trend, so every point is the same seed's data order at a
different length; the seed spread of the folders' repeated arms is reported as the noise floor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from adaponder.plotting import (LINE_MARKERS, arm_color, budget_ticks, figure, footer, legend_outside, save,
                                unique_handles)

CONTROL = "ponderlm-k1"


def load_results(folder: str | Path) -> list[dict]:
    """The per-arm result files of a results folder (its ``*.json`` with an arm, a seed and held-out scores)."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        res = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(res, dict) and {"arm", "seed", "heldout", "train"} <= set(res):
            out.append(res)
    return out


def budget_table(results: Sequence[Mapping], seed: int) -> dict[str, dict[int, float]]:
    """arm → {training tokens → held-out perplexity} for ``seed``."""
    table: dict[str, dict[int, float]] = {}
    for r in results:
        if r["seed"] == seed:
            table.setdefault(r["arm"], {})[int(r["train"]["tokens"])] = float(r["heldout"]["ppl"])
    return table


def gains(table: Mapping[str, Mapping[int, float]], arm: str) -> dict[int, float]:
    """ppl(control) − ppl(arm) per budget where both exist: positive when the arm's passes pay."""
    ctrl = table.get(CONTROL, {})
    return {b: ctrl[b] - p for b, p in sorted(table.get(arm, {}).items()) if b in ctrl}


def verdict(g: Mapping[int, float], noise: float) -> str:
    """How the gain moves from the smallest to the largest budget, against the seed spread."""
    if len(g) < 2:
        return "one budget only: no trend yet"
    budgets = sorted(g)
    first, last = g[budgets[0]], g[budgets[-1]]
    floor = noise if math.isfinite(noise) else 0.0
    if last - first > floor:
        state = ("flips: the passes pay" if last > floor else
                 ("closes (the last gain is inside the seed spread: not distinguishable from none)" if last > -floor
                  else "shrinks"))
        return f"grows with tokens ({first:+.2f} → {last:+.2f}); the deficit {state}"
    if first - last > floor:
        return f"falls with tokens ({first:+.2f} → {last:+.2f})"
    return f"no change beyond the seed spread ({first:+.2f} → {last:+.2f}, spread {floor:.2f})"


def draw_trend(table: Mapping[str, Mapping[int, float]], note: str, noise: float = float("nan")):
    """Left: perplexity vs training tokens per arm. Right: each arm's gain over the one-pass control per budget,
    with the seed spread as a band around zero (a gain inside it is noise). The values are in the report's
    table, so the points carry no labels of their own."""
    fig = figure(11.0, 4.8)
    ax, gx = fig.subplots(1, 2)
    budgets = sorted({b for pts in table.values() for b in pts})
    for i, (arm, pts) in enumerate(sorted(table.items())):
        xs = sorted(pts)
        style = dict(marker=LINE_MARKERS[i % len(LINE_MARKERS)], mfc="none", color=arm_color(arm), label=arm)
        ax.plot([x / 1e6 for x in xs], [pts[x] for x in xs], ls="--" if arm == CONTROL else "-", **style)
        g = gains(table, arm) if arm != CONTROL else {}
        if g:
            gx.plot([b / 1e6 for b in g], list(g.values()), **style)
    gx.axhline(0, color="gray", lw=0.8)
    if math.isfinite(noise):
        gx.axhspan(-noise, noise, color="gray", alpha=0.15, label="seed spread")
    for a in (ax, gx):
        a.set_xscale("log", base=2)
        budget_ticks(a, [b / 1e6 for b in budgets])
        a.set_xlabel("training tokens (millions, log scale)")
        a.grid(alpha=0.3)
    ax.set_ylabel("held-out perplexity")
    ax.set_title("Perplexity vs training tokens", fontsize=11)
    gx.set_ylabel(f"ppl({CONTROL}) − ppl(arm)  (> 0: the passes pay)")
    gx.set_title(f"Gain over {CONTROL} (band: seed spread)", fontsize=11)
    legend_outside(gx, *unique_handles(ax, gx))
    footer(fig, note)
    return fig


def trend_png(table: Mapping[str, Mapping[int, float]], path: Path, note: str, noise: float = float("nan")) -> Path:
    return save(draw_trend(table, note, noise), Path(path))


def section(results: Sequence[Mapping], compare: Sequence[str], seed: int, noise_of: Callable, figs: Path,
            rel: Callable[[Path], str], note: str, verdicts: bool = True) -> list[str]:
    """The report's lines (empty without ``compare`` folders); without ``verdicts`` (a pipeline check) the trend
    is tabulated but not judged."""
    if not compare:
        return []
    others = [r for folder in compare for r in load_results(folder)]
    arms = {r["arm"] for r in results}
    table = budget_table(list(results) + [r for r in others if r["arm"] in arms], seed)
    budgets = sorted({b for pts in table.values() for b in pts})
    by_budget: dict[int, list] = {}
    for r in others + list(results):
        by_budget.setdefault(int(r["train"]["tokens"]), []).append(r)
    spreads = [x for x in (noise_of(rs) for rs in by_budget.values()) if math.isfinite(x)]
    noise = max(spreads) if spreads else float("nan")
    L = ["## Token-budget trend\n",
         f"This study's arms beside the same arms at other budgets ({', '.join(f'`{c}`' for c in compare)}), "
         f"seed {seed}. Gain = ppl({CONTROL}) − ppl(arm): positive when the arm's passes beat one pass of the same "
         f"input scale and init.\n",
         "| arm | " + " | ".join(f"{b:,} tokens" for b in budgets) + " |",
         "|---|" + "---:|" * len(budgets)]
    for arm in sorted(table):
        L.append(f"| {arm} | " + " | ".join(f"{table[arm][b]:.2f}" if b in table[arm] else "–" for b in budgets) + " |")
    for arm in sorted(a for a in table if a != CONTROL):
        g = gains(table, arm)
        if g:
            L.append(f"| gain of {arm} over {CONTROL} | "
                     + " | ".join(f"{g[b]:+.2f}" if b in g else "–" for b in budgets) + " |")
    L.append(f"\nSeed spread of perplexity (largest over the repeated arms at any one budget): {noise:.2f}."
             if math.isfinite(noise) else "")
    for arm in sorted(a for a in table if a != CONTROL and gains(table, a) and verdicts):
        L.append(f"- {arm}: the gain over {CONTROL} {verdict(gains(table, arm), noise)}.")
    L.append(f"\n![Perplexity vs training tokens]({rel(trend_png(table, figs / 'token_trend.png', note, noise))})\n")
    return L


__all__ = ["CONTROL", "budget_table", "draw_trend", "gains", "load_results", "section", "trend_png", "verdict"]
