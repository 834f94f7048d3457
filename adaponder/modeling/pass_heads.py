"""Heads that read each pass's state without steering it, and the per-pass losses that train them (A21–A24).

- :class:`PassHeads`: one ``Linear(d, 1)`` per pass ``1..K−1`` (iteration-specific, as the gates of A5), called as
  ``heads(h, pass_idx)`` with ``pass_idx`` an int or, where elements sit at different passes (depth-batched
  decoding), an integer tensor of ``h``'s leading shape. Two such banks: the **halting heads** (λ_i of A21, the
  LM's counterpart of PALBERT's Lambda layer, B3) and the **consistency heads** (A23: "pass i's greedy token is the
  full model's").
- :class:`DraftHead`: a residual MLP on pass 1's state read out through the model's own output head (A24): the
  draft of self-speculative decoding, trained to predict the full model's distribution with the gradient stopped
  at the backbone and the head's weights.
- :func:`pass_supervision_losses`: the per-pass training terms — the PonderNet exit-distribution loss on the LM
  (A21, ``pondernet``), its detached form (A22, ``pondernet-detached``: the halting heads learn where a pass is
  already right, no early pass is trained on the final target), and the heads' own losses (A23, A24), all from
  the pass states of one forward.

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: The per-pass supervision options of A21–A22 (``schedule.per_pass``); ``none`` is plain PonderLM's final-pass CE.
PER_PASS_OPTIONS = ("none", "pondernet", "pondernet-anchored", "pondernet-detached")
#: λ_i starts at 0.1 (logit −2.197): a token first leaves after pass i with probability ~0.1, PonderNet's prior.
HALTING_INIT_BIAS = math.log(0.1 / 0.9)


class PassHeads(nn.Module):
    """``K − 1`` scalar heads ``w_i·h + b_i`` (one per pass that can be left after), stored as one ``[K−1, d]`` weight
    so a head can be picked per element. Returns logits (apply ``sigmoid`` for probabilities)."""

    per_pass = True  # exit rules call it with the pass index

    def __init__(self, num_heads: int, hidden_size: int, init_bias: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden_size))
        self.bias = nn.Parameter(torch.full((num_heads,), float(init_bias)))
        self.init_bias = float(init_bias)

    def reset_parameters(self, std: float) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, std)
            self.bias.fill_(self.init_bias)

    def forward(self, h: torch.Tensor, pass_idx: int | torch.Tensor) -> torch.Tensor:
        """Logits ``h.shape[:-1]`` of pass ``pass_idx``'s head (1-based); passes past the last head use the last."""
        n = self.weight.shape[0]
        if isinstance(pass_idx, int):
            i = min(max(pass_idx, 1), n) - 1
            return (h.to(self.weight.dtype) @ self.weight[i]) + self.bias[i]
        idx = pass_idx.long().clamp(1, n) - 1
        return (h.to(self.weight.dtype) * self.weight[idx]).sum(-1) + self.bias[idx]

    def all_passes(self, pass_states: list[torch.Tensor]) -> torch.Tensor:
        """Logits ``[..., K−1]`` of every head on its own pass's state (``pass_states[i]`` is pass i+1's)."""
        return torch.stack([self(h, i + 1) for i, h in enumerate(pass_states[:self.weight.shape[0]])], dim=-1)


class DraftHead(nn.Module):
    """``h + W₂ act(W₁ LN(h))`` on pass 1's final-LN state (A24), read out by the model's output head. ``W₂`` starts at
    zero, so an untrained draft head drafts exactly what pass 1's own logits say."""

    def __init__(self, hidden_size: int, mult: int = 2):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.fc_in = nn.Linear(hidden_size, mult * hidden_size)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(mult * hidden_size, hidden_size)

    def reset_parameters(self, std: float) -> None:
        with torch.no_grad():
            self.norm.reset_parameters()
            self.fc_in.weight.normal_(0.0, std)
            self.fc_in.bias.zero_()
            self.fc_out.weight.zero_()
            self.fc_out.bias.zero_()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc_out(self.act(self.fc_in(self.norm(h))))


@dataclass(frozen=True)
class PassSupervision:
    """How a training forward scores the passes (``schedule.per_pass``, A21–A22): ``kind`` one of
    :data:`PER_PASS_OPTIONS`; ``prior`` λ_p of the geometric prior and ``beta`` β of the KL term (A21)."""

    kind: str = "none"
    prior: float = 0.2
    beta: float = 0.01

    def __post_init__(self):
        if self.kind not in PER_PASS_OPTIONS:
            raise ValueError(f"per-pass supervision must be one of {', '.join(PER_PASS_OPTIONS)}; got {self.kind!r}")
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"the halting prior λ_p must lie in (0, 1), got {self.prior}")
        if self.beta < 0:
            raise ValueError(f"β must be >= 0, got {self.beta}")


def _token_ce(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token CE ``[N]`` of ``h wᵀ`` (fp32 logits; the caller keeps N·V small enough)."""
    return F.cross_entropy(F.linear(h, w).float(), targets, reduction="none")


def exit_distribution_log(lam_logits: torch.Tensor) -> torch.Tensor:
    """``log p`` ``[N, K]`` of the exit distribution (B4, A21) from halting logits ``[N, K−1]``: ``p_i = λ_i ∏_{j<i}
    (1−λ_j)``, the last pass the remaining mass; in log space, so the KL term keeps a gradient."""
    log_go = F.logsigmoid(-lam_logits)
    zero = lam_logits.new_zeros(lam_logits.shape[0], 1)
    before = torch.cat([zero, torch.cumsum(log_go, dim=1)], dim=1)
    return before + torch.cat([F.logsigmoid(lam_logits), zero], dim=1)


def geometric_log_prior(K: int, prior: float, device) -> torch.Tensor:
    i = torch.arange(K, dtype=torch.float64)
    p = prior * (1.0 - prior) ** i
    p[-1] = (1.0 - prior) ** (K - 1)
    return p.log().float().to(device)


def pass_supervision_losses(model, pass_states: list[torch.Tensor], targets: torch.Tensor,
                            supervision: PassSupervision | None) -> dict[str, torch.Tensor]:
    """The per-pass terms of one training forward, each a scalar with a graph (mean over scored tokens).

    ``pass_states``: the final-LN states ``[B, T, d]`` of passes 1..K; ``targets`` ``[B, T]`` (−100 ignored).
    Returned keys: ``lm`` (replaces the final-pass CE under A21/A22), ``halting_kl``, ``consistency``, ``draft`` —
    only those that apply. A22 and the heads' losses reach the backbone with no gradient (states and output head
    detached); A21 trains every pass in proportion to its exit probability."""
    K = len(pass_states)
    ok = targets.reshape(-1) != -100
    tgt = targets.reshape(-1)[ok]
    flat = [h.reshape(-1, h.shape[-1])[ok] for h in pass_states]
    w = model.lm_head.weight
    out: dict[str, torch.Tensor] = {}
    kind = "none" if supervision is None else supervision.kind
    pass_logits = None  # every pass's logits, computed once for the expected loss and the consistency targets
    if kind != "none":
        detached = kind == "pondernet-detached"
        # A21 reads the live states; A22 detached ones, so that nothing of its expected loss reaches the backbone
        seen = [h.detach() for h in flat] if detached else flat
        lam = model.halting_heads.all_passes(seen)  # [N, K−1] logits
        log_p = exit_distribution_log(lam)
        p = log_p.exp()
        pass_logits = [F.linear(h, w.detach() if detached else w).float() for h in seen]
        ce = torch.stack([F.cross_entropy(z, tgt, reduction="none") for z in pass_logits], dim=1)  # [N, K]
        rec = (p * ce).sum(1).mean()
        log_prior = geometric_log_prior(K, supervision.prior, p.device)
        kl = (p * (log_p - log_prior)).sum(1).mean()  # KL(p ‖ p_G), the PonderNet paper's direction
        # A22: the backbone learns from the final pass's CE alone, exactly as plain PonderLM's; A21: from E_p[CE];
        # A21's anchored form: from both (the last pass keeps its own full-weight CE)
        out["lm"] = rec if kind == "pondernet" else _token_ce(flat[-1], w, tgt).mean() + rec
        out["halting_kl"] = supervision.beta * kl
    if getattr(model, "consistency_heads", None) is not None:  # A23
        with torch.no_grad():
            greedy = [z.argmax(-1) for z in pass_logits] if pass_logits else [F.linear(h, w).argmax(-1) for h in flat]
            agree = torch.stack([g == greedy[-1] for g in greedy[:-1]], dim=1).float()
        logits = model.consistency_heads.all_passes([h.detach() for h in flat])
        out["consistency"] = F.binary_cross_entropy_with_logits(logits, agree)
    redrafts = model.redraft_heads() if hasattr(model, "redraft_heads") else {}
    drafts = [(name, head, state) for name, head, state in (("draft", getattr(model, "draft_head", None), flat[0]),
                                                             ("redraft", redrafts.get(len(flat) - 1), flat[-2]))
              if head is not None]
    drafts += [("redraft_pass%d" % p, head, flat[p - 1]) for p, head in redrafts.items() if p < len(flat) - 1]
    if drafts:  # A24: pass 1's head and the re-draft heads, each against the full model's distribution, detached
        with torch.no_grad():
            teacher = F.softmax(F.linear(flat[-1], w).float(), dim=-1)
        for name, head, state in drafts:
            draft = F.log_softmax(F.linear(head(state.detach()), w.detach()).float(), dim=-1)
            out[name] = -(teacher * draft).sum(-1).mean()
    return out


__all__ = ["DraftHead", "HALTING_INIT_BIAS", "PER_PASS_OPTIONS", "PassHeads", "PassSupervision",
           "exit_distribution_log", "geometric_log_prior", "pass_supervision_losses"]
