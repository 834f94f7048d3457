"""Configuration of AdaPonder recurrent models (GPT-NeoX fields + recurrence fields).

This file is copied next to saved checkpoints (``auto_map``) so that
``AutoConfig.from_pretrained(path, trust_remote_code=True)`` works without ``adaponder`` installed:
it must only import ``transformers`` and the standard library.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Mapping

from huggingface_hub.dataclasses import strict
from transformers import GPTNeoXConfig

MODES = ("vanilla", "ponderlm", "loop", "adaponder", "pause")
INIT_SCHEMES = ("hf", "pythia")
DEFAULT_PAUSE_TOKENS = 3  # K − 1 for the default K = 4: the same extra backbone compute per token as 4 passes
GATE_ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")

# Run-time settings that configs written before ``RunSettings`` held (``run_settings.LEGACY_CONFIG_KEYS``, repeated
# here because this file travels alone): accepted on load and dropped.
LEGACY_RUN_KEYS = ("halting_threshold", "compact_inference", "ponder_chunk_size", "ponder_recompute")
_DEFAULT_TAU = 1e-4  # run_settings.DEFAULT_TAU

# Keys that GPTNeoXConfig accepts under legacy names (converted into ``rope_parameters``).
_LEGACY_KEYS = {"rotary_pct", "rotary_emb_base", "rope_scaling", "attn_implementation", "torch_dtype", "dtype"}


try:
    from adaponder.typed_config import ConfigError as _ConfigErrorBase
except ImportError:  # a checkpoint's copy of this file, loaded where adaponder is not installed
    _ConfigErrorBase = ValueError


class AdaPonderConfigError(_ConfigErrorBase):
    """Raised once, listing every problem found in a model configuration.

    Where adaponder is installed this is an ``adaponder.typed_config.ConfigError`` like the training, fine-tuning
    and study configurations' errors, so ``except ConfigError`` catches every configuration problem. This file
    also travels with checkpoints, where it may import only the standard library and transformers: there the
    class is a ``ValueError`` with the same interface (``problems``, ``source``).
    """

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        # (not ConfigError.__init__, which does not exist where this file travels alone)
        ValueError.__init__(self, f"{len(self.problems)} problem(s){where}:\n{lines}")


@strict
class AdaPonderConfig(GPTNeoXConfig):
    r"""GPT-NeoX (Pythia) shape plus the recurrence of ``docs/method.md`` (part a).

    Recurrence fields:
        mode: ``vanilla`` (one pass, plain Pythia), ``ponderlm`` (K passes, pondering feedback, no gates),
            ``loop`` (the layer stack applied K times to the hidden state), ``adaponder`` (gated, A1–A9),
            ``pause`` (one pass; P learnable pause embeddings after every token, A19).
        pause_tokens: P of A19 (``pause`` mode only). ``None`` = 3, the extra backbone compute of K = 4 passes;
            0 is exactly ``vanilla``. The backbone sees ``(P + 1)·T`` positions, which
            ``max_position_embeddings`` must cover.
        init: weight initialisation of a from-scratch model (A20): ``hf`` (transformers' N(0, 0.02)) or
            ``pythia`` (GPT-NeoX small_init / wang_init; PonderLM's depth- and pass-scaled truncated
            normal for the pondering modes). Checkpoint loading never re-initialises loaded weights.
        halting_heads: a per-token halting probability λ_i per pass (A21; ``ponderlm`` and ``loop``), trained by
            the PonderNet exit-distribution loss (``schedule.per_pass``) and read by token-level Q-exit.
        consistency_heads: a per-pass head predicting "pass i's greedy token is the full model's" (A23), trained on
            detached states and read by the calibrated consistency exit.
        draft_head: a head on pass 1's state that predicts the full model's distribution (A24), trained with the
            gradient stopped at the backbone; self-speculative decoding drafts with it.
        redraft_head: the same kind of head on pass K−1's state (A24); pipelined decoding drafts the next token
            again from it and restarts that token early where it disagrees with the first draft. Needs K ≥ 3.
        early_redraft_heads: re-draft heads on passes 2..K−2 as well (with ``redraft_head``; K ≥ 4): pipelined
            decoding re-drafts at every pass from 2 to K−1 and drops a wrong draft as soon as one disagrees.
        passes: K, the number of passes. ``None`` = the mode's default (1 for vanilla, 4 otherwise).
        input_scale: c of A1 (``E⁰ = c·Ẽ[x]``). PonderLM's recipe: 1 for 70M/160M, K−1 for 410M and up.
        embedding_multiplier: α of ``Ẽ = α·W_E`` (A1). ``None`` = sqrt(hidden_size) as in A1. Only the
            pondering modes scale embeddings; ``vanilla`` and ``loop`` use ``W_E`` as Pythia does.
        gate_hidden_mult / gate_activation / gate_init_bias: the gate MLP of A5,
            ``Linear(d, m·d) → act → Linear(m·d, 1)``; the last bias starts at ``gate_init_bias``
            (+4 gives s ≈ 0.98, i.e. "s ≈ 1 at start").

    The config holds only what defines the trained model. How a call runs it — τ of A6, the exit rule, fewer
    passes, compaction, chunking — is a :class:`~.run_settings.RunSettings` passed to that call. Configs written
    before that split (``halting_threshold``, ``compact_inference``, ``ponder_chunk_size``, ``ponder_recompute``)
    still load: those keys are dropped (:data:`~.run_settings.LEGACY_CONFIG_KEYS`).
    """

    model_type = "adaponder"

    mode: str = "adaponder"
    passes: int | None = None
    input_scale: float = 1.0
    embedding_multiplier: float | None = None
    gate_hidden_mult: int = 4
    gate_activation: str = "gelu"
    gate_init_bias: float = 4.0
    pause_tokens: int | None = None
    init: str = "hf"
    halting_heads: bool = False
    consistency_heads: bool = False
    draft_head: bool = False
    redraft_head: bool = False
    early_redraft_heads: bool = False

    def __post_init__(self, **kwargs):
        for key in LEGACY_RUN_KEYS:  # run-time settings that older configs held: not the model's any more
            value = self.__dict__.pop(key, kwargs.pop(key, None))
            if key == "halting_threshold" and value is not None and value != _DEFAULT_TAU:
                # the one dropped setting that changes results: say so rather than run at another τ in silence
                warnings.warn(f"this config sets halting_threshold={value}, a run-time setting that configs no "
                              f"longer hold: τ is passed per call (RunSettings(tau={value})); calls that pass none "
                              f"run at τ = {_DEFAULT_TAU:g}", UserWarning, stacklevel=2)
        if self.passes is None:
            self.passes = 1 if self.mode in ("vanilla", "pause") else 4
        if self.mode == "pause" and self.pause_tokens is None:
            self.pause_tokens = DEFAULT_PAUSE_TOKENS
        super().__post_init__(**kwargs)

    # ``@strict`` calls this on creation (and after ``validate()``): we collect every problem at once.
    def validate_architecture(self):
        problems = semantic_problems(self.to_diff_dict() | _core_values(self))
        if problems:
            raise AdaPonderConfigError(problems)

    # -- derived quantities -------------------------------------------------------------------------
    @property
    def num_passes(self) -> int:
        return int(self.passes)

    @property
    def num_pauses(self) -> int:
        """P of A19: pause positions after every token (0 outside ``pause`` mode)."""
        return int(self.pause_tokens or 0) if self.mode == "pause" else 0

    @property
    def ponders(self) -> bool:
        """Whether passes feed back the pondering embedding (A4, A7)."""
        return self.mode in ("ponderlm", "adaponder")

    @property
    def gated(self) -> bool:
        return self.mode == "adaponder" and self.num_passes > 1

    @property
    def embedding_scale(self) -> float:
        """α of ``Ẽ = α·W_E`` (A1); 1 for the modes that do not ponder."""
        if not self.ponders:
            return 1.0
        return math.sqrt(self.hidden_size) if self.embedding_multiplier is None else float(self.embedding_multiplier)

    @property
    def first_pass_scale(self) -> float:
        """Scale of the first pass's input embedding: ``c·α`` (A1)."""
        return self.input_scale * self.embedding_scale if self.ponders else 1.0

    # -- construction from user files -----------------------------------------------------------------
    @classmethod
    def known_keys(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)} | _LEGACY_KEYS

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str | None = None) -> "AdaPonderConfig":
        """Build from a user mapping (a YAML ``model:`` section), rejecting unknown keys.

        Every problem — unknown keys, wrong types, inconsistent values — is reported in one
        :class:`AdaPonderConfigError` that names the source file.
        """
        problems = [f"'{k}' is a run-time setting (passed per call in a RunSettings), not part of the model config"
                    if k in LEGACY_RUN_KEYS else f"unknown key '{k}'" for k in values if k not in cls.known_keys()]
        type_problems = _type_problems(cls, values)
        problems += type_problems
        # Values of the wrong type are reported above; check the rest against each other.
        bad = {p.split("'")[1] for p in type_problems}
        merged = {**_defaults(cls), **{k: v for k, v in values.items() if k not in bad}}
        problems += semantic_problems(merged)
        if problems:
            raise AdaPonderConfigError(problems, source)
        try:
            return cls(**dict(values))
        except AdaPonderConfigError as err:
            raise AdaPonderConfigError(err.problems, source) from None
        except (TypeError, ValueError) as err:  # anything transformers itself rejects
            raise AdaPonderConfigError([str(err)], source) from None


def _defaults(cls) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
    return out


def _core_values(cfg: AdaPonderConfig) -> dict[str, Any]:
    names = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
             "mode", "passes", "gate_hidden_mult", "gate_activation", "input_scale",
             "embedding_multiplier", "rope_parameters", "max_position_embeddings",
             "pause_tokens", "init", "halting_heads", "consistency_heads", "draft_head",
             "redraft_head", "early_redraft_heads")
    return {n: getattr(cfg, n) for n in names}


def _type_problems(cls, values: Mapping[str, Any]) -> list[str]:
    """Cheap type checks so that a string where a number belongs is reported with the rest."""
    numeric = {"hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
               "max_position_embeddings", "gate_hidden_mult", "passes", "pause_tokens"}
    floats = {"input_scale", "gate_init_bias", "layer_norm_eps", "initializer_range",
              "rotary_pct", "rotary_emb_base", "embedding_multiplier", "hidden_dropout", "attention_dropout"}
    bools = {"use_parallel_residual", "tie_word_embeddings", "attention_bias", "use_cache", "halting_heads",
             "consistency_heads", "draft_head", "redraft_head", "early_redraft_heads"}
    problems = []
    for key, val in values.items():
        if key in numeric and val is not None and (isinstance(val, bool) or not isinstance(val, int)):
            problems.append(f"'{key}' must be an integer, got {val!r}")
        elif key in floats and val is not None and (isinstance(val, bool) or not isinstance(val, (int, float))):
            problems.append(f"'{key}' must be a number, got {val!r}")
        elif key in floats and isinstance(val, float) and not math.isfinite(val):  # .inf / .nan in YAML
            problems.append(f"'{key}' must be a finite number, got {val!r}")
        elif key in bools and not isinstance(val, bool):
            problems.append(f"'{key}' must be true or false, got {val!r}")
    return problems


def semantic_problems(v: Mapping[str, Any]) -> list[str]:
    """Every inconsistency in a (merged) set of config values, as human-readable lines."""
    problems: list[str] = []
    mode = v.get("mode", "adaponder")
    if mode not in MODES:
        problems.append(f"'mode' must be one of {', '.join(MODES)}; got {mode!r}")
    passes = v.get("passes")
    if passes is not None and isinstance(passes, int):
        if passes < 1:
            problems.append(f"'passes' (K) must be >= 1, got {passes}")
        elif mode in ("vanilla", "pause") and passes != 1:
            problems.append(f"mode {mode!r} runs exactly one pass; got passes={passes} (use 'ponderlm' or 'loop')")
    pauses = v.get("pause_tokens")
    if pauses is not None and isinstance(pauses, int):
        if mode != "pause":
            problems.append(f"'pause_tokens' is only used by mode 'pause'; got pause_tokens={pauses} with mode {mode!r}")
        elif pauses < 0:
            problems.append(f"'pause_tokens' (P of A19) must be >= 0, got {pauses}")
    looped = mode in ("ponderlm", "loop", "adaponder") and (not isinstance(passes, int) or passes > 1)
    for key in ("halting_heads", "consistency_heads", "draft_head", "redraft_head", "early_redraft_heads"):
        if v.get(key) is True and not looped:
            problems.append(f"'{key}' reads the passes of a looped model (ponderlm, loop or adaponder with passes "
                            f"> 1); got mode {mode!r} with passes={passes}")
    if v.get("redraft_head") is True and looped and isinstance(passes, int) and passes < 3:
        problems.append(f"'redraft_head' reads pass K−1, which at passes={passes} is pass 1, the draft head's: use "
                        "'draft_head' (or passes >= 3)")
    if v.get("early_redraft_heads") is True and looped:
        if v.get("redraft_head") is not True:
            problems.append("'early_redraft_heads' adds re-draft heads before pass K−1's: set 'redraft_head: true' too")
        if isinstance(passes, int) and passes < 4:
            problems.append(f"'early_redraft_heads' reads passes 2..K−2, none at passes={passes}: use passes >= 4 "
                            "(or 'redraft_head' alone)")
    if v.get("halting_heads") is True and mode == "adaponder":
        problems.append("'halting_heads' give a model without gates its halting probabilities (A21); mode "
                        "'adaponder' halts by its gates (A5): use mode 'ponderlm' or 'loop'")
    init = v.get("init", "hf")
    if init not in INIT_SCHEMES:
        problems.append(f"'init' must be one of {', '.join(INIT_SCHEMES)}; got {init!r}")
    d, h = v.get("hidden_size"), v.get("num_attention_heads")
    if isinstance(d, int) and isinstance(h, int):
        if h < 1:
            problems.append(f"'num_attention_heads' must be >= 1, got {h}")
        elif d % h != 0:
            problems.append(f"'hidden_size' ({d}) must be divisible by 'num_attention_heads' ({h})")
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "gate_hidden_mult"):
        val = v.get(key)
        if isinstance(val, int) and val < 1:
            problems.append(f"'{key}' must be >= 1, got {val}")
    act = v.get("gate_activation")
    if act is not None and act not in GATE_ACTIVATIONS:
        problems.append(f"'gate_activation' must be one of {', '.join(GATE_ACTIVATIONS)}; got {act!r}")
    scale = v.get("input_scale")
    if isinstance(scale, (int, float)) and scale <= 0:
        problems.append(f"'input_scale' (c of A1) must be > 0, got {scale}")
    mult = v.get("embedding_multiplier")
    if isinstance(mult, (int, float)) and mult <= 0:
        problems.append(f"'embedding_multiplier' (α of A1) must be > 0, got {mult}")
    pct = v.get("rotary_pct")
    if pct is None and isinstance(v.get("rope_parameters"), Mapping):
        pct = v["rope_parameters"].get("partial_rotary_factor")
    if isinstance(pct, (int, float)) and not 0.0 < pct <= 1.0:
        problems.append(f"'rotary_pct' must lie in (0, 1], got {pct}")
    return problems


def halting_threshold_problem(tau: float) -> str | None:
    """What is wrong with τ (A6), or None: a token halts when ``s < τ`` and ``s`` lies in (0, 1), so τ outside
    (0, 1) would halt every token or none."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < tau < 1.0:
        return f"'halting_threshold' (τ) must lie in (0, 1), got {tau}"
    return None


def check_halting_threshold(tau: float) -> float:
    """``tau`` as a float, or ``ValueError`` naming it (:func:`halting_threshold_problem`)."""
    problem = halting_threshold_problem(tau)
    if problem:
        raise ValueError(problem)
    return float(tau)


__all__ = ["AdaPonderConfig", "AdaPonderConfigError", "INIT_SCHEMES", "MODES", "check_halting_threshold",
           "halting_threshold_problem", "semantic_problems"]
