"""Checks of a training run that need no process group: run on every rank right after the configuration is read
and before DeepSpeed is imported or any process group starts, so a run that cannot succeed stops in seconds
with one error listing everything wrong, instead of after DeepSpeed's start-up.

* the hardware the config declares (``hardware.requires: gpu`` on a machine without a CUDA GPU);
* the data: a prepared folder (``meta.json``) or an indexed PREFIX at ``data.path`` and ``data.val_path``. A folder
  that is not there is prepared only when preparing it was asked for: the config file's ``data.prepare`` prepares
  the file's own ``data.path``; a ``data.path`` given on the command line is prepared only when ``data.prepare`` is
  given there too (so a mistyped path is an error, never a preparation of the preset's corpus into it); the raw
  inputs to prepare must exist;
* a local ``init.backbone`` folder and a ``--resume PATH``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection
from pathlib import Path

from adaponder.data.indexed import is_indexed_prefix
from adaponder.hub import is_hub_id

from .config import TrainConfig, TrainConfigError


def _override_keys(overrides: Collection[str]) -> set[str]:
    """The dotted keys that ``--set KEY=VALUE`` overrides name (``data.path`` for ``data.path=x``)."""
    return {item.split("=", 1)[0].strip() for item in overrides if "=" in item}


def cuda_available() -> bool:
    import torch  # loaded already by the configuration (transformers' config classes)

    return torch.cuda.is_available()


def hardware_problems(cfg: TrainConfig, has_gpu: bool | None = None) -> list[str]:
    hw = cfg.hardware
    if hw.requires != "gpu" or (cuda_available() if has_gpu is None else has_gpu):
        return []
    sized = f" (sized for {hw.sized_for})" if hw.sized_for else ""
    return [f"hardware.requires: gpu{sized}, and this machine has no CUDA GPU; on a CPU train a CPU preset "
            "(--config tiny), or --set hardware.requires=any to start this one anyway"]


def _prepared(path: str) -> bool:
    return (Path(path) / "meta.json").is_file()


def data_problems(cfg: TrainConfig, overridden: set[str]) -> list[str]:
    d = cfg.data
    problems: list[str] = []
    if d.path is None:
        return problems  # reported by the configuration's own checks
    if d.format == "indexed":
        if not is_indexed_prefix(d.path):
            problems.append(f"data.path: {d.path}.idx does not exist (data.format indexed: a PREFIX with "
                            f"PREFIX.bin and PREFIX.idx)")
    elif not _prepared(d.path):
        where = (f"{d.path} holds no prepared data (no meta.json)" if Path(d.path).exists()
                 else f"{d.path} does not exist")
        if d.prepare is None:
            problems.append(f"data.path: {where}; prepare it first (adaponder prepare INPUTS -o {d.path}) or set "
                            "data.prepare")
        elif "data.path" in overridden and not {"data.prepare", "data"} & overridden:
            problems.append(f"data.path: {where} (given with --set); the config's data.prepare {d.prepare} prepares "
                            "the config's own data folder, not one given on the command line: check the path, or add "
                            "--set data.prepare=... to prepare it there")
        else:
            missing = [x for x in d.prepare if x != "bundled" and not glob.glob(os.path.expanduser(x))]
            if missing:
                problems.append(f"data.prepare: {', '.join(missing)} not found (files, folders or globs to prepare "
                                f"into {d.path}; 'bundled' = the shipped corpus)")
    if d.val_path is not None and not (_prepared(d.val_path) or is_indexed_prefix(d.val_path)):
        problems.append(f"data.val_path: {d.val_path} is neither a prepared data folder (meta.json) nor an indexed "
                        "PREFIX (PREFIX.idx)")
    return problems


def path_problems(cfg: TrainConfig, resume: str | None) -> list[str]:
    problems: list[str] = []
    backbone = cfg.init.backbone
    if backbone is not None and not is_hub_id(backbone) and not Path(backbone).expanduser().is_dir():
        problems.append(f"init.backbone: {backbone} is neither a checkpoint folder nor a hub id (org/name)")
    if resume not in (None, "auto") and not Path(resume).is_dir():
        problems.append(f"--resume {resume}: no such checkpoint folder (or 'auto')")
    return problems


def preflight(cfg: TrainConfig, overrides: Collection[str] = (), resume: str | None = None,
              has_gpu: bool | None = None) -> None:
    """Raise one :class:`TrainConfigError` listing every problem above; ``overrides`` are the ``--set`` items."""
    problems = (hardware_problems(cfg, has_gpu) + data_problems(cfg, _override_keys(overrides))
                + path_problems(cfg, resume))
    if problems:
        raise TrainConfigError(problems, cfg.source)


__all__ = ["data_problems", "hardware_problems", "path_problems", "preflight"]
