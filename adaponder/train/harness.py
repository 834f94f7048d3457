"""The run harness: the skeleton that pretraining (:mod:`.trainer`) and GLUE fine-tuning
(:mod:`adaponder.palbert.finetune`) share, written once.

:meth:`RunHarness.setup` joins the process group, locks the run folder (and the checkpoint folder, which another
run may name too), finds the resume point (a fresh run refuses a folder that holds checkpoints), lets the task build
its data and model, checks the checkpoint against the run (model shape, data, settings), builds the DeepSpeed
engine, loads the checkpoint or seeds a fresh run, opens the metrics sink and installs the stop signals.
:meth:`RunHarness.run_steps` is the step loop, which the one training loop of every task
(:func:`.engine.fit`, given the task's :class:`~.engine.TrainingLoop`) runs; :meth:`RunHarness.save` and the resume load are the checkpoint
paths of both tasks; :meth:`RunHarness.session` closes a run (signals, sink, locks, the process group).

A task does not subclass it: it composes a run from its parts, a :class:`~.task_spec.TaskSpec` of plain callables
(build the data and the model, one training step, what the checkpoint records and how it is restored, which
model-config keys are structural), and keeps the run (``self.run``) to read its step, rank, sink and engine.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from adaponder.errors import OutputError, writing
from adaponder.seeding import seed_everything

from . import metrics as M
from .checkpoint import (CheckpointError, CheckpointManager, clear_leftovers, find_resume, has_checkpoint, read_latest,
                         rng_state, set_rng_state, validate)
from .checkpoint_files import barrier
from .distributed import create_engine, destroy_at_exit, init_distributed, lock_on_rank0
from .finite_weights import module_weights_problem
from .resume_checks import ResumeReview, log_review, reconcile_optimizer, review_resume
from .stopping import interrupted, install_stop_signals, restore_signals, saved_and_stopped, stop_at_step
from .task_spec import TaskSpec


class RunHarness:
    """One run of a task, composed from the task's parts (``spec``): set-up, the step loop, checkpoints, stops and
    shutdown. The task's typed config ``cfg`` has ``train.seed``, ``train.stop_at``, ``train.allow_data_change``,
    ``train.allow_optim_change``, ``checkpoint.keep``, ``logging`` and ``deepspeed.zero_stage``. The spec names the
    folders and builds the model (and what :meth:`start_engine` makes ``engine`` and ``opt`` of); the task sets
    ``total_steps`` once its plan or its data says it."""

    out_dir: Path
    ckpt_dir: Path
    total_steps: int

    def __init__(self, spec: TaskSpec, cfg: Any, resume: str | None):
        self.spec, self.cfg = spec, cfg
        self.resume_arg = resume
        self.stop_signal: int | None = None  # a signal this rank received
        self.launcher_gone = False  # a launcher process above this rank is gone (stops as on SIGTERM)
        self.step = 0
        self.last_saved: int | None = None  # the step of the checkpoint last saved or resumed from
        self.last_saved_path: Path | None = None
        self.locks: list[Any] = []
        self.resume_dir: Path | None = None
        self.resume_state: dict[str, Any] | None = None
        self.review = ResumeReview()
        self.reshard = False
        self.saving = False  # a checkpoint is being written (a second Ctrl-C then waits for it)

    # ---- set-up -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Collective: everything before the first step, in the order every task needs."""
        spec = self.spec
        self.open_run()
        spec.prepare()
        files_verified = self.resolve_resume()
        spec.build_data()
        self.model = spec.build_model()
        spec.open_data()
        self.compat = spec.compatibility()
        self.data_identity = spec.data_record()
        self.check_resume(files_verified)
        self.start_engine(*spec.build_engine())
        self.ckpt = CheckpointManager(self.ckpt_dir, self.cfg.checkpoint.keep, self.rank, self.world_size)
        spec.init_counters()
        if self.resume_dir is not None:
            self.load_checkpoint(self.resume_dir)
            self.review.optimizer = reconcile_optimizer(self.resume_dir, self.opt.param_groups,
                                                        spec.optimizer_values(), self.cfg.train.allow_optim_change)
        else:
            seed_everything(self.cfg.train.seed + self.rank)  # dropout differs between ranks; weights do not
        self.write_run_files()
        self.sink = M.MetricsSink(self.out_dir, self.cfg.logging, self.rank,
                                  self.step if self.resume_dir else None, {**self.cfg.to_dict(), **spec.run_info()})
        log_review(self.sink.log, self.step, self.review)
        spec.after_setup()
        self.install_signals()

    def open_run(self) -> None:
        """The process group, then one job per run folder and per checkpoint folder, held until the process exits:
        a second job stops here, before reading anything. The checkpoint folder may be named by another run
        (``checkpoint.dir``), so it is locked on its own whenever it is not the run folder itself."""
        self.out_dir, self.ckpt_dir = self.spec.folders()
        self.rank, self.local_rank, self.world_size = init_distributed()
        self.locks.append(lock_on_rank0(self.out_dir, self.rank, self.spec.folder_name))
        if self.ckpt_dir.resolve() != self.out_dir.resolve():
            self.locks.append(lock_on_rank0(self.ckpt_dir, self.rank, "checkpoint folder"))

    def resolve_resume(self) -> bool:
        """The resume target (``auto``: the newest intact checkpoint, every file's SHA-256 checked; a damaged one is
        named and skipped), after clearing what a killed save or deletion left (:func:`~.checkpoint.clear_leftovers`,
        each incomplete ``stepNNNNNNNN`` folder named). A fresh run never writes into a folder that holds checkpoints.
        Returns whether the target's files were verified already."""
        if self.rank == 0:  # (the folder is locked: what a killed save or deletion left is nobody's work)
            for line in clear_leftovers(self.ckpt_dir):
                M.write_console(line)
        barrier()
        self.resume_dir, files_verified = find_resume(
            self.resume_arg, self.ckpt_dir, notify=lambda line: self.rank == 0 and M.write_console(line))
        if self.resume_dir is None and self.resume_arg in (None, "none") and has_checkpoint(self.ckpt_dir):
            raise CheckpointError(
                f"{self.ckpt_dir} already holds checkpoints (latest: {read_latest(self.ckpt_dir)}); "
                f"continue with --resume auto, or {self.spec.other_folder_hint}")
        return files_verified

    def check_resume(self, files_verified: bool) -> None:
        """The checkpoint against this run: its files and shape (:func:`~.checkpoint.validate`), the task's own
        checks, the data and the other settings (:func:`~.resume_checks.review_resume`). A checkpoint of another
        number of ranks under ZeRO 1-3 is loaded through DeepSpeed's universal checkpoint (converted at load)."""
        if self.resume_dir is None:
            return
        self.resume_state = validate(self.resume_dir, self.compat, check_files=not files_verified)
        self.spec.check_task_resume()
        reported = self.spec.reported_keys() | set(self.spec.optimizer_values().keys)
        self.review = review_resume(self.cfg, self.resume_dir, self.resume_state, self.data_identity, reported)
        saved_world_size = int(self.resume_state.get("world_size", self.world_size))
        self.reshard = saved_world_size != self.world_size and self.cfg.deepspeed.zero_stage >= 1

    def model_compat(self) -> dict[str, Any]:
        """The structural fields of the model's config, as a checkpoint records them."""
        c = self.model.config
        return {k: getattr(c, k, None) for k in self.spec.structural_keys}

    def start_engine(self, optimizer: Any, ds_config: dict[str, Any]) -> None:
        """The DeepSpeed engine of ``self.model`` (which becomes the engine's module)."""
        if self.reshard:
            ds_config.setdefault("checkpoint", {})["load_universal"] = True
        self.opt, self.ds_config = optimizer, ds_config
        self.engine = create_engine(self.model, optimizer, ds_config)
        self.model = self.engine.module

    def write_run_files(self) -> None:
        """Rank 0: ``config.yaml`` (only once the resume is accepted, so it is always what runs) and
        ``ds_config.json``."""
        if self.rank != 0:
            return
        with writing(self.out_dir, "the run's configuration into"):
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.yaml").write_text(self.cfg.to_yaml(), encoding="utf-8")
            (self.out_dir / "ds_config.json").write_text(json.dumps(self.ds_config, indent=2), encoding="utf-8")

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def save(self, force: bool = False) -> Path:
        """Collective. A checkpoint of this step, unless one was saved at it already (``force``: write it again,
        e.g. after an evaluation that changed what the checkpoint records)."""
        if not force and self.last_saved == self.step and self.last_saved_path is not None:
            return self.last_saved_path  # nothing new since (e.g. a signal right after a resume)
        self.spec.before_save()
        rank_state = {**self.spec.rank_state(), "rng": rng_state(), "step": self.step}
        self.saving = True
        try:
            path = self.ckpt.save(self.engine, self.step, rank_state=rank_state,
                                  trainer_state=self.spec.checkpoint_state(), model_config=self.model.config.to_dict(),
                                  protect=self.spec.protected_tags())
        except CheckpointError as err:
            with contextlib.suppress(OutputError):  # (the same full disk may refuse the event too)
                self.sink.log({"kind": "event", "step": self.step, "event": "checkpoint_failed", "message": str(err),
                               "stopping": self.stopping})
            raise
        finally:
            self.saving = False
        self.sink.log({"kind": "event", "step": self.step, "event": "checkpoint", "path": str(path)},
                      f"checkpoint saved: {path}")
        self.last_saved, self.last_saved_path = self.step, path
        return path

    def load_checkpoint(self, tag_dir: Path) -> None:
        """Collective: the engine's states, this rank's own state and the task's state of ``tag_dir``."""
        st = self.resume_state
        saved_world_size = int(st.get("world_size", self.world_size))
        # A rank that the checkpoint has no file for reads rank 0's (the task's rank state must allow that);
        # checked before the (possibly long) re-sharding.
        rank_state, own = self.ckpt.read_rank_state(tag_dir, saved_world_size)
        self.spec.restore_rank_state(rank_state, tag_dir)
        if self.reshard and self.rank == 0:
            M.write_console(f"{tag_dir} was written by {saved_world_size} rank(s), this run has "
                            f"{self.world_size}: re-sharding the ZeRO-{self.cfg.deepspeed.zero_stage} optimizer state "
                            "through DeepSpeed's universal checkpoint")
        self.ckpt.load_engine(self.engine, tag_dir, universal=self.reshard)
        bad_weights = module_weights_problem(self.engine.module)  # (ZeRO-3 files are not read before the load)
        if bad_weights:
            raise CheckpointError(f"cannot resume from {tag_dir}: its weights are not all finite ({bad_weights})")
        self.step = int(st["step"])
        self.spec.restore_state(st)
        if own:
            set_rng_state(rank_state["rng"])
        else:  # a rank the checkpoint has no RNG state for: its own stream, from (seed, rank, step)
            seed_everything(self.cfg.train.seed + self.rank + 1_000_003 * self.step)
        self.last_saved, self.last_saved_path = self.step, tag_dir
        if self.rank == 0:
            M.write_console(f"resumed from {tag_dir} at step {self.step}{self.spec.resumed_note()}")

    # ---- stop signals and stops ---------------------------------------------------------------------------
    def install_signals(self) -> None:
        self._old_handlers = install_stop_signals(self._on_signal, self._on_launcher_gone,
                                                  saving=lambda: self.saving)

    def _on_signal(self, signum: int) -> None:
        if self.stop_signal is None:  # the first one names the stop (Ctrl-C also makes the launcher send SIGTERM)
            self.stop_signal = signum

    def _on_launcher_gone(self) -> None:
        self.launcher_gone = True

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None or self.launcher_gone

    def stop_flags(self) -> list[float]:
        """This rank's [stopping, launcher gone], for the step's all-reduce."""
        return [1.0 if self.stopping else 0.0, 1.0 if self.launcher_gone else 0.0]

    def _restore_signals(self) -> None:
        old = getattr(self, "_old_handlers", None)
        if old is None:
            return
        if not self.stopping:
            restore_signals(old)
        elif old.watch is not None:
            # Exiting with 128+signal: our handlers stay, so that a launcher's follow-up SIGTERM (deepspeed's
            # launch.py signals the other ranks as soon as one has exited) cannot turn that exit into a kill.
            old.watch.stop()

    def stop_if_asked(self, res: dict[str, Any]) -> None:
        """On a signal (any rank: ``res["stop"]``) or a gone launcher: a checkpoint, then exit 128+signal; at
        ``train.stop_at``: a checkpoint, then exit 0. Both raise :class:`~.stopping.TrainingStopped`."""
        if res["stop"]:
            raise saved_and_stopped(self.save(), self.step, self.stop_signal, res["launcher_gone"], self.sink.log)
        stop_at = self.cfg.train.stop_at
        if stop_at is not None and self.step == stop_at and self.step < self.total_steps:
            raise stop_at_step(self.save(), self.step, self.sink.log)

    # ---- the step loop --------------------------------------------------------------------------------------
    def train_done(self) -> bool:
        """The last step is done, or the task ended its training early."""
        return self.step >= self.total_steps or self.spec.done_early()

    def after_step(self) -> None:
        """What is due after a step that did not stop the run (the task's)."""
        self.spec.after_step()

    def run_steps(self, batches: Any, bar: Any) -> None:
        """Steps until :meth:`train_done`: one step, its record, a stop if one was asked for, what is due after."""
        while not self.train_done():
            res = self.spec.train_step(batches)
            self.step += 1
            self.spec.record_step(res, bar)
            self.stop_if_asked(res)
            self.after_step()

    # ---- shutdown -------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._restore_signals()
        M.close_progress_bar()
        if hasattr(self, "sink"):
            self.sink.close()
        for lock in reversed(self.locks):
            if lock is not None:
                lock.release()
        self.locks = []

    @contextlib.contextmanager
    def session(self, alike: tuple[type[BaseException], ...]):
        """Closes the run however it ends. Where every rank ends alike (success, or one of ``alike``: stops are
        agreed between the ranks, user errors are the same on every rank) the process group is destroyed at exit;
        a rank that leaves early while its peers wait in a collective must not also wait at exit."""
        together = False
        try:
            yield self
            together = True
        except alike:
            together = True
            raise
        except KeyboardInterrupt:  # a second Ctrl-C (or one before the handlers): one line, not a traceback
            raise interrupted(self.step, self.last_saved, self.last_saved_path) from None
        finally:
            self.close()
            if together:
                destroy_at_exit()


__all__ = ["RunHarness"]
