"""Which decoding combinations a model takes: mode × schedule × draft × compile × left padding × sampling.

Every combination either runs (and gives the eager token-by-token decoding's greedy tokens, or its distribution when
sampling) or is refused before any forward with one line naming the nearest combination that runs. The table in the
README is :func:`markdown_table`'s output, so the docs cannot drift from what :func:`refusal` decides.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .config import SCHEDULES

MODES = ("vanilla", "ponderlm", "loop", "adaponder", "pause")

#: Modes whose passes the static cache's step runs (the pause mode's extra positions live in the cached forward only).
STATIC_MODES = ("vanilla", "ponderlm", "loop", "adaponder")
#: Modes with K >= 2 pondering passes to draft with (vanilla has one pass).
DRAFT_MODES = ("ponderlm", "loop", "adaponder")
#: Modes the tick layout runs (every row at its own pass; the loop mode feeds back hidden states it does not keep).
TICK_MODES = ("vanilla", "ponderlm", "adaponder")
PIPELINE_MODES = ("ponderlm", "adaponder")


@dataclass(frozen=True)
class Combination:
    mode: str
    schedule: str = "token"
    draft: bool = False
    compile: bool = False
    padded: bool = False
    sampling: bool = False

    def describe(self) -> str:
        parts = [f"schedule={self.schedule!r}"]
        if self.draft:
            parts.append("a draft")
        parts.append("compiled" if self.compile else "eager")
        parts.append("left padding" if self.padded else "no padding")
        parts.append("sampling" if self.sampling else "greedy")
        return ", ".join(parts)

    def spelled(self) -> str:
        """How to ask for it: the ``DecodingConfig`` and what the inputs must be."""
        args = [f"schedule={self.schedule!r}"] if self.schedule != "token" else []
        if self.draft:
            args.append("draft=SpeculativeConfig(...)")
        if self.compile:
            args.append("compile=True")
        return f"DecodingConfig({', '.join(args)})" + \
            f" ({'left padding' if self.padded else 'no padding'}, {'sampling' if self.sampling else 'greedy'})"


def refusal(c: Combination) -> str | None:
    """None when ``c`` runs; else why not, in a few words."""
    if c.mode not in MODES:
        return f"unknown mode {c.mode!r}"
    if c.schedule not in SCHEDULES:
        return f"unknown schedule {c.schedule!r}"
    if c.mode == "pause" and (c.schedule != "token" or c.draft or c.compile):
        return "the pause mode's extra positions are inserted by the eager cached forward only"
    if c.schedule == "token":
        if c.draft and c.mode not in DRAFT_MODES:
            return f"drafting needs passes to verify with (modes {', '.join(DRAFT_MODES)})"
        return None
    if c.draft:
        return f"the {c.schedule!r} schedule takes no draft config" + \
            (" (it drafts from pass 1 by itself)" if c.schedule == "pipelined" else "")
    if c.compile:
        return f"the {c.schedule!r} schedule runs eagerly"
    if c.sampling:
        return f"the {c.schedule!r} schedule decodes greedily"
    modes = TICK_MODES if c.schedule == "depth" else PIPELINE_MODES
    if c.mode not in modes:
        return f"the {c.schedule!r} schedule runs modes {', '.join(modes)}"
    return None


def every_combination(modes=MODES):
    for mode, schedule, draft, compiled, padded, sampling in itertools.product(
            modes, SCHEDULES, (False, True), (False, True), (False, True), (False, True)):
        yield Combination(mode, schedule, draft, compiled, padded, sampling)


def nearest(c: Combination) -> Combination:
    """The supported combination of the same mode closest to ``c``: the inputs (padding, sampling) kept where
    possible, then the fewest settings changed, ties broken by the table's order."""
    def distance(o: Combination):
        inputs = (o.padded != c.padded) + (o.sampling != c.sampling)
        settings = (o.schedule != c.schedule) + (o.draft != c.draft) + (o.compile != c.compile)
        return inputs, settings
    return min((o for o in every_combination((c.mode,)) if refusal(o) is None), key=distance)


def refusal_line(c: Combination) -> str | None:
    """The one line :func:`~.engine.generate_with` raises for an unsupported combination, or None."""
    why = refusal(c)
    if why is None:
        return None
    return f"decoding a {c.mode!r} model with {c.describe()} is not supported: {why}; nearest that works: " \
           f"{nearest(c).spelled()}"


def markdown_table() -> str:
    """Rows: schedule × draft × compile; columns: modes; a cell names what runs (greedy / left padding / sampling)."""
    head = "| schedule | draft | compiled | " + " | ".join(f"`{m}`" for m in MODES) + " |"
    lines = [head, "|" + "---|" * (3 + len(MODES))]
    for schedule, draft, compiled in itertools.product(SCHEDULES, (False, True), (False, True)):
        cells = []
        for mode in MODES:
            runs = [(p, s) for p in (False, True) for s in (False, True)
                    if refusal(Combination(mode, schedule, draft, compiled, p, s)) is None]
            if not runs:
                cells.append("—")
                continue
            words = ["greedy"] if (False, False) in runs else []
            if any(p for p, _ in runs):
                words.append("padding")
            if any(s for _, s in runs):
                words.append("sampling")
            cells.append(", ".join(words))
        lines.append(f"| `{schedule}` | {'γ, P' if draft else '—'} | {'yes' if compiled else 'no'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["Combination", "MODES", "every_combination", "markdown_table", "nearest", "refusal", "refusal_line"]
