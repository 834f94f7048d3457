"""One step of the recurrence, written once: the first pass's input (A1), the gate (A5), the halting rule (A6)
and the gate's weight on the feedback (A7). The training forward, cached decoding, the depth-batched decoder
and the PALBERT classifier all call these; each only places the result in its own layout (a full ``[B, T]``
grid, a compacted subset of tokens, one row per sequence).

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .configuration_adaponder import AdaPonderConfig
from .pondering import skinny_linear

_GATE_ACTS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


def first_input(x0: torch.Tensor, scale: float) -> torch.Tensor:
    """``E⁰ = c·Ẽ[x]`` (A1) from the token embeddings ``W_E[x]``; ``scale`` is the config's ``first_pass_scale``."""
    return x0 * scale if scale != 1.0 else x0


def goes_on(s: torch.Tensor, tau: float) -> torch.Tensor:
    """A6: after pass i a token stays active when its gate ``s^i ≥ τ`` (it halts when ``s^i < τ``). Boolean, with
    no gradient through the indicator."""
    return (s >= tau).detach()


def gate_weighted(e: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
    """The feedback of A7 for the rows of ``e`` (``[..., d]``): ``s·e``, or ``e`` itself where no gate weighs it
    (``s`` None: PonderLM, PALBERT's passes, a gate bypassed in the warm-up)."""
    return e if s is None else e * s.to(e.dtype)[..., None]


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose products of a few rows — a decode step at small batch —
    run by blocks of the weight on the CPU, where MKL's own GEMV is slow (:func:`~.pondering.skinny`). Used for the
    output head, the gates' input layers and, retyped in place, the backbone layers' linear maps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skinny_linear(x, self.weight, self.bias)


class GateOutput(nn.Linear):
    """The gate's last layer, a type of its own so weight init can start it at s ≈ 1 (A5)."""


@dataclass(frozen=True)
class GateWarmup:
    """How the gates act in a training step of the warm-up (A13 **[choice]**, ``schedule.gate_warmup``); the
    trainer passes one to :meth:`AdaPonderForCausalLM.forward` while the warm-up lasts, None afterwards.

    bypass: the PonderLM regime, s ≡ 1 and m ≡ 1: the gates are not run (and receive no gradient).
    halting: False keeps every token active (m ≡ 1) while the gates still scale the update (A7).
    logit_floor: the gates' logit is clamped from below (s ≥ σ(floor)), so cross-entropy cannot push a gate
        into the flat tail of the sigmoid where its gradient (σ' ≈ s) is gone.
    """

    bypass: bool = False
    halting: bool = True
    logit_floor: float | None = None


class PonderGate(nn.Module):
    """Iteration-specific halting gate (A5): ``s = σ(Linear(d, m·d) → act → Linear(m·d, 1))``."""

    def __init__(self, config: AdaPonderConfig):
        super().__init__()
        width = config.gate_hidden_mult * config.hidden_size
        self.fc_in = SkinnyLinear(config.hidden_size, width)
        self.act = _GATE_ACTS[config.gate_activation]()
        self.fc_out = GateOutput(width, 1)

    def forward(self, hidden: torch.Tensor, logit_floor: float | None = None) -> torch.Tensor:
        logit = self.fc_out(self.act(self.fc_in(hidden))).squeeze(-1).float()
        if logit_floor is not None:
            logit = logit.clamp(min=logit_floor)
        return torch.sigmoid(logit)


__all__ = ["GateOutput", "GateWarmup", "PonderGate", "SkinnyLinear", "first_input", "gate_weighted", "goes_on"]
