"""Static-shape decoding: a decode step with fixed shapes and no host synchronisation, which ``torch.compile`` can
turn into one graph (one CUDA graph with ``mode="reduce-overhead"``).

The cache is one preallocated tensor ``[layers, 2, K, B, heads, capacity, head_dim]`` (the depth-batched decoder's
layout, which the cached prefill fills in place: :mod:`.static_cache`). A decode step writes each row's
new K/V at one slot (a device tensor, so the step's shapes never change) and attends over the whole capacity under a
mask of the slots filled so far; nothing grows or is concatenated.

Halting is decided on the device. Every row runs every pass the step computes — the shapes stay fixed — and a row
that stopped keeps what its exit pass produced: its exit-pass hidden state (A9), and in later passes the K/V of its
exit pass (A3, A15), written by :class:`StaticKV` with ``torch.where`` rather than computed into the cache. The
outputs equal those of the eager cached decoding, which skips the passes of halted tokens instead. A step runs either
whole (one graph: no host synchronisation inside a token, what a GPU needs) or pass by pass (one graph per pass, the
passes no row needs skipped after a read of the active mask, which on the CPU waits for nothing); on the CPU the
decoder measures both and takes the faster. The pass loop is the pass driver's (:func:`.pass_driver.drive`, with
:class:`StaticLayout`), so every exit rule that decides on the device (the threshold rule, Q-exit with a head, rules
on token ids) is honoured.

Scope: greedy decoding or sampling, modes ``vanilla``, ``ponderlm``, ``loop`` and ``adaponder``, left-padded batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling.exit_rules import PassView
from ..modeling.pass_driver import drive
from ..modeling.pass_step import first_input, generate_positions
from ..modeling.run_settings import RunSettings, settings_or_default
from .speculative import warp
from .static_cache import cache_over, new_static_kv, pass_buffers
from .way_choice import WayChooser

#: Static caches are sized in multiples of this many positions, so that prompts and generations of nearby lengths
#: share one compiled step (its shapes include the capacity).
CAPACITY_STEP = 128

STATIC_MODES = ("vanilla", "ponderlm", "loop", "adaponder")

#: Steps after which a decoder that chooses between pass by pass and the whole step tries the other again.
PROBE_EVERY = 32

#: Compiled graphs kept per step function (dynamo's ``recompile_limit`` while a compiled step runs).
RECOMPILE_LIMIT = 64


class StaticKV:
    """The ``layer_past`` of a static decode step. For pass ``i`` (1-based) of layer ``l`` it writes the new token's
    aligned K/V (A3: the computed K/V where the row is active, else the previous pass's at the same slot) into that
    (layer, pass)'s buffers (:func:`pass_buffers`) at ``slot`` and returns them whole, ``[B, heads, capacity, hd]``."""

    def __init__(self, buffers: tuple[torch.Tensor, ...], num_passes: int, slot: torch.Tensor):
        self.buffers, self.K, self.slot = buffers, num_passes, slot  # slot: [T] long, on the device
        self.pass_idx = 1
        self.active: torch.Tensor | None = None  # m^i [B·T]; None: every token computes this pass

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        base = 2 * (layer_idx * self.K + self.pass_idx - 1)
        keys, values = self.buffers[base], self.buffers[base + 1]
        if self.active is not None:  # the previous pass's buffers sit just before
            m = self.active.view(key.shape[0], 1, key.shape[2], 1)
            key = torch.where(m, key, self.buffers[base - 2].index_select(2, self.slot))
            value = torch.where(m, value, self.buffers[base - 1].index_select(2, self.slot))
        keys.index_copy_(2, self.slot, key)
        values.index_copy_(2, self.slot, value)
        return keys, values


@dataclass
class StepState:
    """What a static decode step carries from one pass to the next, on the device: the next pass's input ``E``
    ``[N, d]``, the active mask ``m`` and exit passes ``D`` ``[N]`` (A2, A8), the exit-pass states ``h_hat`` (A9; None
    before pass 1) and the exit rule's memory ``carry``. ``N = B·T``: the step's T new tokens of every row, row by
    row (T = 1 when decoding; a block of drafted tokens when verifying them)."""

    E: torch.Tensor
    active: torch.Tensor
    exit_pass: torch.Tensor
    h_hat: torch.Tensor | None = None
    carry: torch.Tensor | None = None

    @classmethod
    def start(cls, model, ids: torch.Tensor) -> "StepState":
        """Before pass 1: E⁰ = c·Ẽ[x] (A1) for ``ids`` ``[N]``, every token active."""
        E = first_input(model.gpt_neox.embed_in(ids), model.config.first_pass_scale)
        ones = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
        return cls(E, ones, ones.long())


class StaticLayout:
    """The static decode step's layout for the pass driver: T new tokens per row (at cache slots ``slot`` ``[T]``,
    rotary positions ``position`` ``[B, T]``; ``ids`` ``[B·T]``), every token through passes ``first..last`` (fixed
    shapes); the active mask, exit passes and exit-pass states are kept with ``torch.where``, on the device. After
    a pass below K the exit step and the feedback run, so that a later call can continue."""

    def __init__(self, model, buffers: tuple[torch.Tensor, ...], attention_mask: torch.Tensor, ids: torch.Tensor,
                 slot: torch.Tensor, position: torch.Tensor, num_passes: int, state: StepState, first: int, last: int):
        self.model, self.mask, self.ids, self.K, self.last = model, attention_mask, ids, num_passes, last
        self.grid = position.shape[0], slot.shape[0], state.E.shape[-1]  # B, T, d
        self.rope = model.gpt_neox.rotary_emb(state.E.view(self.grid), position)
        self.static = StaticKV(buffers, model.config.num_passes, slot)
        self.state = state
        self.i, self.s, self.ending = first - 1, None, False
        self.carry = state.carry  # back into the state when the passes end (decode_passes)

    def running(self) -> bool:
        return not self.ending and self.i < self.last

    def run_pass(self):
        st = self.state
        self.i += 1
        self.static.pass_idx = self.i
        self.static.active = st.active if self.i > 1 else None
        neox = self.model.gpt_neox
        hidden = neox.emb_dropout(st.E.view(self.grid))
        for layer in neox.layers:
            hidden = layer(hidden, attention_mask=self.mask, layer_past=self.static, position_embeddings=self.rope)
        hidden = hidden.view(st.E.shape)
        h = neox.final_layer_norm(hidden)
        st.h_hat = h if st.h_hat is None else torch.where(st.active[:, None], h, st.h_hat)  # A9
        return h, hidden

    def exit_view(self, h, needs):
        cfg, i, st = self.model.config, self.i, self.state
        self.ending = i == self.K or not (cfg.ponders or cfg.mode == "loop")
        if self.ending:
            return None
        self.s = self.model.gates[i - 1](h) if cfg.gated else None  # A5
        view = PassView(pass_idx=i, num_passes=self.K, active=st.active, gate=self.s,
                        logits=self.model.lm_head(h) if "logits" in needs else None,
                        hidden=h if "hidden" in needs else None, token_ids=self.ids if "token_ids" in needs else None,
                        carry=self.carry)
        return view, False

    def feedback(self, h, state, going):
        if self.ending:
            return None
        return dict(E=self.state.E, hidden=h, state=state, weight=self.s)  # every row: a stopped row's is unused

    def advance(self, E, going):
        if self.ending:
            return
        st = self.state
        st.E = E
        going = st.active if going is None else going
        st.exit_pass = st.exit_pass + going.long()  # A8
        st.active = going


def decode_passes(model, settings: RunSettings, buffers: tuple[torch.Tensor, ...], mask: torch.Tensor,
                  ids: torch.Tensor, slot: torch.Tensor, position: torch.Tensor, state: StepState, first: int,
                  last: int) -> StepState:
    """Passes ``first..last`` of a static decode step (the pass driver over :class:`StaticLayout`)."""
    K = settings.num_passes(model.config.num_passes)
    layout = StaticLayout(model, buffers, mask, ids, slot, position, K, state, first, last)
    drive(model, layout, settings.rule, settings)
    layout.state.carry = layout.carry
    return layout.state


def decode_step(model, settings: RunSettings, buffers: tuple[torch.Tensor, ...], key_ok: torch.Tensor,
                ids: torch.Tensor, slot: torch.Tensor, position: torch.Tensor):
    """One greedy decode step at fixed shapes over the cache's :func:`pass_buffers`: ``ids`` ``[B]`` (the last
    tokens), written at cache ``slot`` ``[1]``
    with rotary ``position`` ``[B]``. Marks the slot in ``key_ok`` ``[B, capacity]`` (the keys a query may see) and
    returns ``(logits [B, V], exit_pass [B])``. No host synchronisation: ``torch.compile(fullgraph=True)`` makes it
    one graph."""
    key_ok.index_fill_(1, slot, True)
    mask = key_ok[:, None, None, :]  # [B, 1, 1, capacity]: slots after this one are still False
    K = settings.num_passes(model.config.num_passes)
    state = decode_passes(model, settings, buffers, mask, ids, slot, position[:, None], StepState.start(model, ids), 1,
                          K)
    return model.lm_head(state.h_hat), state.exit_pass


def carry_forward(kv: torch.Tensor, slot: torch.Tensor, done: int) -> None:
    """Every row halted by pass ``done``: passes ``done+1..K`` hold each row's pass-``done`` K/V at ``slot`` (A15)."""
    src = kv[:, :, done - 1].index_select(4, slot)  # [L, 2, B, heads, 1, hd]
    later = kv[:, :, done:]
    later.index_copy_(5, slot, src[:, :, None].expand(-1, -1, later.shape[2], -1, -1, -1, -1))


def compile_step(fn, model):
    """``fn`` (a static step of ``model``) under ``torch.compile``: one full graph of fixed shapes, as CUDA graphs on
    a GPU (``reduce-overhead``), inductor's default on the CPU."""
    cuda = next(model.parameters()).device.type == "cuda"
    return torch.compile(fn, fullgraph=True, dynamic=False, mode="reduce-overhead" if cuda else None)


@dataclass
class StaticOutput:
    """``sequences`` ``[B, T + new]``; ``exit_pass`` ``[B, new]``; ``logits`` ``[B, new, V]`` when asked for."""

    sequences: torch.Tensor
    exit_pass: torch.Tensor
    logits: torch.Tensor | None = None


class StaticDecoder:
    """Greedy decoding on a static cache, eager or compiled (``RunSettings(compile=True)``).

    ``StaticDecoder(model, settings).generate(input_ids, attention_mask, max_new_tokens)``. The prefill is the
    model's cached forward (eager), writing into the static cache; every later token is one :meth:`step`.
    Compiled steps are kept per decoder and reused while the batch size and cache capacity stay the same
    (capacities are rounded up to :data:`CAPACITY_STEP`)."""

    def __init__(self, model, settings: RunSettings | None = None, per_pass: bool | None = None):
        """``per_pass``: True runs each step pass by pass, reading on the host after each pass whether any row goes on,
        and skips the passes no row needs (as the eager cached decoding does), their K/V carried forward in one copy
        (A15); False runs the whole step as one graph, with no synchronisation inside a token. None (the default):
        on a GPU the whole step; on the CPU, where reading the mask waits for nothing, the faster of the two as
        measured while decoding (:class:`~.way_choice.WayChooser`: skipping passes pays when many rows stop early,
        one graph when few do)."""
        cfg = model.config
        if cfg.mode not in STATIC_MODES:
            raise ValueError(f"static decoding supports modes {', '.join(STATIC_MODES)}, not {cfg.mode!r}")
        self.model = model
        self.settings = settings_or_default(settings)
        self.per_pass = per_pass
        self._compiled: dict[bool, object] = {}

    def _function(self, per_pass: bool):
        """:func:`decode_passes` (per pass) or :func:`decode_step`, compiled once when the settings ask for it."""
        plain = decode_passes if per_pass else decode_step
        if not self.settings.compile:
            return plain
        if per_pass not in self._compiled:
            self._compiled[per_pass] = compile_step(plain, self.model)
        return self._compiled[per_pass]

    def step(self, kv: torch.Tensor, key_ok: torch.Tensor, ids: torch.Tensor, slot: torch.Tensor,
             position: torch.Tensor, buffers: tuple[torch.Tensor, ...] | None = None, per_pass: bool | None = None):
        """One decode step over the static cache ``kv`` (:func:`decode_step`'s arguments and results), whole or pass
        by pass (``per_pass``; default: the decoder's, pass by pass on the CPU when it chooses); ``buffers``:
        ``pass_buffers(kv)``, when the caller keeps them from step to step."""
        buffers = pass_buffers(kv) if buffers is None else buffers
        if per_pass is None:
            per_pass = self.per_pass if self.per_pass is not None else kv.device.type == "cpu"
        fn = self._function(per_pass)
        if self.settings.compile:
            # one compiled graph per pass index (pass by pass), per model, batch size and capacity: more than
            # dynamo's default of 8 entries per function for a few models of K = 4
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return self._step(fn, per_pass, kv, buffers, key_ok, ids, slot, position)
        return self._step(fn, per_pass, kv, buffers, key_ok, ids, slot, position)

    def _step(self, fn, per_pass, kv, buffers, key_ok, ids, slot, position):
        model, settings = self.model, self.settings
        if not per_pass:
            return fn(model, settings, buffers, key_ok, ids, slot, position)
        key_ok.index_fill_(1, slot, True)
        mask = key_ok[:, None, None, :]
        K = settings.num_passes(model.config.num_passes)
        state = StepState.start(model, ids)
        for i in range(1, K + 1):
            state = fn(model, settings, buffers, mask, ids, slot, position[:, None], state, i, i)
            if i < K and not bool(state.active.any()):  # every row has stopped: the later passes only carry K/V
                carry_forward(kv, slot, i)
                break
        return model.lm_head(state.h_hat), state.exit_pass

    def new_cache(self, batch: int, capacity: int, device=None) -> torch.Tensor:
        return new_static_kv(self.model, batch, capacity, device)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, need: int):
        """The prompt through the eager cached forward into a new static cache of at least ``need`` positions
        (rounded up to :data:`CAPACITY_STEP`, within the model's positions). Returns the cache, the mask of the
        keys written (``[B, capacity]``), the forward's output (last position's logits) and each row's next rotary
        position ``[B]``."""
        model = self.model
        batch, length = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        capacity = -(-need // CAPACITY_STEP) * CAPACITY_STEP
        if capacity > model.config.max_position_embeddings:
            capacity = max(need, model.config.max_position_embeddings)
        kv = self.new_cache(batch, capacity, input_ids.device)
        positions = generate_positions(attention_mask, 0, length)
        out = model(input_ids, attention_mask=attention_mask, position_ids=positions,
                    cache=cache_over(kv), use_cache=True, logits_to_keep=1,
                    settings=self.settings.replace(compile=False))
        key_ok = torch.zeros(batch, capacity, dtype=torch.bool, device=input_ids.device)
        key_ok[:, :length] = attention_mask.bool()
        return kv, key_ok, out, positions[:, -1] + 1

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int = 20, eos_token_id: int | None = None, pad_token_id: int | None = None,
                 output_logits: bool = False, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> StaticOutput:
        """Greedy tokens as ``model.generate(do_sample=False)`` gives them: a row that emitted ``eos_token_id`` emits
        ``pad_token_id`` (default: the eos id) afterwards, and that is what it reads next. Every row runs
        ``max_new_tokens`` steps (fixed shapes: no early stop). ``do_sample``: each token drawn from the step's
        logits after ``temperature``, ``top_k`` and ``top_p`` (transformers' warpers, in their order), outside the
        compiled step."""
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length ≥ 1, got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        batch, length = input_ids.shape
        device = input_ids.device
        kv, key_ok, out, position = self.prefill(input_ids, attention_mask, length + max_new_tokens)
        logits = out.logits[:, -1]
        tokens = torch.empty(batch, max_new_tokens, dtype=torch.long, device=device)
        exits = torch.empty_like(tokens)
        kept = [logits] if output_logits else None
        pad = pad_token_id if pad_token_id is not None else eos_token_id
        finished = torch.zeros(batch, dtype=torch.bool, device=device)

        def emit(t: int, logits: torch.Tensor, exit_pass: torch.Tensor) -> None:
            if do_sample:
                probs = warp(logits, temperature, top_k, top_p).exp()
                token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                token = logits.argmax(-1)
            if eos_token_id is not None:
                token = torch.where(finished, pad, token)
                finished.logical_or_(token == eos_token_id)
            tokens[:, t], exits[:, t] = token, exit_pass

        emit(0, logits, out.exit_pass[:, -1])
        slot = torch.tensor([length], device=device)
        buffers = pass_buffers(kv)
        chooser = (WayChooser(("pass-by-pass", "whole-step"), PROBE_EVERY, device)
                   if self.per_pass is None and device.type == "cpu" else None)
        for t in range(1, max_new_tokens):
            way = None if chooser is None else chooser.next_way()
            started = None if chooser is None else chooser.start()
            logits, exit_pass = self.step(kv, key_ok, tokens[:, t - 1].contiguous(), slot, position,  # (fixed strides)
                                          buffers, None if way is None else way == "pass-by-pass")
            if chooser is not None:
                chooser.record(way, started, 1)
            emit(t, logits, exit_pass)
            if kept is not None:
                kept.append(logits.clone())
            slot += 1
            position += 1
        return StaticOutput(torch.cat([input_ids, tokens], 1), exits,
                            torch.stack(kept, 1) if kept is not None else None)


__all__ = ["CAPACITY_STEP", "STATIC_MODES", "StaticDecoder", "StaticKV", "StaticLayout", "StaticOutput", "StepState",
           "carry_forward", "compile_step", "decode_passes", "decode_step", "pass_buffers"]
