"""What a task (pretraining, GLUE fine-tuning) hands the run harness (:class:`~.harness.RunHarness`): its parts as
plain callables in a :class:`TaskSpec`, composed into a run rather than overridden in a subclass.

A part that every task must give has no default, so a spec without it fails where it is built (``TypeError``
naming the field), not in the middle of a run; the optional parts do nothing by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .resume_checks import OptimizerValues


def _nothing(*_: Any) -> None:
    return None


def _no_keys() -> set[str]:
    return set()


def _no_info() -> dict[str, Any]:
    return {}


def _no_state() -> dict[str, Any]:
    return {}


def _no_tags() -> tuple[str, ...]:
    return ()


def _no_note() -> str:
    return ""


def _never() -> bool:
    return False


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """A task's parts, in the order the harness's set-up calls them; each reads and keeps the task's own state, and
    reaches the run's (step, rank, sink, engine) through the harness it was composed with."""

    # ---- what every task gives --------------------------------------------------------------------------
    #: ``(run folder, checkpoint folder)``.
    folders: Callable[[], tuple[Path, Path]]
    #: The task's data (tokenizer, examples or loader).
    build_data: Callable[[], None]
    #: The model (it becomes the run's ``model``).
    build_model: Callable[[], Any]
    #: What a checkpoint and the resuming run must agree on (:func:`~.checkpoint.validate`).
    compatibility: Callable[[], dict[str, Any]]
    #: The run's data as a checkpoint records it (role → fingerprint, path, split).
    data_record: Callable[[], dict[str, Any]]
    #: The optimizer hyper-parameters that the checkpoint's optimizer state would silently bring back.
    optimizer_values: Callable[[], OptimizerValues]
    #: ``(optimizer, DeepSpeed config)`` for the run's model; the harness starts the engine from them.
    build_engine: Callable[[], tuple[Any, dict[str, Any]]]
    #: What ``trainer_state.json`` records beyond the step and the files.
    checkpoint_state: Callable[[], dict[str, Any]]
    #: One optimizer step on the batches; the result holds ``stop`` and ``launcher_gone`` (all-reduced over the
    #: ranks).
    train_step: Callable[[Any], dict[str, Any]]

    # ---- optional parts ---------------------------------------------------------------------------------
    #: After the process group and the locks, before anything is read (threads, device, plan).
    prepare: Callable[[], None] = _nothing
    #: After the model: the data that is checked against it (pretraining's loader, whose token ids must fit the
    #: model's vocabulary).
    open_data: Callable[[], None] = _nothing
    #: The task's own checks of the checkpoint it resumes from (raise :class:`~.checkpoint.CheckpointError`).
    check_task_resume: Callable[[], None] = _nothing
    #: Config keys that the task's own resume checks report (left out of the list of changed settings).
    reported_keys: Callable[[], set[str]] = _no_keys
    #: The task's state of a fresh run (a resume then overwrites it).
    init_counters: Callable[[], None] = _nothing
    #: The last of the set-up, with the metrics sink open.
    after_setup: Callable[[], None] = _nothing
    #: What the run's record in the metrics adds to its config.
    run_info: Callable[[], dict[str, Any]] = _no_info
    #: Just before a checkpoint is written.
    before_save: Callable[[], None] = _nothing
    #: This rank's own state in the checkpoint beyond its RNG and the step.
    rank_state: Callable[[], dict[str, Any]] = _no_state
    #: This rank's own state back (``(rank state, checkpoint folder)``), before the engine's are loaded.
    restore_rank_state: Callable[[dict[str, Any], Path], None] = _nothing
    #: The task's state back from ``trainer_state.json`` (the step is restored already).
    restore_state: Callable[[dict[str, Any]], None] = _nothing
    #: Checkpoints that rotation must keep (the best one of a fine-tuning run).
    protected_tags: Callable[[], tuple[str, ...]] = _no_tags
    #: What the "resumed from" line adds.
    resumed_note: Callable[[], str] = _no_note
    #: Whether the task ended its training before the last step (early stopping).
    done_early: Callable[[], bool] = _never
    #: After the step was counted (``(result, progress bar)``): counters, progress bar, the train record.
    record_step: Callable[[dict[str, Any], Any], None] = _nothing
    #: What is due after a step that did not stop the run (evaluation, a periodic checkpoint).
    after_step: Callable[[], None] = _nothing

    # ---- data -------------------------------------------------------------------------------------------
    #: Model-config fields that a checkpoint and the resuming run must agree on.
    structural_keys: tuple[str, ...] = ()
    #: What the run folder is called in a refusal (``run folder``, ``--output folder``).
    folder_name: str = "run folder"
    #: The way out offered to a fresh run whose checkpoint folder already holds checkpoints.
    other_folder_hint: str = "choose another output folder / checkpoint.dir"


__all__ = ["TaskSpec"]
