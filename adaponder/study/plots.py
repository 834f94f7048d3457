"""The study report's figures drawn from the stored per-arm results: the Pareto plot (with a zoom on the gated
arms), NLL by exit pass and exit histograms (one panel per gated run), training curves (whole run and a zoom on
the closest arms). Colours are per arm and markers per policy (:mod:`adaponder.plotting`), the same in every
figure; each ``draw_*`` returns the Figure its ``*_png`` saves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from adaponder.evaluation.pruning import FIXED_RULES
from adaponder.plotting import (LINE_MARKERS, POLICY_HATCH, POLICY_MARKERS, arm_color, figure, footer,
                                legend_outside, readable_log_ticks, save)

from .arms import result_id

Note = Callable[[Sequence[Mapping]], str]


def pruning_markers() -> list[tuple[str, str]]:
    """``(rule, marker)`` for every fixed-pruning rule; a rule without a marker is an error, not a silent gap."""
    missing = [rule for rule in FIXED_RULES if rule not in POLICY_MARKERS]
    if missing:
        raise LookupError(f"no plot marker for fixed-pruning rule(s) {', '.join(missing)} "
                          "(add them to adaponder.plotting.POLICY_MARKERS)")
    return [(rule, POLICY_MARKERS[rule]) for rule in FIXED_RULES]


def _gated(res: Mapping) -> bool:
    return res.get("mode") == "adaponder"


def _mflops(res_or_row: Mapping) -> float:
    return float(res_or_row["flops"]["total"]) / 1e6


def _grid(fig, n: int, ncols: int = 4, sharey: bool = True) -> list:
    """``n`` panels in rows of at most ``ncols``; the unused ones hidden."""
    ncols = min(ncols, n)
    axes = list(fig.subplots(math.ceil(n / ncols), ncols, sharey=sharey, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n]


# -- Pareto ------------------------------------------------------------------------------------------------
def _pareto_points(ax, results: Sequence[Mapping], first_seed: int) -> list[tuple[float, float]]:
    """Every arm's result, each gated arm's τ dial and fixed-pruning controls on ``ax``; returns the points
    of the gated arms (the zoom's region). A repeat seed and the pruning controls are hollow and the dial's dots
    small, drawn on top, so none hides a result on the same spot."""
    gated_pts: list[tuple[float, float]] = []
    # arms that cost the same FLOPs (PonderLM and its variants with pass heads) are spread a little sideways, so that
    # two arms with nearly the same perplexity do not draw one marker exactly over the other
    same_cost: dict[str, list[str]] = {}
    for r in results:
        arms = same_cost.setdefault(f"{_mflops(r['heldout']):.3g}", [])
        if r["arm"] not in arms:
            arms.append(r["arm"])
    for r in results:
        c, filled, h = arm_color(r["arm"]), r["seed"] == first_seed, r["heldout"]
        arms = same_cost[f"{_mflops(h):.3g}"]
        shift = 1.0 + 0.012 * (arms.index(r["arm"]) - (len(arms) - 1) / 2)
        ax.scatter(_mflops(h) * shift, h["ppl"], marker=POLICY_MARKERS["as trained"], s=90, zorder=3 if filled else 5,
                   facecolors=c if filled else "none", edgecolors=c, linewidths=1.5)
        if not _gated(r):
            continue
        gated_pts.append((_mflops(h), h["ppl"]))
        dial = r.get("tau_dial") or []
        if dial:
            xs, ys = [_mflops(d) for d in dial], [d["ppl"] for d in dial]
            ax.plot(xs, ys, ls="-" if filled else "--", color=c, lw=1.0, alpha=0.8, marker=".", ms=4, zorder=6)
            gated_pts += list(zip(xs, ys))
        for rule, mk in pruning_markers():
            fp = (r.get("fixed_pruning") or {}).get(rule)
            if fp:
                ax.scatter(_mflops(fp), fp["ppl"], marker=mk, s=80, facecolors="none", edgecolors=c, linewidths=1.4,
                           zorder=5)
                gated_pts.append((_mflops(fp), fp["ppl"]))
    return gated_pts


def _zoom_box(points: Sequence[tuple[float, float]], full_x, full_y) -> tuple | None:
    """The region of ``points`` with a margin (log-scaled in y), or None when it is most of the whole plot."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [math.log(p[1]) for p in points]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 0.05
    x0, x1 = min(xs) - 0.08 * dx, max(xs) + 0.08 * dx
    y0, y1 = math.exp(min(ys) - 0.12 * dy), math.exp(max(ys) + 0.12 * dy)
    share_x = (x1 - x0) / (full_x[1] - full_x[0])
    share_y = math.log(y1 / y0) / math.log(full_y[1] / full_y[0])
    return None if share_x > 0.8 and share_y > 0.8 else (x0, x1, y0, y1)


def _pareto_legends(ax, results: Sequence[Mapping], first_seed: int) -> None:
    arms = list(dict.fromkeys(r["arm"] for r in results))
    legend_outside(ax, [Line2D([], [], ls="", marker="o", ms=8, color=arm_color(a)) for a in arms], arms,
                   title="arm", title_fontsize=8)
    seeds = sorted({r["seed"] for r in results})
    handles = [Line2D([], [], ls="", marker="o", ms=8, color="black")]
    labels = [f"as trained, seed {first_seed}" + (f" (hollow: seed {', '.join(map(str, seeds[1:]))})"
                                                   if len(seeds) > 1 else "")]
    dial = next((r["tau_dial"] for r in results if r.get("tau_dial")), None)
    if dial:
        handles.append(Line2D([], [], marker=".", color="black", lw=1.0))
        labels.append(f"τ dial ({dial[0]['tau']:g} … {dial[-1]['tau']:g})")
    rules = {rule for r in results for rule in (r.get("fixed_pruning") or {})}
    for rule, mk in pruning_markers():
        if rule in rules:
            handles.append(Line2D([], [], ls="", marker=mk, ms=8, markerfacecolor="none", color="black"))
            labels.append(f"fixed pruning, {rule}")
    legend_outside(ax, handles, labels, where="lower", title="policy", title_fontsize=8)


def draw_pareto(results: Sequence[Mapping], note: str):
    """Held-out perplexity vs inference FLOPs/token: every arm and seed, each gated arm's τ dial and its
    fixed-pruning controls; a second panel zooms on the gated arms when they sit in a corner of the first."""
    first_seed = min(r["seed"] for r in results)
    fig = figure(11.0, 6.0)
    grid = fig.add_gridspec(1, 2)
    ax = fig.add_subplot(grid[0, 0])
    pts = _pareto_points(ax, results, first_seed)
    ax.set_yscale("log")  # one weak arm must not flatten the differences between the others
    ax.margins(0.06)
    box = _zoom_box(pts, ax.get_xlim(), ax.get_ylim())
    panels = [ax]
    if box is None:
        ax.set_subplotspec(grid[0, :])
    else:
        zx = fig.add_subplot(grid[0, 1])
        panels.append(zx)
        _pareto_points(zx, results, first_seed)
        zx.set_yscale("log")
        zx.set_xlim(box[0], box[1])
        zx.set_ylim(box[2], box[3])
        ax.add_patch(Rectangle((box[0], box[2]), box[1] - box[0], box[3] - box[2], fill=False, ls="--", lw=0.9,
                               color="0.4", zorder=1))
        zx.set_title("zoom: the gated arms, their τ dials and pruning controls", fontsize=9)
    for a in panels:
        readable_log_ticks(a, "y")
        a.set_xlabel("inference MFLOPs per token (A17 convention)", fontsize=9)
        a.grid(alpha=0.3)
    ax.set_ylabel("held-out perplexity (log scale)")
    ax.set_title("all arms" + (" (dashed box: the zoom)" if box else ""), fontsize=9)
    fig.suptitle("Perplexity vs inference compute (lower left is better)", fontsize=11)
    _pareto_legends(panels[-1], results, first_seed)
    footer(fig, note)
    return fig


def pareto_png(results: Sequence[Mapping], path: Path, data_note: Note) -> Path:
    return save(draw_pareto(results, data_note(results)), path)


# -- per gated run -----------------------------------------------------------------------------------------
def draw_nll_by_exit(results: Sequence[Mapping], note: str):
    """Mean held-out NLL of the tokens exiting at each pass, one panel per gated run (labels: share of tokens)."""
    gated = [r for r in results if _gated(r) and r.get("nll_by_exit_pass")]
    if not gated:
        return None
    ncols = min(4, len(gated))
    fig = figure(max(2.7 * ncols, 6.4), 2.5 * math.ceil(len(gated) / ncols) + 1.3)
    axes = _grid(fig, len(gated), ncols)
    top = max(row["mean_nll"] for r in gated for row in r["nll_by_exit_pass"] if row["tokens"])
    for ax, r in zip(axes, gated):
        rows = r["nll_by_exit_pass"]
        bars = ax.bar([row["exit_pass"] for row in rows], [row["mean_nll"] if row["tokens"] else 0.0 for row in rows],
                      color=arm_color(r["arm"]), width=0.7)
        for b, row in zip(bars, rows):
            if row["tokens"]:
                ax.annotate(f"{row['fraction']:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([row["exit_pass"] for row in rows])
        ax.set_xlabel("exit pass D", fontsize=8)
        ax.set_ylim(0, top * 1.2)
        ax.set_title(result_id(r), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=8)
    fig.supylabel("mean held-out NLL (nats)", fontsize=9)
    fig.suptitle("Mean NLL of tokens by exit pass (learned gates, τ as trained; labels: share of tokens)",
                 fontsize=10)
    footer(fig, note)
    return fig


def nll_by_exit_png(results: Sequence[Mapping], path: Path, data_note: Note) -> Path | None:
    gated = [r for r in results if _gated(r) and r.get("nll_by_exit_pass")]
    fig = draw_nll_by_exit(results, data_note(gated)) if gated else None
    return save(fig, path) if fig is not None else None


def _histogram_series(results: Sequence[Mapping]) -> list[tuple[Mapping, list[tuple[str, Sequence[int]]]]]:
    """Each gated run with its learned histogram and, for an arm's first seed, its fixed-pruning controls'."""
    gated = [r for r in results if _gated(r)]
    out = []
    for r in gated:
        series = [("learned", r["heldout"]["exit_histogram"])]
        if r["seed"] == min(x["seed"] for x in gated if x["arm"] == r["arm"]):
            series += [(rule, fp["exit_histogram"]) for rule, fp in (r.get("fixed_pruning") or {}).items()]
        out.append((r, series))
    return out


def draw_exit_histograms(results: Sequence[Mapping], note: str):
    """Share of held-out tokens per exit pass, one panel per gated run: the learned gates (solid) and, where the
    run has them, the fixed-pruning controls at the same mean exit pass (hatched)."""
    runs = _histogram_series(results)
    if not runs:
        return None
    ncols = min(4, len(runs))
    fig = figure(max(2.7 * ncols, 6.4), 2.5 * math.ceil(len(runs) / ncols) + 1.4)
    axes = _grid(fig, len(runs), ncols)
    drawn: list[str] = []
    for ax, (r, series) in zip(axes, runs):
        width = 0.8 / len(series)
        for j, (policy, counts) in enumerate(series):
            total = max(sum(counts), 1)
            xs = [k + 1 + (j - (len(series) - 1) / 2) * width for k in range(len(counts))]
            ax.bar(xs, [c / total for c in counts], width=width * 0.95, color=arm_color(r["arm"]),
                   alpha=1.0 if policy == "learned" else 0.45, hatch=POLICY_HATCH.get(policy, "..."),
                   edgecolor="black", linewidth=0.4)
            drawn += [policy] if policy not in drawn else []
        ax.set_xticks(range(1, max(len(c) for _, c in series) + 1))
        ax.set_xlabel("exit pass D", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_title(result_id(r), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=8)
    fig.supylabel("share of held-out tokens", fontsize=9)
    pruning = [p for p in drawn if p != "learned"]
    fig.suptitle("Exit-pass histograms: learned gates" + (" and the fixed-pruning controls at the same mean exit pass"
                                                          if pruning else ""), fontsize=10)
    handles = [Patch(facecolor="0.5" if p == "learned" else "0.85", hatch=POLICY_HATCH.get(p, "..."),
                     edgecolor="black", linewidth=0.4) for p in drawn]
    legend_outside(axes[ncols - 1], handles,
                   ["learned gates" if p == "learned" else f"fixed pruning, {p}" for p in drawn])
    footer(fig, note)
    return fig


def exit_histograms_png(results: Sequence[Mapping], path: Path, data_note: Note) -> Path | None:
    gated = [r for r in results if _gated(r)]
    fig = draw_exit_histograms(results, data_note(gated)) if gated else None
    return save(fig, path) if fig is not None else None


# -- training curves ---------------------------------------------------------------------------------------
def _curve(r: Mapping) -> tuple[list[float], list[float]]:
    rows = [c for c in r["train"]["curve"] if c.get("lm_loss") is not None]
    return [c["tokens"] / 1e6 for c in rows], [c["lm_loss"] for c in rows]


def _closest_runs(results: Sequence[Mapping], start: float) -> tuple[list[Mapping], float]:
    """The runs whose mean loss after ``start`` (millions of tokens) is near the best one's, and that margin."""
    means = {}
    for r in results:
        xs, ys = _curve(r)
        tail = [y for x, y in zip(xs, ys) if x >= start]
        if tail:
            means[id(r)] = sum(tail) / len(tail)
    if not means:
        return [], 0.0
    # Twice the best-to-median gap keeps the bulk of the runs and drops the outliers that stretch the axis.
    ordered = sorted(means.values())
    best, median = ordered[0], ordered[len(ordered) // 2]
    margin = max(0.05, 2 * (median - best))
    return [r for r in results if id(r) in means and means[id(r)] <= best + margin], margin


def draw_training_curves(results: Sequence[Mapping], note: str):
    """Training LM loss vs tokens: the whole run, and its second half zoomed on the runs closest to the best.
    Each arm has its colour and its marker (drawn every few points, staggered between arms, so curves on top of
    each other stay apart); the second seed is dashed."""
    fig = figure(11.0, 5.0)
    ax, zx = fig.subplots(1, 2)
    arms = list(dict.fromkeys(r["arm"] for r in results))
    seeds = sorted({r["seed"] for r in results})
    end = max((max(_curve(r)[0], default=0.0) for r in results), default=0.0)
    close, margin = _closest_runs(results, end / 2)
    labelled: set[str] = set()
    for r in results:
        xs, ys = _curve(r)
        i = arms.index(r["arm"])
        step = max(1, len(xs) // 8)
        style = dict(ls="-" if r["seed"] == seeds[0] else "--", color=arm_color(r["arm"]), lw=1.1,
                     marker=LINE_MARKERS[i % len(LINE_MARKERS)], ms=5, markevery=(i % step, step),
                     markerfacecolor="none",
                     # one legend entry per arm: with seeds × data draws the runs of an arm share its colour
                     label=r["arm"] if r["arm"] not in labelled else "_nolegend_")
        labelled.add(r["arm"])
        ax.plot(xs, ys, **style)
        if any(r is c for c in close):
            zx.plot(xs, ys, **{**style, "markevery": (i % max(1, step // 2), max(1, step // 2))})
    zoom = [y for r in close for x, y in zip(*_curve(r)) if x >= end / 2]
    if zoom:
        pad = 0.05 * ((max(zoom) - min(zoom)) or 0.1)
        zx.set_xlim(end / 2, end * 1.01)
        zx.set_ylim(min(zoom) - pad, max(zoom) + pad)
    ax.set_title("whole run", fontsize=9)
    zx.set_title(f"second half: the runs within {margin:.2f} nats of the best", fontsize=9)
    for a in (ax, zx):
        a.set_xlabel("training tokens (millions)", fontsize=9)
        a.grid(alpha=0.3)
    ax.set_ylabel("training LM loss (nats, logged steps)")
    fig.suptitle("Training curves" + (" (dashed: second seed)" if len(seeds) > 1 else ""),
                 fontsize=11)
    legend_outside(zx, *ax.get_legend_handles_labels(), fontsize=7)
    footer(fig, note)
    return fig


def training_curves_png(results: Sequence[Mapping], path: Path, data_note: Note) -> Path:
    return save(draw_training_curves(results, data_note(results)), path)


__all__ = ["draw_exit_histograms", "draw_nll_by_exit", "draw_pareto", "draw_training_curves", "exit_histograms_png",
           "nll_by_exit_png", "pareto_png", "pruning_markers", "training_curves_png"]
