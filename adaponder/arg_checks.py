"""Checks of a command's own arguments, before any work: one :class:`~adaponder.errors.UsageError` whose message
names the argument, the value given and what was expected (``--gammas '2,0': γ 0 is not >= 1; expected
comma-separated integers >= 1``). argparse's ``type=int`` covers one number; these cover lists and limits."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
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


def name_list(text: str, arg: str, choices: Collection[str], what: str) -> list[str]:
    """``text`` (comma-separated) as a list of names, each one of ``choices``; ``what`` names one in the message
    (e.g. ``dtype``)."""
    names = text.split(",")
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise UsageError(f"{arg} {text!r}: {unknown[0]!r} is not a {what} here; expected a comma-separated list of "
                         f"{', '.join(choices)}")
    return names


def counts(args: Any, names: Iterable[str]) -> None:
    """Each of ``args``' attributes ``names`` (option ``--a-name`` for ``a_name``) an integer >= 1."""
    for name in names:
        number_list(str(getattr(args, name)), "--" + name.replace("_", "-"), int, 1)


@contextmanager
def exit_on_usage_error() -> Iterator[None]:
    """For scripts without :func:`adaponder.cli.errors.cli_main`: a :class:`UsageError` raised inside becomes one
    ``error:`` line on stderr and exit code 2."""
    try:
        yield
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


__all__ = ["counts", "exit_on_usage_error", "name_list", "number_list"]
