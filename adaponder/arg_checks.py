"""Checks of a command's own arguments, before any work: one :class:`~adaponder.errors.UsageError` whose message
names the argument, the value given and what was expected (``--gammas '2,0': γ 0 is not >= 1; expected
comma-separated integers >= 1``). argparse's ``type=int`` covers one number; these cover lists and limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adaponder.errors import UsageError


def number_list(text: str, arg: str, kind: type = int, minimum: float | None = None, what: str = "",
                check: Callable[[Any], bool] | None = None, expected: str = "") -> list:
    """``text`` (comma-separated) as a list of ``kind`` (int or float), each ``>= minimum`` and passing
    ``check``; ``what`` names one item in the message (e.g. ``batch size``)."""
    noun = "integers" if kind is int else "numbers"
    expected = expected or f"comma-separated {noun}" + (f" >= {minimum:g}" if minimum is not None else "")
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise UsageError(f"{arg} {text!r}: empty; expected {expected}")
    out = []
    for item in items:
        if not item:
            raise UsageError(f"{arg} {text!r}: an empty item (two commas, or a trailing one); expected {expected}")
        try:
            value = kind(item)
        except ValueError:
            raise UsageError(f"{arg} {text!r}: {item!r} is not {'an integer' if kind is int else 'a number'}; "
                             f"expected {expected}") from None
        if (minimum is not None and value < minimum) or (check is not None and not check(value)):
            raise UsageError(f"{arg} {text!r}: {what or 'value'} {item} is out of range; expected {expected}")
        out.append(value)
    return out


__all__ = ["number_list"]
