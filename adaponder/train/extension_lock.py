"""A bounded, spoken wait on the build lock of a just-in-time compiled extension.

DeepSpeed loads its CPU collectives (``deepspeed_shm_comm``) through ``torch.utils.cpp_extension.load`` at every
run start; that call takes a lock file in the extension's build folder and, when the file is already there, waits
for it to go — forever, and silently. A build killed midway (a run interrupted during its first start) leaves the
file behind, and every later run on the machine then hangs before printing anything. A run checks the lock first:
a lock that a concurrent start is using goes away within its build time; one that stays is reported, with what to
do, after a bounded wait.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

from torch.utils import cpp_extension

from adaponder.errors import UsageError

#: The extensions a run start loads (DeepSpeed's CPU collectives).
RUN_START_EXTENSIONS = ("deepspeed_shm_comm",)
#: Seconds a run waits for another process's build before giving up (``ADAPONDER_BUILD_LOCK_TIMEOUT``); a first
#: build of the CPU collectives takes 30-60 s on two cores.
DEFAULT_TIMEOUT = 180.0


class ExtensionLockError(UsageError):
    """An extension's build lock stayed held past the bound: most likely left by a build that was killed."""


def lock_path(name: str) -> Path:
    """Where ``torch.utils.cpp_extension`` keeps the build lock of extension ``name`` (``TORCH_EXTENSIONS_DIR``
    honoured)."""
    return Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"


def wait_for_build_locks(names=RUN_START_EXTENSIONS, timeout: float | None = None, poll: float = 1.0,
                         say=None) -> None:
    """Return once no build lock of ``names`` is held; say once what it waits for; raise
    :class:`ExtensionLockError` naming the lock and the way out when one is still held after ``timeout`` seconds
    (default ``ADAPONDER_BUILD_LOCK_TIMEOUT`` or :data:`DEFAULT_TIMEOUT`)."""
    if timeout is None:
        timeout = float(os.environ.get("ADAPONDER_BUILD_LOCK_TIMEOUT", DEFAULT_TIMEOUT))
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    start = time.monotonic()
    for name in names:
        path = lock_path(name)
        told = False
        while path.exists():
            try:
                since = datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")
            except FileNotFoundError:  # released between the two looks
                break
            waited = time.monotonic() - start
            if waited >= timeout:
                raise ExtensionLockError(
                    f"the build lock {path} of extension {name} has been held since {since} and did not go within "
                    f"{timeout:g} s: a build that was killed leaves it behind. If no other run on this machine is "
                    f"starting, delete it (rm {path}) and start again (ADAPONDER_BUILD_LOCK_TIMEOUT sets the wait)")
            if not told:
                say(f"waiting for {path} (a build of {name}, held since {since}; giving up after {timeout:g} s)")
                told = True
            time.sleep(min(poll, max(timeout - waited, 0.0)))


__all__ = ["DEFAULT_TIMEOUT", "ExtensionLockError", "RUN_START_EXTENSIONS", "lock_path", "wait_for_build_locks"]
