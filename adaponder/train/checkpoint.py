"""Crash-safe DeepSpeed checkpoints with the trainer's own state, validated before every resume.

Layout of ``checkpoint.dir``::

    latest                       the tag of the newest complete checkpoint (replaced atomically, written last)
    step00000100/                one complete checkpoint (a DeepSpeed tag folder)
      mp_rank_00_model_states.pt, *optim_states.pt, zero_to_fp32.py   DeepSpeed's files
      rank00000.pt ...           per rank: data-loader state and RNG states (python, numpy, torch, accelerator)
      config.json                the model's AdaPonderConfig (for export without the training YAML)
      trainer_state.json         step, tokens, schedule, compatibility record, a manifest of every file with
                                 its size and the SHA-256 of its content; written last inside the folder

A save writes everything into ``.tmp-stepNNNNNNNN-<pid>`` (rank 0's PID); rank 0 then renames it to
``stepNNNNNNNN`` (atomic) and replaces ``latest`` (atomic). A crash at any point leaves ``latest`` naming the
previous complete checkpoint; the half-written temporary folder is removed by the next save, which removes only
temporaries of its own process or of processes that are gone (two writers on one folder, which the run lock
prevents, would otherwise delete each other's). Older checkpoints beyond ``keep`` are deleted only after the new
one is in place, and never the newest one whose weights were all finite (``weights_finite``, recorded at save).
A checkpoint is deleted by renaming it first to ``.deleting-stepNNNNNNNN-<pid>`` (atomic) and then removing that,
so a kill during the deletion leaves a hidden folder, never a ``stepNNNNNNNN`` holding a part of a checkpoint; every
start clears hidden leftovers and names and removes a ``stepNNNNNNNN`` folder without ``trainer_state.json`` left
by an older version (:func:`clear_leftovers`).
A run resumed from an older checkpoint (a rewind) replaces the checkpoints of the abandoned branch as it reaches
their steps. The folder must be on a filesystem that every node sees.

Integrity and safety on every read (resume and export): every file must have the size and SHA-256 recorded
when it was written (hashing is spread over the ranks); ``--resume auto`` skips damaged checkpoints (newest
first) with one line naming the damaged one and the one used, while an explicit path to a damaged checkpoint
is an error; the same holds for a checkpoint whose weights are not all finite (recorded at save, or NaN/inf
found in its model-states file). Before DeepSpeed (or ``zero_to_fp32``) unpickles a ``.pt`` file, the file is
unpickled with ``torch.load(weights_only=True)``, allowing only tensors, plain containers and the few DeepSpeed
types listed in :func:`deepspeed_safe_globals`, so a file carrying a pickle payload is refused instead of
executed.
Checkpoints written before the hashes existed are checked by size only.

Another number of ranks: the trainer state and the data-loader position do not depend on it; under ZeRO 1-3
the optimizer state is partitioned by rank, so such a checkpoint is converted by DeepSpeed's universal checkpoint
tool (:func:`to_universal`, after the checks above) into ``.reshard-stepNNNNNNNN`` beside the checkpoints and
loaded from there with ``checkpoint.load_universal``; the conversion is deleted after the load (or by the next
save, if the run died meanwhile) and never resumed from on its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from .checkpoint_files import (FINITE_KEY, FORMAT, HASH_KEY, STATE_FILE, CheckpointError, atomic_write, barrier,
                               check_pickles, deepspeed_safe_globals, file_problems, file_sha256, fsync_dir,
                               gather_all, hash_files, integrity_problems, problems_line, rank_and_world, read_state,
                               safe_torch_load, verify_files, weights_problem)
from .finite_weights import module_weights_problem
from adaponder.errors import os_reason, write_failure_reason
from adaponder.run_lock import pid_alive

TAG_RE = re.compile(r"^step(\d{8,})$")
def tag_for(step: int) -> str:
    return f"step{step:08d}"


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
    """The tag ``latest`` names, or None. It must name a folder directly inside ``ckpt_dir``: a path such as
    ``../../other_run/step00000008`` would resume, or export, another run's weights without a word."""
    f = ckpt_dir / "latest"
    if not f.is_file():
        return None
    tag = f.read_text(encoding="utf-8").strip()
    if tag and (tag in (".", "..") or Path(tag).name != tag or "\\" in tag):
        raise CheckpointError(f"{f} names {tag!r}, which is not a checkpoint folder inside {ckpt_dir}; expected the "
                              "name of one of its stepNNNNNNNN folders (complete ones: "
                              f"{', '.join(list_tags(ckpt_dir)) or 'none'})")
    return tag or None


def has_checkpoint(ckpt_dir: Path) -> bool:
    return read_latest(ckpt_dir) is not None or bool(list_tags(ckpt_dir))


def resolve_checkpoint(path: str | Path) -> Path:
    """The tag folder of ``path`` (a checkpoint folder, whose ``latest`` names it, or a tag folder) for tools that
    read a checkpoint (export); errors name the path, not ``--resume``. Nothing is verified here."""
    return _resolve_target(str(path), Path(path), what="checkpoint")


def find_resume(resume: str | None, ckpt_dir: Path,
                notify: Callable[[str], None] | None = None) -> tuple[Path | None, bool]:
    """``(tag folder or None, verified)``. ``"auto"`` takes the checkpoint named by ``latest`` if it is intact
    (every file with its recorded size and SHA-256) and its weights finite, else the newest such older one, and
    calls ``notify`` with one line naming the skipped checkpoint, why, and the one used; ``verified`` is then True
    (files and weights need no second check). When no checkpoint is usable, or for an explicit path, the newest /
    given folder comes back
    unverified (``verified`` False): :func:`validate` then reports its problems. Collective when a process
    group exists (the hashing is spread over the ranks)."""
    chosen = _resolve_target(resume, ckpt_dir)
    if chosen is None or resume != "auto":
        return chosen, False
    root = chosen.parent
    newest = [chosen] + [root / t for t in reversed(list_tags(root)) if t != chosen.name
                         and int(TAG_RE.match(t).group(1)) < _step_of(chosen)]
    skipped: list[tuple[Path, str]] = []  # (checkpoint, "is damaged: ..." or "cannot be resumed from: ...")
    for tag_dir in newest:
        problems = integrity_problems(tag_dir)
        bad_weights = None if problems else weights_problem(tag_dir, read_state(tag_dir))
        if not problems and not bad_weights:
            if skipped:
                bad, why = skipped[0]
                more = f" (and {len(skipped) - 1} more unusable)" if len(skipped) > 1 else ""
                (notify or _print_stderr)(f"checkpoint {bad} {why}{more}; resuming from {tag_dir} instead")
            return tag_dir, True
        skipped.append((tag_dir, f"is damaged: {problems[0]}" if problems else
                        f"cannot be resumed from: {bad_weights}"))
    return chosen, False  # nothing usable: validate() names the problems of the newest


def _step_of(tag_dir: Path) -> int:
    m = TAG_RE.match(tag_dir.name)
    return int(m.group(1)) if m else 1 << 62


def _print_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _resolve_target(resume: str | None, ckpt_dir: Path, what: str = "--resume") -> Path | None:
    if resume is None or resume in ("", "none", "no"):
        return None
    if resume == "auto" and what == "--resume":
        root = ckpt_dir
        if not has_checkpoint(root):
            return None
    else:
        root = Path(resume)
        if not root.exists():
            raise CheckpointError(f"{what} {resume}: no such checkpoint folder")
        if (root / STATE_FILE).is_file():
            return root
        if TAG_RE.match(root.name) and root.is_dir():  # (not a folder of checkpoints: a part of one)
            raise CheckpointError(f"{what} {resume}: an incomplete checkpoint folder ({STATE_FILE} is missing: its "
                                  "save or its deletion was interrupted); complete ones beside it: "
                                  f"{', '.join(list_tags(root.parent)) or 'none'}")
        if (root / "mp_rank_00_model_states.pt").is_file():
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


def validate(tag_dir: Path, compat: dict[str, Any], check_files: bool = True) -> dict[str, Any]:
    """Check a checkpoint before loading anything: complete, files intact (sizes and SHA-256) and weights finite
    (both skipped with ``check_files=False`` when :func:`find_resume` verified them already), same run setup.

    Returns its trainer state. Raises one :class:`CheckpointError` listing every problem. Collective when a
    process group exists.
    """
    state = read_state(tag_dir)
    problems = file_problems(tag_dir, state) if check_files else []
    if check_files and not problems:  # (only intact files are read for their weights)
        bad_weights = weights_problem(tag_dir, state)
        if bad_weights:
            problems.append(f"{bad_weights}; resume from an older checkpoint (--resume auto takes the newest usable "
                            "one)")
    saved = state.get("compat", {})
    for key in sorted(k for k in compat if k in saved):  # (keys a checkpoint lacks were not recorded then)
        a, b = saved.get(key), compat.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    problems.append(f"{key}.{sub} is {a.get(sub)!r} in the checkpoint but {b.get(sub)!r} in this run")
        elif a != b:
            problems.append(f"{key} is {a!r} in the checkpoint but {b!r} in this run")
    if problems:
        raise CheckpointError(problems_line("cannot resume from", tag_dir, problems))
    return state


# -- the manager ------------------------------------------------------------------------------------------
class CheckpointManager:
    def __init__(self, ckpt_dir: Path, keep: int, rank: int, world_size: int):
        self.dir = Path(ckpt_dir)
        self.keep = keep
        self.rank = rank
        self.world_size = world_size

    def save(self, engine, step: int, *, rank_state: dict[str, Any], trainer_state: dict[str, Any],
             model_config: dict[str, Any] | None = None, protect: tuple[str, ...] = ()) -> Path:
        """Collective: every rank calls it. Returns the final tag folder. Rotation (``keep``) never deletes
        the tags in ``protect`` (e.g. the best checkpoint of a fine-tuning run)."""
        tag = tag_for(step)
        final = self.dir / tag
        tmp_tag = f".tmp-{tag}-{self.owner_pid()}"
        tmp = self.dir / tmp_tag
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.dir)
        barrier()
        t0 = time.perf_counter()
        try:
            engine.save_checkpoint(str(self.dir), tag=tmp_tag, client_state={"step": step}, save_latest=False)
            torch.save(rank_state, tmp / f"rank{self.rank:05d}.pt")
            if self.rank == 0 and model_config is not None:
                (tmp / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True), encoding="utf-8")
            error = None
        except (OSError, RuntimeError) as err:  # (disk full, quota...): every rank must hear of it, or the
            error = write_failure_reason(err, self.dir)  # others would wait
            if error is None:
                raise
        errors = [e for e in gather_all(error) if e]
        if errors:
            raise self._write_failed(final, tmp, errors[0])
        # Every file as written: sizes and SHA-256 (listed by rank 0, hashed by all ranks together).
        names = [sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()) if self.rank == 0 else None]
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(names, src=0)
        digests = hash_files(tmp, names[0])
        finite = module_weights_problem(engine.module) is None
        if self.rank == 0:
            manifest = {rel: (tmp / rel).stat().st_size for rel in names[0]}
            state = {"format": FORMAT, "step": step, "tag": tag, "world_size": self.world_size,
                     "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "save_seconds": time.perf_counter() - t0,
                     **trainer_state, "manifest": manifest, HASH_KEY: digests, FINITE_KEY: finite}
            try:
                atomic_write(tmp / STATE_FILE, json.dumps(state, indent=2, sort_keys=True).encode())
            except OSError as err:
                raise self._write_failed(final, tmp, os_reason(err)) from None
            old = None
            if final.exists():  # a run resumed from an earlier checkpoint reaches this step again
                old = self.dir / f".old-{tag}-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
            fsync_dir(self.dir)
            try:
                atomic_write(self.dir / "latest", tag.encode())
            except OSError as err:
                raise CheckpointError(f"could not write {self.dir / 'latest'} ({os_reason(err)}): the checkpoint "
                                      f"{final} is complete, but 'latest' still names the one before; resume with "
                                      f"--resume {final}") from None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            self._rotate(keep_tag=tag, protect=protect)
        barrier()
        return final

    def owner_pid(self) -> int:
        """Collective on first use: rank 0's PID, which names this run's temporary folders on every rank."""
        if not hasattr(self, "_owner_pid"):
            box = [os.getpid()]
            if dist.is_available() and dist.is_initialized() and self.world_size > 1:
                dist.broadcast_object_list(box, src=0)
            self._owner_pid = int(box[0])
        return self._owner_pid

    def _write_failed(self, final: Path, tmp: Path, reason: str) -> CheckpointError:
        """The error of a save that could not write its files: the temporary folder is removed (rank 0), the
        checkpoints already saved and ``latest`` are untouched; the message names them."""
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        latest = read_latest(self.dir)
        kept = (f"the last good checkpoint {self.dir / latest} is untouched" if latest
                else "no earlier checkpoint exists")
        return CheckpointError(f"could not write checkpoint {final} ({reason}); {kept}")

    def _rotate(self, keep_tag: str, protect: tuple[str, ...] = ()) -> None:
        tags = [t for t in list_tags(self.dir) if t not in protect]
        good = self._newest_finite(tags)  # kept whatever ``keep`` says: newer ones may hold NaN weights
        for old in tags[: max(0, len(tags) - self.keep)]:
            if old not in (keep_tag, good):
                delete_checkpoint(self.dir / old)

    def _newest_finite(self, tags: list[str]) -> str | None:
        for tag in reversed(tags):
            try:
                if read_state(self.dir / tag).get(FINITE_KEY, True):  # (not recorded before: as good as it was)
                    return tag
            except CheckpointError:
                continue
        return None

    def load(self, engine, tag_dir: Path) -> dict[str, Any]:
        """Collective: load DeepSpeed's states and this rank's own state, written by as many ranks as now."""
        state, _ = self.read_rank_state(tag_dir, self.world_size)
        self.load_engine(engine, tag_dir)
        return state

    def read_rank_state(self, tag_dir: Path, saved_world_size: int) -> tuple[dict[str, Any], bool]:
        """Collective: check every ``.pt`` of ``tag_dir`` weights-only (before DeepSpeed's own, unrestricted
        ``torch.load`` reads one), then read this rank's own state file, or rank 0's when the checkpoint has
        none for this rank (written by fewer ranks). Returns ``(state, own)``."""
        own = tag_dir / f"rank{self.rank:05d}.pt"
        rank_file = own if own.is_file() or saved_world_size == self.world_size else tag_dir / "rank00000.pt"
        if not rank_file.is_file():
            raise CheckpointError(f"{rank_file} is missing (the checkpoint records {saved_world_size} ranks)")
        check_pickles(tag_dir)
        return safe_torch_load(rank_file, deepspeed_types=False), rank_file == own

    def load_engine(self, engine, tag_dir: Path, universal: bool = False) -> None:
        """Collective: load DeepSpeed's states (module, optimizer). ``universal``: the checkpoint was written by
        another number of ranks under ZeRO 1-3 and the engine was made with ``checkpoint.load_universal``; it is
        first converted by :func:`to_universal` into a temporary folder beside the checkpoints, deleted after."""
        load_dir, work = tag_dir.parent, None
        if universal:
            work = load_dir = to_universal(tag_dir, self.dir / f".reshard-{tag_dir.name}-{self.owner_pid()}",
                                           self.world_size)
        try:
            path, _ = engine.load_checkpoint(str(load_dir), tag=tag_dir.name, load_optimizer_states=True,
                                             load_lr_scheduler_states=False, load_module_strict=True)
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{tag_dir}: DeepSpeed could not load it ({type(err).__name__}: {err})") from None
        finally:
            if work is not None:
                barrier()
                if self.rank == 0:
                    shutil.rmtree(work, ignore_errors=True)
        if path is None:
            raise CheckpointError(f"{tag_dir}: DeepSpeed found no checkpoint to load")


RESHARD_GLOB = ".reshard-step*"  # temporary universal checkpoints (removed after loading, or by the next save)
_TEMPORARY = re.compile(r"^\.(?:tmp|old|reshard|deleting)-step\d{8,}(?:-(\d+))?$")


def delete_checkpoint(tag_dir: Path) -> None:
    """Delete the checkpoint folder ``tag_dir``: renamed first to ``.deleting-<tag>-<pid>`` beside it (atomic), then
    removed. A kill midway leaves that hidden folder, which the next start or save clears, and never a folder named
    like a checkpoint holding a part of one (which later runs could neither use nor tell from a checkpoint)."""
    hidden = tag_dir.parent / f".deleting-{tag_dir.name}-{os.getpid()}"
    try:
        os.replace(tag_dir, hidden)
    except OSError:  # (gone already, or the folder cannot be renamed: a complete checkpoint is better kept whole)
        return
    fsync_dir(tag_dir.parent)
    shutil.rmtree(hidden, ignore_errors=True)


def clear_leftovers(ckpt_dir: Path) -> list[str]:
    """Start-up (rank 0, the run lock held): remove the hidden temporaries that killed processes left
    (:func:`remove_stale_temporaries`, a deletion's included), and every ``stepNNNNNNNN`` folder without
    ``trainer_state.json`` (written last, before the folder gets its name: such a folder is what an interrupted
    deletion of an older version left), unless ``latest`` names it. One without model weights is removed; one that
    still holds weights is moved aside to a hidden ``.incomplete-`` name, not deleted. Returns one line per folder."""
    if not ckpt_dir.is_dir():
        return []
    remove_stale_temporaries(ckpt_dir)
    try:
        named = read_latest(ckpt_dir)
    except CheckpointError:
        named = None  # (reported where the resume reads it)
    lines = []
    for path in sorted(ckpt_dir.iterdir()):
        if not (TAG_RE.match(path.name) and path.is_dir()) or (path / STATE_FILE).is_file() or path.name == named:
            continue
        files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
        held = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "") if files else "nothing"
        if any(f.endswith("model_states.pt") for f in files):
            aside = ckpt_dir / f".incomplete-{path.name}-{int(time.time())}"
            os.replace(path, aside)
            lines.append(f"moved {path} aside to {aside}: an incomplete checkpoint ({STATE_FILE} is missing; it holds "
                         f"{held}), which cannot be resumed from or exported; delete it when it is not needed")
        else:
            delete_checkpoint(path)
            lines.append(f"removed {path}: an incomplete checkpoint folder ({STATE_FILE} is missing; it held {held}), "
                         "left by a deletion that was interrupted")
    return lines


def remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Remove the temporary folders (``.tmp-``, ``.old-``, ``.reshard-``, ``.deleting-stepN-<pid>``) of this process
    and of processes that are gone; another live writer's stay. Names without a PID (older versions) are removed."""
    for path in ckpt_dir.iterdir():
        m = _TEMPORARY.match(path.name)
        if not m or not path.is_dir():
            continue
        pid = int(m.group(1)) if m.group(1) else None
        if pid is None or pid == os.getpid() or not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def to_universal(tag_dir: Path, work: Path, world_size: int) -> Path:
    """Collective: DeepSpeed's universal checkpoint of ``tag_dir`` (``deepspeed.checkpoint.ds_to_universal``: fp32
    weights and Adam moments per parameter, independent of the number of ranks), written by rank 0 into
    ``work/<tag>``; returns ``work``, the folder to load with ``checkpoint.load_universal``. The input was
    verified (sizes, SHA-256, weights-only unpickling) before; the output exists only for this load."""
    rank, _ = rank_and_world()
    error = None
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        args = types.SimpleNamespace(input_folder=str(tag_dir), output_folder=str(work / tag_dir.name),
                                     num_extract_workers=1, num_merge_workers=1,  # (no worker processes in a rank)
                                     keep_temp_folder=False, strict=True, inject_missing_state=True)
        log = io.StringIO()
        try:
            from deepspeed.checkpoint import ds_to_universal  # DeepSpeed is heavy: only a re-shard needs this

            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                ds_to_universal.main(args)
        except Exception as err:  # every rank must hear of it, or the others would wait forever
            shutil.rmtree(work, ignore_errors=True)
            error = (f"{tag_dir}: cannot re-shard it for {world_size} ranks (DeepSpeed's universal checkpoint "
                     f"conversion failed: {type(err).__name__}: {err}); resume on the number of ranks it was "
                     "written with")
    box = [error]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise CheckpointError(box[0])
    return work


__all__ = ["CheckpointManager", "CheckpointError", "atomic_write", "fsync_dir", "validate", "find_resume",
           "resolve_checkpoint", "to_universal",
           "read_state", "list_tags", "read_latest", "has_checkpoint", "rng_state", "set_rng_state", "tag_for",
           "file_sha256", "hash_files", "file_problems", "integrity_problems", "verify_files", "check_pickles",
           "safe_torch_load", "deepspeed_safe_globals", "remove_stale_temporaries", "weights_problem",
           "clear_leftovers", "delete_checkpoint"]
