"""Phases 2–4 of a GLUE fine-tuning run (:class:`~adaponder.palbert.finetune.FineTuner`) and its results files.

2. **dev** — the best checkpoint's weights; every exit rule on dev from one N-pass forward (sharded over the
   ranks): metric, mean exit pass, speed-up N / mean exit pass, exit histogram, metric per pass;
3. **online** — the online (early-exit) path checked against the offline rule (rank 0);
4. **timing** — time per example with early exit vs always-last at batch 1 and 32 (rank 0), within
   ``timing.budget_seconds``; the speed-up as the median over rounds with its spread (:mod:`.timing`).

``results.json`` — and ``results.md`` once the dev phase is done — is rewritten atomically as each phase ends.
A signal between or inside the phases stops the run with the finished phases written.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from adaponder.palbert.classifier import (
    AdaPonderForSequenceClassification,
    PalbertOutput,
    offline_exit,
    predictions_from_outputs,
)
from adaponder.palbert.metrics import glue_metrics
from adaponder.palbert.results import results_markdown
from adaponder.palbert.rule_evaluation import (
    RULE_NAMES,
    evaluate_rules,
    forward_all,
    padded_batches,
    predict_all,
)
from adaponder.palbert.timing import time_rules, timing_units
from adaponder.train.checkpoint import atomic_write, read_latest, tag_for, validate
from adaponder.train.stopping import signal_stop, stop_cause


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class EvaluationPhases:
    """The evaluation phases and results files of :class:`~adaponder.palbert.finetune.FineTuner` (a mixin: it
    reads the tuner's dev set, rules and results, and its run's model, engine and sink)."""

    def _bar(self, total: int, desc: str, unit: str = "batch", leave: bool = True):
        if self.run.rank != 0 or not self.cfg.logging.progress_bar:
            return _NoBar()
        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr, mininterval=1.0,
                    leave=leave)

    def _stop_requested(self, collective: bool) -> tuple[bool, bool]:
        """(any rank stopping, any rank's launcher gone); this rank's own flags when not ``collective``."""
        t = torch.tensor(self.run.stop_flags(), device=self.device)
        if collective and self.run.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t[0] > 0), bool(t[1] > 0)

    def _check_stop(self, phase: str, collective: bool) -> None:
        """After training: stop (with the results of the finished phases written) if a signal arrived."""
        stop, gone = self._stop_requested(collective)
        if not stop:
            return
        done = ", ".join(self.results.get("phases", [])) or "none"
        latest = read_latest(self.ckpt_dir)
        msg = (f"{stop_cause(self.run.stop_signal, gone)} during the {phase} phase: training is complete (checkpoint "
               f"{self.ckpt_dir / latest if latest else 'none'}); {self.out_dir / 'results.json'} holds the finished "
               f"phases ({done}); rerun with --resume auto to evaluate again")
        raise signal_stop(msg, self.run.step, self.run.stop_signal, gone, self.run.sink.log, phase=phase)

    def _dev_output(self, desc: str, leave: bool) -> PalbertOutput:
        """Collective: the N-pass forward of the whole dev set, each rank computing its shard."""
        bs = self.cfg.eval.batch_size
        per_rank = -(-len(self.dev_ids) // self.run.world_size)
        bar = self._bar(-(-per_rank // bs), desc, leave=leave)
        try:
            return forward_all(self.run.model, self.dev_ids, self.dev_y, bs, self.tokenizer.pad_id,
                               engine=self.run.engine, shard=(self.run.rank, self.run.world_size),
                               progress=bar.update)
        finally:
            bar.close()

    def _restore_best(self) -> None:
        """Collective: the best checkpoint's weights (a no-op when the last step was the best)."""
        if not self.best_step or self.best_step == self.run.step:
            return
        tag_dir = self.ckpt_dir / tag_for(self.best_step)
        validate(tag_dir, self.run.compat)
        self.run.ckpt.load(self.run.engine, tag_dir)
        self.run.sink.log({"kind": "event", "step": self.run.step, "event": "restored_best", "path": str(tag_dir)},
                          f"evaluating the best weights: {tag_dir} (step {self.best_step})")

    def _inference_model(self) -> AdaPonderForSequenceClassification | None:
        """Collective: a model for online inference on rank 0 (None elsewhere). Early exit runs a different
        module sequence per batch, which ZeRO-3's partitioned weights cannot follow: rank 0 then gets an
        unpartitioned copy of the weights; other stages use the engine's module."""
        if self.cfg.deepspeed.zero_stage != 3:
            return self.run.model if self.run.rank == 0 else None
        sd = self.run.engine._zero3_consolidated_16bit_state_dict()
        if self.run.rank != 0:
            return None
        copy = AdaPonderForSequenceClassification(self.run.model.config)  # (the config carries the attention choice)
        missing, unexpected = copy.load_state_dict(sd, strict=False)
        if unexpected or [k for k in missing if k not in self._tied_keys(copy)]:
            raise RuntimeError(f"gathered ZeRO-3 weights do not fit the model: missing {missing}, "
                               f"unexpected {unexpected}")
        return copy.to(self.device).eval()

    @staticmethod
    def _tied_keys(model) -> set[str]:
        names = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        return {n for group in names.values() for n in group[1:]}

    def evaluate(self) -> dict[str, Any] | None:
        """Phases 2–4 on the best weights. Collective until the dev forward is done; then rank 0 alone.
        Returns the results on rank 0, None elsewhere."""
        self._check_stop("dev", collective=True)
        t_eval = time.perf_counter()
        self._restore_best()
        out = self._dev_output("dev (best weights)", leave=True)
        self._check_stop("dev", collective=True)
        plain = self._inference_model()
        if self.run.rank != 0:
            return None
        self._dev_phase(out, t_eval)
        self._online_phase(out, plain, t_eval)
        self._timing_phase(plain, t_eval)
        if self.cfg.train.save_model:
            plain.save_pretrained(self.out_dir / "model")
        self.results["complete"] = True
        self._write_results()
        self.log(results_markdown(self.results))
        return self.results

    def _ticker(self, bar, phase: str) -> Callable[[int], None]:
        """A progress callback that also stops (with the finished phases written) if a signal arrived."""
        def tick(k: int) -> None:
            bar.update(k)
            self._check_stop(phase, collective=False)

        return tick

    def _dev_phase(self, out: PalbertOutput, t_eval: float) -> None:
        """Every exit rule on dev, and the metric of each pass."""
        cfg, ecfg = self.cfg, self.cfg.eval
        n_units = sum(ecfg.sample_draws if r == "sample" else 1 for r in self.rules)
        bar = self._bar(n_units + cfg.model.passes, "exit rules", unit="rule")
        try:
            tick = self._ticker(bar, "dev")
            rules = evaluate_rules(self.run.model, out, self.dev_y, self.spec, self.rules, q=ecfg.q,
                                   patience=ecfg.patience, sample_draws=ecfg.sample_draws, seed=cfg.train.seed,
                                   progress=tick)
            regression = self.run.model.config.is_regression
            per_pass = []
            for i in range(cfg.model.passes):
                preds = predictions_from_outputs(out.pass_logits[:, i], regression).numpy()
                per_pass.append(float(glue_metrics(self.spec.name, preds, self.dev_y)[self.spec.main_metric]))
                tick(1)
        finally:
            bar.close()
        self.results["dev"] = {"rules": rules, "per_pass": per_pass,
                               "mean_p": out.p.mean(0).tolist() if out.p is not None else None}
        self._phase_done("dev", t_eval)

    def _online_phase(self, out: PalbertOutput, plain, t_eval: float) -> None:
        """Examples leave the batch as they exit; the result must agree with the offline rule."""
        ecfg, sel = self.cfg.eval, self.select_rule
        regression = self.run.model.config.is_regression
        batches = list(padded_batches(self.dev_ids, self.dev_y, 32, self.tokenizer.pad_id))
        bar = self._bar(len(batches), f"online {RULE_NAMES[sel]}")
        try:
            online_out, online_exit = predict_all(plain, batches, sel, ecfg.q, ecfg.patience,
                                                  progress=self._ticker(bar, "online"))
        finally:
            bar.close()
        off_outputs, off_idx = offline_exit(out, sel, q=ecfg.q, patience=ecfg.patience, regression=regression,
                                            regression_threshold=self.run.model.config.pabee_regression_threshold)
        online = {
            "rule": sel, "batch_size": 32,
            "metrics": glue_metrics(self.spec.name, predictions_from_outputs(online_out, regression).numpy(),
                                    self.dev_y),
            "mean_exit_pass": float(online_exit.float().mean()),
            "exit_agreement": float((online_exit == off_idx + 1).float().mean()),
            "max_abs_output_diff": float((online_out - off_outputs).abs().max()),
        }
        if sel == "sample":  # per-batch vs whole-set random draws: the streams differ by design
            online["exit_agreement"] = online["max_abs_output_diff"] = None
        self.results["online"] = online
        self._phase_done("online", t_eval)

    def _timing_phase(self, plain, t_eval: float) -> None:
        """Time per example with early exit vs always-last (``timing.enabled``), within timing.budget_seconds."""
        tm, ecfg = self.cfg.timing, self.cfg.eval
        if tm.enabled:
            ids = self.dev_ids[:tm.max_examples]
            budget = f"a budget of {tm.budget_seconds:g} s" if tm.budget_seconds is not None else "no time budget"
            self.log(f"timing phase: {len(ids)} dev examples at batch sizes {tm.batch_sizes}, up to {tm.repeats} "
                     f"rounds, {budget} (timing.budget_seconds)")
            bar = self._bar(timing_units(len(ids), tm.batch_sizes, tm.repeats), "timing")
            try:
                self.results["timing"] = time_rules(plain, ids, self.tokenizer.pad_id,
                                                    rules=[r for r in tm.rules if r in self.rules],
                                                    batch_sizes=tm.batch_sizes, repeats=tm.repeats, q=ecfg.q,
                                                    patience=ecfg.patience, threads=tm.threads,
                                                    budget_seconds=tm.budget_seconds,
                                                    progress=self._ticker(bar, "timing"))
            finally:
                bar.close()
        else:
            self.results["timing"] = None
        self._phase_done("timing", t_eval)

    def _results_base(self) -> dict[str, Any]:
        c = self.run.model.config
        return {
            "task": self.spec.name, "main_metric": self.spec.main_metric, "method": c.palbert_method,
            "num_passes": self.cfg.model.passes, "core_mode": c.mode, "init": self.init,
            "init_revision": self.init_revision, "seed": self.cfg.train.seed,
            "select_rule": self.select_rule, "q": self.cfg.eval.q, "patience": self.cfg.eval.patience,
            "config": self.cfg.to_dict(),
            "data": {"dir": self.data_dir, "hf_dataset": self.cfg.data.hf_dataset,
                     "train_examples": self.counts["train"], "dev_examples": self.counts["dev"],
                     "tokenizer": self.tokenizer.name},
            "majority_baseline": self.majority,
            "phases": [], "complete": False,
            "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                            "machine": platform.machine()},
        }

    def _update_train_results(self) -> None:
        done = self.run.train_done()
        self.results["train"] = {
            "steps": self.run.step, "total_steps": self.run.total_steps, "steps_per_epoch": self.steps_per_epoch,
            "best_step": self.best_step, "best_dev_main": self.best_score, "stopped_early": self.stopped_early,
            "seconds": self.train_seconds, "world_size": self.run.world_size, "history": self.history,
            "checkpoint_dir": str(self.ckpt_dir),
            "resumed_from": str(self.run.resume_dir) if self.run.resume_dir is not None else None}
        if done and "train" not in self.results["phases"]:
            self.results["phases"].append("train")
        self._write_results()

    def _phase_done(self, phase: str, t_eval: float) -> None:
        self.results["phases"].append(phase)
        self.results["eval_seconds"] = time.perf_counter() - t_eval
        self._write_results()
        self.run.sink.log({"kind": "event", "step": self.run.step, "event": "phase_done", "phase": phase},
                          f"{phase} phase done: {self.out_dir / 'results.json'}")

    def _write_results(self) -> None:
        """Rank 0: results.json (and results.md once the dev phase is done), each replaced atomically."""
        if self.run.rank != 0:
            return
        text = json.dumps(self.results, indent=2, default=float) + "\n"
        atomic_write(self.out_dir / "results.json", text.encode("utf-8"))
        if "dev" in self.results:
            atomic_write(self.out_dir / "results.md", results_markdown(self.results).encode("utf-8"))


__all__ = ["EvaluationPhases"]
