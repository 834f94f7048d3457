"""Depth-wise continuous batching for decoding: every row of the batch at its own pass (A6–A8, A15).

The cached ``forward`` decodes a batch in lockstep: one token per row per step, K passes per step, each pass
computing the rows still active in it. The weights (layers, and W_out, W_E for the pondering product A4) are
read once per pass for the whole batch as long as *any* row is active there, so in a batch the bytes a step
reads hardly fall with halting, and decoding — bandwidth-bound at small batch — saves little wall-clock.

:class:`DepthBatchedDecoder` schedules by pass instead. One *tick* runs the layer stack once over all live
rows, each at its own pass of its own token. A row whose token halts after the tick (A6; or reaches pass K)
emits the token and starts its next token at pass 1 in the next tick, while the other rows go on pondering.
Every weight read then serves a full batch, and the number of ticks is the number of token-passes over the
batch size: wall-clock falls with the skipped token-passes (Mixture-of-Recursions' depth-wise batching).

The arithmetic per row is the cached ``forward``'s (same layers, gates, pondering, A15 K/V reuse), so a row's
tokens and exit passes are those of decoding it alone (``tests/test_depth_batching.py``). What differs is the
layout: the prefill writes the K/V of every layer and pass into one tensor ``[layers, 2, K, B, heads, capacity,
head_dim]`` (:meth:`DepthBatchedDecoder.new_cache`); the ticks read the values there and the keys from a copy
transposed once after the prefill (``[.., head_dim, capacity]``, :meth:`DepthBatchedDecoder.prepare`). A tick writes
each row's new key and value at (its pass, its position), copies the K/V of the tokens that halted forward (A15) in
one indexed copy each, and attends for all rows at once: with the keys transposed, both products of attention are
weighted sums of buffer rows picked by index (``embedding_bag``), so rows at different passes and positions need
neither an SDPA call each nor a gathered copy of the cache (:func:`row_attention`). transformers' GPT-NeoX layers
run unchanged; their attention is routed to :func:`row_attention` through ``AttentionInterface`` (the documented
way to plug an attention function in) for the duration of the ticks. The transposed keys cost memory: the cache's
keys are held twice while decoding. They also cost reads in proportion to the buffer's capacity (a row of the
transposed keys spans every position), so the buffers start with room for ``GROWTH`` new positions and double
when the ticks reach their end, rather than holding the whole generation from the start.

The exit step and the feedback are the pass driver's (:func:`.pass_driver.exit_step`, :func:`.pass_driver.feed_back`),
applied to the tick's rows, each at its own pass: any exit rule that decides per element (the threshold rule of A6,
Q-exit with a head, a rule on token ids; not fixed pruning, which draws over a batch at one pass) is honoured. A rule's
memory (``carries``) stays with its row and starts afresh at each token's pass 1, as the exit step sees to for every
layout (:func:`~.exit_rules.rule_answer`): a row that emits a token starts the next in the same slot.

Scope: greedy decoding of prompts left-padded or not, modes ``vanilla``, ``ponderlm`` and ``adaponder``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from ..modeling.attention import ROW_ATTENTION
from ..modeling.exit_rules import PassView
from ..modeling.input_checks import check_generation_length
from ..modeling.pass_driver import drive
from ..modeling.pass_step import first_input, generate_positions
from ..modeling.ponder_cache import PonderCache
from .static_cache import cache_over, new_static_kv, starts_at
from ..modeling.run_settings import RunSettings, settings_or_default



class RowPlan:
    """Where the live rows of a tick attend, as row indices of the layer's K/V buffers viewed as tables: built once per
    tick, shared by every layer.

    Row ``i`` (buffer row ``rows[i]``, pass ``passes[i]``, position ``positions[i]``) attends with head ``h`` to slot
    ``((pass - 1)·B + row)·heads + h``. ``key_rows`` ``[n·heads, hd]``: that slot's rows of the transposed keys
    (``[.., hd, capacity]``, a row per key dimension); ``value_rows`` ``[n·heads, span]``: its rows of the values
    (a row per position), positions past the row's own clamped to it (weight 0 there); ``future`` ``[n·heads, span]``:
    the positions a row must not see. ``span`` = the largest position + 1."""

    def __init__(self, rows: torch.Tensor, passes: torch.Tensor, positions: torch.Tensor, span: int, *, batch: int,
                 heads: int, head_dim: int, capacity: int, pads: torch.Tensor | None = None):
        device = rows.device
        slot = (((passes - 1) * batch + rows)[:, None] * heads + torch.arange(heads, device=device)).reshape(-1, 1)
        pos = positions.repeat_interleave(heads)[:, None]
        t = torch.arange(span, device=device)[None]
        self.key_rows = slot * head_dim + torch.arange(head_dim, device=device)
        self.value_rows = slot * capacity + torch.minimum(t, pos)
        self.future = t > pos
        if pads is not None:  # a left-padded row's padding slots are masked as the future is
            self.future |= t < pads.repeat_interleave(heads)[:, None]


def row_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, ponder_rows=None,
                  **kwargs):
    """Attention of one tick, every row at its own pass and position, in one call per product: ``query``
    ``[n, heads, 1, hd]``; ``key`` the layer's transposed keys of every pass ``[K, B, heads, hd, capacity]`` and
    ``value`` its values ``[K, B, heads, capacity, hd]`` (from :meth:`TickKV.update`); ``ponder_rows`` the
    :class:`RowPlan`. Returns ``[n, 1, heads, hd]`` as transformers' attention functions do.

    Both products are weighted sums of table rows picked by index — ``embedding_bag`` — so rows at different passes
    and positions share one call each and no K/V is gathered into a copy: scores = Σ_d q_d·Kᵀ[d, :] (a row of the
    transposed keys per key dimension), output = Σ_t p_t·V[t] (a row of the values per position)."""
    plan: RowPlan = ponder_rows
    n, heads, _, hd = query.shape
    span = plan.future.shape[1]
    scores = F.embedding_bag(plan.key_rows, key.view(-1, key.shape[-1]), mode="sum",
                             per_sample_weights=query.reshape(n * heads, hd))[:, :span]
    scores = (scores.float() * scaling).masked_fill_(plan.future, float("-inf"))
    probs = scores.softmax(-1).to(value.dtype)  # exactly 0 at the future positions, whatever their buffer holds
    out = F.embedding_bag(plan.value_rows, value.view(-1, hd), mode="sum", per_sample_weights=probs)
    return out.view(n, 1, heads, hd), None


AttentionInterface.register(ROW_ATTENTION, row_attention)


def _index(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


class TickKV:
    """The ``layer_past`` of a tick: writes each row's new key and value at (its pass, its position) — the key into
    the transposed keys, one indexed write each — and hands the layer's whole buffers to :func:`row_attention`."""

    def __init__(self, keys_t: torch.Tensor, values: torch.Tensor):
        self.keys_t = keys_t  # [layers, K, B, heads, hd, capacity]
        self.values = values  # [layers, K, B, heads, capacity, hd]
        self.index: tuple | None = None  # (pass - 1, row, position) of every live row

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        p, r, t = self.index
        keys_t, values = self.keys_t[layer_idx], self.values[layer_idx]
        keys_t[p, r, :, :, t] = key[:, :, 0]
        values[p, r, :, t] = value[:, :, 0]
        return keys_t, values


class TickGates:
    """The iteration-specific gates (A5) of a tick whose rows sit at different passes: the rows are put in pass order
    by one gather, each gate runs on its contiguous slice (no more rows than it needs), and one more gather puts the
    values back in row order. A tick whose rows share one pass calls that gate alone."""

    def __init__(self, gates):
        self.gates = gates

    def __call__(self, h: torch.Tensor, passes: list[int]) -> torch.Tensor:
        """s of each row of ``h`` ``[n, d]`` at its pass (``passes``, 1-based, on the host); 0 past the last gate
        (pass K: the row halts anyway)."""
        n, G = h.shape[0], len(self.gates)
        first = passes[0]
        if all(p == first for p in passes):
            return self.gates[first - 1](h) if first <= G else h.new_zeros(n, dtype=torch.float32)
        order = sorted(range(n), key=passes.__getitem__)
        order_t = _index(order, h.device)
        sorted_h = h.index_select(0, order_t)
        parts, start = [], 0
        for p, group in itertools.groupby(passes[i] for i in order):
            count = sum(1 for _ in group)
            part = sorted_h[start:start + count]
            parts.append(self.gates[p - 1](part) if p <= G else part.new_zeros(count, dtype=torch.float32))
            start += count
        s = torch.cat(parts)
        return torch.empty_like(s).index_copy_(0, order_t, s)  # back to row order


@dataclass
class DepthBatchedOutput:
    """``sequences`` ``[B, T + new]`` (prompt and generated tokens); ``exit_pass`` ``[B, new]`` the pass each
    generated token exited at (the first from the prefill); ``ticks`` stack runs after the prefill;
    ``token_passes`` the passes they computed summed over rows (ticks × live rows); ``new_tokens`` ``[B]`` how many
    tokens each row got (fewer than asked after an EOS or ``max_ticks``). What the ticks read besides the layers and
    the head (once a tick), for a benchmark's bytes model: ``pondering_ticks`` ticks that ran the pondering product
    (W_E), ``gate_runs`` gates run summed over ticks, ``attended`` key positions attended summed over rows and
    ticks."""

    sequences: torch.Tensor
    exit_pass: torch.Tensor
    ticks: int
    token_passes: int
    pondering_ticks: int
    gate_runs: int
    attended: int
    new_tokens: torch.Tensor


@dataclass
class DecoderPrefill:
    """A prefill in the decoder's layout (:meth:`DepthBatchedDecoder.prefill`): the model's ``output`` (``logits``,
    ``exit_pass``, ``cache``), the K/V buffers every tick reads — ``values`` ``[layers, K, B, heads, capacity, hd]``,
    the cache's own storage, and ``keys_t`` ``[layers, K, B, heads, hd, capacity]``, the keys transposed once for
    :func:`row_attention` — and ``capacity``, the positions they hold."""

    output: object
    keys_t: torch.Tensor
    values: torch.Tensor
    pads: torch.Tensor | None = None  # [B] leading padding slots of each row (left-padded prompts), None: none

    @property
    def capacity(self) -> int:
        return self.values.shape[4]

    def grown(self, capacity: int) -> "DecoderPrefill":
        """New buffers with room for ``capacity`` positions holding this one's (this one stays as it is: a caller
        may decode from it again); ``output`` is shared."""
        keys_t = self.keys_t.new_empty(*self.keys_t.shape[:-1], capacity)
        values = self.values.new_empty(*self.values.shape[:-2], capacity, self.values.shape[-1])
        keys_t[..., :self.capacity].copy_(self.keys_t)
        values[..., :self.capacity, :].copy_(self.values)
        return DecoderPrefill(self.output, keys_t, values, self.pads)


class DepthBatchedDecoder:
    """Greedy decoding with depth-wise continuous batching (see the module docstring).

    ``DepthBatchedDecoder(model).generate(input_ids, max_new_tokens)``: ``input_ids`` ``[B, T]`` without
    padding; every row gets ``max_new_tokens`` tokens (fewer when ``eos_token_id`` ends it: the rest of its row
    is ``eos_token_id`` and its exit passes 0).
    """

    #: New positions the tick buffers have room for at first; they double when the ticks reach their end.
    GROWTH = 64

    def __init__(self, model, settings: RunSettings | None = None):
        """``settings``: the :class:`~.run_settings.RunSettings` this decoder runs with (τ, exit rule, passes)."""
        cfg = model.config
        if cfg.mode not in ("vanilla", "ponderlm", "adaponder"):
            raise ValueError(f"depth-batched decoding supports modes vanilla, ponderlm and adaponder, not {cfg.mode!r}")
        self.model = model
        self.settings = settings_or_default(settings)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None,
                 prefill=None, max_ticks: int | None = None,
                 attention_mask: torch.Tensor | None = None) -> DepthBatchedOutput:
        """``prefill``: the prefill when the caller already ran it (a benchmark timing prefill and decoding apart) —
        a :class:`DecoderPrefill` from :meth:`prefill`, decoded in place while it has room (then in grown copies:
        it can be decoded from again), or the output of ``model(input_ids, use_cache=True)``, brought into the
        decoder's layout first. ``max_ticks``: stop after
        that many ticks (tokens still in flight are dropped) — a server's steady state, where a finished row's
        slot is refilled at once, measured without the tail of a batch whose last rows finish alone.
        ``attention_mask``: left-padded prompts (zeros before each row's first token)."""
        model, cfg = self.model, self.model.config
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length ≥ 1, got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        batch, length = input_ids.shape
        K = self.settings.num_passes(cfg.num_passes)
        room = max_new_tokens if max_ticks is None else min(max_new_tokens, max_ticks + 1)
        need = length + room  # positions the generation can reach
        check_generation_length(cfg.max_position_embeddings, length, room, None)
        if prefill is None:
            prefill = self.prefill(input_ids, min(need, length + self.GROWTH), attention_mask)
        elif not isinstance(prefill, DecoderPrefill):
            prefill = self.prepare(prefill, min(need, length + self.GROWTH))
        ticks = TickLayout(self, prefill, input_ids, K, need, max_new_tokens, eos_token_id, max_ticks)
        drive(model, ticks, self.settings.rule)
        tokens, exits, device = ticks.tokens, ticks.exits, input_ids.device
        fill = eos_token_id if eos_token_id is not None else 0
        gen = torch.tensor([t + [fill] * (max_new_tokens - len(t)) for t in tokens], device=device)
        ex = torch.tensor([d + [0] * (max_new_tokens - len(d)) for d in exits], device=device)
        count = _index([len(t) for t in tokens], device)
        return DepthBatchedOutput(torch.cat([input_ids, gen], 1), ex, ticks.ticks, ticks.token_passes,
                                  ticks.pondering_ticks, ticks.gate_runs, ticks.attended, count)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, capacity: int,
                attention_mask: torch.Tensor | None = None) -> DecoderPrefill:
        """The cached forward over the prompts (A16), writing straight into a cache in the decoder's layout with room
        for ``capacity`` positions, then the keys transposed for the ticks (:meth:`prepare`). ``attention_mask``:
        left padding (each row's rotary positions start at its first token; its padding slots are never attended)."""
        cache = self.new_cache(input_ids.shape[0], capacity, input_ids.device)
        if attention_mask is None or bool(attention_mask.all()):
            return self.prepare(self.model(input_ids, cache=cache, use_cache=True, settings=self.settings), capacity)
        mask = attention_mask.to(input_ids.device).long()
        pads = (mask.cumsum(1) == 0).sum(1)
        if not bool((mask.sum(1) + pads == mask.shape[1]).all()):
            raise ValueError("depth-batched decoding takes left padding only: attention_mask has zeros after a row's "
                             "first token")
        out = self.model(input_ids, attention_mask=mask, position_ids=generate_positions(mask, 0, mask.shape[1]),
                         cache=cache, use_cache=True, settings=self.settings)
        prefill = self.prepare(out, capacity)
        prefill.pads = pads
        return prefill

    def prepare(self, output, capacity: int) -> DecoderPrefill:
        """``output`` of the cached forward in the decoder's layout: its values where they are (a cache from
        :meth:`new_cache` with room) or copied into a buffer with room, and its keys transposed into a buffer of their
        own — a copy of the prompt's keys, once per prefill, that lets every tick attend by index
        (:func:`row_attention`)."""
        cfg, cache = self.model.config, output.cache
        length = cache.get_seq_length()
        kv = self._layout(cache, capacity)
        if kv is not None:  # the values stay where the prefill wrote them
            values = kv[:, 1]
            keys_t = values.new_empty(*values.shape[:4], values.shape[5], capacity)
            keys_t[..., :length].copy_(kv[:, 0, :, :, :, :length].transpose(-1, -2))
            return DecoderPrefill(output, keys_t, values)
        v = cache.view(1, 0)[1]
        b, h, _, hd = v.shape
        values = v.new_empty(cfg.num_hidden_layers, cfg.num_passes, b, h, capacity, hd)
        keys_t = values.new_empty(*values.shape[:4], hd, capacity)
        for layer in range(cfg.num_hidden_layers):
            for p in range(cfg.num_passes):
                k, v = cache.view(p + 1, layer)
                keys_t[layer, p, ..., :length].copy_(k.transpose(-1, -2))
                values[layer, p, :, :, :length].copy_(v)
        return DecoderPrefill(output, keys_t, values)

    def new_cache(self, batch: int, capacity: int, device=None) -> PonderCache:
        """An empty :class:`PonderCache` in the decoder's layout (one ``[layers, 2, K, B, heads, capacity, hd]`` tensor
        of keys and values) for the prefill to fill: decoding then starts without copying the values (the keys are
        copied once, transposed: :meth:`prepare`). Lockstep decoding (the cached ``forward``) can use it too while it
        has room."""
        return cache_over(new_static_kv(self.model, batch, capacity, device))

    def _layout(self, cache: PonderCache, capacity: int) -> torch.Tensor | None:
        """The ``[layers, 2, K, B, heads, capacity, hd]`` tensor holding the prefill's K/V when the cache came from
        :meth:`new_cache`, has room and every (pass, layer) still lives in it; else None (:meth:`prepare` copies)."""
        cfg = self.model.config
        kv = cache.pass_buffers
        if kv is not None and kv.shape[5] >= capacity and all(
                starts_at(cache.view(p + 1, layer)[i], kv[layer, i, p])
                for p in range(cfg.num_passes) for layer in range(cfg.num_hidden_layers) for i in range(2)):
            return kv
        return None


class TickLayout:
    """The depth-batched decoder's layout for the pass driver: one row per live sequence, each at its own pass and
    position. A tick is one pass of the driver's loop over all live rows; a row that halts emits its token and starts
    the next one at pass 1 (A1) in the same slot."""

    def __init__(self, decoder: DepthBatchedDecoder, prefill: DecoderPrefill, input_ids: torch.Tensor, K: int,
                 need: int, max_new_tokens: int, eos_token_id: int | None, max_ticks: int | None):
        model, cfg = decoder.model, decoder.model.config
        self.model, self.K, self.need, self.max_ticks = model, K, need, max_ticks
        self.limit, self.eos = max_new_tokens, eos_token_id
        self.prefill = prefill
        self.kv = TickKV(prefill.keys_t, prefill.values)
        heads = cfg.num_attention_heads
        self.layout = dict(batch=prefill.values.shape[2], heads=heads, head_dim=cfg.hidden_size // heads)
        self.gates = TickGates(model.gates) if len(model.gates) else None
        self.device = input_ids.device
        out = prefill.output
        batch, length = input_ids.shape
        self.tokens = [[y] for y in out.logits[:, -1].argmax(-1).tolist()]
        self.exits = [[d] for d in out.exit_pass[:, -1].tolist()]
        self.live = [b for b in range(batch) if not self._done(self.tokens[b])]
        self.passes = [1] * len(self.live)
        self.positions = [length] * len(self.live)
        self.E = self._first_input([self.tokens[b][-1] for b in self.live])
        self.carry = None  # the exit rule's per-row memory (a row at pass 1 starts afresh: exit_rules.rule_answer)
        self.ticks = self.token_passes = self.pondering_ticks = self.gate_runs = self.attended = 0

    def running(self) -> bool:
        return bool(self.live) and (self.max_ticks is None or self.ticks < self.max_ticks)

    def run_pass(self):
        if max(self.positions) >= self.prefill.capacity:  # the ticks reached the buffers' end: double them
            self.prefill = self.prefill.grown(min(self.need, 2 * self.prefill.capacity))
            self.kv = TickKV(self.prefill.keys_t, self.prefill.values)
        rows_t, self.pass_t, pos_t = (_index(x, self.device) for x in (self.live, self.passes, self.positions))
        pads = None if self.prefill.pads is None else self.prefill.pads.index_select(0, rows_t)
        plan = RowPlan(rows_t, self.pass_t, pos_t, max(self.positions) + 1, capacity=self.prefill.capacity,
                       pads=pads, **self.layout)
        self.kv.index = (self.pass_t - 1, rows_t, pos_t)
        h = self._stack(self.E, pos_t if pads is None else pos_t - pads, plan)  # [n, d]: final-LN hidden state
        self.ticks += 1
        self.token_passes += len(self.live)
        self.attended += sum(self.positions) + len(self.positions)
        self.gate_runs += len({p for p in self.passes if p <= len(self.model.gates)})
        return h, None

    def exit_view(self, h, needs):
        self.s = None if self.gates is None else self.gates(h, self.passes)  # [n] float (A5)
        self.z = self._logits(h)  # the exit logits of rows that halt; the pondering logits of the others (A4)
        view = PassView(pass_idx=self.pass_t, num_passes=self.K, active=torch.ones_like(self.pass_t, dtype=torch.bool),
                        gate=self.s, logits=self.z if "logits" in needs else None, hidden=h,
                        token_ids=self._token_ids() if "token_ids" in needs else None, carry=self.carry)
        return view, self.pass_t >= self.K

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(h)

    def _token_ids(self) -> torch.Tensor:
        """The token each row runs its pass on: its newest."""
        return _index([self.tokens[b][-1] for b in self.live], self.device)

    def feedback(self, h, state, going):
        """E^i = E^{i-1} + s^i·e^i (A7) for the rows that go on pondering (the softmax in place: z is not read
        afterwards)."""
        self.halt_h, self.nxt_h = torch.stack([(~going).long(), self.z.argmax(-1)]).tolist()  # the one host sync
        return self._pondering_args()

    def _pondering_args(self) -> dict | None:
        """:func:`~.pass_driver.feed_back`'s arguments for the rows that go on (``halt_h`` read), None if none does."""
        go = [i for i, stop in enumerate(self.halt_h) if not stop]
        if not go:
            return None
        self.pondering_ticks += 1
        idx = _index(go, self.device)
        return dict(E=self.E, dest=idx, logits=self.z.index_select(0, idx), in_place=True,
                    weight=None if self.s is None else self.s.index_select(0, idx))

    def advance(self, E, going):
        if E is not None:
            self.E = E
        live, passes, positions = self.live, self.passes, self.positions
        stopped = [i for i, stop in enumerate(self.halt_h) if stop]
        self._carry_forward([(live[i], passes[i], positions[i]) for i in stopped])
        keep_rows = live
        self._advance()
        if self.carry is not None and len(self.live) < len(keep_rows):
            self.carry = self.carry.index_select(0, _index([keep_rows.index(b) for b in self.live], self.device))

    # -- pieces of a tick -------------------------------------------------------------------------------------
    def _advance(self):
        """After a tick: rows that go on move to their next pass; rows that halted emit their token (and exit pass)
        and, unless done, start the next token at pass 1 (A1) one position on; finished rows leave."""
        E, live, passes, positions = self.E, self.live, self.passes, self.positions
        tokens, exits, halt_h, nxt_h = self.tokens, self.exits, self.halt_h, self.nxt_h
        keep, new_rows, new_tokens = [], [], []
        for i, b in enumerate(live):
            if not halt_h[i]:
                passes[i] += 1
                keep.append(i)
                continue
            tokens[b].append(nxt_h[i])
            exits[b].append(passes[i])
            if not self._done(tokens[b]):
                passes[i], positions[i] = 1, positions[i] + 1
                keep.append(i)
                new_rows.append(len(keep) - 1)
                new_tokens.append(nxt_h[i])
        if len(keep) < len(live):
            E = E.index_select(0, _index(keep, E.device))
            live, passes, positions = ([x[i] for i in keep] for x in (live, passes, positions))
        if new_rows:
            E = E.index_copy(0, _index(new_rows, E.device), self._first_input(new_tokens))
        self.E, self.live, self.passes, self.positions = E, live, passes, positions

    def _done(self, tokens: list[int]) -> bool:
        return len(tokens) >= self.limit or (self.eos is not None and tokens[-1] == self.eos)

    def _first_input(self, token_ids: list[int]) -> torch.Tensor:
        """E⁰ = c·Ẽ[x] of the given tokens (A1), ``[n, d]``."""
        embed = self.model.gpt_neox.embed_in
        return first_input(embed(_index(token_ids, self.device)), self.model.config.first_pass_scale)

    def _stack(self, E: torch.Tensor, rotary: torch.Tensor, plan: RowPlan) -> torch.Tensor:
        """The layer stack over a tick's rows at rotary positions ``rotary`` ``[n]`` (slot minus left padding)."""
        neox = self.model.gpt_neox
        hidden = neox.emb_dropout(E[:, None])
        rope = neox.rotary_emb(hidden, rotary[:, None])
        for layer in neox.layers:
            hidden = layer(hidden, attention_mask=None, layer_past=self.kv, position_embeddings=rope, ponder_rows=plan)
        return neox.final_layer_norm(hidden)[:, 0]

    def _carry_forward(self, halted: list[tuple[int, int, int]]) -> None:
        """A token that halted at pass D keeps its pass-D K/V in passes D+1..K (A15): one indexed copy of every
        layer's keys and one of its values, for all rows that halted in this tick."""
        pairs = [(row, d, j, pos) for row, d, pos in halted for j in range(d + 1, self.K + 1)]
        if not pairs:
            return
        kv = self.kv
        row, src, dst, pos = (_index(c, self.device) for c in zip(*pairs))
        kv.keys_t[:, dst - 1, row, :, :, pos] = kv.keys_t[:, src - 1, row, :, :, pos]
        kv.values[:, dst - 1, row, :, pos] = kv.values[:, src - 1, row, :, pos]


__all__ = ["DecoderPrefill", "DepthBatchedDecoder", "DepthBatchedOutput", "TickGates", "ROW_ATTENTION",
           "row_attention"]
