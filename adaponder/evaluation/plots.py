"""PNG figures of the halting analysis and the compute dial (matplotlib, Agg backend, labelled axes). Each
``draw_*`` returns the Figure its ``*_png`` saves."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from adaponder.plotting import POLICY_COLORS, POLICY_MARKERS, figure, legend_outside, plt, save

_COLORS = POLICY_COLORS


def draw_exit_histogram(hists: Sequence[int] | Mapping[str, Sequence[int]], title: str = "Exit-pass histogram"):
    """Fraction of tokens per exit pass; several policies (a mapping label → counts) as grouped bars."""
    if not isinstance(hists, Mapping):
        hists = {"learned": hists}
    K = max(len(h) for h in hists.values())
    fig = figure(7.2, 4.0)
    ax = fig.add_subplot()
    width = 0.8 / len(hists)
    # Upright share labels fit over a bar only while the bars are wide; narrower bars get them turned upright.
    upright = len(hists) * K <= 12
    for j, (label, counts) in enumerate(hists.items()):
        total = max(sum(counts), 1)
        fracs = [c / total for c in counts]
        xs = [k + 1 + (j - (len(hists) - 1) / 2) * width for k in range(len(counts))]
        mean = sum((k + 1) * f for k, f in enumerate(fracs))
        bars = ax.bar(xs, fracs, width=width * 0.95, color=_COLORS.get(label), label=f"{label} (mean {mean:.3f})")
        for b, f in zip(bars, fracs):
            ax.annotate(f"{f:.1%}", (b.get_x() + b.get_width() / 2, f), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=0 if upright else 90)
    ax.set_xticks(range(1, K + 1))
    ax.set_xlabel("exit pass D (backbone passes run)")
    ax.set_ylabel("fraction of tokens")
    ax.set_ylim(0, 1.18)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    legend_outside(ax, *ax.get_legend_handles_labels())
    return fig


def exit_histogram_png(hists: Sequence[int] | Mapping[str, Sequence[int]], path: str | Path,
                       title: str = "Exit-pass histogram") -> Path:
    return save(draw_exit_histogram(hists, title), path, dpi=120)


def draw_nll_by_exit(rows: Sequence[Mapping], title: str = "Mean NLL of tokens by exit pass (learned gates)"):
    """Bars: mean NLL (nats) of the tokens that exited at each pass, annotated with token counts."""
    fig = figure(6.4, 4.0)
    ax = fig.add_subplot()
    xs = [r["exit_pass"] for r in rows]
    ys = [r["mean_nll"] if r["tokens"] else 0.0 for r in rows]
    bars = ax.bar(xs, ys, color=_COLORS["learned"])
    for b, r in zip(bars, rows):
        label = f"n={r['tokens']}" if r["tokens"] else "no tokens"
        ax.annotate(label, (b.get_x() + b.get_width() / 2, b.get_height()), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)
    finite = [y for y in ys if y and math.isfinite(y)]
    ax.set_ylim(0, (max(finite) if finite else 1.0) * 1.18)
    ax.set_xticks(xs)
    ax.set_xlabel("exit pass D (backbone passes run)")
    ax.set_ylabel("mean NLL of the predicted token (nats)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return fig


def nll_by_exit_png(rows: Sequence[Mapping], path: str | Path,
                    title: str = "Mean NLL of tokens by exit pass (learned gates)") -> Path:
    return save(draw_nll_by_exit(rows, title), path, dpi=120)


def _tau_table(tx, rows: Sequence[Mapping], colors) -> None:
    """The dial's points as a table beside the plot (τ, FLOPs, perplexity), each row with its point's colour:
    close τ values land on almost the same spot, where labels on the points would cover each other."""
    tx.set_axis_off()
    n = len(rows) + 1
    step = min(0.075, 0.95 / n)
    tx.text(0.1, 1.0, f"{'τ':<8}{'×pass':>6} {'ppl':>7}", family="monospace", fontsize=7.5, va="top",
            weight="bold")
    for i, (r, c) in enumerate(sorted(zip(rows, colors), key=lambda rc: rc[0]["tau"]), start=1):
        y = 1.0 - i * step
        tx.scatter([0.03], [y - step * 0.35], color=c, s=22, clip_on=False)
        tx.text(0.1, y, f"{r['tau']:<8g}{r['flops']['x_one_pass']:>6.3f} {r['ppl']:>7.2f}", family="monospace",
                fontsize=7.5, va="top")
    tx.set_xlim(0, 1)
    tx.set_ylim(0, 1)


def draw_ppl_vs_flops(dial_rows: Sequence[Mapping], points: Mapping[str, Mapping] | None = None,
                      title: str = "Perplexity vs realised compute (τ dial)"):
    """The τ dial as a line (perplexity vs FLOPs per token in multiples of one pass; each point coloured by τ,
    its values in the table beside the plot), plus single ``points`` (fixed-pruning baselines, no halting, the
    first pass alone) as hollow markers under the dial, so a dial point on the same spot stays visible."""
    fig = figure(8.6, 4.6)
    ax, tx = fig.subplots(1, 2, width_ratios=[3.0, 1.25])
    rows = sorted(dial_rows, key=lambda r: r["flops"]["x_one_pass"])
    if rows:
        xs = [r["flops"]["x_one_pass"] for r in rows]
        ys = [r["ppl"] for r in rows]
        cmap = plt.get_cmap("viridis")
        order = sorted(r["tau"] for r in rows)
        colors = [cmap(0.9 * order.index(r["tau"]) / max(len(rows) - 1, 1)) for r in rows]
        ax.plot(xs, ys, "-", color=_COLORS["learned"], lw=1.2, zorder=3, label="learned gates, τ sweep")
        ax.scatter(xs, ys, c=colors, s=26, marker=POLICY_MARKERS["learned"], edgecolors="white", linewidths=0.4,
                   zorder=4)
        _tau_table(tx, rows, colors)
    else:
        tx.set_axis_off()
    for label, s in (points or {}).items():
        ax.scatter([s["flops"]["x_one_pass"]], [s["ppl"]], marker=POLICY_MARKERS.get(label, "x"), s=90,
                   facecolors="none", edgecolors=_COLORS.get(label, "black"), linewidths=1.6, label=label, zorder=2)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.margins(0.08)
    ax.set_xlabel("realised FLOPs per token (× one pass)")
    ax.set_ylabel("perplexity (held-out)")
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    legend_outside(fig, *ax.get_legend_handles_labels(), where="lower center", ncol=3)
    return fig


def ppl_vs_flops_png(dial_rows: Sequence[Mapping], path: str | Path,
                     points: Mapping[str, Mapping] | None = None,
                     title: str = "Perplexity vs realised compute (τ dial)") -> Path:
    return save(draw_ppl_vs_flops(dial_rows, points, title), path, dpi=120)


__all__ = ["draw_exit_histogram", "draw_nll_by_exit", "draw_ppl_vs_flops", "exit_histogram_png", "nll_by_exit_png",
           "ppl_vs_flops_png"]
