"""A prepared data folder that a run is reading cannot be replaced under it.

``adaponder-prepare --overwrite`` swaps a new folder in for the old one; a run that is reading the old one would
go on with memory maps of deleted files, or meet new shards of other sizes at its next resume. A run therefore
registers as a reader of each prepared folder it reads, for its whole life: an exclusive ``flock`` on its own
file ``DATA/.adaponder.readers/<host>-<pid>.lock``, which records the run folder, host, PID and start time. A
preparation that would replace the folder tries each reader file: one that is locked belongs to a live run, and
the preparation refuses, naming it (once before it starts, and again just before the swap). The OS releases the
lock when the run exits in any way, so a killed run's file is taken for stale and ignored.

A run registers only while no preparation holds the folder's own lock (``.NAME.lock`` beside it, see
:func:`adaponder.run_lock.lock_beside`): it takes that lock shared for the moment of registering, so a run cannot
slip in between a preparation's last check and its swap. A data folder the run cannot write to (a read-only
share) is not registered: nothing run by this user can replace it either.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from .errors import DataError

READERS = ".adaponder.readers"


class DataInUseError(DataError):
    """The data folder is being rewritten, or is read by a run that a rewrite would pull the data from under."""


class DataReader:
    """This process's registration as a reader of one prepared folder; :meth:`release` (or the exit) ends it."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
            self.path.parent.rmdir()  # (only when no other reader is left)
        except OSError:
            pass
        os.close(fd)


def hold_data(folder: str | os.PathLike[str], user: str) -> DataReader | None:
    """Register this process (``user``: e.g. ``run folder runs/x``) as a reader of the prepared ``folder``.
    Raises :class:`DataInUseError` while a preparation is rewriting it; ``None`` when ``folder`` is not a folder
    (an indexed prefix) or cannot be written to."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    beside = folder.parent / f".{folder.name}.lock"
    guard = _shared(beside, folder)
    try:
        readers = folder / READERS
        path = readers / f"{socket.gethostname()}-{os.getpid()}.lock"
        try:
            readers.mkdir(exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return None  # a folder we cannot write to: nothing we run can replace it either
        fcntl.flock(fd, fcntl.LOCK_EX)  # (our own file: never contended)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{user} (host {socket.gethostname()}, PID {os.getpid()}, started {started})".encode(), 0)
        return DataReader(path, fd)
    finally:
        if guard is not None:
            os.close(guard)


def _shared(lock_file: Path, folder: Path) -> int | None:
    """A shared flock on the preparation lock beside ``folder`` when that file exists (a preparation holds or
    just held it); refused while a preparation holds it exclusively."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "holder not yet recorded"
        os.close(fd)
        raise DataInUseError(f"data folder {folder} is being rewritten by adaponder-prepare ({holder}; lock file "
                             f"{lock_file}); wait for it to finish, then start the run") from None
    except OSError:
        os.close(fd)
        return None
    return fd


def live_readers(folder: str | os.PathLike[str]) -> list[str]:
    """What each live run reading ``folder`` recorded (run folder, host, PID, start); stale files are skipped."""
    found = []
    readers = Path(folder) / READERS
    try:
        paths = sorted(readers.iterdir())
    except OSError:
        return []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found.append(os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or path.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return found


def refuse_if_read(folder: str | os.PathLike[str]) -> None:
    """:class:`DataInUseError` naming the run when a live run reads ``folder`` (before replacing it)."""
    readers = live_readers(folder)
    if readers:
        more = f" and {len(readers) - 1} other run(s)" if len(readers) > 1 else ""
        raise DataInUseError(f"output folder {folder} is in use: it is the data of {readers[0]}{more}; replacing "
                             "it would change the data under that run. Wait for the run to finish or stop it, or "
                             "prepare into another folder")


__all__ = ["READERS", "DataInUseError", "DataReader", "hold_data", "live_readers", "refuse_if_read"]
