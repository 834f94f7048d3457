"""User errors on the command line: one ``error:`` line and exit code 2 instead of a traceback.

Every console entry point's ``main`` is wrapped by :func:`cli_main`. An exception that
:func:`adaponder.errors.is_user_error` classifies as the user's is printed as ``error: <message on one line>`` on
stderr (by rank 0 only in a distributed run: every rank sees the same inputs) and the command exits with 2. Any
other exception is a bug and keeps its traceback. ``--debug`` anywhere on the command line (taken out before the
arguments are parsed) or ``ADAPONDER_DEBUG=1`` shows the traceback of user errors too.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence

from adaponder.errors import UsageError, debug_requested, debug_tracebacks, is_user_error, one_line, require_checkpoint

EXIT_USER_ERROR = 2
EXIT_NONFINITE = 3  # a NaN/inf result (as pretraining's non-finite run): reported, never passed off as a number
DEBUG_FLAG = "--debug"
DEBUG_HELP = "show the full traceback of an error instead of one 'error:' line (or set ADAPONDER_DEBUG=1)"


def report(err: BaseException) -> int:
    """Print ``error: <one line>`` (rank 0 only) and return the exit code 2."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"error: {one_line(str(err)) or type(err).__name__}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


def cli_main(main: Callable[[list[str]], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a console entry point ``main(argv) -> exit code``: user errors become one line and exit code 2.

    The wrapper takes ``argv`` (default ``sys.argv[1:]``), removes ``--debug`` from it and calls ``main`` with
    the rest, so ``main``'s parser need not know the flag (``add_debug_help`` lists it in ``--help``)."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        with debug_tracebacks(DEBUG_FLAG in args):
            try:
                return main([a for a in args if a != DEBUG_FLAG])
            except Exception as err:
                if debug_requested() or not is_user_error(err):
                    raise
                return report(err)

    return wrapper


def add_debug_help(parser) -> None:
    """List ``--debug`` in an argparse parser's help (the flag itself is handled by :func:`cli_main`)."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)


__all__ = ["EXIT_NONFINITE", "EXIT_USER_ERROR", "UsageError", "add_debug_help", "cli_main", "debug_requested",
           "is_user_error", "one_line", "report", "require_checkpoint"]
