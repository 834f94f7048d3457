"""Schedules as pure functions of the step: learning rate, the A13 ponder loss, the A14 stages.

Everything the trainer needs at step ``t`` (0-based, the step about to be taken) follows from the step and
the resolved plan, so a resumed run recomputes it exactly and no scheduler state has to be saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaponder.modeling import GateWarmup


def learning_rate(step: int, *, lr: float, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.1,
                  decay: str = "cosine") -> float:
    """Linear warm-up from ``lr/warmup`` to ``lr`` over ``warmup_steps``, then decay to ``min_lr_ratio·lr``
    at the last step (Pythia / GPT-NeoX: cosine to 0.1×)."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    min_lr = lr * min_lr_ratio
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if decay == "constant":
        return lr
    if decay == "linear":
        return lr - (lr - min_lr) * progress
    if decay == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown decay {decay!r}")


@dataclass(frozen=True)
class PonderState:
    """What the loss looks like at one step (A13)."""

    k: float  # bottom-k fraction of the gate pool
    weight: float  # λ, 0 before S0

    @property
    def active(self) -> bool:
        return self.k > 0 and self.weight > 0


def ponder_schedule(step: int, *, s0: int, s1: int, k_max: float, weight: float) -> PonderState:
    """A13: ``L = L_LM`` for ``step < s0``; then ``L_LM + λ·L_ponder`` with
    ``k = k_max · min(1, (step − s0)/(s1 − s0))`` (a jump to ``k_max`` at ``s0`` when ``s1 == s0``).

    At ``step == s0`` the ramp is at 0 (k = 0: no ponder loss yet); it reaches ``k_max`` at ``s1``.
    """
    if step < s0:
        return PonderState(0.0, 0.0)
    ramp = 1.0 if s1 <= s0 else min(1.0, (step - s0) / (s1 - s0))
    return PonderState(k_max * ramp, weight)


def exit_rate(step: int, *, s0: int, s1: int) -> float:
    """A25: the share of tokens whose sampled exits are applied in the training forward — 0 before ``s0`` (every
    token runs every pass), rising linearly to 1 at ``s1`` (the ramp of A13's k)."""
    if step < s0:
        return 0.0
    return 1.0 if s1 <= s0 else min(1.0, (step - s0) / (s1 - s0))


GATE_WARMUPS = ("live", "bypassed", "floored")


def gate_warmup(step: int, *, regime: str, s0: int, s1: int, floor: float, tau: float):
    """How the gates act at ``step`` (A13 **[choice]**): a :class:`~adaponder.modeling.GateWarmup`, or None when
    they act as the method defines (always for ``live``, the paper's schedule).

    * ``bypassed``: before ``s0`` the PonderLM regime (s ≡ 1, m ≡ 1; the gates are not run and not updated);
      from ``s0`` the gates act and learn from their initial bias, with the ponder loss.
    * ``floored``: before ``s0`` no token halts and the gate logits are floored at ``floor`` (the gates learn but
      cannot saturate); from ``s0`` to ``s1`` the floor falls linearly to 4 nats below the halting threshold's
      logit, so halting becomes possible as the ponder loss ramps up; from ``s1`` on, no floor.
    """
    if regime == "live" or step >= (s0 if regime == "bypassed" else s1):
        return None
    if regime == "bypassed":
        return GateWarmup(bypass=True, halting=False)
    if regime != "floored":
        raise ValueError(f"unknown gate warm-up {regime!r} (expected one of {', '.join(GATE_WARMUPS)})")
    if step < s0:
        return GateWarmup(halting=False, logit_floor=floor)
    end = math.log(tau / (1.0 - tau)) - 4.0
    return GateWarmup(logit_floor=floor + (end - floor) * (step - s0) / max(1, s1 - s0))


def stage(step: int, gates_only_steps: int) -> str:
    """A14: ``"gates_only"`` (backbone frozen) for the first ``gates_only_steps`` steps, then ``"joint"``."""
    return "gates_only" if step < gates_only_steps else "joint"


__all__ = ["GATE_WARMUPS", "gate_warmup", "learning_rate", "ponder_schedule", "PonderState", "stage"]
