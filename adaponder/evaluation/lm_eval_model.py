"""The ``adaponder`` lm-eval model: lm-eval's ``HFLM`` with the recurrence settings pinned and the realised
compute of every scored token counted.

Importing this module registers the model with lm-eval (``@register_model("adaponder")``). lm-eval's own
CLI does not import it, so use ``adaponder-eval`` / ``python -m adaponder.cli.lm_eval`` (lm-eval's CLI
with this module imported first), or in Python::

    import adaponder.evaluation.lm_eval_model  # registers "adaponder"
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    res = simple_evaluate(model="adaponder", model_args="checkpoint=CKPT,tau=1e-4",
                          tasks=["adaponder_lambada_openai"], task_manager=TaskManager(include_path="eval/tasks"))
    res["config"]["adaponder"]  # settings, mean exit pass, exit histogram, FLOPs per token

Model arguments (``--model_args k=v,...``):

* ``checkpoint`` (or ``pretrained``): a saved AdaPonder checkpoint folder, or a hub id ``org/name`` with
  ``revision`` (branch, tag or commit) resolved through the Hugging Face cache as ``init.backbone`` is.
* ``passes``: K to run (default: the checkpoint's; at most the trained K for gated models).
* ``tau``: τ of A6 (default: 1e-4).
* ``exit_rule``: ``learned`` (the gates); ``q-exit`` (token-level Q-exit on the halting heads, A21 / B9, at
  ``q``, default 0.5); ``consistency`` (the consistency heads, A23, at ``consistency_threshold``, default the
  calibration ``adaponder calibrate`` wrote next to the checkpoint); or fixed pruning ``uniform`` /
  ``geometric`` (docs/method.md (a), baselines) with mean exit pass ``target_mean_exit``; without it, the learned
  policy's mean exit pass on ``calibration_tokens`` tokens of ``calibration_data`` (default: the bundled corpus)
  is used and printed.
  In Python, any :class:`~adaponder.modeling.exit_rules.ExitRule` object.
  Every forward of the model (scoring and generation) runs with these settings (``RunSettings``).
* ``pruning_seed``: seed of the fixed-pruning draws.
* ``speculative_draft_tokens`` γ (default: off) and ``speculative_draft_passes`` P (default 1): generation tasks
  decode self-speculatively (:mod:`adaponder.generation.speculative`; the same greedy output). The halting summary
  then counts the prompts' positions only: drafts and verifications run the passes without the forward hook.
* ``decoding_schedule`` (``token``, the default; ``depth``; ``pipelined``) and ``decoding_compile`` (``true``: the
  compiled static-shape steps): how generation tasks decode (``adaponder.generation.DecodingConfig``, greedy tokens
  equal to ``generate``'s); a combination the model's mode does not take is refused before the model runs.
* ``batch_size``, ``dtype`` (default ``auto``: the checkpoint's), ``device`` (default: cuda if available),
  and any other ``HFLM`` argument (``max_length``, …).

Counting: a forward hook records the exit passes D_t (A8) of each call. For loglikelihood requests the
scored positions are those lm-eval scores (the continuation tokens' predicting positions); for generation,
the position that predicts each generated token. The summary — tokens, mean exit pass, exit-pass histogram,
FLOPs per token (A17, at the mean request length as context) and its multiple of one pass — is logged at the
end of the run and stored under ``results["config"]["adaponder"]``.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

import adaponder.modeling  # noqa: F401  (registers the AdaPonder config/model with transformers' Auto classes)
from adaponder.data import bundled_corpus_dir
from adaponder.data.tokenizer import as_tokenizer
from adaponder.errors import UsageError
from adaponder.hub import checkpoint_source
from adaponder.modeling.exits import exit_counts
from adaponder.modeling.input_checks import context_tokens

from .accounting import ONE_PASS_BASELINE, flops_summary
from .perplexity import load_documents, score_documents
from .pruning import FIXED_RULES
from adaponder.modeling.exit_rules import ExitRule
from adaponder.modeling.run_settings import RunSettings
from adaponder.generation import DecodingConfig, SpeculativeConfig
from adaponder.generation.config import SCHEDULES
from adaponder.generation.support import Combination, refusal_line

from .settings import (check_exit_rule, recurrence_overrides, require_finite_weights, require_readable_weights,
                       settings_of)

log = logging.getLogger("adaponder.evaluation")


def _as_int(v, name: str = "value"):
    """A model argument that must be a whole number (``--model_args name=v``), or None when not given."""
    if v is None or v == "" or v == "None":
        return None
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        return int(v) if isinstance(v, (int, float)) else int(str(v).strip())
    except ValueError:
        raise UsageError(f"--model_args {name}={v}: not an integer; expected a whole number (e.g. {name}=4)") from None


def _as_bool(v, name: str) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise UsageError(f"--model_args {name}={v}: expected true or false")


def _as_float(v, name: str = "value"):
    if v is None or v == "" or v == "None":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        raise UsageError(f"--model_args {name}={v}: not a number; expected a number (e.g. {name}=0.5)") from None


@register_model("adaponder")
class AdaPonderLM(HFLM):
    """``HFLM`` for AdaPonder checkpoints with pinned K, τ and exit rule, reporting realised compute."""

    #: every instance created in this process (``adaponder-eval`` prints their summaries at the end)
    instances: list["AdaPonderLM"] = []

    def __init__(self, checkpoint: str | None = None, pretrained=None, passes=None, tau=None,
                 exit_rule: str | ExitRule = "learned", target_mean_exit=None, pruning_seed=0,
                 calibration_data: str | None = None, calibration_tokens=4096, batch_size=1, dtype="auto",
                 device: str | None = None, speculative_draft_tokens=None, speculative_draft_passes=1, q=0.5,
                 consistency_threshold=None, decoding_schedule="token", decoding_compile=False, **kwargs):
        ckpt = checkpoint if checkpoint is not None else pretrained
        if ckpt is None:
            raise ValueError("the adaponder model needs checkpoint=PATH (or pretrained=PATH)")
        if isinstance(ckpt, (str, os.PathLike)):  # a hub id (+ revision) is read from its cached snapshot folder
            ckpt = checkpoint_source(ckpt, kwargs.pop("revision", None))
            require_readable_weights(ckpt)
        check_exit_rule(exit_rule)
        # whole numbers, checked before the model loads (lm-eval hands model_args over as strings)
        draft_tokens = _as_int(speculative_draft_tokens, "speculative_draft_tokens")
        draft_passes = _as_int(speculative_draft_passes, "speculative_draft_passes")
        compiled = _as_bool(decoding_compile, "decoding_compile")
        if decoding_schedule not in SCHEDULES:
            raise UsageError(f"--model_args decoding_schedule={decoding_schedule}: expected one of "
                             f"{', '.join(SCHEDULES)}")
        passes = _as_int(passes, "passes")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        kwargs.setdefault("backend", "causal")  # the config's model_type is not in HF's causal-LM mapping
        if isinstance(ckpt, (str, os.PathLike)):  # K is built in (HFLM hands it on to from_pretrained)
            kwargs.update(recurrence_overrides(ckpt, passes))
        elif passes is not None:
            raise ValueError("passes applies to a checkpoint path; build a model instance with it instead "
                             "(AdaPonderForCausalLM.from_pretrained(path, passes=…))")
        super().__init__(pretrained=ckpt, batch_size=batch_size, dtype=dtype, device=device, **kwargs)
        self.checkpoint = str(ckpt) if isinstance(ckpt, (str, os.PathLike)) else type(ckpt).__name__
        model = self._model
        if isinstance(ckpt, (str, os.PathLike)):
            require_finite_weights(model, ckpt)
        self.nonfinite_scores = 0  # rows whose scored logits held NaN/inf (adaponder-eval then fails)
        self.exit_rule = exit_rule
        self.pruning_seed = int(pruning_seed)
        tau = _as_float(tau, "tau")
        target = _as_float(target_mean_exit)
        if isinstance(exit_rule, ExitRule):  # a rule object from Python: applied as it is
            self.settings = settings_of(model, self.checkpoint, "learned", None, self.pruning_seed, tau=tau)
            self.settings.exit_rule = repr(exit_rule)
            self.run_settings = RunSettings(tau=self.settings.tau, exit_rule=exit_rule)
        else:
            if exit_rule in FIXED_RULES and target is None:
                self.run_settings = RunSettings() if tau is None else RunSettings(tau=tau)
                target = self._calibrate(calibration_data, int(calibration_tokens))
            self.settings = settings_of(model, self.checkpoint, exit_rule, target, self.pruning_seed, tau=tau,
                                        q=_as_float(q, "q"),
                                        consistency_threshold=_as_float(consistency_threshold, "consistency_threshold"))
            self.run_settings = self.settings.run_settings(model)
        self.target_mean_exit = target
        print(self.settings.banner(), flush=True)
        self.reset_halting_stats()
        self._generating = False
        self._last_exit = None
        self._row = 0
        model.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        model.register_forward_hook(self._post_hook, with_kwargs=True)
        self.speculative = None
        if draft_tokens:
            self.speculative = SpeculativeConfig(draft_passes, draft_tokens)
            self.speculative.check(model.config.num_passes)
        self.decoding = DecodingConfig(decoding_schedule, self.speculative, compiled)
        line = refusal_line(Combination(model.config.mode, decoding_schedule, draft_tokens is not None, compiled,
                                        padded=True))
        if line is not None:  # lm-eval batches left-padded prompts
            raise UsageError(f"--model_args: {line}")
        if self.decoding == DecodingConfig():
            self.decoding = None
        AdaPonderLM.instances.append(self)

    @property
    def max_length(self) -> int:
        """HFLM reads ``max_position_embeddings`` as tokens; in pause mode a token takes 1 + num_pauses of them."""
        return self._max_length or context_tokens(self._model.config)

    # -- fixed-pruning target ------------------------------------------------------------------------
    def _calibrate(self, data: str | None, max_tokens: int) -> float:
        if data is None:
            data = str(bundled_corpus_dir())
        docs = load_documents(data, self.tokenizer, max_tokens=max_tokens)
        codec = as_tokenizer(self.tokenizer)
        window = min(self.max_length, context_tokens(self._model.config))
        scores = score_documents(self._model, docs, window=window, eod_id=codec.eod_id, pad_id=codec.pad_id,
                                 settings=self.run_settings)
        mean = float(scores.exit_pass.mean())
        print(f"[adaponder] fixed-pruning target: the learned policy's mean exit pass on {len(scores)} tokens of "
              f"{data} is {mean:.4f} (pass target_mean_exit=... to pin it)", flush=True)
        return mean

    # -- hooks ----------------------------------------------------------------------------------------
    def _pre_hook(self, module, args, kwargs):
        kwargs["settings"] = self.run_settings
        return args, kwargs

    def _post_hook(self, module, args, kwargs, output):
        exit_pass = getattr(output, "exit_pass", None)
        if exit_pass is None:
            return None
        self._last_exit = exit_pass.detach()
        self._row = 0
        if self._generating:  # the last position predicts the next generated token
            self._count(exit_pass[:, -1], exit_pass.shape[1], kind="generated")
        return None

    def _count(self, exit_pass: torch.Tensor, context: int, kind: str = "scored") -> None:
        ep = exit_pass.reshape(-1).long().cpu()
        K = len(self._hist[kind])
        self._hist[kind] += exit_counts(ep.clamp(1, K), K).numpy()
        self._ctx[kind] += float(context) * ep.numel()

    def _select_cont_toks(self, logits, contlen=None, inplen=None):
        # HFLM calls this once per row of the last forward, in row order: the scored positions of that row.
        if not bool(torch.isfinite(logits).all()):
            self.nonfinite_scores += 1
        if self._last_exit is not None and self.backend == "causal" and contlen and inplen:
            row = self._row
            self._row += 1
            if row < self._last_exit.shape[0]:
                self._count(self._last_exit[row, inplen - contlen:inplen], inplen, kind="scored")
                self._count(self._last_exit[row, :inplen], inplen, kind="input")
        return super()._select_cont_toks(logits, contlen=contlen, inplen=inplen)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        self._generating = True
        try:
            if self.decoding is not None:
                return self._engine_generate(context, max_length, **generation_kwargs)
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        finally:
            self._generating = False

    def _engine_generate(self, context, max_length: int, **kw):
        """Decoding as ``decoding_schedule``, ``decoding_compile`` and the draft say, up to ``max_length`` tokens in
        all; lm-eval cuts the text at the stop sequences afterwards, as it does after ``generate``'s own stopping
        criteria (which only stop early)."""
        temperature = float(kw.pop("temperature", 0.0) or 0.0)
        do_sample = bool(kw.pop("do_sample", temperature > 0))
        sampling = dict(do_sample=True, temperature=temperature, top_k=kw.pop("top_k", None),
                        top_p=kw.pop("top_p", None)) if do_sample else {}
        out = self.model.generate(context, attention_mask=kw.pop("attention_mask", None),
                                  max_new_tokens=max(1, max_length - context.shape[1]),
                                  pad_token_id=self.tokenizer.pad_token_id, settings=self.run_settings,
                                  decoding=self.decoding, **sampling)
        self.speculative_stats = out.stats
        return out.sequences

    # -- summary --------------------------------------------------------------------------------------
    def reset_halting_stats(self) -> None:
        K = int(self._model.config.num_passes)
        self._hist = {k: np.zeros(K, dtype=np.int64) for k in ("scored", "input", "generated")}
        self._ctx = {k: 0.0 for k in self._hist}
        rule = getattr(getattr(self, "run_settings", None), "exit_rule", None)
        if hasattr(rule, "reset"):  # a seeded rule (fixed pruning) draws the same subsets again
            rule.reset()

    def halting_summary(self) -> dict:
        """Settings plus, per kind of position (``scored``: loglikelihood continuations; ``input``: every
        position of the scored requests; ``generated``: generated tokens), token count, mean exit pass,
        exit-pass histogram and FLOPs per token."""
        out = {"settings": self.settings.as_dict()}
        for kind, hist in self._hist.items():
            n = int(hist.sum())
            if n == 0:
                continue
            passes = np.repeat(np.arange(1, len(hist) + 1), hist)
            out[kind] = {
                "tokens": n,
                "mean_exit_pass": float(passes.mean()),
                "exit_histogram": hist.tolist(),
                "flops_per_token": flops_summary(self._model, passes, self._ctx[kind] / n),
            }
        return out

    def summary_lines(self) -> list[str]:
        s = self.halting_summary()
        lines = []
        for kind in ("scored", "generated", "input"):
            if kind in s:
                r = s[kind]
                f = r["flops_per_token"]
                lines.append(f"{kind} tokens: {r['tokens']}, mean exit pass {r['mean_exit_pass']:.4f} "
                             f"(of K={len(r['exit_histogram'])}), exit histogram {r['exit_histogram']}, "
                             f"FLOPs/token {f['total'] / 1e6:.3f} M = {f['x_one_pass']:.3f}x one pass "
                             f"(context {f['context']:.0f})")
        if lines:
            lines.append(ONE_PASS_BASELINE)
        return lines

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["adaponder"] = self.halting_summary()
        for line in self.summary_lines():
            log.info("[adaponder] %s", line)
        return info


__all__ = ["AdaPonderLM"]
