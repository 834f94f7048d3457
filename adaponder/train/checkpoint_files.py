"""The files of one checkpoint folder: how they are written (atomically, durably), hashed and checked (sizes,
SHA-256, weights that are not finite), and unpickled safely (tensors and DeepSpeed's own types only). The folder
layout and the save/resume logic are in :mod:`adaponder.train.checkpoint`."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from .finite_weights import first_nonfinite

STATE_FILE = "trainer_state.json"
FORMAT = "adaponder.train.checkpoint/v1"
HASH_KEY = "sha256"  # trainer_state.json: {"sha256": {relative path: hex digest}} next to "manifest" (sizes)
FINITE_KEY = "weights_finite"  # trainer_state.json: whether every weight was finite at save (absent before)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: missing, incomplete, corrupt or from an incompatible run."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (a no-op where directories cannot be synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step (a synced temporary renamed over it): readers see the old file
    or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk: no half-written temporary left behind)
        raise
    fsync_dir(path.parent)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sharded(items: list[str], fn: Callable[[str], Any], threads: bool = True) -> dict[str, Any]:
    """``{item: fn(item)}`` for every item, the work spread over the ranks (and a few threads in each when
    ``threads``), the result on every rank. Collective when a process group exists: every rank calls it with
    the same items. ``fn`` must not raise (a rank that raised would leave the others waiting): it returns its
    error."""
    rank, world = rank_and_world()
    mine = items[rank::world]
    workers = max(1, min(4, len(mine), os.cpu_count() or 1)) if threads else 1
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            local = dict(zip(mine, pool.map(fn, mine)))
    else:
        local = {item: fn(item) for item in mine}
    if world == 1:
        return local
    boxes: list[Any] = [None] * world
    dist.all_gather_object(boxes, local)
    merged: dict[str, Any] = {}
    for box in boxes:
        merged.update(box)
    return merged


def gather_all(item: Any) -> list[Any]:
    """Collective: ``item`` of every rank (a list of one outside a process group)."""
    _, world = rank_and_world()
    if world == 1:
        return [item]
    boxes: list[Any] = [None] * world
    dist.all_gather_object(boxes, item)
    return boxes


# -- content hashes ---------------------------------------------------------------------------------------
def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's content, streamed (constant memory)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _digest_or_error(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as err:
        return f"error: {err}"


def hash_files(folder: Path, names: list[str]) -> dict[str, str]:
    """Collective: ``{name: sha256}`` for the files ``names`` of ``folder``, hashed by all ranks together."""
    digests = _sharded(names, lambda rel: _digest_or_error(folder / rel))
    errors = [f"{rel}: {d[len('error: '):]}" for rel, d in sorted(digests.items()) if d.startswith("error: ")]
    if errors:
        raise CheckpointError(f"{folder}: cannot hash the files just written ({'; '.join(errors)})")
    return digests


def _check_file(folder: Path, rel: str, size: Any, digest: str | None) -> str | None:
    """The problem with one recorded file, or None when it is as written."""
    f = folder / rel
    try:
        actual = f.stat().st_size if f.is_file() else None
    except OSError:
        actual = None
    if actual is None:
        return f"file {rel} is missing"
    if actual != size:
        return f"file {rel} has {actual} bytes, {size} were written (truncated or corrupt)"
    if digest is None:
        return None
    got = _digest_or_error(f)
    if got.startswith("error: "):
        return f"file {rel} cannot be read ({got[len('error: '):]})"
    if got != digest:
        return f"file {rel} has sha256 {got[:16]}..., expected {digest[:16]}... as recorded at save (corrupt)"
    return None


def file_problems(tag_dir: Path, state: dict[str, Any]) -> list[str]:
    """Collective: every recorded file of a checkpoint present, with its recorded size and content hash
    (hashes only for checkpoints that recorded them). Returns the problems, in file order."""
    manifest = state.get("manifest", {})
    hashes = state.get(HASH_KEY) or {}
    names = sorted(manifest)
    found = _sharded(names, lambda rel: _check_file(tag_dir, rel, manifest[rel], hashes.get(rel)))
    return [found[rel] for rel in names if found.get(rel)]


def integrity_problems(tag_dir: Path) -> list[str]:
    """Collective: why a checkpoint folder is not intact (unreadable state, missing/short/changed files)."""
    try:
        state = read_state(tag_dir)
    except CheckpointError as err:
        return [str(err)]
    return file_problems(tag_dir, state)


def _weights_problem(tag_dir: Path, state: dict[str, Any]) -> str | None:
    if state.get(FINITE_KEY) is False:
        return "its weights were not all finite when it was saved (NaN or inf)"
    f = tag_dir / "mp_rank_00_model_states.pt"  # (ZeRO 0-2: the module's weights; ZeRO-3 keeps them elsewhere)
    if not f.is_file():
        return None
    try:
        module = safe_torch_load(f, mmap=True).get("module") or {}
    except (CheckpointError, AttributeError):
        return None  # unreadable: the integrity and weights-only checks report that
    found = first_nonfinite(module.items())
    return f"its weights are not all finite ({found} in {f.name})" if found else None


def weights_problem(tag_dir: Path, state: dict[str, Any]) -> str | None:
    """Collective: why a checkpoint's weights are unusable (recorded as non-finite at save, or NaN/inf in its
    model-states file), or None. Rank 0 reads the file; every rank gets the answer."""
    return _sharded(["weights"], lambda _: _weights_problem(tag_dir, state), threads=False).get("weights")


def problems_line(what: str, tag_dir: Path, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{what} {tag_dir}: {problems[0]}"
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"{what} {tag_dir}:\n{lines}"


def verify_files(tag_dir: Path, state: dict[str, Any], what: str = "cannot use") -> None:
    """Collective: raise one :class:`CheckpointError` naming every file that is not as it was written."""
    problems = file_problems(tag_dir, state)
    if problems:
        raise CheckpointError(problems_line(what, tag_dir, problems))


# -- unpickling: tensors and DeepSpeed's own types only ---------------------------------------------------
def deepspeed_safe_globals() -> list[Any]:
    """The non-tensor types DeepSpeed (0.14-0.19) pickles into its checkpoint files (ZeRO 0-3, fp32/bf16/fp16,
    CPU offload): the loss scalers, the ZeRO stage enum and the fragment addresses of the parameter slice
    mappings. Everything else a weights-only load refuses."""
    # DeepSpeed takes seconds to import: only loading a checkpoint needs these (its pickles' allowed classes)
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


_REFUSED_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


def safe_torch_load(path: str | Path, *, mmap: bool = False, deepspeed_types: bool = True) -> Any:
    """``torch.load(weights_only=True)`` on the CPU, DeepSpeed's checkpoint types allowed; a file that would run
    code (or is unreadable) raises one clear :class:`CheckpointError` and nothing in it is executed."""
    path = Path(path)
    # (not thread-safe: torch keeps the allowed globals in one module-level set)
    present = set(torch.serialization.get_safe_globals())
    allowed = [g for g in (deepspeed_safe_globals() if deepspeed_types else []) if g not in present]
    try:
        mmap = mmap and zipfile.is_zipfile(path)  # memory-mapping needs the (default) zip format
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        text = str(err)
        m = _REFUSED_GLOBAL.search(text)
        if m:
            raise CheckpointError(
                f"{path}: refused to load: unpickling it would call `{m.group(1)}`, which is neither a tensor nor one "
                "of DeepSpeed's checkpoint types (a tampered or foreign file; nothing in it was run)") from None
        if "WeightsUnpickler error" in text:
            detail = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n")[0]
            raise CheckpointError(
                f"{path}: refused to load: {detail} (only tensors, plain containers and DeepSpeed's checkpoint types "
                "are allowed; a tampered or foreign file; nothing in it was run)") from None
        raise CheckpointError(f"{path}: cannot be read (UnpicklingError: {text.splitlines()[0] if text else ''}); "
                              "the checkpoint is corrupt") from None
    except Exception as err:  # zip/pickle errors of every kind
        first = str(err).splitlines()[0] if str(err) else ""
        raise CheckpointError(f"{path}: cannot be read ({type(err).__name__}: {first}); "
                              "the checkpoint is corrupt") from None


def _pickle_problem(path: Path) -> str | None:
    try:
        safe_torch_load(path, mmap=True)
    except CheckpointError as err:
        return str(err)
    return None


def check_pickles(tag_dir: Path) -> None:
    """Collective: unpickle every ``.pt`` file of ``tag_dir`` weights-only (tensors memory-mapped, not read)
    before DeepSpeed's own, unrestricted ``torch.load`` sees it; raise on the first file refused."""
    names = sorted(str(p.relative_to(tag_dir)) for p in tag_dir.rglob("*.pt") if p.is_file())
    found = _sharded(names, lambda rel: _pickle_problem(tag_dir / rel), threads=False)
    problems = [found[rel] for rel in names if found.get(rel)]
    if problems:
        raise CheckpointError(problems[0] + (f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else ""))


def read_state(tag_dir: Path) -> dict[str, Any]:
    f = tag_dir / STATE_FILE
    if not f.is_file():
        raise CheckpointError(f"{tag_dir} is not a complete adaponder checkpoint ({STATE_FILE} is missing; "
                              "the save was interrupted or the folder was not written by launch/pretrain.py)")
    try:
        state = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{f}: unreadable ({err}); the checkpoint is corrupt") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{f}: not an adaponder training checkpoint (format {state.get('format') if isinstance(state, dict) else None!r})")
    return state


__all__ = ["CheckpointError", "FINITE_KEY", "FORMAT", "HASH_KEY", "STATE_FILE", "atomic_write", "barrier",
           "check_pickles", "deepspeed_safe_globals", "file_problems", "file_sha256", "fsync_dir", "gather_all",
           "hash_files", "integrity_problems", "problems_line", "rank_and_world", "read_state", "safe_torch_load",
           "verify_files", "weights_problem"]
