"""DeepSpeed's CPU collectives (``deepspeed_shm_comm``): built once per Python environment, in that environment's
own folder, behind a lock that a killed process cannot leave held.

DeepSpeed compiles the extension through ``torch.utils.cpp_extension.load`` whenever it starts on the CPU. Left to
itself that build lands in one folder per user (``~/.cache/torch_extensions``), so every Python environment on the
machine (two checkouts' venvs, a wheel install) rebuilds the others' build; and torch's lock file holds no owner,
so a process killed while building leaves a lock that every later start waits on forever.

Here:

- each environment gets its own extensions folder (``TORCH_EXTENSIONS_DIR`` when the user set one), keyed by its
  interpreter prefix, Python and torch: environments never share, or rebuild, each other's build;
- ``adaponder build-extensions`` builds it once at set-up (``scripts/setup.sh`` does), so a run start finds it
  built; a run that finds it missing builds it once, for every later run of that environment;
- the build or load runs under an ``flock`` on a file of that folder: the kernel drops it when its holder dies, even
  by SIGKILL. Holding it, a torch lock file in our own folder can only be a dead build's, and is removed (said in one
  line). In a folder the user shared by setting ``TORCH_EXTENSIONS_DIR``, another program may be building: a torch
  lock is waited on while the build shows life (a process working in the build folder, or its files changing), and
  only a lock with no sign of life for ``ADAPONDER_BUILD_LOCK_TIMEOUT`` seconds gets the advice to delete it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from adaponder.errors import UsageError

#: The extensions a run start loads (DeepSpeed's CPU collectives).
RUN_START_EXTENSIONS = ("deepspeed_shm_comm",)
#: Seconds a torch build lock in a shared folder may show no sign of life before it is called dead
#: (``ADAPONDER_BUILD_LOCK_TIMEOUT``). A live build shows life (a compiler working in its folder) all along.
DEFAULT_TIMEOUT = 60.0
#: A file of the build folder written this recently counts as a sign of life.
RECENT_S = 10.0
OWNER_LOCK = "adaponder-owner.lock"
#: Holds the ``TORCH_EXTENSIONS_DIR`` that this project chose (so a value it set is not taken for the user's).
_SET_BY_US = "ADAPONDER_TORCH_EXTENSIONS_DIR"

Say = Callable[[str], None]


class ExtensionLockError(UsageError):
    """A build lock with no sign of life for the whole bound, in a folder this project does not own."""


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def lock_timeout() -> float:
    """``ADAPONDER_BUILD_LOCK_TIMEOUT`` in seconds (a positive number), or :data:`DEFAULT_TIMEOUT`."""
    raw = os.environ.get("ADAPONDER_BUILD_LOCK_TIMEOUT")
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"ADAPONDER_BUILD_LOCK_TIMEOUT={raw!r}: expected a positive number of seconds "
                         f"(default {DEFAULT_TIMEOUT:g})")
    return value


def environment_key() -> str:
    """What tells this Python environment from another: its prefix, Python and torch (a build is valid for these)."""
    import torch

    version = f"{sys.prefix}|{sys.version}|{torch.__version__}"
    return f"{Path(sys.prefix).name.lstrip('.') or 'python'}-{hashlib.sha256(version.encode()).hexdigest()[:12]}"


def environment_extensions_dir() -> Path:
    """This environment's own extensions folder (under ``$XDG_CACHE_HOME``, or ``~/.cache``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "adaponder" / "torch_extensions" / environment_key()


def use_environment_extensions_dir() -> tuple[Path, bool]:
    """Point ``TORCH_EXTENSIONS_DIR`` at this environment's own folder unless the user set one (their choice
    stands). Returns the folder and whether it is the project's own (True) or the user's (False). Child processes
    (the ranks of a launch) inherit the variable."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given and given != os.environ.get(_SET_BY_US):
        return Path(given), False
    # (a value this project set, here or in a parent process of perhaps another environment, is recomputed)
    folder = environment_extensions_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = os.environ[_SET_BY_US] = str(folder)
    return folder, True


def lock_path(name: str, root: Path | None = None) -> Path:
    """Where ``torch.utils.cpp_extension`` keeps the build lock of extension ``name``."""
    if root is None:
        from torch.utils import cpp_extension

        return Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
    return Path(root) / name / "lock"


def _processes_in(folder: Path) -> list[int]:
    """The processes (that this user may see) whose working directory is ``folder``: ninja and the compiler run
    there while torch builds."""
    found = []
    target = os.path.realpath(folder)
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/cwd") == target:
                    found.append(int(entry.name))
    return found


def _last_change(folder: Path) -> float:
    """The newest modification time among ``folder`` and its files (0 when it cannot be read)."""
    newest = 0.0
    with contextlib.suppress(OSError):
        newest = folder.stat().st_mtime
        for entry in os.scandir(folder):
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def shows_life(folder: Path, now: float | None = None) -> str | None:
    """Why a build in ``folder`` looks alive (a process working there, or a file written in the last
    :data:`RECENT_S` seconds), or None when nothing does."""
    pids = _processes_in(folder)
    if pids:
        return f"process {pids[0]} is working in it"
    age = (now if now is not None else time.time()) - _last_change(folder)
    if age < RECENT_S:
        return f"its files changed {age:.0f} s ago"
    return None


def _since(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")
    except FileNotFoundError:
        return None


def clear_dead_build_locks(root: Path, names=RUN_START_EXTENSIONS, say: Say | None = None) -> list[Path]:
    """In a folder this project owns, with its owner lock held: any torch build lock is a killed build's (a live
    one would hold the owner lock). Remove them, saying so; returns what was removed."""
    say = say or _say_stderr
    removed = []
    for name in names:
        path = lock_path(name, root)
        since = _since(path)
        if since is not None:
            path.unlink(missing_ok=True)
            say(f"removed {path}, left by a build of {name} that was killed ({since}); building it again")
            removed.append(path)
    return removed


def wait_for_live_builds(root: Path, names=RUN_START_EXTENSIONS, timeout: float | None = None, poll: float = 1.0,
                         say: Say | None = None) -> None:
    """In a folder shared with other programs: return once no torch build lock of ``names`` is held. A lock whose
    build shows life (:func:`shows_life`) is waited on, for as long as it lives; one that shows none for ``timeout``
    seconds raises :class:`ExtensionLockError` with the advice to delete it."""
    timeout = lock_timeout() if timeout is None else timeout
    say = say or _say_stderr
    for name in names:
        path = lock_path(name, root)
        told, lifeless_since = None, None
        while (since := _since(path)) is not None:
            alive = shows_life(path.parent)
            now = time.monotonic()
            if alive:
                lifeless_since = None
                if told != "alive":
                    say(f"waiting for a build of {name} in {path.parent} ({alive}; its lock held since {since})")
                    told = "alive"
            else:
                lifeless_since = lifeless_since if lifeless_since is not None else now
                if now - lifeless_since >= timeout:
                    raise ExtensionLockError(
                        f"the build lock {path} of extension {name} has been held since {since} with no sign of a "
                        f"build (no process working in {path.parent}, no file changed) for {timeout:g} s: a build "
                        f"that was killed leaves it behind. Delete it (rm {path}) and start again "
                        f"(ADAPONDER_BUILD_LOCK_TIMEOUT sets the wait)")
                if told != "lifeless":
                    say(f"waiting for {path} (a build of {name}, held since {since}, shows no sign of life; "
                        f"giving up after {timeout:g} s)")
                    told = "lifeless"
            time.sleep(poll)


@contextlib.contextmanager
def owner_lock(root: Path, say: Say | None = None) -> Iterator[None]:
    """Hold the exclusive ``flock`` of ``root`` (one builder or loader of this environment's extensions at a
    time). The kernel releases it when the holder exits, however it exits. A wait names the holder."""
    say = say or _say_stderr
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            say(f"waiting for {holder} to finish building or loading DeepSpeed's CPU collectives in {root}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def extensions_ready(say: Say | None = None) -> Iterator[Path]:
    """Around DeepSpeed's start on the CPU: this environment's extensions folder chosen, no dead build lock in the
    way, and one process at a time building or loading there. Yields the folder."""
    timeout = lock_timeout()  # (a bad value is named whichever folder is used)
    root, ours = use_environment_extensions_dir()
    with owner_lock(root, say):
        if ours:
            clear_dead_build_locks(root, say=say)
        else:
            wait_for_live_builds(root, timeout=timeout, say=say)
        yield root


def load_cpu_collectives(say: Say | None = None) -> Path | None:
    """Load DeepSpeed's CPU collectives into this process, building them first where this environment has no
    build; None where DeepSpeed needs none (an accelerator other than the CPU). DeepSpeed's op loader keeps the
    module for the process, so its own start loads nothing more. Returns the extensions folder. Call it before any
    rendezvous: the ranks of one machine take turns here."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return None
    with extensions_ready(say) as root:
        builder = accelerator.create_op_builder("ShareMemCommBuilder")
        if builder is not None and builder.is_compatible():
            builder.load(verbose=False)
    return root


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


__all__ = ["DEFAULT_TIMEOUT", "ExtensionLockError", "RUN_START_EXTENSIONS", "clear_dead_build_locks", "has_cuda",
           "environment_extensions_dir", "extensions_ready", "load_cpu_collectives", "lock_path", "lock_timeout",
           "owner_lock", "shows_life", "use_environment_extensions_dir", "wait_for_live_builds"]

