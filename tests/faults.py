"""Fault injection for the tests (not a test module, not part of the package): patches that make a real run
meet a non-finite loss or die in the middle of a checkpoint save. They are installed in the process that runs
the launcher (the long-lived worker of ``helpers_train.LauncherWorker``, or a rank started by ``deepspeed``
through :data:`RANK_SCRIPT`), so the package's own code paths carry no hooks for them.

A spec is a mapping: ``{"nonfinite_steps": [5], "nonfinite_rank": 1}`` multiplies the training loss of those
(1-based) steps by NaN (on one rank, or every rank when ``nonfinite_rank`` is absent); ``{"crash_in_save_at": 4}``
raises :class:`SimulatedCrash` in the save of step 4 once the checkpoint's files are written, before they are
hashed and renamed into place (a process killed in the middle of a save); ``{"crash_in_rotation": True}`` "kills"
the first deletion of an old checkpoint after one file; ``{"sigints": {"where": "save", "step": 4, "count": 2}}``
sends two SIGINTs (Ctrl-C twice) in the save of step 4 (``"step"``: at the start of training step 4).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any


class SimulatedCrash(RuntimeError):
    """The process "died" in the middle of a checkpoint save."""


def _nonfinite_losses(stack: contextlib.ExitStack, steps: list[int], rank: int | None) -> None:
    import adaponder.train.trainer as T

    real_step, real_loss = T.Trainer.train_step, T.training_loss
    current = {"inject": False}

    def train_step(self, train_iter):
        current["inject"] = self.run.step + 1 in steps and rank in (None, self.run.rank)
        try:
            return real_step(self, train_iter)
        finally:
            current["inject"] = False

    def training_loss(out, ps):
        loss, lm, pl = real_loss(out, ps)
        return (loss * float("nan") if current["inject"] else loss), lm, pl

    stack.enter_context(_patched(T.Trainer, "train_step", train_step))
    stack.enter_context(_patched(T, "training_loss", training_loss))


def _crash_in_save(stack: contextlib.ExitStack, step: int) -> None:
    import adaponder.train.checkpoint as C

    real = C.hash_files
    temporary = re.compile(rf"^\.tmp-step{step:08d}-\d+$")

    def hash_files(folder, names):
        if temporary.match(folder.name):  # the files are written; hashing and the rename would come next
            raise SimulatedCrash(f"simulated crash in the middle of saving step {step}")
        return real(folder, names)

    stack.enter_context(_patched(C, "hash_files", hash_files))


def _crash_in_rotation(stack: contextlib.ExitStack) -> None:
    """The first deletion of an old checkpoint removes one file (``trainer_state.json``, which makes a folder a
    checkpoint) and "dies": the state a SIGKILL in the middle of ``shutil.rmtree`` leaves."""
    import os
    import shutil

    import adaponder.train.checkpoint as C

    real = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        state = os.path.join(path, "trainer_state.json")
        if os.path.isfile(state):
            os.unlink(state)
            raise SimulatedCrash(f"simulated crash in the middle of deleting {path}")
        return real(path, *args, **kwargs)

    stack.enter_context(_patched(C.shutil, "rmtree", rmtree))


def _sigints(stack: contextlib.ExitStack, where: str, step: int, count: int) -> None:
    """``count`` SIGINTs (Ctrl-C) to this process in the save of ``step`` (``where="save"``: once its files are
    written, before they are hashed) or at the start of training step ``step`` (1-based, ``where="step"``)."""
    import os
    import signal

    import adaponder.train.checkpoint as C
    import adaponder.train.trainer as T

    def send():
        for _ in range(count):
            os.kill(os.getpid(), signal.SIGINT)  # (the handler runs before the next line)

    if where == "save":
        real = C.hash_files
        temporary = re.compile(rf"^\.tmp-step{step:08d}-\d+$")

        def hash_files(folder, names):
            if temporary.match(folder.name):
                send()
            return real(folder, names)

        stack.enter_context(_patched(C, "hash_files", hash_files))
    else:
        real_step = T.Trainer.train_step

        def train_step(self, train_iter):
            if self.run.step + 1 == step:
                send()
            return real_step(self, train_iter)

        stack.enter_context(_patched(T.Trainer, "train_step", train_step))


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextlib.contextmanager
def injected(spec: dict[str, Any] | None):
    """The faults of ``spec`` (see the module doc) for the duration of the block."""
    with contextlib.ExitStack() as stack:
        spec = spec or {}
        if spec.get("nonfinite_steps"):
            _nonfinite_losses(stack, list(spec["nonfinite_steps"]), spec.get("nonfinite_rank"))
        if spec.get("crash_in_save_at") is not None:
            _crash_in_save(stack, int(spec["crash_in_save_at"]))
        if spec.get("crash_in_rotation"):
            _crash_in_rotation(stack)
        if spec.get("sigints"):
            _sigints(stack, spec["sigints"]["where"], int(spec["sigints"]["step"]), int(spec["sigints"]["count"]))
        yield


#: ``launch/pretrain.py`` as a rank runs it under ``deepspeed``, with the faults of ``$ADAPONDER_TEST_FAULTS`` (JSON).
RANK_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {launch!r})
sys.path.insert(0, {tests!r})
from faults import injected
from pretrain import main
with injected(json.loads(os.environ.get("ADAPONDER_TEST_FAULTS", "{{}}"))):
    code = main()
sys.exit(code)
"""
