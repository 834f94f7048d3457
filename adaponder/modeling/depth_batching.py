"""Depth-wise continuous batching for decoding: every row of the batch at its own pass (issue 16; A6–A8, A15).

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
layout: the K/V of every layer and pass live in one tensor ``[layers, 2, K, B, heads, capacity, head_dim]``; a
tick writes each row's new keys and values at (its pass, its position) in one indexed write per layer, copies the
K/V of the tokens that halted forward (A15) in one indexed copy, and the attention of a row reads its own pass's
slice — one SDPA call per run of adjacent rows at the same pass and position (one call in all when
every row is in step), no gathered copy of the cache. transformers' GPT-NeoX layers run unchanged; their
attention is routed to :func:`row_attention` through ``AttentionInterface`` (the documented way to plug an
attention function in) for the duration of the ticks.

Scope: greedy decoding of equal-length, unpadded prompts, the threshold rule of A6 (no ``halting_policy``),
modes ``vanilla``, ``ponderlm`` and ``adaponder``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from .modeling_adaponder import _attention_implementation
from .ponder_cache import PonderCache, starts_at
from .pondering import pondering_from_logits

ROW_ATTENTION = "adaponder_rows"


@dataclass
class RowPlan:
    """Where each live row of a tick attends: buffer row ``rows[i]``, pass ``passes[i]`` (1-based), keys at
    positions ``0..positions[i]``. ``runs`` groups adjacent rows that can share one attention call."""

    rows: list[int]
    passes: list[int]
    positions: list[int]

    def __post_init__(self):
        self.runs = []  # (first live index, count, buffer row, pass, position)
        for i, (r, p, t) in enumerate(zip(self.rows, self.passes, self.positions)):
            last = self.runs[-1] if self.runs else None
            if last and last[2] + last[1] == r and last[3] == p and last[4] == t:
                self.runs[-1] = (last[0], last[1] + 1, last[2], p, t)
            else:
                self.runs.append((i, 1, r, p, t))


def row_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, ponder_rows=None,
                  **kwargs):
    """Attention of one tick: ``query`` ``[n, heads, 1, hd]``; ``key``/``value`` the layer's keys and values of every
    pass, ``[K, B, heads, capacity, hd]`` each (from :meth:`TickKV.update`); ``ponder_rows`` the :class:`RowPlan`.
    Returns ``[n, 1, heads, hd]`` as transformers' attention functions do."""
    plan: RowPlan = ponder_rows
    outs = []
    for first, count, row, p, t in plan.runs:
        k = key[p - 1, row:row + count, :, :t + 1]
        v = value[p - 1, row:row + count, :, :t + 1]
        outs.append(F.scaled_dot_product_attention(query[first:first + count], k, v, scale=scaling))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.transpose(1, 2), None


AttentionInterface.register(ROW_ATTENTION, row_attention)


def _index(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


class TickKV:
    """The ``layer_past`` of a tick: writes each row's new K/V at (its pass, its position) — keys and values in one
    indexed write — and hands the layer's whole buffers to :func:`row_attention`."""

    def __init__(self, kv: torch.Tensor):
        self.kv = kv  # [layers, 2, K, B, heads, capacity, hd]
        self.index: tuple | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.kv[layer_idx]
        layer[self.index] = torch.stack((key[:, :, 0], value[:, :, 0]), 1)  # [n, 2, heads, hd]
        return layer[0], layer[1]


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
    tokens each row got (fewer than asked after an EOS or ``max_ticks``)."""

    sequences: torch.Tensor
    exit_pass: torch.Tensor
    ticks: int
    token_passes: int
    new_tokens: torch.Tensor


class DepthBatchedDecoder:
    """Greedy decoding with depth-wise continuous batching (see the module docstring).

    ``DepthBatchedDecoder(model).generate(input_ids, max_new_tokens)``: ``input_ids`` ``[B, T]`` without
    padding; every row gets ``max_new_tokens`` tokens (fewer when ``eos_token_id`` ends it: the rest of its row
    is ``eos_token_id`` and its exit passes 0).
    """

    def __init__(self, model):
        cfg = model.config
        if cfg.mode not in ("vanilla", "ponderlm", "adaponder"):
            raise ValueError(f"depth-batched decoding supports modes vanilla, ponderlm and adaponder, not {cfg.mode!r}")
        self.model = model

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None,
                 prefill=None, max_ticks: int | None = None) -> DepthBatchedOutput:
        """``prefill``: the output of ``model(input_ids, use_cache=True)`` when the caller already ran it (a
        benchmark timing prefill and decoding apart); a cache from :meth:`new_cache` is decoded in place, any other
        is copied. ``max_ticks``: stop after
        that many ticks (tokens still in flight are dropped) — a server's steady state, where a finished row's
        slot is refilled at once, measured without the tail of a batch whose last rows finish alone."""
        model, cfg = self.model, self.model.config
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length ≥ 1, got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        batch, length = input_ids.shape
        K = cfg.num_passes
        room = max_new_tokens if max_ticks is None else min(max_new_tokens, max_ticks + 1)
        if prefill is None:  # the cached forward (A16), writing straight into the decoder's layout
            prefill = model(input_ids, cache=self.new_cache(batch, length + room, input_ids.device), use_cache=True)
        out = prefill
        kv = TickKV(self._layout(out.cache, length + room))
        gates = TickGates(model.gates) if len(model.gates) else None
        device = input_ids.device
        tokens = [[y] for y in out.logits[:, -1].argmax(-1).tolist()]
        exits = [[d] for d in out.exit_pass[:, -1].tolist()]

        live = [b for b in range(batch) if not self._done(tokens[b], max_new_tokens, eos_token_id)]
        passes = [1] * len(live)
        positions = [length] * len(live)
        embed = model.gpt_neox.embed_in
        E = self._first_input(embed, [tokens[b][-1] for b in live], device)
        ticks = token_passes = 0
        with _attention_implementation(cfg, ROW_ATTENTION):
            while live and (max_ticks is None or ticks < max_ticks):
                plan = RowPlan(live, passes, positions)
                rows_t, pass_t, pos_t = (_index(x, device) for x in (live, passes, positions))
                kv.index = (slice(None), pass_t - 1, rows_t, slice(None), pos_t)
                h = self._stack(E, pos_t, kv, plan)  # [n, d]: final-LN hidden state of this tick's pass
                ticks += 1
                token_passes += len(live)

                s = None if gates is None else gates(h, passes)  # [n] float (A5)
                halt = pass_t >= K if s is None else (pass_t >= K) | (s < cfg.halting_threshold)  # A6
                z = model.lm_head(h)  # the exit logits of rows that halt; the pondering logits of the others (A4)
                nxt = z.argmax(-1)
                halt_h, nxt_h = torch.stack([halt.long(), nxt]).tolist()  # the tick's one host synchronisation

                go = [i for i, stop in enumerate(halt_h) if not stop]
                if go:  # E^i = E^{i-1} + s^i·e^i (A7) for the rows that go on pondering
                    idx = _index(go, device)
                    e = pondering_from_logits(z.index_select(0, idx), model.gpt_neox.embed_in.weight,
                                              cfg.embedding_scale, in_place=True)  # (A4)
                    if s is not None:
                        e = e * s.index_select(0, idx).to(e.dtype)[:, None]
                    E = E.index_add(0, idx, e.to(E.dtype))
                stopped = [i for i, stop in enumerate(halt_h) if stop]
                self._carry_forward(kv.kv, [(live[i], passes[i], positions[i]) for i in stopped], K, device)

                keep, new_rows, new_tokens = [], [], []
                for i, b in enumerate(live):
                    if not halt_h[i]:
                        passes[i] += 1
                        keep.append(i)
                        continue
                    tokens[b].append(nxt_h[i])
                    exits[b].append(passes[i])
                    if not self._done(tokens[b], max_new_tokens, eos_token_id):
                        passes[i], positions[i] = 1, positions[i] + 1
                        keep.append(i)
                        new_rows.append(len(keep) - 1)
                        new_tokens.append(nxt_h[i])
                if len(keep) < len(live):
                    E = E.index_select(0, _index(keep, device))
                    live = [live[i] for i in keep]
                    passes = [passes[i] for i in keep]
                    positions = [positions[i] for i in keep]
                if new_rows:  # rows that emitted a token start the next one at pass 1 (A1)
                    E = E.index_copy(0, _index(new_rows, device),
                                     self._first_input(embed, new_tokens, device))

        fill = eos_token_id if eos_token_id is not None else 0
        gen = torch.tensor([t + [fill] * (max_new_tokens - len(t)) for t in tokens], device=device)
        ex = torch.tensor([d + [0] * (max_new_tokens - len(d)) for d in exits], device=device)
        count = _index([len(t) for t in tokens], device)
        return DepthBatchedOutput(torch.cat([input_ids, gen], 1), ex, ticks, token_passes, count)

    # -- pieces of a tick -------------------------------------------------------------------------------------
    @staticmethod
    def _done(tokens: list[int], limit: int, eos: int | None) -> bool:
        return len(tokens) >= limit or (eos is not None and tokens[-1] == eos)

    def _first_input(self, embed, token_ids: list[int], device) -> torch.Tensor:
        """E⁰ = c·Ẽ[x] of the given tokens (A1), ``[n, d]``."""
        x0 = embed(torch.tensor(token_ids, device=device))
        scale = self.model.config.first_pass_scale
        return x0 * scale if scale != 1.0 else x0

    def _stack(self, E: torch.Tensor, pos_t: torch.Tensor, kv: TickKV, plan: RowPlan) -> torch.Tensor:
        neox = self.model.gpt_neox
        hidden = neox.emb_dropout(E[:, None])
        rope = neox.rotary_emb(hidden, pos_t[:, None])
        for layer in neox.layers:
            hidden = layer(hidden, attention_mask=None, layer_past=kv, position_embeddings=rope, ponder_rows=plan)
        return neox.final_layer_norm(hidden)[:, 0]

    @staticmethod
    def _carry_forward(kv: torch.Tensor, halted: list[tuple[int, int, int]], K: int, device) -> None:
        """A token that halted at pass D keeps its pass-D K/V in passes D+1..K (A15): one indexed copy, every layer's
        keys and values, for all rows that halted in this tick."""
        pairs = [(row, d, j, pos) for row, d, pos in halted for j in range(d + 1, K + 1)]
        if not pairs:
            return
        row, src, dst, pos = (_index(c, device) for c in zip(*pairs))
        kv[:, :, dst - 1, row, :, pos] = kv[:, :, src - 1, row, :, pos]

    def new_cache(self, batch: int, capacity: int, device=None) -> PonderCache:
        """An empty :class:`PonderCache` in the decoder's layout (one ``[layers, 2, K, B, heads, capacity, hd]`` tensor
        of keys and values) for the prefill to fill: decoding then starts without copying the cache. Lockstep
        decoding (the cached ``forward``) can use it too while it has room."""
        cfg = self.model.config
        heads = cfg.num_attention_heads
        shape = (cfg.num_hidden_layers, 2, cfg.num_passes, batch, heads, capacity, cfg.hidden_size // heads)
        param = next(self.model.parameters())
        device = param.device if device is None else device
        return PonderCache.with_buffers(torch.empty(shape, dtype=param.dtype, device=device))

    def _layout(self, cache: PonderCache, capacity: int) -> torch.Tensor:
        """The ``[layers, 2, K, B, heads, capacity, hd]`` tensor holding the prefill's K/V: that of a cache from
        :meth:`new_cache` when every (pass, layer) still lives in it, else a copy."""
        cfg = self.model.config
        K, L = cfg.num_passes, cfg.num_hidden_layers
        kv = cache.pass_buffers
        if kv is not None and kv.shape[5] >= capacity and all(
                starts_at(cache.view(p + 1, layer)[i], kv[layer, i, p])
                for p in range(K) for layer in range(L) for i in range(2)):
            return kv
        k0 = cache.view(1, 0)[0]
        fresh = self.new_cache(k0.shape[0], capacity, k0.device).pass_buffers
        for layer in range(L):
            for p in range(K):
                for i in range(2):
                    t = cache.view(p + 1, layer)[i]
                    fresh[layer, i, p, :, :, :t.shape[2]].copy_(t)
        return fresh


__all__ = ["DepthBatchedDecoder", "DepthBatchedOutput", "TickGates", "ROW_ATTENTION", "row_attention"]
