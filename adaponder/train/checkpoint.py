"""Crash-safe DeepSpeed checkpoints with the trainer's own state, validated before every resume.

Layout of ``checkpoint.dir``::

    latest                       the tag of the newest complete checkpoint (replaced atomically, written last)
    step00000100/                one complete checkpoint (a DeepSpeed tag folder)
      mp_rank_00_model_states.pt, *optim_states.pt, zero_to_fp32.py   DeepSpeed's files
      rank00000.pt ...           per rank: data-loader state and RNG states (python, numpy, torch, accelerator)
      config.json                the model's AdaPonderConfig (for export without the training YAML)
      trainer_state.json         step, tokens, schedule, compatibility record and a manifest of every file
                                 with its size; written last inside the folder

A save writes everything into ``.tmp-stepNNNNNNNN``; rank 0 then renames it to ``stepNNNNNNNN`` (atomic) and
replaces ``latest`` (atomic). A crash at any point leaves ``latest`` naming the previous complete checkpoint;
the half-written temporary folder is removed by the next save. Older checkpoints beyond ``keep`` are deleted
only after the new one is in place. A run resumed from an older checkpoint (a rewind) replaces the
checkpoints of the abandoned branch as it reaches their steps. The folder must be on a filesystem that every
node sees.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

TAG_RE = re.compile(r"^step(\d{8,})$")
STATE_FILE = "trainer_state.json"
FORMAT = "adaponder.train.checkpoint/v1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: missing, incomplete, corrupt or from an incompatible run."""


class SimulatedCrash(RuntimeError):
    """Raised by ``debug.crash_in_save_at`` in the middle of a save (tests)."""


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def _fsync_dir(path: Path) -> None:
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


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


# -- RNG state --------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (CPU) and accelerator RNG states of this process, torch.save-able as weights."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


# -- finding and validating -------------------------------------------------------------------------------
def list_tags(ckpt_dir: Path) -> list[str]:
    """Complete checkpoints (folders named stepNNNNNNNN holding trainer_state.json), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if p.is_dir() and TAG_RE.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(tags, key=lambda t: int(TAG_RE.match(t).group(1)))


def read_latest(ckpt_dir: Path) -> str | None:
    f = ckpt_dir / "latest"
    if not f.is_file():
        return None
    return f.read_text(encoding="utf-8").strip() or None


def has_checkpoint(ckpt_dir: Path) -> bool:
    return read_latest(ckpt_dir) is not None or bool(list_tags(ckpt_dir))


def resolve_resume(resume: str | None, ckpt_dir: Path) -> Path | None:
    """The tag folder to resume from: ``None`` (fresh start), ``"auto"`` (the newest checkpoint in
    ``ckpt_dir``, or a fresh start if there is none), or a path to a checkpoint folder or a tag folder."""
    if resume is None or resume in ("", "none", "no"):
        return None
    if resume == "auto":
        root = ckpt_dir
        if not has_checkpoint(root):
            return None
    else:
        root = Path(resume)
        if not root.exists():
            raise CheckpointError(f"--resume {resume}: no such checkpoint folder")
        if (root / STATE_FILE).is_file() or (root / "mp_rank_00_model_states.pt").is_file():
            return root
    latest = read_latest(root)
    if latest is None:
        tags = list_tags(root)
        if not tags:
            raise CheckpointError(f"{root}: no checkpoint found (no 'latest' file and no complete stepNNNNNNNN folder)")
        latest = tags[-1]
    tag_dir = root / latest
    if not tag_dir.is_dir():
        raise CheckpointError(f"{root}/latest names {latest!r}, but {tag_dir} does not exist; "
                              f"pass an existing checkpoint folder explicitly (complete ones: {', '.join(list_tags(root)) or 'none'})")
    return tag_dir


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


def validate(tag_dir: Path, compat: dict[str, Any]) -> dict[str, Any]:
    """Check a checkpoint before loading anything: complete, files intact (sizes), same run setup.

    Returns its trainer state. Raises one :class:`CheckpointError` listing every problem.
    """
    state = read_state(tag_dir)
    problems = []
    for rel, size in sorted(state.get("manifest", {}).items()):
        f = tag_dir / rel
        if not f.is_file():
            problems.append(f"file {rel} is missing")
        elif f.stat().st_size != size:
            problems.append(f"file {rel} has {f.stat().st_size} bytes, {size} were written (truncated or corrupt)")
    saved = state.get("compat", {})
    for key in sorted(set(saved) | set(compat)):
        a, b = saved.get(key), compat.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    problems.append(f"{key}.{sub} is {a.get(sub)!r} in the checkpoint but {b.get(sub)!r} in this run")
        elif a != b:
            problems.append(f"{key} is {a!r} in the checkpoint but {b!r} in this run")
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise CheckpointError(f"cannot resume from {tag_dir}:\n{lines}")
    return state


def _safe_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip/pickle errors of every kind
        raise CheckpointError(f"{path}: cannot be read ({type(err).__name__}: {err}); the checkpoint is corrupt") from None


# -- the manager ------------------------------------------------------------------------------------------
class CheckpointManager:
    def __init__(self, ckpt_dir: Path, keep: int, rank: int, world_size: int):
        self.dir = Path(ckpt_dir)
        self.keep = keep
        self.rank = rank
        self.world_size = world_size

    def save(self, engine, step: int, *, rank_state: dict[str, Any], trainer_state: dict[str, Any],
             model_config: dict[str, Any] | None = None, crash: bool = False) -> Path:
        """Collective: every rank calls it. Returns the final tag folder."""
        tag = tag_for(step)
        final = self.dir / tag
        tmp_tag = f".tmp-{tag}"
        tmp = self.dir / tmp_tag
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            for stale in [*self.dir.glob(".tmp-step*"), *self.dir.glob(".old-step*")]:
                shutil.rmtree(stale, ignore_errors=True)
        _barrier()
        t0 = time.perf_counter()
        engine.save_checkpoint(str(self.dir), tag=tmp_tag, client_state={"step": step}, save_latest=False)
        torch.save(rank_state, tmp / f"rank{self.rank:05d}.pt")
        if self.rank == 0 and model_config is not None:
            (tmp / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True), encoding="utf-8")
        _barrier()
        if crash:
            raise SimulatedCrash(f"simulated crash in the middle of saving step {step} (debug.crash_in_save_at)")
        if self.rank == 0:
            manifest = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            state = {"format": FORMAT, "step": step, "tag": tag, "world_size": self.world_size,
                     "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "save_seconds": time.perf_counter() - t0,
                     **trainer_state, "manifest": manifest}
            _atomic_write(tmp / STATE_FILE, json.dumps(state, indent=2, sort_keys=True).encode())
            old = None
            if final.exists():  # a run resumed from an earlier checkpoint reaches this step again
                old = self.dir / f".old-{tag}-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            _atomic_write(self.dir / "latest", tag.encode())
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            self._rotate(keep_tag=tag)
        _barrier()
        return final

    def _rotate(self, keep_tag: str) -> None:
        tags = list_tags(self.dir)
        for old in tags[: max(0, len(tags) - self.keep)]:
            if old != keep_tag:
                shutil.rmtree(self.dir / old, ignore_errors=True)

    def load(self, engine, tag_dir: Path) -> dict[str, Any]:
        """Collective: load DeepSpeed states (module, optimizer) and this rank's own state."""
        rank_file = tag_dir / f"rank{self.rank:05d}.pt"
        if not rank_file.is_file():
            raise CheckpointError(f"{rank_file} is missing: the checkpoint was written by a different number of ranks")
        rank_state = _safe_load(rank_file)
        try:
            path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=True,
                                             load_lr_scheduler_states=False, load_module_strict=True)
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{tag_dir}: DeepSpeed could not load it ({type(err).__name__}: {err})") from None
        if path is None:
            raise CheckpointError(f"{tag_dir}: DeepSpeed found no checkpoint to load")
        return rank_state


__all__ = ["CheckpointManager", "CheckpointError", "SimulatedCrash", "validate", "resolve_resume", "read_state",
           "list_tags", "read_latest", "has_checkpoint", "rng_state", "set_rng_state", "tag_for"]
