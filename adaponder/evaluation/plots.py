"""PNG figures of the halting analysis and the compute dial (matplotlib, Agg backend, labelled axes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"learned": "#1f77b4", "uniform": "#ff7f0e", "geometric": "#2ca02c", "no halting": "#7f7f7f",
           "first pass only": "#000000"}


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def exit_histogram_png(hists: Sequence[int] | Mapping[str, Sequence[int]], path: str | Path,
                       title: str = "Exit-pass histogram") -> Path:
    """Fraction of tokens per exit pass; several policies (a mapping label → counts) as grouped bars."""
    if not isinstance(hists, Mapping):
        hists = {"learned": hists}
    K = max(len(h) for h in hists.values())
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.8 / len(hists)
    for j, (label, counts) in enumerate(hists.items()):
        total = max(sum(counts), 1)
        fracs = [c / total for c in counts]
        xs = [k + 1 + (j - (len(hists) - 1) / 2) * width for k in range(len(counts))]
        mean = sum((k + 1) * f for k, f in enumerate(fracs))
        bars = ax.bar(xs, fracs, width=width * 0.95, color=_COLORS.get(label), label=f"{label} (mean {mean:.3f})")
        for b, f in zip(bars, fracs):
            ax.annotate(f"{f:.1%}", (b.get_x() + b.get_width() / 2, f), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(1, K + 1))
    ax.set_xlabel("exit pass D (backbone passes run)")
    ax.set_ylabel("fraction of tokens")
    ax.set_ylim(0, 1.1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def nll_by_exit_png(rows: Sequence[Mapping], path: str | Path,
                    title: str = "Mean NLL of tokens by exit pass (learned gates)") -> Path:
    """Bars: mean NLL (nats) of the tokens that exited at each pass, annotated with token counts."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = [r["exit_pass"] for r in rows]
    ys = [r["mean_nll"] if r["tokens"] else 0.0 for r in rows]
    bars = ax.bar(xs, ys, color=_COLORS["learned"])
    for b, r in zip(bars, rows):
        label = f"n={r['tokens']}" if r["tokens"] else "no tokens"
        ax.annotate(label, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    finite = [y for y in ys if y and math.isfinite(y)]
    ax.set_ylim(0, (max(finite) if finite else 1.0) * 1.15)
    ax.set_xticks(xs)
    ax.set_xlabel("exit pass D (backbone passes run)")
    ax.set_ylabel("mean NLL of the predicted token (nats)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def ppl_vs_flops_png(dial_rows: Sequence[Mapping], path: str | Path,
                     points: Mapping[str, Mapping] | None = None,
                     title: str = "Perplexity vs realised compute (τ dial)") -> Path:
    """The τ dial as a line (perplexity vs FLOPs per token in multiples of one pass, each point labelled
    with τ), plus single ``points`` (e.g. fixed-pruning baselines, no halting) as markers."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    if dial_rows:
        rows = sorted(dial_rows, key=lambda r: r["flops"]["x_one_pass"])
        xs = [r["flops"]["x_one_pass"] for r in rows]
        ys = [r["ppl"] for r in rows]
        ax.plot(xs, ys, "-o", color=_COLORS["learned"], label="learned gates, τ sweep", zorder=3)
        # Points closer than ~6% of the axis ranges share one label; labels alternate above/below the line.
        all_y = ys + [s["ppl"] for s in (points or {}).values()]
        xspan = (max(xs) - min(xs)) or 1.0
        yspan = (max(all_y) - min(all_y)) or 1.0
        groups: list[list[int]] = []
        for i, (x, y) in enumerate(zip(xs, ys)):
            j = groups[-1][-1] if groups else None
            if j is not None and abs(x - xs[j]) < 0.06 * xspan and abs(y - ys[j]) < 0.06 * yspan:
                groups[-1].append(i)
            else:
                groups.append([i])
        for g, members in enumerate(groups):
            taus = [f"{t:g}" for t in sorted(rows[i]["tau"] for i in members)]
            x, y = xs[members[0]], ys[members[0]]
            ax.annotate("τ=" + ", ".join(taus), (x, y), textcoords="offset points",
                        xytext=(6, 8) if g % 2 == 0 else (6, -14), fontsize=7, color=_COLORS["learned"])
    markers = {"uniform": "s", "geometric": "^", "no halting": "D", "first pass only": "v"}
    for label, s in (points or {}).items():
        ax.scatter([s["flops"]["x_one_pass"]], [s["ppl"]], marker=markers.get(label, "x"), s=55,
                   color=_COLORS.get(label), label=f"{label}", zorder=4)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_xlabel("realised FLOPs per token (× one pass)")
    ax.set_ylabel("perplexity (held-out)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


__all__ = ["exit_histogram_png", "nll_by_exit_png", "ppl_vs_flops_png"]
