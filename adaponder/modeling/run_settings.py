"""How a call runs a trained model: τ, the exit rule, the passes to run, compaction and chunking.

These are settings of a call, not of the model: one :class:`RunSettings` is passed to ``forward``, ``generate``, the
depth-batched and self-speculative decoders and the classifier's ``predict``, and is never written into the model's
config (as transformers keeps generation settings in a ``GenerationConfig`` passed per call). A call without one
runs with ``RunSettings()``: the defaults below.

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from .exit_protocol import ExitRule, ExitRuleError, ThresholdExit, check_tau, rule_problem

try:
    from adaponder.errors import UsageError as _UsageError
except ImportError:  # a checkpoint's copy of this file, loaded where adaponder is not installed
    _UsageError = ValueError

#: τ of A6 when a call names none.
DEFAULT_TAU = 1e-4

#: Keys that configs written before run-time settings left the model config held, and the setting each one was.
#: A ``config.json`` holding them still loads (they are dropped there); a training file's ``model:`` section may
#: still name them (they become the run's :class:`RunSettings`).
LEGACY_CONFIG_KEYS = {"halting_threshold": "tau", "compact_inference": "compact", "ponder_chunk_size": "chunk_size",
                      "ponder_recompute": "recompute"}


class SettingsError(_UsageError, TypeError):
    """Run-time settings built with bad fields (:class:`RunSettings`, ``SpeculativeConfig``): one error naming every
    bad field, what it got and what was expected. Where adaponder is installed this is a
    :class:`adaponder.errors.UsageError` (a ``ValueError``); it is a ``TypeError`` too (a field of the wrong type)."""

    def __init__(self, owner: str, problems: list[str]):
        self.owner, self.problems = owner, list(problems)
        text = self.problems[0] if len(self.problems) == 1 else \
            f"{len(self.problems)} bad fields: " + "; ".join(self.problems)
        super().__init__(f"{owner}: {text}")


def _got(value) -> str:
    return f"got {value!r} ({type(value).__name__})"


def int_field(problems: list[str], name: str, value, low: int, *, optional: bool = False):
    """``value`` as an int when it is an integer (not a bool) ``>= low`` (or None when ``optional``); else the
    problem is added to ``problems`` and ``value`` returned as it is."""
    if value is None and optional:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low:
        return int(value)
    problems.append(f"{name} must be an integer >= {low}{' or None' if optional else ''}, {_got(value)}")
    return value


def bool_field(problems: list[str], name: str, value):
    if not isinstance(value, bool):
        problems.append(f"{name} must be True or False, {_got(value)}")
    return value


def positive_field(problems: list[str], name: str, value):
    """``value`` as a float when it is a finite real number (not a bool) ``> 0``; else the problem is added."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    problems.append(f"{name} must be a number > 0, {_got(value)}")
    return value


@dataclass(frozen=True)
class RunSettings:
    """The settings of one call.

    tau: τ of A6 for the default exit rule (a token stops after pass i when its gate ``s^i < τ``).
    exit_rule: an :class:`~.exit_rules.ExitRule`; None: the threshold rule at ``tau`` (``ThresholdExit(tau)``).
    passes: run at most this many passes (None: the model's K). A gated model has gates for its K passes only.
    compact: without gradients, passes after the first may compute only the still-active tokens (A16); results
        are identical either way. ``"auto"`` (the default) compacts where the model's own measurements say it is
        faster than a dense pass with the halted tokens masked (:mod:`.compaction_choice`: gathering and
        scattering can cost more than the work skipped); True always compacts; False runs every token through
        every pass (ZeRO-3).
    chunk_size: most tokens per chunk when forming the pondering embedding ``softmax(z)·Ẽ`` (A4) and the loss
        (A10), so no B×T×V tensor is materialised at once (0 = the device's default block: 2**25 probabilities on
        the CPU, 2**27 on a GPU).
    recompute: in training, recompute each pondering pass's probabilities in backward (memory does not grow with
        B×T×V per pass) or keep them (False: one ``h W_outᵀ`` product per pondering pass less).
    compile: the older spelling of ``generate(..., decoding=DecodingConfig(compile=True))`` (``adaponder.generation``:
        greedy decoding on the compiled static-shape step); the forward itself never compiles.
    """

    tau: float = DEFAULT_TAU
    exit_rule: ExitRule | None = None
    passes: int | None = None
    compact: bool | str = "auto"
    chunk_size: int = 0
    recompute: bool = True
    compile: bool = False

    def __post_init__(self):
        """Every field's type and range, checked at once: one :class:`SettingsError` naming every bad field (an
        exit rule alone at fault: :class:`~.exit_rules.ExitRuleError`, naming its class). Bools are not integers."""
        problems = []
        try:
            object.__setattr__(self, "tau", check_tau(self.tau))
        except ValueError as err:
            problems.append(f"{err} ({type(self.tau).__name__})")
        object.__setattr__(self, "passes", int_field(problems, "passes", self.passes, 1, optional=True))
        if not (self.compact == "auto" and isinstance(self.compact, str) or isinstance(self.compact, bool)):
            problems.append(f"compact must be True, False or 'auto', got {self.compact!r}")
        object.__setattr__(self, "chunk_size", int_field(problems, "chunk_size (0 = the default block)",
                                                         self.chunk_size, 0))
        bool_field(problems, "recompute", self.recompute)
        bool_field(problems, "compile", self.compile)
        rule = None if self.exit_rule is None else rule_problem(self.exit_rule)
        if rule is not None and not problems:
            raise ExitRuleError(rule)
        if rule is not None:
            problems.insert(0, rule)
        if problems:
            raise SettingsError("RunSettings", problems)

    @property
    def rule(self) -> ExitRule:
        """The exit rule this call applies."""
        return self.exit_rule if self.exit_rule is not None else ThresholdExit(self.tau)

    def num_passes(self, trained: int) -> int:
        """The passes this call runs of a model with ``trained`` passes."""
        return trained if self.passes is None else min(int(self.passes), trained)

    def replace(self, **changes) -> "RunSettings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_legacy(cls, values: Mapping[str, Any], base: "RunSettings | None" = None) -> "RunSettings":
        """Settings from the keys of :data:`LEGACY_CONFIG_KEYS` found in ``values`` (others ignored), over ``base``."""
        found = {LEGACY_CONFIG_KEYS[k]: v for k, v in values.items() if k in LEGACY_CONFIG_KEYS and v is not None}
        return dataclasses.replace(base or cls(), **found)


def settings_or_default(settings: RunSettings | None) -> RunSettings:
    if settings is None:
        return RunSettings()
    if not isinstance(settings, RunSettings):
        raise TypeError(f"settings must be a RunSettings, got {type(settings).__name__}")
    return settings


__all__ = ["DEFAULT_TAU", "LEGACY_CONFIG_KEYS", "RunSettings", "SettingsError", "bool_field", "int_field",
           "positive_field", "settings_or_default"]
