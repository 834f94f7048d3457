"""The one training loop: :func:`fit` trains pretraining (:mod:`.trainer`) and GLUE fine-tuning
(:mod:`adaponder.palbert.finetune`) alike, from the parts a task hands it as a :class:`TrainingLoop` (plain
functions: where the batches come from, what is said first, what follows the last step), on a run set up by the
run harness (:class:`~.harness.RunHarness`: process group, checkpoints, stops, the step itself), which each task
composes from its own parts (:class:`~.task_spec.TaskSpec`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from . import metrics as M


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class TrainingLoop:
    """What a task adds to the common loop."""

    #: The training batches from the run's current step on (called once the loop starts).
    batches: Callable[[], Iterator[Any]]
    #: Rank 0's first lines: what is trained, on what, for how many steps.
    announce: Callable[[], None] = _nothing
    #: Just before the first step (clocks, windows of logged values).
    begin: Callable[[], None] = _nothing
    #: A resumed run first does what was due after its step (an evaluation that a stop came before).
    catch_up: bool = False
    #: After the loop, however it ended (a stop raises through it).
    end: Callable[[], None] = _nothing
    #: After the last step (the final evaluation, the export, the results); its value is :func:`fit`'s.
    finish: Callable[[], Any] = _nothing


class Run(Protocol):
    """What :func:`fit` needs of a set-up run (:class:`~.harness.RunHarness` has it all)."""

    step: int
    rank: int
    total_steps: int
    cfg: Any

    def train_done(self) -> bool: ...

    def after_step(self) -> None: ...

    def run_steps(self, batches: Iterator[Any], bar: Any) -> None: ...


def fit(run: Run, loop: TrainingLoop) -> Any:
    """Collective: train ``run`` to its last step (a run that is done already goes straight to ``loop.finish``).
    The progress bar (rank 0, ``logging.progress_bar``) is closed before ``loop.finish`` writes to the console."""
    loop.announce()
    loop.begin()
    bar = None
    try:
        if loop.catch_up and run.step > 0:
            run.after_step()
        if not run.train_done():
            bar = M.progress_bar(run.rank == 0 and run.cfg.logging.progress_bar, run.total_steps, run.step)
        run.run_steps(loop.batches(), bar)
    finally:
        if bar is not None:
            M.close_progress_bar()
        loop.end()
    return loop.finish()


__all__ = ["Run", "TrainingLoop", "fit"]
