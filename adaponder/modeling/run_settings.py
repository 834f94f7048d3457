"""How a call runs a trained model: τ, the exit rule, the passes to run, compaction and chunking.

These are settings of a call, not of the model: one :class:`RunSettings` is passed to ``forward``, ``generate``, the
depth-batched and self-speculative decoders and the classifier's ``predict``, and is never written into the model's
config (as transformers keeps generation settings in a ``GenerationConfig`` passed per call). A call without one
runs with ``RunSettings()``: the defaults below.

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .exit_rules import ExitRule, ThresholdExit, check_tau

#: τ of A6 when a call names none.
DEFAULT_TAU = 1e-4

#: Keys that configs written before run-time settings left the model config held, and the setting each one was.
#: A ``config.json`` holding them still loads (they are dropped there); a training file's ``model:`` section may
#: still name them (they become the run's :class:`RunSettings`).
LEGACY_CONFIG_KEYS = {"halting_threshold": "tau", "compact_inference": "compact", "ponder_chunk_size": "chunk_size",
                      "ponder_recompute": "recompute"}


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
    compile: greedy ``generate`` decodes with the static-shape step (:mod:`.static_decoding`) compiled by
        ``torch.compile`` (one graph per step; CUDA graphs on a GPU) instead of the eager cached forward, which stays
        the reference. The first step of a new batch size or cache capacity pays the compilation.
    """

    tau: float = DEFAULT_TAU
    exit_rule: ExitRule | None = None
    passes: int | None = None
    compact: bool | str = "auto"
    chunk_size: int = 0
    recompute: bool = True
    compile: bool = False

    def __post_init__(self):
        object.__setattr__(self, "tau", check_tau(self.tau))
        if self.passes is not None and (isinstance(self.passes, bool) or not isinstance(self.passes, int)
                                        or self.passes < 1):
            raise ValueError(f"passes must be an integer >= 1, got {self.passes!r}")
        if self.compact not in (True, False, "auto") or isinstance(self.compact, int) and not isinstance(
                self.compact, bool):
            raise ValueError(f"compact must be True, False or 'auto', got {self.compact!r}")
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 0:
            raise ValueError(f"chunk_size must be an integer >= 0 (0 = the default block), got {self.chunk_size!r}")
        if self.exit_rule is not None and not isinstance(self.exit_rule, ExitRule):
            raise TypeError(f"exit_rule must be an ExitRule (needs, stops(view)); got {type(self.exit_rule).__name__}")

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


__all__ = ["DEFAULT_TAU", "LEGACY_CONFIG_KEYS", "RunSettings", "settings_or_default"]
