"""The pieces a pass is made of: the first pass's input (A1), the gate (A5) and its warm-up regimes, the ponder
loss (A11–A12), and what the pass loop (:mod:`.pass_driver`) carries from one pass to the next
(:class:`PassContext`, :class:`PassRun`), so that a loop stopped after some passes can be continued.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_adaponder import AdaPonderConfig
from .ponder_cache import TokenSubset
from .pondering import skinny_linear

_GATE_ACTS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


@dataclass
class PassContext:
    """Per-call inputs shared by all passes (see ``AdaPonderForCausalLM.pass_context``)."""

    x0: torch.Tensor  # W_E[x], [B, T, d]
    E0: torch.Tensor  # first-pass input, c·Ẽ[x] (A1)
    batch: int
    length: int
    past: int  # tokens already in the cache
    valid: torch.Tensor  # [B, T] non-padding
    key_padding: torch.Tensor | None  # [B, past + T], None when nothing is padded
    full_mask: torch.Tensor | None  # the attention mask when every token is computed
    rope: tuple[torch.Tensor, torch.Tensor]
    impl: str
    ids: torch.Tensor | None = None  # [B, T] input ids, for exit rules that ask for them (None: embeddings given)

    def select_rows(self, rows: torch.Tensor) -> "PassContext":
        """The same context for a subset of the batch (examples that have not exited yet)."""
        pick = lambda t: None if t is None else t.index_select(0, rows)  # noqa: E731
        rope = tuple(t.index_select(0, rows) if t.shape[0] > 1 else t for t in self.rope)
        return PassContext(pick(self.x0), pick(self.E0), int(rows.numel()), self.length, self.past,
                           pick(self.valid), pick(self.key_padding), pick(self.full_mask), rope, self.impl,
                           pick(self.ids))


@dataclass
class PassRun:
    """The state of the pass loop (:meth:`AdaPonderForCausalLM.run_passes`) and what it accumulates for the output:
    the next pass's input ``E`` and active mask ``m`` (A2, A7), exit passes (A8), exit-pass states (A9), gate values
    and their pool (A11), the share of tokens active in each pass, and (on request) every pass's logits.
    ``next_pass`` is the pass the loop would run next (``K + 1`` once it is done); ``subset`` the tokens that pass
    computes when compacting (A16), None for all of them; ``carry`` the exit rule's per-token memory
    (:class:`~.exit_rules.PassView`)."""

    E: torch.Tensor
    active: torch.Tensor
    exit_pass: torch.Tensor
    h_hat: torch.Tensor | None = None
    next_pass: int = 1
    subset: TokenSubset | None = None
    gate_values: list = dataclasses.field(default_factory=list)
    gate_masks: list = dataclasses.field(default_factory=list)
    active_fraction: list = dataclasses.field(default_factory=list)
    pass_logits: list = dataclasses.field(default_factory=list)
    pass_states: list = dataclasses.field(default_factory=list)
    carry: torch.Tensor | None = None

    @classmethod
    def start(cls, ctx: PassContext) -> "PassRun":
        """Before pass 1: every token active (m¹ = 1, A2), input E⁰ (A1)."""
        ones = torch.ones(ctx.batch, ctx.length, dtype=torch.bool, device=ctx.E0.device)
        return cls(ctx.E0, ones, ones.long())

    @classmethod
    def resume(cls, E, active, exit_pass, h_hat, next_pass: int, compact: bool,
               carry: torch.Tensor | None = None) -> "PassRun":
        """A loop stopped before ``next_pass`` (e.g. tokens drafted with the first passes, concatenated along the
        sequence), to be continued over all its tokens at once. ``compact``: the next pass computes only the
        active tokens (no gradients; one host synchronisation here)."""
        subset = TokenSubset.from_mask(active) if compact and not torch.is_grad_enabled() else None
        if subset is not None and subset.num_tokens == active.numel():
            subset = None
        return cls(E, active, exit_pass, h_hat, next_pass, subset, carry=carry)

    def gate_tensors(self, num_passes: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``[B, T, K-1]`` gate values and pool mask, zero-padded where the loop stopped before a gate ran."""
        if not self.gate_values:
            return None, None
        gv, gm = torch.stack(self.gate_values, dim=-1), torch.stack(self.gate_masks, dim=-1)
        pad = num_passes - 1 - gv.shape[-1]
        return (F.pad(gv, (0, pad)), F.pad(gm, (0, pad))) if pad > 0 else (gv, gm)


def first_input(x0: torch.Tensor, scale: float) -> torch.Tensor:
    """``E⁰ = c·Ẽ[x]`` (A1) from the token embeddings ``W_E[x]``; ``scale`` is the config's ``first_pass_scale``."""
    return x0 * scale if scale != 1.0 else x0

def generate_positions(mask: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Position ids of slots ``start .. start+count-1``: the number of real tokens before each (left padding does not
    count), as transformers' ``generate`` numbers them; padding slots get 1."""
    pos = mask.long().cumsum(-1) - 1
    pos = pos.masked_fill(mask == 0, 1)
    return pos[:, start:start + count]


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose products of a few rows — a decode step at small batch —
    run by blocks of the weight on the CPU, where MKL's own GEMV is slow (:func:`~.pondering.skinny`). Used for the
    output head, the gates' input layers and the backbone layers' linear maps (built as such: :class:`PonderLayer`)."""

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


def ponder_loss(gate_values: torch.Tensor, gate_mask: torch.Tensor, k: float) -> torch.Tensor:
    """Bottom-k ponder loss (A11–A12): the mean of the ⌈k·|G|⌉ smallest gate values of the pool G.

    ``gate_mask`` selects G (gates of active, non-padding tokens). Returns 0 (with a graph) when G is
    empty or k = 0, so the trainer can always add ``λ·ponder_loss``.

    |G| stays on the device: gates outside G sort last (+inf) and a prefix mask keeps the n smallest, so the
    training step does not wait for the device to learn n (a boolean-mask gather or ``topk(n)`` would).
    """
    if k <= 0:
        return gate_values.sum() * 0.0
    flat, mask = gate_values.reshape(-1), gate_mask.reshape(-1)
    ordered = torch.where(mask, flat, torch.full_like(flat, math.inf)).sort().values
    n = torch.ceil(mask.sum().double() * k)  # ⌈k·|G|⌉, in double precision as the host would compute it
    keep = torch.arange(flat.numel(), device=flat.device) < n
    return torch.where(keep, ordered, torch.zeros_like(ordered)).sum() / n.clamp(min=1).to(flat.dtype)


__all__ = ["GateOutput", "GateWarmup", "PassContext", "PassRun", "PonderGate", "SkinnyLinear", "first_input",
           "generate_positions",
           "ponder_loss"]
