"""Markdown tables of the evaluation reports: a header, one alignment per column, rows of formatted cells."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """``align``: one character per column, ``l`` (left) or ``r`` (right); default: the first column left, the
    others right (labels, then numbers)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"{len(header)} columns but {len(align)} alignments ({align!r})")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


__all__ = ["markdown_table"]
