"""The pass driver: the pass loop (:func:`drive`), written once, and the two steps between passes — the exit step
(A5 gate values in, A6 halting mask out, by the call's exit rule) and the feedback step (A4 + A7 pondering, or the Loop
Transformer's hidden state).

A consumer gives :func:`drive` a :class:`Layout`: where the elements of its passes live and what it keeps of them.
:class:`GridLayout` is the ``[B, T]`` token grid, all of it or a compacted subset (A16) — the training forward,
prefill, cached decoding and self-speculative draft/verify run it through :func:`run_passes`. The depth-batched
decoder's layout is one row per sequence, each at its own pass (:mod:`.depth_batching`); the PALBERT classifier's is
one pooled vector per example (``adaponder.palbert.classifier``).

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .exit_protocol import ExitRule, PassView, rule_answer
from .pass_step import GateWarmup, PassContext, PassRun
from .ponder_cache import KVAligner, TokenSubset
from .pondering import pondering_from_logits
from .run_settings import RunSettings

try:  # compact="auto" measures where adaponder is installed; a checkpoint's copy alone compacts (same results, A16)
    from adaponder.modeling.compaction_choice import CompactionChoice, start_timer, stop_timer
except ImportError:
    CompactionChoice = None


def exit_step(rule: ExitRule, view: PassView, last: bool | torch.Tensor = False) -> torch.Tensor:
    """A6, for any rule: the elements of ``view.active`` that go on to the next pass (``m^{i+1}``, boolean, no
    gradient). ``last``: True (or True per element) where the element has run its last pass and stops whatever the
    rule says. The rule is asked through :func:`~.exit_rules.rule_answer`, for every layout: its memory starts
    afresh at each element's pass 1 and its answer is checked (a boolean tensor of the view's shape); its memory for
    the next pass is left in ``view.next_carry``."""
    if last is True:
        return torch.zeros_like(view.active)
    going = view.active & ~rule_answer(rule, view).detach()
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


class Layout(Protocol):
    """Where a consumer keeps the elements its passes run over, and what it does with their results. :func:`drive`
    calls, for each pass: :meth:`run_pass`, :meth:`exit_view`, then (with the exit step's answer) :meth:`settle`,
    :meth:`feedback` and :meth:`advance`. ``carry`` is the exit rule's per-element memory, which the layout keeps
    aligned with its elements."""

    carry: torch.Tensor | None

    def running(self) -> bool:
        """True while another pass is to run."""

    def run_pass(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass of the stack over the current elements: ``(h, state)``, the final-LN hidden states and the
        pre-norm ones (loop mode's feedback), rows in the layout's flat order."""

    def exit_view(self, h: torch.Tensor, needs: frozenset) -> tuple[PassView, bool | torch.Tensor] | None:
        """What the exit rule sees of the pass (computing only ``needs``), with ``last`` (True, or per element, where
        the pass was the element's last); None where no exit step follows this pass (every element goes on)."""

    def feedback(self, h: torch.Tensor, state: torch.Tensor | None, going: torch.Tensor | None) -> dict | None:
        """Record what the elements that stop produced, and say which go on: :func:`feed_back`'s arguments for the
        next pass's input (None: nothing is fed back — the loop ends, or no element goes on). ``going``: the exit
        step's answer over the elements of the pass (None: all go on)."""

    def advance(self, E: torch.Tensor | None, going: torch.Tensor | None) -> None:
        """Take the next pass's input (None: unchanged) and move the elements on."""


def drive(core, layout: Layout, rule: ExitRule, settings: RunSettings | None = None) -> Layout:
    """The pass loop — the only one. Every consumer (the training forward, prefill, cached decoding, self-speculative
    draft and verify, the depth-batched decoder's ticks, the PALBERT classifier) gives it a :class:`Layout`; the exit
    step (A6, by ``rule``) and the feedback (A4/A7 or loop mode's) between passes are applied here."""
    while layout.running():
        h, state = layout.run_pass()
        step = layout.exit_view(h, rule.needs)
        going = None
        if step is not None:
            view, last = step
            going = exit_step(rule, view, last)
            layout.carry = view.next_carry
        args = layout.feedback(h, state, going)
        layout.advance(None if args is None else feed_back(core, settings=settings, **args), going)
    return layout


def run_passes(core, ctx: PassContext, aligner: KVAligner, run: PassRun | None = None, last: int | None = None, *,
               settings: RunSettings, gate_warmup: GateWarmup | None = None,
               return_pass_logits: bool = False, return_pass_states: bool = False) -> PassRun:
    """Passes ``run.next_pass .. last`` (default: from pass 1 to the K this call runs; A2–A9) over the token grid of
    ``ctx``: run the stack on the tokens still active, keep each token's exit-pass state, then the exit step and the
    feedback before the next pass — also after ``last`` when it is below K, so that a later call can continue from
    the returned state (self-speculative decoding drafts with the first passes and verifies with the rest)."""
    grid = GridLayout(core, ctx, aligner, run, last, settings, gate_warmup, return_pass_logits, return_pass_states)
    drive(core, grid, settings.rule, settings)
    run = grid.run
    run.carry = grid.carry
    if run.next_pass > grid.K:
        while len(run.active_fraction) < core.config.num_passes:
            run.active_fraction.append(run.active_fraction[-1] * 0)
    return run


class GridLayout:
    """The ``[B, T]`` token grid (:func:`run_passes`): all of it, or without gradients the tokens still active
    (compacted, A16). Its state is a :class:`~.pass_step.PassRun`, which a later call may continue."""

    def __init__(self, core, ctx: PassContext, aligner: KVAligner, run: PassRun | None, last: int | None,
                 settings: RunSettings, gate_warmup: GateWarmup | None, return_pass_logits: bool,
                 return_pass_states: bool = False):
        cfg = core.config
        self.core, self.ctx, self.aligner, self.gate_warmup = core, ctx, aligner, gate_warmup
        self.K = settings.num_passes(cfg.num_passes)
        self.last = self.K if last is None else min(last, self.K)
        self.compact_ok = bool(settings.compact) and ctx.impl != "flash_attention_2" and not torch.is_grad_enabled()
        # "auto": compaction or a dense masked pass, whichever the measurements say is faster at this grid size
        self.choice = compaction_choice(core) if self.compact_ok and settings.compact == "auto" and \
            CompactionChoice is not None else None
        self.timer = None  # (started, compacted) while the pass is being measured
        self.run = PassRun.start(ctx) if run is None else run
        self.n_valid = ctx.valid.sum().clamp(min=1)
        self.grad = torch.is_grad_enabled()
        self.return_pass_logits = return_pass_logits
        self.return_pass_states = return_pass_states
        self.s = None  # the gate values of the pass (A5), None where no gate weighs the feedback
        self.ending = False
        self.carry = self.run.carry  # back into the run when the loop ends (run_passes)

    def running(self) -> bool:
        run = self.run
        if run.next_pass > self.last:
            return False
        run.active_fraction.append((run.active & self.ctx.valid).sum() / self.n_valid)
        if run.subset is not None and run.subset.num_tokens == 0:  # every token halted: later passes only carry
            for j in range(run.next_pass, self.last + 1):          # K/V (A15)
                self.aligner.carry_forward(j)
            run.next_pass = self.last + 1
            return False
        return True

    def run_pass(self):
        run, ctx = self.run, self.ctx
        i = run.next_pass
        if self.choice is not None:
            compacted = run.subset is not None
            timed = self.choice.wants_timing(run.E.device, ctx.batch * ctx.length, compacted)
            self.timer = (start_timer(run.E.device), compacted) if timed else None
        h_flat, state_flat = self.core.run_pass(run.E, ctx, i, self.aligner, run.active if i > 1 else None,
                                                run.subset)
        # A9 on hidden states: the head runs once, on each token's exit-pass state, instead of
        # keeping a B×T×V logits tensor per pass.
        if run.subset is not None:  # no gradients here: overwrite the active tokens' rows in place
            run.h_hat[run.subset.b_idx, run.subset.t_idx] = h_flat
        else:
            h_i = h_flat.reshape(ctx.batch, ctx.length, -1)
            run.h_hat = h_i if run.h_hat is None else torch.where(run.active[..., None], h_i, run.h_hat)
        if self.return_pass_logits:
            run.pass_logits.append(self.core.lm_head(self._full(h_flat)))
        if self.return_pass_states:  # every pass's final-LN states, for the per-pass losses (A21–A24)
            run.pass_states.append(self._full(h_flat))
        run.next_pass = i + 1
        return h_flat, state_flat

    def exit_view(self, h_flat, needs):
        """Gate (A5) and the rule's view after pass i; the gate values of the active tokens go to ``run`` for the
        ponder loss (A11)."""
        cfg, run, warm = self.core.config, self.run, self.gate_warmup
        i = run.next_pass - 1
        self.s = None
        self.ending = i == self.K or not (cfg.ponders or cfg.mode == "loop")  # the last pass, or a one-pass mode
        if self.ending:
            run.next_pass = self.K + 1
            return None
        bypass = warm is not None and warm.bypass
        if cfg.gated and not bypass:
            self.s = self._full(self.core.gates[i - 1](h_flat, None if warm is None else warm.logit_floor))
            run.gate_values.append(torch.where(run.active, self.s, torch.zeros_like(self.s)))
            run.gate_masks.append(run.active & self.ctx.valid)
        if bypass or (warm is not None and not warm.halting):
            return None
        view = PassView(
            pass_idx=i, num_passes=self.K, active=run.active, gate=None if self.s is None else self.s.detach(),
            logits=self.core.lm_head(self._full(h_flat)) if "logits" in needs else None,
            hidden=self._full(h_flat) if "hidden" in needs else None,
            token_ids=self.ctx.ids if "token_ids" in needs else None, valid=self.ctx.valid, carry=self.carry)
        return view, False

    def feedback(self, h_flat, state_flat, going):
        """Training forms the next input for every token (the gate weight masked by ``m^{i+1}``). Without
        gradients only the tokens that go on are fed back (A15–A17: D−1 pondering products), found once, with the
        pass's only host synchronisation (none while no token stops)."""
        if self.ending:
            return None
        run, s = self.run, self.s
        batch, length, d = run.E.shape
        flat = run.E.reshape(batch * length, d)
        next_active = run.active if going is None else going
        if self.grad:
            self.going_on = None
        elif next_active is run.active:
            self.going_on = run.subset
        else:
            self.going_on = TokenSubset.from_mask(next_active)
        going_on = self.going_on
        if self.grad or going_on is None:
            weight = None if s is None else (next_active.to(s.dtype) * s if self.grad else s).reshape(-1)
            return dict(E=flat, hidden=h_flat, state=state_flat, weight=weight)
        n = going_on.num_tokens
        if n == 0:
            return None
        subset = run.subset
        if n == h_flat.shape[0]:  # every computed token goes on: h_flat's rows, in order
            rows = None
        elif subset is None:
            rows = going_on.b_idx * length + going_on.t_idx
        else:  # positions, among the computed tokens, of those that go on (size known: no host sync)
            rows = torch.nonzero_static(next_active[subset.b_idx, subset.t_idx], size=n).squeeze(1)
        pick = (lambda x: x) if rows is None else (lambda x: x.index_select(0, rows))  # noqa: E731
        return dict(E=flat, dest=None if n == batch * length else going_on.b_idx * length + going_on.t_idx,
                    hidden=pick(h_flat), state=None if state_flat is None else pick(state_flat),
                    weight=None if s is None else s[going_on.b_idx, going_on.t_idx])

    def advance(self, E, going):
        if self.ending:
            return
        run = self.run
        total = self.ctx.batch * self.ctx.length
        if self.timer is not None:
            started, compacted = self.timer
            computed = run.subset.num_tokens if compacted else total
            self.choice.record(run.E.device, total, compacted, computed, stop_timer(run.E.device, started))
            self.timer = None
        if E is not None:
            run.E = E.reshape(run.E.shape)
        next_active = run.active if going is None else going
        run.exit_pass = run.exit_pass + next_active.long()  # A8: D_t counts the passes a token was active in
        run.active = next_active
        going_on = self.going_on
        compact = self.compact_ok and going_on is not None and going_on.num_tokens < next_active.numel()
        if compact and self.choice is not None:
            compact = self.choice.choose(run.E.device, total, going_on.num_tokens)
        run.subset = going_on if compact else None

    def _full(self, flat: torch.Tensor) -> torch.Tensor:
        return _unflatten(flat, self.run.subset, self.ctx.batch, self.ctx.length)


def compaction_choice(core) -> "CompactionChoice":
    """The model's compaction measurements (kept on the model: every call at a grid size refines them)."""
    choice = getattr(core, "_compaction_choice", None)
    if choice is None:
        choice = core._compaction_choice = CompactionChoice()
    return choice


def _unflatten(flat: torch.Tensor, subset: TokenSubset | None, batch: int, length: int) -> torch.Tensor:
    if subset is None:
        return flat.reshape(batch, length, *flat.shape[1:])
    full = flat.new_zeros(batch, length, *flat.shape[1:])
    full[subset.b_idx, subset.t_idx] = flat
    return full


__all__ = ["GridLayout", "Layout", "drive", "exit_step", "feed_back", "run_passes"]
