"""What counts as a user error, and how it reads on one line.

An exception of one of the project's user-error types — a bad configuration, data, checkpoint or argument, a
path that does not exist, token ids the model cannot embed — is something the user can fix; any other exception
is a bug. The command-line wrapper (:func:`adaponder.cli.errors.cli_main`) prints the first kind as one
``error:`` line and keeps the traceback of the second; the library raises and classifies, and prints nothing.
``--debug`` (handled by the wrapper) or ``ADAPONDER_DEBUG=1`` keeps the traceback of user errors too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from adaponder.hub import is_hub_id, resolve_pretrained

# (module, class) of the project's user errors. Looked up in sys.modules only: a class whose module was never
# imported cannot have been raised, so classifying an error imports nothing (no torch/DeepSpeed start-up).
_PROJECT_ERRORS = (
    ("adaponder.typed_config", "ConfigError"),  # training, fine-tuning and study configurations
    ("adaponder.modeling.configuration_adaponder", "AdaPonderConfigError"),
    ("adaponder.modeling.modeling_adaponder", "TokenIdError"),  # ids outside the vocabulary, empty input
    ("adaponder.modeling.input_checks", "ModelInputError"),  # ids of a wrong dtype/shape, past the positions
    ("adaponder.data.errors", "DataError"),
    ("adaponder.palbert.glue_datasets", "GlueDatasetError"),
    ("adaponder.palbert.glue", "GlueDataError"),
    ("adaponder.hub", "HubError"),
    ("adaponder.train.checkpoint", "CheckpointError"),
    ("adaponder.train.export", "ExportError"),
)
# OS errors about a path the user named; their message names the path.
_PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

_debug = False  # set by debug_tracebacks() for the duration of a command that got --debug


class UsageError(ValueError):
    """A command-line argument that cannot work (a missing checkpoint folder, a window beyond the context)."""


class OutputError(RuntimeError):
    """An output that could not be written (disk full, a quota, a read-only or vanished folder). The message names
    the path and what was being written; nothing the tool had written before is damaged."""


def os_reason(err: OSError) -> str:
    """The operating system's words for ``err`` (``No space left on device``), without the path it repeats; for
    the errors whose words alone do not say what is wrong (``File exists``, ``Read-only file system``), the
    path the OS refused and the cause."""
    words = err.strerror or str(err) or type(err).__name__
    where = err.filename if err.filename is not None else None
    causes = {errno.EEXIST: "a file, not a folder, is in the way at {}",
              errno.ENOTDIR: "a part of {} is a file, not a folder",
              errno.EROFS: "{} lies on a file system mounted read-only",
              errno.EACCES: "this user may not write to {}",
              errno.EPERM: "this user may not write to {}"}
    cause = causes.get(err.errno)
    return f"{words}: {cause.format(where)}" if cause and where is not None else words


# What torch.save's zip writer raises when a write fails (a full disk gives no OSError there).
_TORCH_WRITE_FAILURES = ("iostream error", "inline_container", "PytorchStreamWriter", "unexpected pos")


def write_failure_reason(err: BaseException, folder: str | os.PathLike[str]) -> str | None:
    """Why writing into ``folder`` failed, in the operating system's words, or ``None`` when ``err`` is not a
    write failure. ``torch.save`` reports a full disk as a ``RuntimeError`` from its zip writer; the free space
    left on ``folder``'s file system tells that case apart from other write errors."""
    if isinstance(err, OSError):
        return os_reason(err)
    if not isinstance(err, RuntimeError) or not any(m in str(err) for m in _TORCH_WRITE_FAILURES):
        return None
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if free is not None and free < 1 << 20:
        return f"No space left on device ({free:,} bytes free)"
    return f"write error: {one_line(str(err))}"


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Within the block, an ``OSError`` becomes one :class:`OutputError`: ``could not write <what> <path>
    (<reason>)`` — e.g. a full disk while appending to ``metrics.jsonl`` — instead of a traceback."""
    try:
        yield
    except OutputError:
        raise
    except OSError as err:
        raise OutputError(f"could not write {what} {path} ({os_reason(err)})") from err


@contextlib.contextmanager
def debug_tracebacks(on: bool) -> Iterator[None]:
    """Within the block, user errors keep their traceback when ``on`` (nested blocks never switch it off)."""
    global _debug
    saved, _debug = _debug, _debug or on
    try:
        yield
    finally:
        _debug = saved


def debug_requested() -> bool:
    """Whether user errors should keep their traceback (``--debug`` or ``ADAPONDER_DEBUG=1``)."""
    return _debug or os.environ.get("ADAPONDER_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is something the user can fix (see the module doc), as opposed to a bug."""
    if isinstance(err, (UsageError, OutputError, *_PATH_ERRORS)):
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


def require_checkpoint(path: str | os.PathLike[str], label: str = "checkpoint", revision: str | None = None) -> Path:
    """``path`` as a Path if it is a Hugging Face checkpoint folder (holds ``config.json``), else
    :class:`UsageError` naming it — rather than transformers' hub error for a name that is not a repo id. A hub id
    (``org/name``, at ``revision``) is resolved to its local snapshot folder as ``init.backbone`` is
    (:func:`adaponder.hub.resolve_pretrained`; its :class:`~adaponder.hub.HubError` names the id)."""
    if revision or is_hub_id(path):
        return resolve_pretrained(path, revision)
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{label} {path}: no such folder (expected a checkpoint folder with config.json)")
    if not (p / "config.json").is_file():
        raise UsageError(f"{label} {path}: not a checkpoint folder (no config.json in it)")
    return p


__all__ = ["OutputError", "UsageError", "debug_requested", "debug_tracebacks", "is_user_error", "one_line", "os_reason",
           "require_checkpoint", "write_failure_reason", "writing"]
