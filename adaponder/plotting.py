"""The shared look of every figure (evaluation report, study, training report): the Agg backend, one colour
per study arm and one marker per halting policy (the same in every plot), legends outside the axes, plain
numbers on log axes, footers that fit the figure, and saving.

Every ``draw_*`` function of the report modules returns its :class:`~matplotlib.figure.Figure`, so a test can
measure the layout of what the ``*_png`` function saves.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

#: One colour per arm of the studies; an arm not listed gets a stable colour of ``_SPARE`` from its name.
ARM_COLORS = {
    "vanilla": "#7f7f7f", "vanilla-deep": "#17becf", "ponderlm": "#ff7f0e", "ponderlm-k1": "#bcbd22",
    "loop": "#2ca02c", "pause": "#d62728", "adaponder-paper": "#1f77b4", "adaponder-strong": "#9467bd",
    "adaponder-warm": "#8c564b", "adaponder-floor": "#e377c2", "adaponder-floor-strong": "#393b79",
    "adaponder-warm-strong": "#637939",
}
_SPARE = ["#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#a55194"]

#: One marker per halting policy: the model as trained (its own gates at the trained τ), the τ dial, the
#: fixed-pruning controls at the learned mean exit pass, all passes, and the first pass alone.
POLICY_MARKERS = {"as trained": "o", "learned": "o", "τ dial": ".", "uniform": "^", "geometric": "v",
                  "no halting": "D", "first pass only": "s"}
#: Colours of the policies where one model is shown (the evaluation report has no arms to colour).
POLICY_COLORS = {"learned": "#1f77b4", "uniform": "#ff7f0e", "geometric": "#2ca02c", "no halting": "#7f7f7f",
                 "first pass only": "#000000"}
#: Hatching of the fixed-pruning bars where bars carry the arm's colour.
POLICY_HATCH = {"learned": "", "uniform": "///", "geometric": "\\\\\\"}
#: Markers that tell apart lines of one plot beyond their colour (drawn every few points, staggered).
LINE_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p"]


def arm_color(arm: str) -> str:
    return ARM_COLORS.get(arm) or _SPARE[zlib.crc32(arm.encode()) % len(_SPARE)]


def figure(width: float, height: float, **kw):
    """A figure whose layout engine keeps legends placed ``outside`` and the footer inside the figure."""
    return plt.figure(figsize=(width, height), layout="constrained", **kw)


def readable_log_ticks(ax, axis: str = "y") -> None:
    """Plain-number ticks on a log axis: evenly spaced round numbers within a decade or so, 1-2-5 steps over
    two decades, powers of ten (thinned) beyond, and never the lone ``10^x`` label a short log range gets by
    default. Call after the data (or the limits) are set."""
    ax_ = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    if lo > 0 and hi / lo < 30:
        ax_.set_major_locator(ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    else:
        decades = math.log10(hi / lo) if lo > 0 else math.inf
        ax_.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,),
                                                numticks=8))
    ax_.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_.set_minor_formatter(ticker.NullFormatter())


def budget_ticks(ax, values: Sequence[float], axis: str = "x") -> None:
    """Ticks exactly at ``values`` (e.g. the token budgets of a trend), labelled as plain numbers."""
    ax_ = ax.xaxis if axis == "x" else ax.yaxis
    ax_.set_major_locator(ticker.FixedLocator(sorted(set(values))))
    ax_.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax_.set_minor_locator(ticker.NullLocator())


def footer(fig, note: str, fontsize: float = 7) -> None:
    """The data note under everything else (legends placed ``lower center`` included), wrapped to the figure's
    width: the layout engine lays the figure out above a strip kept for it."""
    if not note:
        return
    chars = max(40, int(fig.get_figwidth() * 72 / (fontsize * 0.62)))
    lines = textwrap.wrap(note, chars)
    strip = (len(lines) * fontsize * 1.35 + 8) / (fig.get_figheight() * 72)
    fig.get_layout_engine().set(rect=(0, strip, 1, 1 - strip))
    fig.text(0.01, 0.004, "\n".join(lines), fontsize=fontsize, ha="left", va="bottom")


def legend_outside(owner, handles, labels, where: str = "upper", **kw):
    """A legend outside the plotting area. ``owner`` an Axes: beside its right edge, at its top (``upper``) or
    bottom (``lower``), kept within the axes' height so it never reaches the footer; a second legend beside the
    same axes keeps the first. ``owner`` a Figure: a figure legend at ``outside <where>`` (``lower center``)."""
    if not handles:
        return None
    kw.setdefault("fontsize", 8)
    if not hasattr(owner, "get_legend"):
        return owner.legend(handles, labels, loc=f"outside {where}", **kw)
    if owner.get_legend() is not None:
        owner.add_artist(owner.get_legend())
    anchor = (1.02, 1.0) if where == "upper" else (1.02, 0.0)
    return owner.legend(handles, labels, loc=f"{where} left", bbox_to_anchor=anchor, borderaxespad=0, **kw)


def unique_handles(*axes) -> tuple[list, list[str]]:
    """The legend entries of ``axes``, each label once (first one wins)."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels and not lab.startswith("_"):
                handles.append(h)
                labels.append(lab)
    return handles, labels


def short_path(p: str | Path) -> str:
    """A path as a footer shows it: relative paths as given, an absolute one by its last two parts (a footer
    must not carry one machine's folders)."""
    p = Path(p)
    return p.as_posix() if not p.is_absolute() else "…/" + "/".join(p.parts[-2:])


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


__all__ = ["ARM_COLORS", "LINE_MARKERS", "POLICY_COLORS", "POLICY_HATCH", "POLICY_MARKERS", "arm_color",
           "budget_ticks", "figure", "footer", "legend_outside", "readable_log_ticks", "save", "short_path",
           "unique_handles"]
