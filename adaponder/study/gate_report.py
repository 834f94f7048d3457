"""The study report's gate section: each gated arm's per-gate median value over training (one panel per arm and
seed, the warm-up shaded, τ drawn) and a table of where the gates ended — the evidence for or against a gate
that saturated during training (a dead pass), which the final perplexity alone does not show.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from adaponder.plotting import LINE_MARKERS, figure, footer, legend_outside, plt, readable_log_ticks, save, unique_handles

from .arms import result_id

#: Plotted floor for a median that underflowed to 0 (log axis).
_FLOOR = 1e-40


def gate_rows(res: Mapping) -> list[Mapping]:
    """The logged training steps of ``res`` that carry gate statistics (empty for ungated arms and for results
    stored before training summaries held them)."""
    return [c for c in res.get("train", {}).get("curve", []) if c.get("gate_median")]


def _warmup_span(rows: Sequence[Mapping]) -> tuple[int, int] | None:
    """From step 0 to the last logged step whose gates were not live (bypassed or floored), if any; a bypassed
    warm-up logs no gate statistics, so this reads every logged step, not only the gate rows."""
    steps = [c["step"] for c in rows if c.get("gate_warmup") not in (None, "live")]
    return (0, max(steps)) if steps else None


def _shown(results: Sequence[Mapping]) -> list[Mapping]:
    """The results with gate statistics, the seeds of an arm side by side."""
    order = list(dict.fromkeys(r["arm"] for r in results))
    return sorted((r for r in results if gate_rows(r)), key=lambda r: (order.index(r["arm"]), r["seed"]))


def draw_gate_curves(results: Sequence[Mapping], note: str):
    """One panel per gated run: each gate's median value over training (log scale), the warm-up shaded, τ."""
    shown = _shown(results)
    if not shown:
        return None
    ncols = min(4, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = figure(max(3.3 * ncols, 8.0), 2.5 * nrows + 1.6)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, shown):
        rows = gate_rows(r)
        steps = [c["step"] for c in rows]
        span = _warmup_span(r["train"]["curve"])
        if span:
            ax.axvspan(span[0], span[1], color="0.9", lw=0, label="warm-up (gates not live)")
        for g in range(max(len(c["gate_median"]) for c in rows)):
            vals = [c["gate_median"][g] if g < len(c["gate_median"]) else float("nan") for c in rows]
            # Gates often sit on the same value (all near 1 early, or all at the floor): a marker of their own,
            # staggered, keeps each visible where the lines coincide.
            every = max(1, len(steps) // 6)
            ax.plot(steps, [max(v, _FLOOR) for v in vals], lw=1.3, color=plt.get_cmap("tab10")(g),
                    marker=LINE_MARKERS[g % len(LINE_MARKERS)], ms=4, mfc="none",
                    markevery=(g * every // 3 % every, every), label=f"gate {g + 1} (after pass {g + 1})")
        tau = rows[-1].get("tau")
        if tau:
            ax.axhline(tau, color="k", ls=":", lw=1, label=f"τ = {tau:g}")
        ax.set_yscale("log")
        ax.set_title(result_id(r), fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes[:, 0]:
        readable_log_ticks(ax, "y")  # shared y: one locator serves every panel
        ax.set_ylabel("median gate value s", fontsize=8)
    for col in range(ncols):  # the lowest panel shown in each column (the last row may be short)
        rows_shown = [row for row in range(nrows) if row * ncols + col < len(shown)]
        axes[rows_shown[-1], col].set_xlabel("step", fontsize=8)
    handles, labels = unique_handles(*axes.flat[:len(shown)])  # warm-up shading may appear on a later panel only
    fig.suptitle("Gates during training: median gate value per gate (log scale)", fontsize=10)
    legend_outside(axes[0, -1], handles, labels)
    footer(fig, note, fontsize=6)
    return fig


def gate_curves_png(results: Sequence[Mapping], path: Path, note: str) -> Path | None:
    fig = draw_gate_curves(results, note)
    return save(fig, path) if fig is not None else None


def _g(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.2g}"


def _pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.0%}"


def section(results: Sequence[Mapping], figs: Path, rel: Callable[[Path], str],
            data_note: Callable[[Sequence[Mapping]], str]) -> list[str]:
    """Markdown for the gate section (empty when no result carries gate statistics); ``data_note(shown)`` is the
    plot's footnote for the results it shows."""
    shown = _shown(results)
    if not shown:
        return []
    L = ["## Gates during training\n",
         "Per gate (gate g decides after pass g): its median value at the last logged step, the lowest median any "
         "logged step saw, the share of the tokens reaching it that it halted, and the share of all tokens that "
         "passes 2..K ran for, at the last logged step (training batch). A median below τ means the gate halts "
         "most of the tokens that reach it — the purpose of a gate after training, but a dead gate when "
         "cross-entropy alone drove it there before the ponder loss started, or when the passes after it run for almost no token: "
         "the two signs the trainer's collapse alarm watches (its warning is in the run's log and report).\n",
         "| arm | seed | warm-up | final median s per gate | lowest median per gate | halt share per gate | "
         "passes 2..K active |",
         "|---|---:|---|---|---|---|---|"]
    for r in shown:
        rows = gate_rows(r)
        n = max(len(c["gate_median"]) for c in rows)
        low = [min(c["gate_median"][g] for c in rows if g < len(c["gate_median"])) for g in range(n)]
        last = rows[-1]
        halt = last.get("gate_halt_share") or []
        warm = next((c["gate_warmup"].split()[0] for c in r["train"]["curve"]
                     if c.get("gate_warmup") not in (None, "live")), "none")
        L.append(f"| {r['arm']} | {r['seed']} | {warm} | {' / '.join(_g(x) for x in last['gate_median'])} | "
                 f"{' / '.join(_g(x) for x in low)} | {' / '.join(_pct(x) for x in halt) or '–'} | "
                 f"{' / '.join(_pct(x) for x in (last.get('active_fraction') or [])[1:]) or '–'} |")
    png = gate_curves_png(shown, figs / "gate_curves.png", data_note(shown))
    L.append(f"\n![Gates during training]({rel(png)})\n")
    return L


__all__ = ["draw_gate_curves", "gate_curves_png", "gate_rows", "section"]
