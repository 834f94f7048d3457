"""The pass driver: passes i = 1..K over whatever layout a caller gives it, and the two steps between passes,
each written once — the exit step (A5 gate values in, A6 halting mask out, by the call's exit rule) and the
feedback step (A4 + A7 pondering, or the Loop Transformer's hidden state).

* :func:`run_passes` is the pass loop over a ``[B, T]`` token grid, all of it or a compacted subset (A16): the
  training forward, prefill, cached decoding and self-speculative draft/verify all run it (each only builds its
  :class:`~.pass_step.PassContext` and reads the returned :class:`~.pass_step.PassRun`).
* :func:`exit_step` turns an exit rule's answer into the next active mask; :func:`feed_back` forms the next pass's
  input for the elements that go on. The depth-batched decoder (one row per sequence, each at its own pass) and the
  PALBERT classifier (one pooled vector per example) call these two with their own layouts.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import torch

from .exit_rules import ExitRule, PassView
from .pass_step import GateWarmup, PassContext, PassRun
from .ponder_cache import KVAligner, TokenSubset
from .pondering import pondering_from_logits
from .run_settings import RunSettings


def exit_step(rule: ExitRule, view: PassView, last: bool | torch.Tensor = False) -> torch.Tensor:
    """A6, for any rule: the elements of ``view.active`` that go on to the next pass (``m^{i+1}``, boolean, no
    gradient). ``last``: True (or True per element) where the element has run its last pass and stops whatever the
    rule says. Returns ``view.active`` itself when nothing stops (a caller can then skip finding the survivors)."""
    if last is True:
        return torch.zeros_like(view.active)
    stops = rule.stops(view)
    going = view.active if stops is None else view.active & ~stops.detach().to(torch.bool)
    if isinstance(last, torch.Tensor):
        going = going & ~last
    return going


def feed_back(core, E: torch.Tensor, *, dest: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
              logits: torch.Tensor | None = None, state: torch.Tensor | None = None,
              weight: torch.Tensor | None = None, settings: RunSettings | None = None,
              in_place: bool = False) -> torch.Tensor:
    """The next pass's input for the elements that go on, in the caller's flat layout: ``E`` ``[N, d]`` and, for the
    ``n`` elements that go on, their rows ``dest`` of ``E`` (None: all N, in order).

    Pondering modes: ``E + w·e`` with ``e = softmax(z)·Ẽ`` (A4) from the pass's final-LN ``hidden`` states
    ``[n, d]`` (chunked, :meth:`ponder_from_hidden`) or from ``logits`` ``[n, V]`` already computed (``in_place``:
    the softmax may overwrite them); ``weight`` ``[n]`` is the gate's ``s`` (A7), None where no gate weighs the
    feedback (PonderLM, PALBERT's passes, a gate bypassed in the warm-up). Loop mode: the pre-norm ``state``
    ``[n, d]`` replaces the rows."""
    if core.config.mode == "loop":
        return state if dest is None else E.index_copy(0, dest, state.to(E.dtype))
    if logits is not None:
        e = pondering_from_logits(logits, core.gpt_neox.embed_in.weight, core.config.embedding_scale,
                                  in_place=in_place)
    else:
        e = core.ponder_from_hidden(hidden, settings)
    if weight is not None:
        e = e * weight.to(e.dtype)[..., None]
    return E + e if dest is None else E.index_add(0, dest, e.to(E.dtype))


def run_passes(core, ctx: PassContext, aligner: KVAligner, run: PassRun | None = None, last: int | None = None, *,
               settings: RunSettings, gate_warmup: GateWarmup | None = None,
               return_pass_logits: bool = False) -> PassRun:
    """Passes ``run.next_pass .. last`` (default: from pass 1 to the K this call runs; A2–A9) over the token grid of
    ``ctx``: run the stack on the tokens still active, keep each token's exit-pass state, then the exit step and the
    feedback before the next pass — also after ``last`` when it is below K, so that a later call can continue from
    the returned state (self-speculative decoding drafts with the first passes and verifies with the rest)."""
    cfg = core.config
    K = settings.num_passes(cfg.num_passes)
    last = K if last is None else min(last, K)
    rule = settings.rule
    compact_ok = settings.compact and ctx.impl != "flash_attention_2" and not torch.is_grad_enabled()
    run = PassRun.start(ctx) if run is None else run
    batch, length, valid = ctx.batch, ctx.length, ctx.valid
    n_valid = valid.sum().clamp(min=1)
    grad = torch.is_grad_enabled()
    for i in range(run.next_pass, last + 1):
        active, subset = run.active, run.subset
        run.active_fraction.append((active & valid).sum() / n_valid)
        if subset is not None and subset.num_tokens == 0:  # every token halted: later passes only carry K/V (A15)
            for j in range(i, last + 1):
                aligner.carry_forward(j)
            run.next_pass = last + 1
            break
        h_flat, state_flat = core.run_pass(run.E, ctx, i, aligner, active if i > 1 else None, subset)
        # A9 on hidden states: the head runs once, on each token's exit-pass state, instead of
        # keeping a B×T×V logits tensor per pass.
        if subset is not None:  # no gradients here: overwrite the active tokens' rows in place
            run.h_hat[subset.b_idx, subset.t_idx] = h_flat
        else:
            h_i = h_flat.reshape(batch, length, -1)
            run.h_hat = h_i if run.h_hat is None else torch.where(active[..., None], h_i, run.h_hat)
        if return_pass_logits:
            run.pass_logits.append(core.lm_head(_unflatten(h_flat, subset, batch, length)))
        run.next_pass = i + 1
        if i == K:
            break
        if not (cfg.ponders or cfg.mode == "loop"):  # one-pass modes
            run.next_pass = K + 1
            break
        s, next_active = _exit_after(core, i, K, h_flat, run, ctx, rule, gate_warmup)
        # Without gradients, the tokens that go on — fed back now, computed by the next pass — are found
        # once, with the pass's only host synchronisation (none while no token stops).
        if grad:
            going_on = None
        elif next_active is active:
            going_on = subset
        else:
            going_on = TokenSubset.from_mask(next_active)
        run.E = _grid_feedback(core, run.E, h_flat, state_flat, s, next_active, subset, going_on, grad, settings)
        run.exit_pass = run.exit_pass + next_active.long()  # A8: D_t counts the passes a token was active in
        run.active = next_active
        compact = compact_ok and going_on is not None and going_on.num_tokens < batch * length
        run.subset = going_on if compact else None
    if run.next_pass > K:
        while len(run.active_fraction) < cfg.num_passes:
            run.active_fraction.append(run.active_fraction[-1] * 0)
    return run


def _exit_after(core, i: int, K: int, h_flat, run: PassRun, ctx: PassContext, rule: ExitRule,
                gate_warmup: GateWarmup | None):
    """Gate and exit step after pass ``i`` on the grid (A5, A6): ``(s, m^{i+1})``; ``s`` None where no gate weighs
    the feedback. The gate values of the active tokens go to ``run`` for the ponder loss (A11)."""
    cfg = core.config
    batch, length = run.active.shape
    active, subset = run.active, run.subset
    bypass = gate_warmup is not None and gate_warmup.bypass
    s = None
    if cfg.gated and not bypass:
        s_flat = core.gates[i - 1](h_flat, None if gate_warmup is None else gate_warmup.logit_floor)  # A5
        s = _unflatten(s_flat, subset, batch, length)
        run.gate_values.append(torch.where(active, s, torch.zeros_like(s)))
        run.gate_masks.append(active & ctx.valid)
    if bypass or (gate_warmup is not None and not gate_warmup.halting):
        return s, active
    needs = rule.needs
    view = PassView(
        pass_idx=i, num_passes=K, active=active, gate=None if s is None else s.detach(),
        logits=core.lm_head(_unflatten(h_flat, subset, batch, length)) if "logits" in needs else None,
        hidden=_unflatten(h_flat, subset, batch, length) if "hidden" in needs else None,
        token_ids=ctx.ids if "token_ids" in needs else None, valid=ctx.valid, carry=run.carry)
    next_active = exit_step(rule, view)
    run.carry = view.next_carry
    return s, next_active


def _grid_feedback(core, E, h_flat, state_flat, s, next_active, subset, going_on, grad, settings):
    """:func:`feed_back` on the ``[B, T]`` grid. Training forms it for every token (the gate weight masked by
    ``m^{i+1}``). Without gradients only the tokens that go on — ``going_on``, a :class:`TokenSubset` of
    ``next_active``; None: all of them — are fed back (A15–A17: D−1 pondering products). ``h_flat`` and
    ``state_flat`` hold the rows of ``subset``'s tokens (all tokens when it is None)."""
    batch, length, d = E.shape
    flat = E.reshape(batch * length, d)
    if grad or going_on is None:
        weight = None if s is None else (next_active.to(s.dtype) * s if grad else s).reshape(-1)
        return feed_back(core, flat, hidden=h_flat, state=state_flat, weight=weight,
                         settings=settings).reshape(batch, length, d)
    n = going_on.num_tokens
    if n == 0:
        return E
    if n == h_flat.shape[0]:  # every computed token goes on: h_flat's rows, in order
        rows = None
    elif subset is None:
        rows = going_on.b_idx * length + going_on.t_idx
    else:  # positions, among the computed tokens, of those that go on (size known: no host sync)
        rows = torch.nonzero_static(next_active[subset.b_idx, subset.t_idx], size=n).squeeze(1)
    pick = (lambda x: x) if rows is None else (lambda x: x.index_select(0, rows))  # noqa: E731
    weight = None if s is None else s[going_on.b_idx, going_on.t_idx]
    dest = None if n == batch * length else going_on.b_idx * length + going_on.t_idx
    return feed_back(core, flat, dest=dest, hidden=pick(h_flat), state=pick(state_flat), weight=weight,
                     settings=settings).reshape(batch, length, d)


def _unflatten(flat: torch.Tensor, subset: TokenSubset | None, batch: int, length: int) -> torch.Tensor:
    if subset is None:
        return flat.reshape(batch, length, *flat.shape[1:])
    full = flat.new_zeros(batch, length, *flat.shape[1:])
    full[subset.b_idx, subset.t_idx] = flat
    return full


__all__ = ["exit_step", "feed_back", "run_passes"]
