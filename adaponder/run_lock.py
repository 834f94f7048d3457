"""One writer per output folder: an exclusive OS file lock held for the whole run.

Two jobs writing one run folder (a scheduler requeueing a job while the old one still runs, the same command
started twice) would interleave their metrics, checkpoints and exports with no error. A job therefore takes
``fcntl.flock`` on a lock file before it writes anything, and a second job on the same folder is refused at
once, naming the holder (host, PID, start time) that the lock file records. The OS releases the lock when the
holding process exits in any way (a crash or SIGKILL included), so no stale lock ever needs removing by hand;
the file a killed job leaves behind is simply taken over by the next one. A job that ends normally removes it.

flock works between processes of one machine and on most network filesystems that support it; on a
filesystem without working locks (some NFS setups) the lock cannot protect jobs on different nodes.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from adaponder.errors import UsageError, os_reason

LOCK_NAME = ".adaponder.lock"  # inside a run folder


class RunLockError(UsageError):
    """The folder is in use by another job (the message names it), or its lock file cannot be made."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (whose ever it is)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


class RunLock:
    """An exclusive, non-blocking flock on ``path``; :meth:`release` (or the process's exit) frees it."""

    def __init__(self, path: str | os.PathLike[str], what: str, created_dir: Path | None = None):
        self.path = Path(path)
        self.what = what  # e.g. "run folder /x/y", for the refusal message
        self.created_dir = created_dir  # made for the lock: removed on release if still empty
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        while True:  # (again when the file was removed by its releasing holder after we opened it)
            fd = self._try_lock()
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()}, PID {os.getpid()}, started {started}\n".encode(), 0)
        self._fd = fd
        return self

    def _try_lock(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise RunLockError(f"{self.what}: cannot create the lock file {self.path} "
                               f"({os_reason(err)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLockError(f"{self.what} is in use by another job ({holder}; lock file {self.path}); "
                               "wait for it to finish, stop it, or choose another output folder") from None
        except OSError as err:
            os.close(fd)
            raise RunLockError(f"{self.what}: cannot lock {self.path} ({err.strerror or err}); the filesystem "
                               "may not support file locks") from None
        return fd

    def release(self) -> None:
        """Remove the lock file and free the lock (idempotent). A job that opened the file meanwhile finds it
        gone once it gets the lock, and starts over on a new file (see :meth:`acquire`)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass
            os.close(fd)  # closing the only descriptor releases the flock
            if self.created_dir is not None:
                try:  # (a run that failed before writing anything leaves no empty folder behind)
                    self.created_dir.rmdir()
                except OSError:
                    pass

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire() if not self.held else self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder not yet recorded: it has just started"


def lock_folder(folder: str | os.PathLike[str], what: str = "run folder") -> RunLock:
    """Create ``folder`` if needed and lock it for this process (``folder/.adaponder.lock``); raises
    :class:`RunLockError` naming the holder when another job has it."""
    folder = Path(folder)
    created = None if folder.exists() else folder
    return RunLock(folder / LOCK_NAME, f"{what} {folder}", created).acquire()


def lock_beside(target: str | os.PathLike[str], what: str = "output folder") -> RunLock:
    """Lock a folder that is created only at the end (renamed into place): ``.NAME.lock`` beside it."""
    target = Path(target)
    return RunLock(target.parent / f".{target.name}.lock", f"{what} {target}").acquire()


__all__ = ["LOCK_NAME", "RunLock", "RunLockError", "lock_beside", "lock_folder", "pid_alive"]
