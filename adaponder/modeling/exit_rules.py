"""Exit rules beyond the default one: which elements stop after pass i (the protocol, :class:`PassView` and the
default :class:`ThresholdExit` are :mod:`.exit_protocol`'s, importable from here too).

Rules here: :class:`NoHalting`, :class:`FirstPassOnly`, :class:`FixedPruning` (the iso-FLOPs control: random subsets
with per-pass rates, see ``adaponder.evaluation.pruning`` for the target histograms), :class:`QExit` (PALBERT's
Q-exit, B9, per example or per token: on the LM's halting heads, A21), :class:`ConsistencyExit` (the consistency
heads' calibrated threshold, A23), :class:`SampledExit` (exits drawn from the halting heads and applied in
training, A25) and :class:`GivenExits` (given exit passes replayed). A saved checkpoint does not carry them: a rule
is an object passed in ``RunSettings``, and the forward needs only the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .exit_protocol import (NEEDS, ExitRule, ExitRuleError, PassView, ThresholdExit, check_rule,  # noqa: F401
                            check_tau, rule_answer, rule_problem)


class _EveryElement:
    """A rule that gives every element the same answer after every pass."""

    needs = frozenset()
    carries = False
    stop = False

    def stops(self, view: PassView) -> torch.Tensor:
        return torch.full_like(view.active, self.stop)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoHalting(_EveryElement):
    """Every element runs every pass (the gates still weigh the feedback, A7)."""


class FirstPassOnly(_EveryElement):
    """Every element stops after pass 1 (the "first pass only" reference of the reports)."""

    stop = True


class FixedPruning:
    """Fixed pruning, the iso-FLOPs control: after pass i, ``round(h_i · n)`` of the n active, non-padding elements
    (stochastically rounded, so the expected count is exact) stop, chosen uniformly at random with a seeded generator.
    Gate values play no part in the decision (the model still weighs the feedback of the elements that go on by their
    gate, A7). :meth:`reset` restarts the stream, so repeated evaluations draw the same subsets.
    ``adaponder.evaluation.pruning.fixed_pruning`` builds one whose exit-pass histogram is uniform or geometric."""

    needs = frozenset({"valid"})
    carries = False

    def __init__(self, rates: Sequence[float], seed: int = 0, rule: str = "custom",
                 histogram: Sequence[float] | None = None):
        self.rates = [float(r) for r in rates]
        self.seed = int(seed)
        self.rule = rule
        self.histogram = list(histogram) if histogram is not None else None
        self.generator = torch.Generator().manual_seed(self.seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def stops(self, view: PassView) -> torch.Tensor:
        stop = torch.zeros_like(view.active)
        if not isinstance(view.pass_idx, int):
            raise ValueError("fixed pruning draws per pass over a whole batch; it needs every element at one pass")
        if view.pass_idx > len(self.rates):
            return stop
        rate = self.rates[view.pass_idx - 1]
        eligible = view.active if view.valid is None else view.active & view.valid
        candidates = eligible.reshape(-1).nonzero().squeeze(-1)
        n = int(candidates.numel())
        if n == 0 or rate <= 0.0:
            return stop
        expected = rate * n
        n_halt = int(math.floor(expected))
        if torch.rand((), generator=self.generator).item() < expected - n_halt:
            n_halt += 1
        n_halt = min(n_halt, n)
        if n_halt:
            pick = torch.randperm(n, generator=self.generator)[:n_halt].to(candidates.device)
            stop.view(-1)[candidates[pick]] = True
        return stop

    def __repr__(self) -> str:
        rates = ", ".join(f"{r:.4f}" for r in self.rates)
        return f"FixedPruning(rule={self.rule!r}, rates=[{rates}], seed={self.seed})"


class QExit:
    """PALBERT's Q-exit (B9): stop at the first pass whose cumulative exit probability ``Σ_{j≤i} p_j`` exceeds ``q``,
    with ``p_i = λ_i ∏_{j<i}(1 − λ_j)`` (B4). The running survival ``∏(1 − λ_j)`` is the rule's per-element memory,
    added in pass order as :func:`adaponder.palbert.pondernet.q_exit` adds it, so online and offline exits agree.

    Per example (the classifier) λ comes from the model's Lambda layer (``needs`` ``lambda``). Per token (the LM)
    give the rule a ``head``: the model's halting heads (``QExit(q, model.halting_heads)``, A21: called with the
    pass's hidden state and the pass index), or any module mapping a hidden state ``[..., d]`` to a halting logit
    ``[..., 1]`` (or ``[...]``); then it needs ``hidden`` instead."""

    carries = True

    def __init__(self, q: float = 0.5, head: torch.nn.Module | None = None):
        self.q = float(q)
        self.head = head
        self.needs = frozenset({"hidden"}) if head is not None else frozenset({"lambda"})

    def halting_probability(self, view: PassView) -> torch.Tensor:
        if self.head is None:
            if view.lam is None:
                raise ValueError("QExit without a head needs λ from the model (a Lambda layer)")
            return view.lam.float()
        per_pass = getattr(self.head, "per_pass", False)  # a bank of per-pass heads (A21) also takes the pass
        logit = (self.head(view.hidden, view.pass_idx) if per_pass else self.head(view.hidden)).float()
        return torch.sigmoid(logit.squeeze(-1) if logit.dim() == view.active.dim() + 1 else logit)

    def stops(self, view: PassView) -> torch.Tensor:
        lam = self.halting_probability(view).reshape(view.active.shape)
        if view.carry is None:  # (∏_{j<i}(1 − λ_j), Σ_{j<i} p_j) per element
            survival, cdf = torch.ones_like(lam), torch.zeros_like(lam)
        else:
            survival, cdf = view.carry.unbind(-1)
        p_i = survival * lam
        cdf = cdf + p_i
        view.next_carry = torch.stack([survival * (1 - lam), cdf], dim=-1)
        return cdf > self.q

    def __repr__(self) -> str:
        return f"QExit(q={self.q:g}{', head' if self.head is not None else ''})"


class SampledExit:
    """Exits applied in training (A25): after pass i < K a token whose exits are applied in this forward stops with
    probability λ^i_t (its halting head, A21), so its exit pass is a draw from its exit distribution p_t; each token's
    exits are applied with probability ``rate`` (drawn once, at pass 1: the rule's memory). ``generator``: a CPU
    generator the draws come from (the trainer seeds one per step, so a resumed run draws the same exits)."""

    needs = frozenset({"hidden"})
    carries = True

    def __init__(self, head: torch.nn.Module, rate: float = 1.0, generator: torch.Generator | None = None):
        if head is None:
            raise ValueError("sampled exits need the model's halting heads (halting_heads: true, A21)")
        if not 0.0 <= float(rate) <= 1.0:
            raise ValueError(f"the share of tokens whose exits are applied must lie in [0, 1], got {rate}")
        self.head = head
        self.rate = float(rate)
        self.generator = generator

    def _uniform(self, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(like.shape, generator=self.generator).to(like.device)

    def stops(self, view: PassView) -> torch.Tensor:
        lam = torch.sigmoid(self.head(view.hidden.detach(), view.pass_idx).float()).reshape(view.active.shape)
        if view.carry is None:
            applied = self._uniform(lam) < self.rate
        else:
            applied = view.carry[..., 0] > 0.5
        view.next_carry = applied.float()[..., None]
        return applied & (self._uniform(lam) < lam)

    def __repr__(self) -> str:
        return f"SampledExit(rate={self.rate:g})"


class GivenExits:
    """Every element stops at a given exit pass: ``exit_pass`` (integers 1..K) of the view's shape, e.g. the exits a
    training forward drew, replayed by cached decoding one position at a time."""

    needs = frozenset()
    carries = False

    def __init__(self, exit_pass: torch.Tensor):
        self.exit_pass = exit_pass

    def stops(self, view: PassView) -> torch.Tensor:
        return (self.exit_pass.to(view.active.device) <= view.pass_idx).reshape(view.active.shape)

    def __repr__(self) -> str:
        return "GivenExits()"


class ConsistencyExit:
    """A23: after pass i a token stops when its consistency head says, with probability above ``threshold``, that
    pass i's greedy token is the full model's. ``threshold`` comes from calibration on held-out data
    (``adaponder calibrate``: the largest disagreement with the full model it allows, δ, at a stated confidence);
    1 never stops. ``head``: the model's consistency heads (called with the hidden state and the pass index)."""

    needs = frozenset({"hidden"})
    carries = False

    def __init__(self, threshold: float, head: torch.nn.Module):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"the consistency exit's threshold must lie in [0, 1], got {threshold}")
        if head is None:
            raise ValueError("the consistency exit needs the model's consistency heads (consistency_heads: true)")
        self.threshold = float(threshold)
        self.head = head

    def stops(self, view: PassView) -> torch.Tensor:
        p = torch.sigmoid(self.head(view.hidden, view.pass_idx).float()).reshape(view.active.shape)
        return p > self.threshold  # NaN never stops

    def __repr__(self) -> str:
        return f"ConsistencyExit(threshold={self.threshold:.6g})"


__all__ = ["NEEDS", "ConsistencyExit", "ExitRule", "ExitRuleError", "FirstPassOnly", "FixedPruning", "GivenExits",
           "NoHalting", "PassView", "QExit", "SampledExit", "ThresholdExit", "check_rule", "check_tau", "rule_answer",
           "rule_problem"]
