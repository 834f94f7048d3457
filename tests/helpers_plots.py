"""Layout checks of a rendered matplotlib Figure: every visible text box (titles, axis and tick labels,
annotations, legend entries, footers) inside the figure, no two of them overlapping, and every annotation
inside its axes (off the spines)."""

from __future__ import annotations

import math

import numpy as np

from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from matplotlib.text import Annotation, Text

#: Pixels two boxes may share before they count as overlapping (anti-aliasing, rounding).
TOLERANCE = 1.0


def _drawn_tick_labels(fig) -> tuple[set[int], set[int]]:
    """(ids of every tick label object, ids of those the axes actually draw: ticks inside the view)."""
    every, drawn = set(), set()
    axes = list(fig.axes) + [c for ax in fig.axes for c in ax.child_axes]
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) or 1.0
            for ticks in (axis.get_major_ticks(), axis.get_minor_ticks()):
                for tick in ticks:
                    every |= {id(tick.label1), id(tick.label2)}
            for minor in (False, True):
                locs = axis.get_minorticklocs() if minor else axis.get_majorticklocs()
                ticks = axis.get_minor_ticks(len(locs)) if minor else axis.get_major_ticks(len(locs))
                for loc, tick in zip(locs, ticks):
                    if lo - 1e-9 * span <= loc <= hi + 1e-9 * span:
                        drawn |= {id(tick.label1), id(tick.label2)}
    return every, drawn


def text_boxes(fig) -> list[tuple[Text, object]]:
    """Every text the figure draws, with its box in display pixels."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    every_tick, drawn_tick = _drawn_tick_labels(fig)
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or (t.get_alpha() == 0):
            continue
        if id(t) in every_tick and id(t) not in drawn_tick:
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        out.append((t, t.get_window_extent(renderer)))
    return out


def _area(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0) if w > TOLERANCE and h > TOLERANCE else 0.0


def layout_problems(fig) -> list[str]:
    """What is wrong with the layout (empty when nothing is)."""
    boxes = text_boxes(fig)
    fb = fig.bbox
    problems = []
    for t, b in boxes:
        if b.x0 < fb.x0 - TOLERANCE or b.y0 < fb.y0 - TOLERANCE or b.x1 > fb.x1 + TOLERANCE or b.y1 > fb.y1 + TOLERANCE:
            problems.append(f"outside the figure: {t.get_text()!r}")
        if isinstance(t, Annotation) and t.axes is not None:
            ab = t.axes.bbox
            if b.x0 <= ab.x0 + TOLERANCE or b.y0 <= ab.y0 + TOLERANCE or b.x1 >= ab.x1 - TOLERANCE \
                    or b.y1 >= ab.y1 - TOLERANCE:
                problems.append(f"annotation on or past the axes' edge: {t.get_text()!r}")
    for i, (t, b) in enumerate(boxes):
        for u, c in boxes[i + 1:]:
            if _area(b, c) > 0:
                problems.append(f"overlap: {t.get_text()!r} and {u.get_text()!r}")
    return problems


def _markers(ax) -> list[tuple[object, float, float, float, bool, float]]:
    """(artist, x, y, radius in pixels, filled, z) of every marker the axes draws."""
    px = ax.figure.dpi / 72
    out = []
    for i, line in enumerate(ax.lines):
        if line.get_marker() in (None, "", "None", " ", "_", "|") or not line.get_visible():
            continue  # no marker, or an error bar's cap (a stroke at the bar's end, not a data point)
        face = line.get_markerfacecolor()
        filled = face not in ("none", "None") and to_rgba(face, line.get_alpha())[3] >= 0.6
        xy = line.get_transform().transform(line.get_xydata())
        every = line.get_markevery()
        idx = range(len(xy)) if every is None else range(len(xy))[slice(every[0], None, every[1])] \
            if isinstance(every, tuple) else range(len(xy))
        for k in idx:
            out.append((line, xy[k][0], xy[k][1], line.get_markersize() / 2 * px, filled, line.get_zorder() + i * 1e-6))
    for i, coll in enumerate(ax.collections):
        if not isinstance(coll, PathCollection) or not coll.get_visible():
            continue
        xy = coll.get_offset_transform().transform(coll.get_offsets())
        faces, sizes = coll.get_facecolors(), coll.get_sizes()
        for k, (x, y) in enumerate(xy):
            face = faces[k % len(faces)] if len(faces) else None
            filled = face is not None and face[3] * (coll.get_alpha() if coll.get_alpha() is not None else 1) >= 0.6
            r = math.sqrt(sizes[k % len(sizes)]) / 2 * px if len(sizes) else 3 * px
            out.append((coll, x, y, r, filled, coll.get_zorder() + (len(ax.lines) + i) * 1e-6))
    return out


def hidden_markers(fig) -> list[str]:
    """Markers drawn wholly under a filled marker of another artist (the one on top covers it)."""
    fig.canvas.draw()
    problems = []
    for ax in list(fig.axes) + [c for a in fig.axes for c in a.child_axes]:
        marks = _markers(ax)
        for a in marks:
            for b in marks:
                if a[0] is b[0] or not b[4] or b[5] <= a[5]:
                    continue  # b must be another artist's filled marker drawn above a
                if math.hypot(a[1] - b[1], a[2] - b[2]) + a[3] <= b[3] + 0.5:
                    problems.append(f"a marker of {a[0].get_label()!r} is hidden under {b[0].get_label()!r}")
    return sorted(set(problems))


def legends_inside_axes(fig) -> list[str]:
    """Legends drawn over an axes' plotting area or over a text outside them (a footer, a title)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    out = []
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for leg in legends:
        lb = leg.get_window_extent(r)
        for ax in fig.axes:
            if ax.get_visible() and ax.axison and _area(lb, ax.bbox) > 0:
                out.append(f"legend over an axes: {[t.get_text() for t in leg.get_texts()][:2]}")
        own = {id(t) for t in leg.findobj(Text)}
        for t, b in text_boxes(fig):
            if id(t) not in own and _area(lb, b) > 0:
                out.append(f"legend {[t.get_text() for t in leg.get_texts()][:1]} over the text {t.get_text()!r}")
    return out


def unreadable_log_axes(fig) -> list[str]:
    """Log axes with fewer than two tick labels, or with ``10^x`` labels instead of plain numbers."""
    fig.canvas.draw()
    out = []
    _, drawn = _drawn_tick_labels(fig)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log" or not any(t.label1.get_visible() for t in axis.get_major_ticks()):
                continue  # a linear axis, or one whose labels a shared neighbour shows
            labels = [t.get_text() for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                      for t in (tick.label1,) if id(t) in drawn and t.get_visible() and t.get_text().strip()]
            if len(labels) < 2 or any("$" in s or "^" in s for s in labels):
                out.append(f"log axis {axis.axis_name} of {ax.get_title()!r}: tick labels {labels}")
    return out


def indistinct_lines(fig) -> list[str]:
    """Labelled lines of one axes that share colour, line style and marker (one would hide the other)."""
    out = []
    for ax in fig.axes:
        seen = {}
        for line in ax.lines:
            if line.get_label().startswith("_"):
                continue
            key = (to_rgba(line.get_color()), line.get_linestyle(), line.get_marker())
            if key in seen:
                out.append(f"{line.get_label()!r} looks like {seen[key]!r}")
            seen.setdefault(key, line.get_label())
    return out


def _plain(line) -> bool:
    return line.get_marker() in (None, "", "None", " ")


def lines_under_lines(fig, pixels: float = 3.0) -> list[str]:
    """Labelled lines without markers that run within ``pixels`` of another one of the same style over most of
    their length: the one drawn first disappears under the other."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        lines = [ln for ln in ax.lines if not ln.get_label().startswith("_") and len(ln.get_xydata()) > 2]
        for i, a in enumerate(lines):
            for b in lines[i + 1:]:
                if not (_plain(a) and _plain(b)) or a.get_linestyle() != b.get_linestyle():
                    continue
                pa = a.get_transform().transform(a.get_xydata())
                pb = b.get_transform().transform(b.get_xydata())
                order = pb[:, 0].argsort()
                yb = np.interp(pa[:, 0], pb[order, 0], pb[order, 1], left=np.nan, right=np.nan)
                close = np.abs(pa[:, 1] - yb) < pixels
                if np.nansum(close) > 0.5 * len(pa):
                    out.append(f"{a.get_label()!r} runs under {b.get_label()!r}")
    return out


def all_problems(fig) -> list[str]:
    return (layout_problems(fig) + hidden_markers(fig) + legends_inside_axes(fig) + unreadable_log_axes(fig)
            + indistinct_lines(fig) + lines_under_lines(fig))


__all__ = ["all_problems", "hidden_markers", "indistinct_lines", "layout_problems", "legends_inside_axes", "lines_under_lines",
           "text_boxes", "unreadable_log_axes"]
