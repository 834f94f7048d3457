"""The pretraining loop: DeepSpeed engine, A13 schedule, A14 stages, checkpoints, metrics, signals.

The model knows nothing of ranks; DeepSpeed settings come from :mod:`.ds_config`; the recipe from the YAML.
One optimizer step:

1. the learning rate, ponder-loss state (k, λ) and stage (gates-only or joint) follow from the step number;
2. ``grad_accum`` micro-batches: forward, ``L = L_LM (+ λ·L_ponder)``, ``engine.backward``; statistics are
   accumulated locally;
3. one all-reduce of the statistics vector: mean losses, exit passes, whether any rank saw a non-finite
   loss, whether any rank received SIGTERM/SIGINT;
4. ``engine.step()``: the guarded AdamW refuses the update if a loss or a gradient was non-finite anywhere
   (parameters and optimizer state stay bit-identical); N refusals in a row stop the run;
5. logging, periodic validation, checkpoints; on a signal: a checkpoint, then exit.

Stopping: SIGTERM/SIGINT on any rank, or the death of a launcher process above a rank (the ``deepspeed``
runner signalled alone would otherwise orphan the ranks), sets the stop flag of step 3; every rank then saves
the checkpoint together and exits with 128+signal. The set-up, the step loop, checkpoints, stops and shutdown are the
run harness's (:mod:`.harness`, shared with fine-tuning): :class:`Trainer` hands it pretraining's parts as a
:class:`~.task_spec.TaskSpec` and keeps the run it composes; the signal handlers, launcher watch and exit codes
are :mod:`.stopping`'s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from adaponder.data.errors import DataError
from adaponder.data.fingerprint import data_identity
from adaponder.data.in_use import hold_data
from adaponder.data.layout import verify_shards
from adaponder.data.tokenizer import load_tokenizer
from adaponder.data.training_source import train_loader, training_source, validation_batches, validation_source
from adaponder.errors import OutputError, debug_requested, writing
from adaponder.modeling import AdaPonderConfigError, ponder_loss
from adaponder.modeling.exit_rules import SampledExit
from adaponder.modeling.pass_heads import PassSupervision
from adaponder.modeling.run_settings import RunSettings
from adaponder.run_lock import RunLockError

from . import metrics as M
from .checkpoint import CheckpointError, read_latest
from .config import RunPlan, TrainConfig, TrainConfigError, plan_run, schedule_findings
from .distributed import broadcast_error, deal
from .export import export_engine
from .finite_weights import module_weights_problem
from .ds_config import BatchSizes, build_ds_config, clips_in_deepspeed
from .engine import TrainingLoop, fit
from .harness import RunHarness
from .task_spec import TaskSpec
from .optim import GuardedAdamW, guarded_cpu_adam, param_groups
from .plan import startup_memory_warning  # (CUDA only: the planner's memory model against this device)
from .resume_checks import OptimizerValues, check_schedule, pretraining_values
from .peak import agreed_peak
from .pretraining_inputs import build_pretraining_model, prepare_data
from .report import (append_gate_section, compute_saved, console_report, eval_batch, eval_summary, eval_vector,
                     write_report)
from .gate_watch import GateWatch, gate_stats
from .schedule import exit_rate, gate_warmup, learning_rate, ponder_schedule, stage
from .stopping import EXIT_ERROR, EXIT_NONFINITE, EXIT_OK, TrainingStopped


def training_loss(out, ps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A13: ``(L, L_LM, L_ponder)``. ``L = L_LM`` before S0 (and for models without gates); after it
    ``L = L_LM + λ·L_ponder`` with the bottom-k ponder loss (A11–A12) at the scheduled k. ``L_ponder`` is
    None for models without gates, and 0 while the ponder loss is off. The pass heads' terms (A21–A24:
    ``out.aux_losses``) are added to ``L`` as they are."""
    lm = out.loss
    heads = sum(out.aux_losses.values()) if out.aux_losses else None  # A21–A24's head terms (detached inputs)
    if heads is not None:
        lm_total = lm + heads
    else:
        lm_total = lm
    if out.gate_values is None or out.gate_mask is None:
        return lm_total, lm, None
    if not ps.active:
        return lm_total, lm, lm.new_zeros(())
    pl = ponder_loss(out.gate_values, out.gate_mask, ps.k)
    return lm_total + ps.weight * pl, lm, pl


# -- the trainer -----------------------------------------------------------------------------------------
class Trainer:
    """Pretraining, composed with the run harness: its parts (:meth:`task_spec`) build the data, the model and the
    engine, take one optimizer step and say what a checkpoint records; ``run`` (a
    :class:`~.harness.RunHarness` built from them) sets up, saves, stops and closes the run, and holds its step,
    rank, sink, model and engine."""

    #: Model-config fields that a checkpoint and the resuming run must agree on.
    structural_keys = ("mode", "passes", "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "intermediate_size", "vocab_size", "gate_hidden_mult", "gate_activation", "input_scale",
                       "embedding_multiplier", "use_parallel_residual", "tie_word_embeddings",
                       "max_position_embeddings", "halting_heads", "consistency_heads", "draft_head",
                       "redraft_head", "early_redraft_heads")

    def __init__(self, cfg: TrainConfig, resume: str | None = None):
        self.cfg = cfg
        self.schedule_changes: list[str] = []  # allowed by train.allow_schedule_change on resume
        self._ds_config: dict[str, Any] | None = None  # the one the model was built under (ZeRO-3 needs it first)
        self.run = RunHarness(self.task_spec(), cfg, resume)

    def task_spec(self) -> TaskSpec:
        """Pretraining's parts of a run."""
        return TaskSpec(
            folders=lambda: (self.cfg.out_dir, self.cfg.checkpoint_dir), build_data=self.build_data,
            build_model=self.build_model, compatibility=self.compatibility, data_record=self.data_record,
            optimizer_values=self.optimizer_values, build_engine=self.build_engine,
            checkpoint_state=self.checkpoint_state, train_step=self.train_step, prepare=self.prepare,
            open_data=self.open_data, check_task_resume=self.check_task_resume, reported_keys=self.reported_keys,
            init_counters=self.init_counters, after_setup=self.after_setup, run_info=self.run_info,
            rank_state=self.rank_state, restore_rank_state=self.restore_rank_state, restore_state=self.restore_state,
            resumed_note=self.resumed_note, record_step=self.record_step, after_step=self.after_step,
            structural_keys=self.structural_keys, other_folder_hint="set another train.out_dir / checkpoint.dir")

    @property
    def k_passes(self) -> int:
        return self.run.model.config.num_passes

    @property
    def gated(self) -> bool:
        return bool(self.run.model.config.gated)

    @functools.cached_property
    def run_settings(self) -> RunSettings:
        """How the training forward and validation run the model (τ, compaction, chunking): never its config. Read
        from the config when first needed (set-up), so that a trainer is built before its configuration is checked."""
        return self.cfg.run_settings()

    @functools.cached_property
    def _supervision_kw(self) -> dict[str, Any]:
        """The training forward's per-pass supervision (A21–A22, ``schedule.per_pass``); none by default."""
        s = self.cfg.schedule
        if s.per_pass == "none":
            return {}
        return {"pass_supervision": PassSupervision(s.per_pass, prior=s.halting_prior, beta=s.halting_beta)}

    def _step_settings(self, step: int, micro: int) -> RunSettings:
        """The training forward's settings at ``step``: with ``schedule.train_exits: sampled`` (A25) the halting heads'
        exits are drawn and applied, from a generator seeded by (seed, step, micro-batch, rank), so that a resumed
        run draws the same exits."""
        if self.cfg.schedule.train_exits == "none":
            return self.run_settings
        rate = exit_rate(step, s0=self.plan.s0, s1=self.plan.s1)
        if rate <= 0.0:
            return self.run_settings
        key = f"{self.cfg.train.seed}:{step}:{micro}:{self.run.rank}".encode()
        generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        return self.run_settings.replace(exit_rule=SampledExit(self.run.model.halting_heads, rate, generator))

    # ---- set-up ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        cfg = self.cfg
        from deepspeed.accelerator import get_accelerator  # DeepSpeed is heavy: only a run's start needs it

        self.device = torch.device(get_accelerator().device_name(self.run.local_rank)
                                   if get_accelerator().device_name() != "cpu" else "cpu")
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self.plan: RunPlan = plan_run(cfg, self.run.world_size)
        self.run.total_steps = self.plan.total_steps
        for line in schedule_findings(cfg, self.plan)[1]:
            self._warn(line)

    def _warn(self, line: str) -> None:
        """One ``warning:`` line (rank 0): the run goes on, but the user should know."""
        if self.run.rank == 0:
            M.write_console(f"warning: {line}")

    def data_record(self) -> dict[str, Any]:
        cfg = self.cfg
        return data_identity(cfg.data, with_validation=bool(cfg.eval.every or cfg.eval.at_end))

    def check_task_resume(self) -> None:
        saved = self.run.resume_state.get("compat", {})
        if "global_batch" not in saved and "grad_accum" in saved:  # (recorded before global_batch was)
            old_batch = saved["world_size"] * saved["micro_batch"] * saved["grad_accum"]
            if old_batch != self.plan.global_batch:
                raise CheckpointError(f"cannot resume from {self.run.resume_dir}: global_batch is {old_batch} in the "
                                      f"checkpoint but {self.plan.global_batch} in this run")
        self.schedule_changes = check_schedule(self.run.resume_dir, self.run.resume_state, self._schedule_record(),
                                               self.cfg.train.allow_schedule_change)

    def reported_keys(self) -> set[str]:
        return set(self._schedule_record())

    def optimizer_values(self) -> OptimizerValues:
        return pretraining_values(self.cfg.optim)

    def init_counters(self) -> None:
        self.tokens_seen = 0
        self.consecutive_skips = 0
        self.skipped_total = 0
        self._skipped_window = 0  # skipped steps since the last train record
        self.gate_watch = GateWatch(self.run_settings.tau, self.plan.s0)

    def run_info(self) -> dict[str, Any]:
        return {"plan": vars(self.plan)}

    def after_setup(self) -> None:
        if self.schedule_changes:
            changes = "; ".join(self.schedule_changes)
            self.run.sink.log({"kind": "event", "step": self.run.step, "event": "schedule_changed", "changes": changes},
                              f"schedule changed on resume (train.allow_schedule_change): {changes}; the learning-rate "
                              f"and ponder-loss schedules are rebuilt from step {self.run.step}")
        flops = self.run.model.flops_per_token(None, context=self.plan.seq_len, training=True)["total"]
        peak = agreed_peak(self.cfg.logging.peak_flops, self.device, self.cfg.deepspeed.precision, self.run.rank,
                           self.run.world_size)
        self.throughput = M.Throughput(flops, peak, self.run.world_size,
                                       warn=lambda line: self.run.rank == 0 and M.write_console(line))

    def build_data(self) -> None:
        self.tokenizer_path = prepare_data(self.cfg, self.run.rank)
        self.hold_and_verify_data()
        self.tokenizer = load_tokenizer(self.tokenizer_path)

    def hold_and_verify_data(self) -> None:
        """Collective: rank 0 registers the run as a reader of each prepared folder it reads (so no
        ``adaponder-prepare --overwrite`` replaces it under the run) and re-hashes the shards of each split it reads
        against ``meta.json``, at every start and resume; a failure reaches every rank."""
        cfg = self.cfg
        sources = [training_source(cfg.data)]
        err = None
        if self.run.rank == 0:
            try:
                if cfg.eval.every or cfg.eval.at_end:
                    sources.append(validation_source(cfg.data))
                packed = [s for s in sources if s.kind == "packed"]
                for folder in dict.fromkeys(s.path for s in packed):
                    self.run.locks.append(hold_data(folder, f"{self.run.spec.folder_name} {self.run.out_dir}"))
                t0, hashed = time.perf_counter(), sum(verify_shards(s.path, s.split) for s in packed)
                if time.perf_counter() - t0 >= 2:  # (said only when it is a noticeable part of the start-up)
                    M.write_console(f"data verified against meta.json: {hashed / 1e6:.1f} MB of shards re-hashed "
                                    f"in {time.perf_counter() - t0:.2f} s")
            except DataError as e:
                err = str(e)
        err = broadcast_error(err)
        if err:
            raise DataError(err)

    def build_model(self) -> Any:
        model, self._ds_config = build_pretraining_model(self.cfg, self.plan, self.run.rank)
        return model

    def open_data(self) -> None:
        """The training loader and a first validation batch, whose token ids must fit the model's vocabulary."""
        cfg, model = self.cfg, self.run.model
        # data.format packed (PackedLoader) or indexed (IndexedLoader, Megatron .bin/.idx): same interface.
        self.loader = train_loader(cfg.data, seq_len=self.plan.seq_len, micro_batch=self.plan.micro_batch,
                                   rank=self.run.rank, world_size=self.run.world_size, seed=cfg.train.seed,
                                   tokenizer=self.tokenizer, vocab_size=model.config.vocab_size)
        plan = self.plan
        if self.loader.num_samples < plan.global_batch:
            # (not an error: a tiny corpus is a legitimate smoke test, but every step then repeats samples)
            self._warn(f"data.path: the training data {cfg.data.path} holds {self.loader.num_samples} samples of "
                       f"data.seq_len + 1 = {plan.seq_len + 1} tokens, fewer than one global batch of "
                       f"{plan.global_batch} (train.micro_batch {plan.micro_batch} × grad_accum {plan.grad_accum} × "
                       f"{plan.world_size} ranks): every step draws the same samples again")
        # Fail now, not at the first validation, if the validation data (data.val_path or the val split) is unusable.
        if cfg.eval.every or cfg.eval.at_end:
            next(validation_batches(cfg.data, seq_len=self.plan.seq_len, micro_batch=1, rank=0,
                                    world_size=1, tokenizer=self.tokenizer,
                                    vocab_size=model.config.vocab_size, max_batches=1), None)

    def compatibility(self) -> dict[str, Any]:
        return {
            "model": self.run.model_compat(),
            "seq_len": self.plan.seq_len,
            # (the number of ranks, micro-batch and accumulation may change: the data order depends on the
            # global batch only; checkpoints before that recorded world_size, micro_batch, grad_accum instead)
            "global_batch": self.plan.global_batch,
            "zero_stage": self.cfg.deepspeed.zero_stage,
            "precision": self.cfg.deepspeed.precision,
            "seed": self.cfg.train.seed,
            "tokenizer_fingerprint": self.tokenizer.fingerprint,
            "train_samples": self.loader.num_samples,
        }

    def build_engine(self) -> tuple[Any, dict[str, Any]]:
        cfg = self.cfg
        groups = param_groups(self.run.model, cfg.optim.weight_decay)
        kw = dict(lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
        if cfg.deepspeed.offload_optimizer != "none":
            opt = guarded_cpu_adam(groups, **kw)
        else:
            opt = GuardedAdamW(groups, **kw)
        if self.plan.gates_only_steps > 0:
            # A14: while the backbone is frozen its gradients are zeroed on arrival, so clipping sees only
            # the gates, and the guard leaves its parameter groups (and their Adam state) untouched.
            self._backbone_frozen = False
            for name, p in self.run.model.named_parameters():
                if not name.startswith("gates."):
                    p.register_hook(lambda g: torch.zeros_like(g) if self._backbone_frozen else g)
        ds_config = self._ds_config
        if ds_config is None:  # a model builder that needed no DeepSpeed config: one sized from its model
            ds_config = build_ds_config(cfg.deepspeed, BatchSizes.of(self.plan), cfg.optim.grad_clip,
                                        sum(p.numel() for p in self.run.model.parameters()), cfg.source)
        return opt, ds_config

    # ---- checkpoints ----------------------------------------------------------------------------------
    def _schedule_record(self) -> dict[str, Any]:
        """What the learning-rate (and A13/A14) schedules are built from, by config key; step counts resolved."""
        cfg, plan = self.cfg, self.plan
        return {"train.steps": plan.total_steps, "optim.warmup": plan.warmup_steps, "optim.lr": cfg.optim.lr,
                "optim.decay": cfg.optim.decay, "optim.min_lr_ratio": cfg.optim.min_lr_ratio,
                "schedule.s0": plan.s0, "schedule.s1": plan.s1, "schedule.k_max": cfg.schedule.k_max,
                "schedule.ponder_weight": cfg.schedule.ponder_weight, "init.gates_only_tokens": plan.gates_only_steps,
                "schedule.gate_warmup": cfg.schedule.gate_warmup, "schedule.gate_floor": cfg.schedule.gate_floor}

    def checkpoint_state(self) -> dict[str, Any]:
        return {"tokens_seen": self.tokens_seen, "consecutive_skips": self.consecutive_skips,
                "skipped_total": self.skipped_total, "compat": self.run.compat, "plan": vars(self.plan),
                "gate_watch": self.gate_watch.state_dict(),
                "lr_schedule": self._schedule_record(),
                "tokenizer": self.tokenizer_path, "config_fingerprint": self.cfg.fingerprint(),
                "config": self.cfg.to_dict(), "data": self.run.data_identity,
                "schedule": {"s0": self.plan.s0, "s1": self.plan.s1, "k_max": self.cfg.schedule.k_max,
                             "ponder_weight": self.cfg.schedule.ponder_weight,
                             "gates_only_steps": self.plan.gates_only_steps}}

    def rank_state(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}

    def restore_rank_state(self, rank_state: dict[str, Any], tag_dir: Path) -> None:
        # The loader state is the position in the global sample stream (the same on every rank and for any
        # number of ranks), so a rank that the checkpoint has no file for can read rank 0's.
        try:
            self.loader.load_state_dict(rank_state["loader"])
        except Exception as err:
            raise CheckpointError(f"{tag_dir}: data-loader state does not fit ({err})") from None

    def restore_state(self, st: dict[str, Any]) -> None:
        self.tokens_seen = int(st.get("tokens_seen", 0))
        self.consecutive_skips = int(st.get("consecutive_skips", 0))
        self.skipped_total = int(st.get("skipped_total", 0))
        self.gate_watch.load_state_dict(st.get("gate_watch", {}))

    def resumed_note(self) -> str:
        return f" ({self.tokens_seen:,} tokens seen)"

    # ---- one optimizer step ---------------------------------------------------------------------------
    def _set_stage(self, step: int, gates_bypassed: bool = False) -> str:
        """A14's stage, and which parameter groups the optimizer leaves out this step: the backbone in the
        gates-only stage, the gates while a warm-up bypasses them (no update, no weight decay)."""
        st = stage(step, self.plan.gates_only_steps)
        frozen = st == "gates_only"
        if self.plan.gates_only_steps > 0:
            self._backbone_frozen = frozen
        if self.plan.gates_only_steps > 0 or self.cfg.schedule.gate_warmup == "bypassed":
            for g in self.run.opt.param_groups:
                g["frozen"] = (frozen and g.get("part") == "backbone") or (gates_bypassed and g.get("part") == "gates")
        return st

    def train_step(self, train_iter) -> dict[str, Any]:
        cfg, plan, engine = self.cfg, self.plan, self.run.engine
        step = self.run.step  # 0-based index of this step
        lr = learning_rate(step, lr=cfg.optim.lr, total_steps=plan.total_steps, warmup_steps=plan.warmup_steps,
                           min_lr_ratio=cfg.optim.min_lr_ratio, decay=cfg.optim.decay)
        for g in self.run.opt.param_groups:
            g["lr"] = lr
        ps = ponder_schedule(step, s0=plan.s0, s1=plan.s1, k_max=cfg.schedule.k_max, weight=cfg.schedule.ponder_weight)
        gw = gate_warmup(step, regime=cfg.schedule.gate_warmup, s0=plan.s0, s1=plan.s1, floor=cfg.schedule.gate_floor,
                         tau=self.run_settings.tau) if self.gated else None
        st = self._set_stage(step, gates_bypassed=gw is not None and gw.bypass)
        warmup_kw = {} if gw is None else {"gate_warmup": gw}

        vec = M.stats_vector(self.k_passes, self.device)
        t0 = time.perf_counter()
        engine.train()
        for micro in range(plan.grad_accum):
            x = next(train_iter).to(self.device, non_blocking=True)
            if cfg.debug.trace_batches:
                self._trace(step, x)
            out = engine(input_ids=x[:, :-1], shift_labels=x[:, 1:], use_cache=False, return_logits=False,
                         settings=self._step_settings(step, micro), **warmup_kw, **self._supervision_kw)
            loss, lm, pl = training_loss(out, ps)
            M.add_micro_batch(vec, loss, lm, pl, out.exit_pass, self.k_passes)
            engine.backward(loss)
            if micro < plan.grad_accum - 1:
                engine.step()
        vec[M.STOP] = 1.0 if self.run.stopping else 0.0
        vec[M.GONE] = 1.0 if self.run.launcher_gone else 0.0
        if dist.is_initialized() and self.run.world_size > 1:
            dist.all_reduce(vec)
        nonfinite = bool(vec[M.NONFINITE] > 0)
        self.run.opt.veto = nonfinite
        self.run.opt.last_skipped = False
        own_norm = None
        if not clips_in_deepspeed(cfg.deepspeed) and not nonfinite:
            params = [p for p in self.run.model.parameters() if p.grad is not None]
            max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
            own_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        engine.step()
        skipped = nonfinite or self.run.opt.last_skipped or not engine.was_step_applied()
        norm = own_norm if own_norm is not None else engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else None
        if skipped:
            norm = float("nan") if nonfinite else (norm if norm is not None else float("inf"))
        dt = time.perf_counter() - t0
        self.throughput.add(dt, plan.tokens_per_step)
        result = M.summarize(vec, self.k_passes)
        # fp16: DeepSpeed's dynamic loss scaling skips steps whose scaled gradients overflow and lowers the
        # scale; that is routine (not a failure) while the loss itself stays finite.
        scale_skip = skipped and not nonfinite and cfg.deepspeed.precision == "fp16"
        result.update(lr=lr, k=ps.k, **{"lambda": ps.weight if ps.active else 0.0}, grad_norm=norm,
                      stage=st, skipped=skipped, loss_scale_skip=scale_skip, stop=bool(vec[M.STOP] > 0),
                      launcher_gone=bool(vec[M.GONE] > 0),
                      nonfinite_micro=int(vec[M.NONFINITE]), gate_warmup=self._warmup_name(gw))
        logged = (step + 1) % cfg.logging.every == 0 or step + 1 == plan.total_steps
        if logged and out.gate_values is not None:  # the last micro-batch's gates (a host read: logged steps only)
            result["gate_median"], result["gate_halt_share"] = gate_stats(
                out.gate_values, out.gate_mask, self.run_settings.tau)
        return result

    @staticmethod
    def _warmup_name(gw) -> str | None:
        if gw is None:
            return None
        return "bypassed" if gw.bypass else f"floored at {gw.logit_floor:.2f}" + ("" if gw.halting else ", no halting")

    def _trace(self, step: int, x: torch.Tensor) -> None:
        folder = self.cfg.out_dir / "trace"
        folder.mkdir(parents=True, exist_ok=True)
        rows = [hashlib.sha1(r.cpu().numpy().tobytes()).hexdigest()[:16] for r in x]
        with open(folder / f"rank{self.run.rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step + 1, "rows": rows}) + "\n")

    # ---- validation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, max_batches: int | None, progress: bool = False) -> dict[str, Any]:
        """Validation over the first ``max_batches`` micro-batches of the validation data (all of it with None),
        the same tokens whatever the number of ranks: the micro-batches are dealt out to the ranks in turn
        (:func:`deal`) and the token-weighted sums all-reduced. ``progress``: a bar on rank 0 (only where no
        training bar is open)."""
        cfg, engine = self.cfg, self.run.engine
        model = engine.module
        zero3 = cfg.deepspeed.zero_stage == 3
        # Under ZeRO-3 every rank must run the same module sequence (parameter all-gathers): no early exit.
        settings = self.run_settings.replace(compact=False) if zero3 else self.run_settings
        engine.eval()
        vec = eval_vector(self.k_passes, self.device)
        mb = cfg.eval.micro_batch or self.plan.micro_batch
        batches = validation_batches(cfg.data, seq_len=self.plan.seq_len, micro_batch=mb, rank=0, world_size=1,
                                     tokenizer=self.tokenizer, vocab_size=model.config.vocab_size,
                                     max_batches=max_batches)
        try:
            shown = progress and self.run.rank == 0 and cfg.logging.progress_bar
            for x, counted in tqdm(deal(batches, self.run.rank, self.run.world_size), desc="validation", unit="batch",
                                   total=max_batches, disable=not shown, leave=False):
                if counted:
                    eval_batch(engine, x.to(self.device), vec, self.k_passes, settings)
                elif zero3:  # the same number of forward calls on every rank (each gathers parameters); discarded
                    eval_batch(engine, x.to(self.device), eval_vector(self.k_passes, self.device), self.k_passes,
                               settings)
        finally:
            engine.train()
        if dist.is_initialized() and self.run.world_size > 1:
            dist.all_reduce(vec)
        summary = eval_summary(vec, self.k_passes)
        summary.update(compute_saved(model, summary["exit_hist"], self.plan.seq_len))
        return summary

    def _log_eval(self, summary: dict[str, Any], final: bool = False) -> None:
        rec = {"kind": "eval", "step": self.run.step, "final": final, **summary}
        line = (f"eval step {self.run.step}: val_loss {summary['val_loss']:.4f} | ppl {summary['val_ppl']:.2f} | "
                f"mean exit pass {summary['mean_exit_pass']:.3f}")
        self.run.sink.log(rec, line)

    # ---- the loop -------------------------------------------------------------------------------------
    def training_loop(self) -> TrainingLoop:
        """Pretraining's parts of the common loop (:func:`~.engine.fit`): the loader's batches; after the last
        step the final validation, checkpoint, export and report (:meth:`_finish`)."""
        return TrainingLoop(batches=lambda: iter(self.loader), announce=self._announce, begin=self._begin,
                            finish=lambda: self._finish(self._last_result, self._t_start))

    def _begin(self) -> None:
        self._t_start = time.perf_counter()
        self._last_result: dict[str, Any] = {}

    def record_step(self, res: dict[str, Any], bar) -> None:
        self.tokens_seen += self.plan.tokens_per_step
        if not self._count_skip(res):
            self._last_result = res
        if bar is not None:
            bar.update(1)
            if not res["skipped"]:
                bar.set_postfix(loss=f"{res['loss']:.3f}", D=f"{res['mean_exit_pass']:.2f}", refresh=False)
        if self.run.step % self.cfg.logging.every == 0 or self.run.step == self.plan.total_steps:
            self._log_train(res)

    def after_step(self) -> None:
        cfg, total = self.cfg, self.plan.total_steps
        if cfg.eval.every and self.run.step % cfg.eval.every == 0 and self.run.step < total:
            self._log_eval(self.evaluate(cfg.eval.max_batches))
        if self.run.step % cfg.checkpoint.every == 0 and self.run.step < total:
            self.run.save()

    def _announce(self) -> None:
        """Rank 0's first lines: what is trained, where, and on what schedule; whether it fits the GPU's memory."""
        if self.run.rank != 0:
            return
        cfg, plan, p = self.cfg, self.plan, self.run.model.parameter_counts()
        M.write_console(
            f"training {self.run.model.config.mode} (K={self.k_passes}) {p['total']:,} parameters on "
            f"{self.run.world_size} rank(s), ZeRO-{cfg.deepspeed.zero_stage}, {cfg.deepspeed.precision}: "
            f"{plan.total_steps} steps × {plan.global_batch} sequences × {plan.seq_len} tokens "
            f"(micro-batch {plan.micro_batch} × accumulation {plan.grad_accum} × {self.run.world_size} ranks)"
            + (f"; ponder loss (λ={cfg.schedule.ponder_weight}) from step {plan.s0}, k reaches "
               f"{cfg.schedule.k_max} at step {plan.s1}" if self.gated else "")
            + (f"; gates-only stage: {plan.gates_only_steps} steps" if plan.gates_only_steps else ""))

        warning = startup_memory_warning(cfg, self.device, self.run.world_size, self.run.model.config)
        if warning:
            self.run.sink.log({"kind": "event", "step": self.run.step, "event": "memory_warning",
                               "message": warning}, warning)

    def _count_skip(self, res: dict[str, Any]) -> bool:
        """Whether the step just taken applied no update (an fp16 overflow, or a non-finite loss or gradient norm),
        logged as an event; ``train.max_consecutive_skips`` non-finite steps in a row stop the run."""
        if not (res["loss_scale_skip"] or res["skipped"]):
            self.consecutive_skips = 0
            return False
        self.skipped_total += 1
        self._skipped_window += 1
        if res["loss_scale_skip"]:  # (not a non-finite step: the streak neither grows nor ends)
            self.run.sink.log({"kind": "event", "step": self.run.step, "event": "loss_scale_overflow"},
                              f"step {self.run.step}: fp16 gradient overflow, step skipped and loss scale lowered")
            return True
        self.consecutive_skips += 1
        what = "loss" if res["nonfinite_micro"] else "gradient norm"
        self.run.sink.log({"kind": "event", "step": self.run.step, "event": "skipped_step",
                           "reason": f"non-finite {what}", "grad_norm": res["grad_norm"],
                           "consecutive": self.consecutive_skips},
                          f"step {self.run.step}: skipped (non-finite {what}); no update applied "
                          f"[{self.consecutive_skips} in a row]")
        limit = self.cfg.train.max_consecutive_skips
        if self.consecutive_skips >= limit:
            latest = read_latest(self.run.ckpt_dir)
            first = self.run.step - self.consecutive_skips + 1  # (the streak may have begun before a resume)
            msg = (f"stopping: {self.consecutive_skips} consecutive steps ({first}..{self.run.step}) had a non-finite "
                   f"loss or gradient norm (train.max_consecutive_skips = {limit}); no update was applied in them. The last "
                   f"checkpoint is {self.run.ckpt_dir / latest if latest else 'none (no checkpoint yet)'}, untouched. "
                   "Lower optim.lr or check the data, then continue with --resume auto.")
            self.run.sink.log({"kind": "event", "step": self.run.step, "event": "stopped_nonfinite",
                               "message": msg})  # (printed once, by run())
            raise TrainingStopped(msg, EXIT_NONFINITE)
        return True

    def _log_train(self, res: dict[str, Any]) -> None:
        """The train record of this step (NaN losses where it was skipped) and the throughput since the last."""
        rec = {"kind": "train", "step": self.run.step, "tokens": self.tokens_seen,
               **{k: res[k] for k in ("loss", "lm_loss", "ponder_loss", "k", "lambda", "mean_exit_pass",
                                      "active_fraction", "exit_hist", "lr", "grad_norm", "stage", "gate_warmup",
                                      "gate_median", "gate_halt_share")
                  if k in res and (self.gated or k not in ("ponder_loss", "k", "lambda", "gate_warmup"))},
               "skipped": self._skipped_window, **self.throughput.summary()}
        if res["skipped"]:
            for key in ("loss", "lm_loss", "ponder_loss", "mean_exit_pass"):
                if key in rec:
                    rec[key] = float("nan")
        rec.update({f"train_{k}": v for k, v in
                    compute_saved(self.run.model, res["exit_hist"], self.plan.seq_len).items() if k == "flops_saved"})
        if self.gated:
            rec["tau"] = self.run_settings.tau
        self.run.sink.log(rec, M.train_line(self.run.step, self.plan.total_steps, rec))
        self.throughput.reset()
        self._skipped_window = 0
        if self.gated and not res["skipped"]:
            for alarm in self.gate_watch.observe(self.run.step, res.get("gate_median"), res["active_fraction"]):
                self.run.sink.log({"kind": "event", **alarm}, f"WARNING: {alarm['message']}")

    def _finish(self, last: dict[str, Any], t_start: float) -> dict[str, Any]:
        """After the last step: the final validation, a checkpoint of the last step, the Hugging Face export, the
        report and ``summary.json``. A non-finite final validation loss fails the run (no export, no report)."""
        cfg = self.cfg
        steps = [what for what, due in (("final validation", cfg.eval.at_end), ("checkpoint",
                 self.run.last_saved != self.run.step), ("Hugging Face export", cfg.checkpoint.export_hf)) if due]
        if self.run.rank == 0 and steps:  # the training bar is gone; say what the remaining time is spent on
            M.write_console(f"training done; now: {', '.join(steps)} (into {cfg.out_dir})")
        final_eval = self.evaluate(cfg.eval.max_batches, progress=True) if cfg.eval.at_end else None
        if final_eval is not None:
            self._log_eval(final_eval, final=True)
        if self.run.last_saved != self.run.step:
            self.run.save()
        if final_eval is not None and not math.isfinite(final_eval["val_loss"]):
            msg = (f"stopping: the final validation loss is {final_eval['val_loss']} (expected a finite number) "
                   f"at step {self.run.step}; no Hugging Face export was written. The last checkpoint is "
                   f"{self.run.last_saved_path}; check the data and the train losses in "
                   f"{cfg.out_dir / 'metrics.jsonl'}.")
            self.run.sink.log({"kind": "event", "step": self.run.step, "event": "nonfinite_final_eval", "message": msg})
            raise TrainingStopped(msg, EXIT_NONFINITE)
        export_dir = self.export_hf(cfg.out_dir / "hf") if cfg.checkpoint.export_hf else None
        wall = time.perf_counter() - t_start
        summary = {"steps": self.run.step, "tokens_seen": self.tokens_seen, "wall_seconds": wall,
                   "final_train": last, "final_eval": final_eval, "export": str(export_dir) if export_dir else None,
                   "skipped_total": self.skipped_total}
        if self.run.rank == 0:
            if final_eval is not None and cfg.eval.report:
                details = {"mode": self.run.model.config.mode, "steps": self.run.step, "tokens seen": self.tokens_seen,
                           "wall time (s)": f"{wall:.1f}", "final train loss": f"{last.get('loss', float('nan')):.4f}",
                           "ranks": self.run.world_size}
                with writing(cfg.out_dir / "report.md", "the run report"):
                    write_report(cfg.out_dir, final_eval, title=f"Run report: {cfg.out_dir}", details=details)
                    if self.gated:
                        append_gate_section(cfg.out_dir, cfg.schedule.gate_warmup)
                M.write_console(console_report(final_eval))
                M.write_console(f"report: {cfg.out_dir / 'report.md'}")
            with writing(cfg.out_dir / "summary.json", "the run summary"):
                (cfg.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float),
                                                          encoding="utf-8")
        return summary

    # ---- export ---------------------------------------------------------------------------------------
    def export_hf(self, out_dir: Path) -> Path:
        """Collective. The Hugging Face export of the run, written atomically over an earlier one (a temporary
        sibling folder renamed into place, :func:`.export.write_atomically`)."""
        bad_weights = module_weights_problem(self.run.engine.module)
        if bad_weights:  # every rank stops together, exit 3 as for a non-finite final validation loss
            raise TrainingStopped(f"stopping: the weights at step {self.run.step} are not all finite ({bad_weights}); "
                                  "no Hugging Face export was written. The last checkpoint is "
                                  f"{self.run.last_saved_path}", EXIT_NONFINITE)
        extra = {"step": self.run.step, "tokens_seen": self.tokens_seen, "config": self.cfg.to_dict()}
        export_engine(self.run.engine, self.cfg.deepspeed.zero_stage == 3, self.run.rank, out_dir,
                      self.tokenizer_path, extra)
        return out_dir


def run(cfg: TrainConfig, resume: str | None = None) -> int:
    """Set up, train, export; returns the process exit code. Errors the user can fix print one clear message."""
    user_errors = (TrainConfigError, AdaPonderConfigError, DataError, CheckpointError, RunLockError, OutputError)
    trainer = Trainer(cfg, resume)
    rank = int(os.environ.get("RANK", "0"))
    try:
        # (stops are agreed between the ranks before anyone raises; every rank sees the same configuration, data
        # and checkpoint folder)
        with trainer.run.session(alike=(TrainingStopped, *user_errors)):
            trainer.run.setup()
            rank = trainer.run.rank
            fit(trainer.run, trainer.training_loop())
        return EXIT_OK
    except TrainingStopped as stop:
        if rank == 0:  # (the event in metrics.jsonl holds the same message; the console gets it once, here)
            M.write_console(str(stop))
        return stop.exit_code
    except user_errors as err:
        if debug_requested():  # --debug / ADAPONDER_DEBUG=1: the traceback (adaponder.errors)
            raise
        if rank == 0:  # rank 0 speaks for all
            M.write_console(f"error: {err}")
        return EXIT_ERROR


__all__ = ["Trainer", "run", "training_loss"]
