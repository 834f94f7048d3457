"""Pretraining and fine-tuning train in one loop (``adaponder.train.engine.fit``): each task hands it a
``TrainingLoop`` of plain functions, and neither keeps a fit of its own. The loop is driven here with fake runs
shaped as each task's (fake steps and batches in place of the model and data builders)."""

import pytest

from adaponder.train import metrics as M
from adaponder.train.engine import TrainingLoop, fit


class FakeCfg:
    class logging:  # noqa: N801 (the config's section name)
        progress_bar = False


class FakeRun:
    """The harness's side of the loop: steps until ``total_steps``; ``stop_at`` raises as a stop does."""

    def __init__(self, total_steps, step=0, stop_at=None):
        self.step, self.rank, self.total_steps, self.cfg = step, 0, total_steps, FakeCfg()
        self.stop_at, self.events = stop_at, []

    def train_done(self):
        return self.step >= self.total_steps

    def after_step(self):
        self.events.append(("after_step", self.step))

    def run_steps(self, batches, bar):
        while not self.train_done():
            self.events.append(("step", next(batches)))
            self.step += 1
            if self.step == self.stop_at:
                raise KeyboardInterrupt("stopped")
            self.after_step()


def _loop(run, **parts):
    ev = run.events
    return TrainingLoop(batches=lambda: iter(range(run.step, 100)), announce=lambda: ev.append("announce"),
                        begin=lambda: ev.append("begin"), end=lambda: ev.append("end"),
                        finish=lambda: ev.append("finish") or "done", **parts)


def test_pretraining_and_fine_tuning_use_the_one_loop():
    from adaponder.palbert.finetune import FineTuner
    from adaponder.train.harness import RunHarness
    from adaponder.train.trainer import Trainer

    for task in (Trainer, FineTuner):
        assert not hasattr(task, "fit") and callable(task.training_loop), task  # no fit of its own
    assert not hasattr(RunHarness, "fit")


def test_a_pretraining_shaped_run_trains_then_finishes():
    run = FakeRun(total_steps=3)
    assert fit(run, _loop(run)) == "done"
    assert run.events == ["announce", "begin", ("step", 0), ("after_step", 1), ("step", 1), ("after_step", 2),
                          ("step", 2), ("after_step", 3), "end", "finish"]


def test_a_resumed_fine_tuning_shaped_run_catches_up_first():
    run = FakeRun(total_steps=3, step=2)
    fit(run, _loop(run, catch_up=True))
    assert run.events == ["announce", "begin", ("after_step", 2), ("step", 2), ("after_step", 3), "end", "finish"]
    done = FakeRun(total_steps=3, step=3)  # finished already: straight to the finish, no bar
    fit(done, _loop(done, catch_up=True))
    assert done.events == ["announce", "begin", ("after_step", 3), "end", "finish"]


def test_a_stop_ends_the_loop_without_the_finish_and_closes_the_bar():
    run = FakeRun(total_steps=5, stop_at=2)
    run.cfg.logging.progress_bar = True
    try:
        with pytest.raises(KeyboardInterrupt):
            fit(run, _loop(run))
    finally:
        run.cfg.logging.progress_bar = False
    assert run.events[-1] == "end" and "finish" not in run.events
    assert M._BAR is None  # the progress bar was closed on the way out
