"""User errors on the command line: one ``error:`` line and exit code 2 instead of a traceback.

Every console entry point's ``main`` is wrapped by :func:`cli_main`. An exception of one of the project's
user-error types — a bad configuration, data, checkpoint or argument, a path that does not exist, token ids
the model cannot embed — is printed as ``error: <message on one line>`` on stderr (by rank 0 only in a
distributed run: every rank sees the same inputs) and the command exits with 2. Any other exception is a bug
and keeps its traceback. ``--debug`` anywhere on the command line (taken out before the arguments are
parsed) or ``ADAPONDER_DEBUG=1`` shows the traceback of user errors too.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_USER_ERROR = 2
DEBUG_FLAG = "--debug"
DEBUG_HELP = "show the full traceback of an error instead of one 'error:' line (or set ADAPONDER_DEBUG=1)"

# (module, class) of the project's user errors. Looked up in sys.modules only: a class whose module was never
# imported cannot have been raised, so classifying an error imports nothing (no torch/DeepSpeed start-up).
_PROJECT_ERRORS = (
    ("adaponder.typed_config", "ConfigError"),  # training, fine-tuning and study configurations
    ("adaponder.modeling.configuration_adaponder", "AdaPonderConfigError"),
    ("adaponder.modeling.modeling_adaponder", "TokenIdError"),  # ids outside the vocabulary, empty input
    ("adaponder.data.errors", "DataError"),
    ("adaponder.data.glue_datasets", "GlueDatasetError"),
    ("adaponder.palbert.glue", "GlueDataError"),
    ("adaponder.hub", "HubError"),
    ("adaponder.train.checkpoint", "CheckpointError"),
    ("adaponder.train.export", "ExportError"),
)
# OS errors about a path the user named; their message names the path.
_PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

_debug = False  # set for the duration of a wrapped call that got --debug


class UsageError(ValueError):
    """A command-line argument that cannot work (a missing checkpoint folder, a window beyond the context)."""


def debug_requested() -> bool:
    """Whether user errors should keep their traceback (``--debug`` or ``ADAPONDER_DEBUG=1``)."""
    return _debug or os.environ.get("ADAPONDER_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is something the user can fix (see the module doc), as opposed to a bug."""
    if isinstance(err, (UsageError, *_PATH_ERRORS)):
        return True
    for module, name in _PROJECT_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(err, cls):
            return True
    return False


def one_line(message: str) -> str:
    """``message`` on one line: a list such as a configuration error's ``N problem(s) in X:\\n  - a\\n  - b``
    becomes ``N problem(s) in X: a; b``."""
    lines = [ln.strip().removeprefix("- ").strip() for ln in message.splitlines()]
    lines = [ln for ln in lines if ln]
    out = lines[0] if lines else ""
    for ln in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + ln
    return out


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
        global _debug
        args = list(sys.argv[1:] if argv is None else argv)
        flagged = DEBUG_FLAG in args
        saved, _debug = _debug, _debug or flagged
        try:
            return main([a for a in args if a != DEBUG_FLAG])
        except Exception as err:
            if debug_requested() or not is_user_error(err):
                raise
            return report(err)
        finally:
            _debug = saved

    return wrapper


def add_debug_help(parser) -> None:
    """List ``--debug`` in an argparse parser's help (the flag itself is handled by :func:`cli_main`)."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)


def require_checkpoint(path: str | os.PathLike[str], label: str = "checkpoint") -> Path:
    """``path`` as a Path if it is a Hugging Face checkpoint folder (holds ``config.json``), else
    :class:`UsageError` naming it — rather than transformers' hub error for a name that is not a repo id."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{label} {path}: no such folder (expected a checkpoint folder with config.json)")
    if not (p / "config.json").is_file():
        raise UsageError(f"{label} {path}: not a checkpoint folder (no config.json in it)")
    return p


__all__ = ["EXIT_USER_ERROR", "UsageError", "add_debug_help", "cli_main", "debug_requested", "is_user_error",
           "one_line", "report", "require_checkpoint"]
