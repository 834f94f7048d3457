"""The exit-rule protocol: which elements stop after pass i, given what the pass produced.

An element is whatever the caller's layout runs a pass over: a token of the ``[B, T]`` grid (training forward,
prefill, cached and self-speculative decoding), a row of the depth-batched decoder (one token per sequence, each at
its own pass), or a pooled example of the PALBERT classifier. The pass driver (:mod:`.pass_driver`) hands a rule a
:class:`PassView` holding, for the elements that ran the pass, only what the rule says it ``needs``; the rule
answers with a boolean tensor of the same shape, True where the element stops after this pass. The driver alone
turns that answer into the next active mask (monotone; every element stops after the last pass) — rules never see
or write the mask themselves.

Every pass of every layout reaches the rule through :func:`rule_answer` (called by the driver's exit step), the one
place that starts a rule's memory afresh at each element's pass 1 and checks the answer; :func:`check_rule` checks
a rule's ``needs`` where it enters (``RunSettings``). Both raise :class:`ExitRuleError`, naming the rule's class.
The default rule, :class:`ThresholdExit` (A6), lives here; the others are in :mod:`.exit_rules`.

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

try:
    from adaponder.errors import UsageError as _UsageError
except ImportError:  # a checkpoint's copy of this file, loaded where adaponder is not installed
    _UsageError = ValueError

#: What a rule may ask the driver for (``ExitRule.needs``):
#:   ``gate``: s^i of A5 (None for models without gates);
#:   ``logits``: the pass's logits z^i (LM head over the hidden state; the classifier's head output);
#:   ``hidden``: the pass's final-LN hidden state (the LM) or pooled vector c_i (the classifier);
#:   ``lambda``: the halting probability λ_i of B3 (the classifier's Lambda layer);
#:   ``token_ids``: the input id of each element (the classifier: the id of the pooled, last real token);
#:   ``valid``: True where the element is not padding.
NEEDS = frozenset({"gate", "logits", "hidden", "lambda", "token_ids", "valid"})


class ExitRuleError(_UsageError, TypeError):
    """An exit rule that breaks the protocol: ``needs`` naming a field the driver does not know, or an answer after a
    pass that is not a boolean tensor of the view's shape (or memory that does not follow the elements). Where
    adaponder is installed this is a :class:`adaponder.errors.UsageError` (a ``ValueError``); it is a ``TypeError``
    too. The message names the rule's class, what it gave and what was expected."""


@dataclass
class PassView:
    """What one pass produced, for the elements that ran it (shapes: the layout's, e.g. ``[B, T]``, ``[n]``, ``[B]``;
    vectors add a last dimension). Fields a rule did not ask for are None.

    ``pass_idx``: the pass just run, 1-based — an int, or an integer tensor of the layout's shape when elements sit
    at different passes (depth-batched decoding). ``active``: the elements that ran this pass (a rule's answer is
    only read there). ``carry``: the rule's own per-element memory from the previous pass of the same element — None
    at pass 1; where elements sit at different passes, the elements at their pass 1 start afresh as if it were None
    (:func:`rule_answer`; see :meth:`ExitRule.stops`)."""

    pass_idx: int | torch.Tensor
    num_passes: int
    active: torch.Tensor
    gate: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    lam: torch.Tensor | None = None
    token_ids: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    carry: torch.Tensor | None = None
    #: set by a rule with memory (``ExitRule.carries``): its memory for the next pass, in the same layout
    next_carry: torch.Tensor | None = None


@runtime_checkable
class ExitRule(Protocol):
    """The protocol: ``needs`` (a subset of :data:`NEEDS`) and ``stops(view) -> bool tensor`` (True: stops after
    ``view.pass_idx``). A rule whose decision depends on earlier passes sets ``carries = True``, reads
    ``view.carry`` and writes ``view.next_carry`` (a tensor whose leading dimensions are the view's shape); the layout
    keeps it aligned with its elements, and every element's memory starts afresh (None) at its pass 1 — also for the
    next token of a row that the depth-batched decoder starts in the same slot (:func:`rule_answer`: where elements
    sit at different passes it asks such a rule twice, so ``stops`` should change nothing but ``view.next_carry``)."""

    needs: frozenset

    def stops(self, view: PassView) -> torch.Tensor: ...


class ThresholdExit:
    """A6: after pass i a token stops when its gate ``s^i < τ``. A model without gates never stops early."""

    needs = frozenset({"gate"})
    carries = False

    def __init__(self, tau: float):
        self.tau = check_tau(tau)

    def stops(self, view: PassView) -> torch.Tensor:
        if view.gate is None:
            return torch.zeros_like(view.active)
        # "not s ≥ τ" rather than "s < τ": a NaN gate stops (it cannot be trusted to ponder on)
        return ~(view.gate >= self.tau).detach()

    def __repr__(self) -> str:
        return f"ThresholdExit(tau={self.tau:g})"


def rule_problem(rule) -> str | None:
    """What is wrong with ``rule`` as an exit rule (naming its class), or None: it must have ``stops`` and ``needs``, a
    collection of names from :data:`NEEDS` (a misspelt one is named with the closest known name)."""
    name = type(rule).__name__
    if not callable(getattr(rule, "stops", None)) or not hasattr(rule, "needs"):
        return (f"exit_rule must be an ExitRule (needs, stops(view)); got {name}, which has no "
                f"{'stops(view) method' if not callable(getattr(rule, 'stops', None)) else 'needs'}")
    needs = rule.needs
    if isinstance(needs, (str, bytes)) or not isinstance(needs, Collection):
        return (f"exit rule {name}: needs must be a set of field names from {', '.join(sorted(NEEDS))}; "
                f"got {type(needs).__name__} {needs!r}")
    bad = []
    for field in needs:
        if not isinstance(field, str):
            bad.append(f"{field!r} ({type(field).__name__}, not a field name)")
        elif field not in NEEDS:
            close = difflib.get_close_matches(field, NEEDS, n=1)
            bad.append(f"{field!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if bad:
        return (f"exit rule {name}: needs names {'an unknown field' if len(bad) == 1 else 'unknown fields'} "
                f"{', '.join(bad)}; known fields: {', '.join(sorted(NEEDS))}")
    return None


def check_rule(rule):
    """``rule`` itself, or :class:`ExitRuleError` (:func:`rule_problem`): checked where a rule enters."""
    problem = rule_problem(rule)
    if problem is not None:
        raise ExitRuleError(problem)
    return rule


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _check_answer(rule, view: PassView, stops) -> torch.Tensor:
    """``stops`` if it is a boolean tensor of the view's shape, else :class:`ExitRuleError` (dtype and shape are
    metadata: no host synchronisation)."""
    shape = tuple(view.active.shape)
    if isinstance(stops, torch.Tensor) and stops.dtype == torch.bool and tuple(stops.shape) == shape:
        return stops
    hint = ""
    if isinstance(stops, torch.Tensor) and stops.dtype != torch.bool:
        hint = "; a number is not a decision: compare it (e.g. p > threshold)"
    after = " (each element at its own pass)" if isinstance(view.pass_idx, torch.Tensor) else \
        f" after pass {view.pass_idx}"
    raise ExitRuleError(f"exit rule {type(rule).__name__}: stops(view){after} returned {_described(stops)}; "
                        f"expected a torch.bool tensor of the view's shape {shape}, True where the element "
                        f"stops{hint}")


def _check_memory(rule, view: PassView, memory, what: str) -> None:
    if memory is None:
        return
    if getattr(rule, "carries", False) is not True:  # a decoder that cannot keep memory refuses rules that say so
        raise ExitRuleError(f"exit rule {type(rule).__name__}: {what} is set, but the rule does not declare "
                            f"carries = True; expected carries = True on a rule with memory across passes")
    shape = tuple(view.active.shape)
    if not isinstance(memory, torch.Tensor) or tuple(memory.shape[:len(shape)]) != shape:
        raise ExitRuleError(f"exit rule {type(rule).__name__}: {what} is {_described(memory)}; expected a tensor "
                            f"whose leading dimensions are the view's shape {shape} (one memory per element)")


def rule_answer(rule, view: PassView) -> torch.Tensor:
    """``rule``'s answer after the pass of ``view`` — a boolean tensor of the view's shape, True where the element
    stops — with ``view.next_carry`` set to its memory for the next pass. The one place every layout's exit step
    asks a rule, so that each of them:

    - starts the rule's memory afresh at every element's pass 1: ``view.carry`` is None at pass 1; where elements
      sit at different passes (``pass_idx`` a tensor, with memory from earlier ticks), the rule is asked twice — as
      at pass 1 (no memory) and with its memory — and each element takes the answer and next memory of its own case
      (no host synchronisation);
    - gives a rule that asks for ``valid`` the all-True mask where the layout has no padding;
    - checks the answer (:class:`ExitRuleError`: not a tensor, not boolean — a float 0.3 would otherwise read as
      True —, or not the view's shape) and the memory's leading shape (metadata only: cheap, no synchronisation).
    """
    if view.valid is None and "valid" in rule.needs:
        view.valid = torch.ones_like(view.active)
    view.next_carry = None
    per_element = isinstance(view.pass_idx, torch.Tensor)
    if not per_element and view.pass_idx == 1:
        view.carry = None
    _check_memory(rule, view, view.carry, "its memory from the previous pass (view.carry)")
    if not per_element or view.carry is None:
        stops = _check_answer(rule, view, rule.stops(view))
        _check_memory(rule, view, view.next_carry, "the memory it wrote (view.next_carry)")
        return stops
    afresh = dataclasses.replace(view, carry=None, next_carry=None)
    first = _check_answer(rule, afresh, rule.stops(afresh))
    later = _check_answer(rule, view, rule.stops(view))
    fresh = view.pass_idx == 1
    a, b = afresh.next_carry, view.next_carry
    _check_memory(rule, view, a, "the memory it wrote at pass 1 (view.next_carry)")
    _check_memory(rule, view, b, "the memory it wrote (view.next_carry)")
    if a is not None and b is not None:
        if a.shape != b.shape:
            raise ExitRuleError(f"exit rule {type(rule).__name__}: the memory it wrote at pass 1 has shape "
                                f"{tuple(a.shape)} and later {tuple(b.shape)}; expected one shape per element")
        view.next_carry = torch.where(fresh.reshape(*fresh.shape, *([1] * (a.dim() - fresh.dim()))), a, b)
    else:
        view.next_carry = a if b is None else b
    return torch.where(fresh, first, later)


def check_tau(tau: float) -> float:
    """τ of A6 as a float, or ``ValueError``: a token stops when ``s < τ`` and ``s`` lies in (0, 1), so τ outside
    (0, 1) would stop every token or none."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < tau < 1.0:
        raise ValueError(f"τ (tau, the halting threshold of A6) must lie in (0, 1), got {tau}")
    return float(tau)


__all__ = ["NEEDS", "ExitRule", "ExitRuleError", "PassView", "ThresholdExit", "check_rule", "check_tau",
           "rule_answer", "rule_problem"]
