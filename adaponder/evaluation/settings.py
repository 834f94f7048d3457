"""Load a checkpoint for evaluation with its recurrence settings pinned, checked and printable.

Every evaluation entry point (perplexity, dial, report, the ``adaponder`` lm-eval model) goes through
:func:`load_for_eval` / :func:`recurrence_overrides`, so K (passes), τ (halting threshold) and the exit rule
are set in one place and printed the same way. K and τ are configuration values the model is *built* with
(``from_pretrained(path, passes=K)``); τ and the exit rule are settings of each call (:class:`RunSettings`,
:meth:`RecurrenceSettings.run_settings`): nothing is written into a model's config afterwards.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from adaponder.data import load_tokenizer
from adaponder.errors import UsageError
from adaponder.hub import checkpoint_source
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
from adaponder.modeling.exit_rules import ConsistencyExit, ExitRule, QExit
from adaponder.modeling.run_settings import DEFAULT_TAU, RunSettings
from adaponder.train.finite_weights import NonFiniteWeightsError, first_nonfinite

from .exit_calibration import load_calibration
from .pruning import FIXED_RULES, make_policy

#: ``learned`` (the gates, A6), token-level Q-exit on the halting heads (A21, B9), the calibrated consistency exit
#: (A23) or a fixed-pruning rule (:data:`.pruning.FIXED_RULES`).
EXIT_RULES = ("learned", "q-exit", "consistency", *FIXED_RULES)
#: Rules that read heads of the model (built with it: :meth:`RecurrenceSettings.run_settings`).
HEAD_RULES = ("q-exit", "consistency")
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float32"``/``"bf16"``/… or a ``torch.dtype``; ``None``/``"auto"`` keep the checkpoint's dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key == "auto":
        return None
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(set(_DTYPES)))}")
    return _DTYPES[key]


@dataclass
class RecurrenceSettings:
    """The recurrence settings an evaluation ran with (what the report pins and prints).

    ``passes`` is K in use (≤ ``trained_passes`` for gated models); ``tau`` is τ (A6);
    ``exit_rule`` is ``learned`` (the gates, A6) or fixed pruning (``uniform`` / ``geometric`` exit-pass
    histograms with mean ``target_mean_exit``, drawn with ``pruning_seed``).
    """

    checkpoint: str
    mode: str
    passes: int
    trained_passes: int
    tau: float = DEFAULT_TAU
    exit_rule: str = "learned"
    target_mean_exit: float | None = None
    pruning_seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    q: float = 0.5
    consistency_threshold: float | None = None
    calibration: str | None = None  # where the consistency threshold came from

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        rule = self.exit_rule
        if rule not in EXIT_RULES:  # an exit rule object given in Python: its repr
            pass
        elif rule == "q-exit":
            rule += f" (per token on the halting heads, A21/B9: stop once Σ p_j > q = {self.q:g})"
        elif rule == "consistency":
            rule += (f" (consistency heads, A23: stop once P(pass i's greedy = pass K's) > {self.consistency_threshold:.6g}"
                     f"; {self.calibration or 'threshold given'})")
        elif rule != "learned":
            rule += f" (fixed pruning, target mean exit pass {self.target_mean_exit:.4f}, seed {self.pruning_seed})"
        else:
            rule += " (gates, A6: halt after pass i when s^i < τ)"
        return [
            f"checkpoint: {self.checkpoint}",
            f"mode: {self.mode}",
            f"passes K: {self.passes} (trained with {self.trained_passes})",
            f"halting threshold τ: {self.tau:g}",
            f"exit rule: {rule}",
            f"dtype: {self.dtype}, device: {self.device}",
        ]

    def run_settings(self, model=None) -> RunSettings:
        """The :class:`RunSettings` of the scoring calls: τ and, for fixed pruning, a freshly seeded rule; the rules
        that read the model's heads (Q-exit, the consistency exit) need the ``model``."""
        if self.exit_rule in HEAD_RULES:
            return RunSettings(tau=self.tau, exit_rule=head_rule(model, self.exit_rule, self.q,
                                                                 self.consistency_threshold))
        rule = make_policy(self.exit_rule, self.passes, self.target_mean_exit, self.pruning_seed)
        return RunSettings(tau=self.tau, exit_rule=rule)

    def banner(self) -> str:
        return "[adaponder] recurrence settings\n" + "\n".join(f"  {line}" for line in self.lines())


def trained_passes(model) -> int:
    """K the checkpoint was trained with: the ``passes`` of the ``config.json`` it was loaded from (a model built
    to run fewer passes leaves the later gates unused), else gates + 1 for gated models, else ``config.passes``."""
    source = str(getattr(model.config, "_name_or_path", "") or "")
    if source and os.path.isfile(os.path.join(source, "config.json")):
        return AdaPonderConfig.from_pretrained(source).num_passes
    cfg = model.config
    if cfg.mode == "adaponder" and len(model.gates) > 0:
        return len(model.gates) + 1
    return int(cfg.passes)


def recurrence_overrides(checkpoint: str | os.PathLike, passes: int | None = None) -> dict[str, Any]:
    """The configuration values to build ``checkpoint``'s model with (``from_pretrained(path, **values)``),
    refusing what the checkpoint cannot run: a gated model runs at most the K it was trained with (one gate per
    pondering step); ``vanilla`` runs exactly one pass."""
    values: dict[str, Any] = {}
    if passes is not None:
        cfg = AdaPonderConfig.from_pretrained(os.fspath(checkpoint))
        passes = int(passes)
        # (UsageError, a ValueError: every command shows these as one line naming passes, not a traceback)
        if passes < 1:
            raise UsageError(f"passes must be >= 1, got {passes}")
        if cfg.mode == "vanilla" and passes != 1:
            raise UsageError(f"passes={passes}: a vanilla (one-pass) checkpoint runs exactly one pass")
        if cfg.mode == "adaponder" and passes > cfg.num_passes:
            raise UsageError(f"this checkpoint has gates for {cfg.num_passes} passes; passes={passes} exceeds it (the "
                             f"K it was trained with); expected 1 <= passes <= {cfg.num_passes}")
        # heads with one row per pass (A21-A24) are shaped by the trained K: a model of fewer passes cannot load them
        sized = [name for name in ("halting_heads", "consistency_heads", "early_redraft_heads")
                 if getattr(cfg, name, False)]
        if sized and passes < cfg.num_passes:
            raise UsageError(f"passes={passes}: this checkpoint's {' and '.join(sized)} hold one head per pass of the "
                             f"K={cfg.num_passes} it was trained with; run it at passes={cfg.num_passes}")
        values["passes"] = passes
    return values


def check_exit_rule(exit_rule: str | ExitRule) -> None:
    """Raise ``ValueError`` unless ``exit_rule`` is one of :data:`EXIT_RULES` (or an exit rule object)."""
    if not isinstance(exit_rule, ExitRule) and exit_rule not in EXIT_RULES:
        raise ValueError(f"exit_rule must be one of {', '.join(EXIT_RULES)}; got {exit_rule!r}")


def head_rule(model, exit_rule: str, q: float = 0.5, threshold: float | None = None) -> ExitRule:
    """The exit rule object of ``q-exit`` (on the model's halting heads) or ``consistency`` (its consistency heads at
    ``threshold``); a clear error for a model without those heads."""
    if model is None:
        raise ValueError(f"exit rule {exit_rule!r} reads the model's heads: pass the model")
    if exit_rule == "q-exit":
        if getattr(model, "halting_heads", None) is None:
            raise UsageError(f"exit rule 'q-exit' needs halting heads (a model trained with halting_heads: true, "
                             f"docs/method.md A21); this {model.config.mode} model has none")
        if not 0.0 <= float(q) <= 1.0:
            raise UsageError(f"q (the Q-exit threshold, B9) must lie in [0, 1], got {q}")
        return QExit(float(q), head=model.halting_heads)
    if getattr(model, "consistency_heads", None) is None:
        raise UsageError("exit rule 'consistency' needs consistency heads (a model trained with consistency_heads: "
                         f"true, docs/method.md A23); this {model.config.mode} model has none")
    if threshold is None:
        raise UsageError("exit rule 'consistency' needs its calibrated threshold (adaponder calibrate, or give one)")
    return ConsistencyExit(float(threshold), model.consistency_heads)


def settings_of(model, checkpoint: str, exit_rule: str = "learned", target_mean_exit: float | None = None,
                pruning_seed: int = 0, tau: float | None = None, q: float = 0.5,
                consistency_threshold: float | None = None) -> RecurrenceSettings:
    """The settings an evaluation of ``model`` runs with; ``tau`` None: :data:`DEFAULT_TAU` (checked, A6). The
    consistency exit's threshold, when not given, is the calibration written next to the checkpoint
    (``adaponder calibrate``)."""
    check_exit_rule(exit_rule)
    cfg = model.config
    calibration = None
    if exit_rule == "consistency" and consistency_threshold is None:
        try:
            found = load_calibration(checkpoint)
        except FileNotFoundError as err:
            raise UsageError(str(err)) from None
        consistency_threshold = float(found["threshold"])
        calibration = (f"calibrated to δ = {found['delta']:g} at confidence {found['confidence']:g} on "
                       f"{found['windows']} windows of split {found['split']!r}")
    if exit_rule in HEAD_RULES:
        head_rule(model, exit_rule, q, consistency_threshold)  # refused here, before any scoring, if it cannot run
    return RecurrenceSettings(
        checkpoint=str(checkpoint), mode=cfg.mode, passes=int(cfg.passes), trained_passes=trained_passes(model),
        tau=RunSettings(tau=DEFAULT_TAU if tau is None else tau).tau, exit_rule=exit_rule,
        target_mean_exit=None if target_mean_exit is None else float(target_mean_exit),
        pruning_seed=int(pruning_seed), dtype=str(model.dtype).removeprefix("torch."), device=str(model.device),
        q=float(q), consistency_threshold=None if consistency_threshold is None else float(consistency_threshold),
        calibration=calibration,
    )


def load_tokenizer_for(checkpoint: str | os.PathLike, revision: str | None = None):
    """The checkpoint's own tokenizer if it has one, else the bundled Pythia (GPT-NeoX-20B) tokenizer.
    ``checkpoint`` is a folder or a hub id (at ``revision``; :func:`adaponder.hub.checkpoint_source`)."""
    path = os.fspath(checkpoint_source(checkpoint, revision))
    if any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return AutoTokenizer.from_pretrained(path)
    tok = load_tokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=tok._backend, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|padding|>",
                                   name_or_path=tok.name)  # named in messages, e.g. a corpus of another tokenizer


def load_for_eval(checkpoint: str | os.PathLike, passes: int | None = None,
                  dtype: str | torch.dtype | None = "float32", device: str = "cpu", revision: str | None = None):
    """``(model, tokenizer)`` in eval mode on ``device``, built with K (see :func:`recurrence_overrides`).
    ``checkpoint`` is a folder or a hub id (at ``revision``), resolved as ``init.backbone`` is
    (:func:`adaponder.hub.checkpoint_source`)."""
    path = os.fspath(checkpoint_source(checkpoint, revision))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path}: not a checkpoint directory (no config.json)")
    torch_dtype = parse_dtype(dtype)
    require_readable_weights(path)
    model = AdaPonderForCausalLM.from_pretrained(path, dtype="auto" if torch_dtype is None else torch_dtype,
                                                 **recurrence_overrides(path, passes))
    require_finite_weights(model, path)
    model.to(device).eval()
    return model, load_tokenizer_for(path)


def require_readable_weights(checkpoint: str | os.PathLike) -> None:
    """Every ``*.safetensors`` file of a checkpoint folder must open (its header read and its size checked
    against the tensors it lists; nothing else is read): a truncated or damaged file is named, with safetensors'
    reason, instead of a deserializing error that names no file."""
    folder = os.fspath(checkpoint)
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(folder, name), framework="pt"):
                pass
        except SafetensorError as err:
            reason = str(err).removeprefix("Error while deserializing header: ")
            raise UsageError(f"{os.path.join(folder, name)}: cannot be read ({reason}): the file is truncated or "
                             "damaged; export the checkpoint again") from None


def require_finite_weights(model, checkpoint: str | os.PathLike) -> None:
    """Refuse weights holding NaN or inf (every score would be NaN): :class:`NonFiniteWeightsError` naming the
    weights file and the first such tensor."""
    found = first_nonfinite(model.named_parameters())
    if found:
        path = os.fspath(checkpoint)
        names = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin")))
        where = os.path.join(path, names[0]) if len(names) == 1 else path
        raise NonFiniteWeightsError(f"{where}: the weights are not all finite ({found}); nothing can be evaluated "
                                    "with them (export an earlier training checkpoint)")


__all__ = ["EXIT_RULES", "HEAD_RULES", "head_rule", "RecurrenceSettings", "check_exit_rule", "load_for_eval",
           "load_tokenizer_for", "parse_dtype", "recurrence_overrides", "require_finite_weights", "require_readable_weights", "settings_of", "trained_passes"]
