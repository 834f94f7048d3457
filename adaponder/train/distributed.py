"""The process group and the DeepSpeed engine: one rank under ``python``, N under ``deepspeed --num_gpus N``
(or ``torchrun``), and how batches are dealt out to the ranks."""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from adaponder.run_lock import RunLockError, lock_folder

from .config import TrainConfigError
from .extensions import load_cpu_collectives


#: DeepSpeed's notices that are true of every run of this trainer and say nothing about this one: its optimizer is
#: torch's AdamW, which the generated DeepSpeed config admits under ZeRO on purpose (``zero_allow_untested_optimizer``;
#: DeepSpeed then warns on every run), and on the CPU DeepSpeed reports loading its shared-memory collectives.
KNOWN_NOTICES = ("You are using ZeRO with an untested optimizer", "deepspeed_shm_comm_op built successfully")


class _KnownNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(notice in record.getMessage() for notice in KNOWN_NOTICES)


def quiet_known_notices() -> None:
    """Filter :data:`KNOWN_NOTICES` out of DeepSpeed's log (once per process); any other warning still shows."""
    ds_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _KnownNotices) for f in ds_logger.filters):
        ds_logger.addFilter(_KnownNotices())


@contextlib.contextmanager
def _printed_notices_dropped():
    """DeepSpeed prints (rather than logs) some notices: stdout is held while it runs and passed on without the
    known ones."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            yield
    finally:
        rest = [ln for ln in held.getvalue().splitlines(keepends=True)
                if not any(notice in ln for notice in KNOWN_NOTICES)]
        if rest:
            sys.stdout.write("".join(rest))
            sys.stdout.flush()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_OWNED_GROUP = False  # whether init_distributed created the default process group (and so may destroy it)
_EXIT_HOOK = False  # whether destroy_at_exit registered its hook


def init_distributed() -> tuple[int, int, int]:
    """Join the launcher's process group (``deepspeed``/``torchrun`` set RANK, WORLD_SIZE, ...), or make a
    1-rank group for a plain ``python launch/pretrain.py``. Returns (rank, local_rank, world_size)."""
    global _OWNED_GROUP
    # DeepSpeed takes seconds to import: only a run's start needs it, not its configuration checks or --help
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    acc = get_accelerator()
    if not dist.is_initialized():
        if acc.device_name() == "cpu":
            # DeepSpeed's CPU collectives, loaded (or, once per environment, built) before the rendezvous: in this
            # environment's own folder, one process at a time, a killed build's lock cleared. DeepSpeed's start
            # below finds them loaded.
            load_cpu_collectives()
        # (mpirun-style launches: DeepSpeed maps the OMPI_* variables to RANK/LOCAL_RANK/WORLD_SIZE itself)
        quiet_known_notices()
        with _printed_notices_dropped():
            deepspeed.init_distributed(dist_backend=acc.communication_backend_name(), verbose=False)
        _OWNED_GROUP = True
        if acc.device_name() == "cpu":
            _release_shm_name(dist.get_rank())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if acc.device_name() != "cpu":
        acc.set_device(local_rank)
    return dist.get_rank(), local_rank, dist.get_world_size()


def _release_shm_name(rank: int) -> None:
    """DeepSpeed's CPU all-reduce creates one named shared-memory segment per rank (``/dev/shm/deepspeed_allreduce_
    buffer_<uid>_<addr>_<port>_<rank>``, 69 MB) and never unlinks it: every CPU launch left them behind, in RAM, until
    reboot. Once every rank has opened every segment (the barrier), the names can go; the mappings stay valid until
    the processes exit, and then the memory is freed."""
    dist.barrier()
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")
    (Path("/dev/shm") / name).unlink(missing_ok=True)


def destroy_at_exit() -> None:
    """Destroy the process group that :func:`init_distributed` created when the interpreter exits (an ``atexit``
    hook, which runs while Python is still whole). Left to interpreter finalization, Gloo's worker threads can
    still hold work whose tensors need the GIL while Python is being torn down: the rank then dies with
    ``terminate called without an active exception`` (SIGABRT; the ``deepspeed`` runner exits 250) after a run
    that succeeded. Not destroyed at once because DeepSpeed caches its groups for the life of the process: a
    second run in the same process needs the same group. Call it only where every rank ends the same way
    (success, a stop, an error every rank raised): a rank that leaves early while its peers wait in a
    collective should not also wait at exit. A group the caller created is left alone."""
    global _EXIT_HOOK
    if _OWNED_GROUP and not _EXIT_HOOK:
        atexit.register(_destroy_owned_group)
        _EXIT_HOOK = True


def _destroy_owned_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_error(message: str | None) -> str | None:
    """Share rank 0's error (or None) with every rank, so all of them fail together instead of hanging."""
    box = [message]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def lock_on_rank0(folder: Path, rank: int, what: str = "run folder"):
    """Rank 0 locks ``folder`` for the whole run (:mod:`adaponder.run_lock`); a refusal reaches every rank, so
    all of them stop together. Returns the lock on rank 0, None on the others."""
    lock, err = None, None
    if rank == 0:
        try:
            lock = lock_folder(folder, what)
        except RunLockError as e:
            err = str(e)
    err = broadcast_error(err)
    if err:
        raise RunLockError(err)
    return lock


def _paths_to(tree: Any, key: str, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if not isinstance(tree, dict):
        return []
    found = [prefix + (key,)] if key in tree else []
    return found + [p for k, v in tree.items() for p in _paths_to(v, key, prefix + (str(k),))]


def deepspeed_config_problems(err: Exception, ds_config: dict[str, Any]) -> list[str]:
    """One line per setting DeepSpeed's own config validation refused, named as the ``deepspeed.overrides`` key
    it came from (the generated part of the config is always valid), with DeepSpeed's reason; [] when ``err``
    is not such a validation error."""
    errors = getattr(err, "errors", None)
    if not callable(errors) or not str(getattr(err, "title", "")).startswith("DeepSpeed"):
        return []
    out = []
    for e in errors():
        loc = [str(x) for x in e.get("loc", ())]
        paths = _paths_to(ds_config, loc[0]) if loc else []
        where = "deepspeed.overrides." + ".".join(paths[0] + tuple(loc[1:])) if paths else "deepspeed.overrides"
        reason = "unknown DeepSpeed key" if e.get("type") == "extra_forbidden" else e.get("msg", "invalid")
        out.append(f"{where}: {reason} (DeepSpeed's {err.title} refused {e.get('input')!r}); see "
                   "DeepSpeed's configuration documentation for the keys of this section")
    return out


def create_engine(model: torch.nn.Module, optimizer, ds_config: dict[str, Any]):
    """``deepspeed.initialize`` in the process group of :func:`init_distributed`. Under ZeRO-3 the parameters
    that ``model.external_parameters()`` names (read outside their own modules by the pass loop: the
    pondering embedding A4, the chunked cross-entropy) are gathered for the whole forward."""
    import deepspeed  # DeepSpeed takes seconds to import (as in init_distributed)

    quiet_known_notices()
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config,
                                               dist_init_required=False)
    except ValueError as err:  # pydantic's ValidationError of DeepSpeed's config models
        problems = deepspeed_config_problems(err, ds_config)
        if not problems:
            raise

        raise TrainConfigError(problems) from None
    if ds_config.get("zero_optimization", {}).get("stage") == 3:
        module = engine.module
        for p in module.external_parameters():
            deepspeed.zero.register_external_parameter(module, p)
    return engine


def deal(batches, rank: int, world_size: int):
    """``(batch, counted)`` for ``rank``: the batches dealt out in turn (rank ``r`` gets every ``world_size``-th
    from the ``r``-th), so the ranks together cover each batch once, whatever their number. If the last round is
    short, the ranks left out get its first batch with ``counted`` False: under ZeRO-3 every rank must run as
    many forward calls as the others."""
    round_ = []
    for x in batches:
        round_.append(x)
        if len(round_) == world_size:
            yield round_[rank], True
            round_ = []
    if round_:
        yield (round_[rank], True) if rank < len(round_) else (round_[0], False)


__all__ = ["init_distributed", "destroy_at_exit", "broadcast_error", "create_engine", "deal", "lock_on_rank0"]
