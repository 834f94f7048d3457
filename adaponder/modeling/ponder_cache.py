"""K/V alignment across passes (A3) and the per-(pass, layer) KV cache (A15, A16).

One mechanism serves training and inference. transformers' ``GPTNeoXAttention`` computes this pass's
rotated keys/values and hands them to ``layer_past.update(k, v, layer_idx)`` before attention. We pass a
:class:`KVAligner` as ``layer_past``: it replaces the K/V of halted tokens by the K/V of their last active
pass (A3) and, when a :class:`PonderCache` is attached, appends the aligned K/V to that pass's cache, so
that decoding later attends to exactly what the training-mode forward attended to (A18).

Like ``configuration_adaponder.py`` this file travels with saved checkpoints: standard library, torch and
transformers imports only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer


def starts_at(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether ``view`` begins where ``base`` does, in the same storage (``data_ptr`` is 0 for an empty view)."""
    return (view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            and view.storage_offset() == base.storage_offset())


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views of buffers with room to grow along the sequence.

    Appending writes the new positions in place instead of ``torch.cat``-copying the whole cache at every
    decoding step; when the room runs out the buffers grow by half (amortised O(1) per token). The first write
    (prefill) reserves exactly what it needs, so a cache that is never extended costs no more memory. Generic
    ``Cache`` operations may replace ``keys``/``values`` (``crop``, ``reorder_cache``, offloading, …): a layer
    whose tensors are no longer views of its own buffers adopts them into new buffers at its next append.
    """

    def __init__(self):
        super().__init__()
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def _own_view(self) -> bool:
        if self._buffers is None or self.keys is None:
            return False
        return all(starts_at(t, b) and t.stride() == b.stride() and t.shape[:2] == b.shape[:2]
                   for t, b in zip((self.keys, self.values), self._buffers))

    def slots(self, like: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for ``new`` more positions shaped like ``like`` ([B, heads, ·, head_dim]); returns the key and
        value slots to write them into. ``keys``/``values`` then include the slots."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        length = self.get_seq_length()
        need = length + new
        if not (self._own_view() and self._buffers[0].shape[2] >= need):
            capacity = need if length == 0 else max(need, length + max(length // 2, 64))
            b, h, _, hd = like.shape
            bufs = tuple(like.new_empty(b, h, capacity, hd) for _ in range(2))
            if length:
                bufs[0][:, :, :length].copy_(self.keys)
                bufs[1][:, :, :length].copy_(self.values)
            self._buffers = bufs
        k, v = self._buffers
        self.keys, self.values = k[:, :, :need], v[:, :, :need]
        return k[:, :, length:need], v[:, :, length:need]

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Use ``keys``/``values`` ``[B, heads, capacity, hd]`` (e.g. views of a larger buffer) as the room to fill,
        empty for now: writes go into them in place until ``capacity`` positions are used."""
        self.device, self.is_initialized = keys.device, True
        self._buffers = (keys, values)
        self.keys, self.values = keys[:, :, :0], values[:, :, :0]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        k, v = self.slots(key_states, key_states.shape[-2])
        k.copy_(key_states)
        v.copy_(value_states)
        return self.keys, self.values

    def reset(self) -> None:
        self._buffers = None
        super().reset()


class PonderCache(Cache):
    """A KV cache keyed by (pass, layer): pass ``i`` (1-based) of layer ``l`` lives in ``layers[(i-1)·L + l]``.

    Every pass holds the *aligned* K/V (A3) of every past token, so a token that halted at pass ``D``
    appears in passes ``j > D`` with its pass-``D`` K/V — written once, never recomputed (A15).
    Each (pass, layer) is a :class:`GrowingLayer`: decoding appends in place. The generic ``Cache`` operations
    (``crop``, ``reorder_cache``, ``batch_select_indices``, …) act on all passes alike, so beam search and
    assisted decoding keep working.
    """

    def __init__(self, num_passes: int, num_layers: int):
        super().__init__(layers=[GrowingLayer() for _ in range(num_passes * num_layers)])
        self.num_passes = num_passes
        self.num_layers = num_layers
        self.pass_buffers: torch.Tensor | None = None  # the one tensor it fills, when built over a static cache

    def pass_layer(self, pass_idx: int, layer_idx: int) -> GrowingLayer:
        return self.layers[(pass_idx - 1) * self.num_layers + layer_idx]

    def slots(self, pass_idx: int, layer_idx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the aligned K/V of the new tokens (shaped like ``like``) go; see :meth:`GrowingLayer.slots`."""
        return self.pass_layer(pass_idx, layer_idx).slots(like, like.shape[-2])

    def view(self, pass_idx: int, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.pass_layer(pass_idx, layer_idx)
        return layer.keys, layer.values

    def append(self, pass_idx: int, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        """Append the new tokens' aligned K/V; returns the full cached K/V of that (pass, layer)."""
        layer = self.pass_layer(pass_idx, layer_idx)
        if layer.get_seq_length() == 0 and layer._buffers is None:
            # First write: keep the tensors instead of copying them (passes may share one tensor, a halted
            # token's reused K/V); the first append after it adopts them into a buffer.
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            return keys, values
        return layer.update(keys, values)

    def get_seq_length(self, layer_idx: int = 0) -> int:  # every (pass, layer) holds the same tokens
        return self.layers[0].get_seq_length() if self.layers[0].is_initialized else 0

    def kv_bytes(self) -> int:
        """Bytes of cached keys and values (every pass and layer; room reserved for growth not counted)."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:
                total += layer.keys.numel() * layer.keys.element_size()
                total += layer.values.numel() * layer.values.element_size()
        return total


@dataclass
class TokenSubset:
    """Still-active tokens of a ``[B, T]`` chunk: flat (``b_idx``/``t_idx``, row-major, the layout a compacted pass's
    projections and MLPs run in) and packed into ``[R, Tq]`` (rows that have any, left-aligned: the layout of its
    attention, which reads each row's own K/V).

    ``rows[r]`` is the batch row of packed row ``r``; ``token[r, j]`` the position in the chunk of its
    ``j``-th active token (rows shorter than ``Tq`` are padded; padding slots are computed and dropped).
    Built with one host synchronisation (three counts); every index after that has a size known on the host,
    so no later step waits for the device.
    """

    rows: torch.Tensor
    token: torch.Tensor
    b_idx: torch.Tensor
    t_idx: torch.Tensor
    batch_size: int
    num_tokens: int
    slot: torch.Tensor | None  # position of each token in the flattened [R·Tq] packing; None: no padding

    @classmethod
    def from_mask(cls, active: torch.Tensor) -> "TokenSubset":
        counts = active.sum(dim=1)
        has = counts > 0
        n, r, tq = torch.stack([counts.sum(), has.sum(), counts.max()]).tolist()  # the one host sync
        b_idx, t_idx = torch.nonzero_static(active, size=n).unbind(1)
        rows = torch.nonzero_static(has, size=r).squeeze(1)
        packed_row = (torch.cumsum(has, 0) - 1)[b_idx]
        starts = torch.cumsum(counts, 0) - counts
        j = torch.arange(n, device=active.device) - starts[b_idx]
        token = torch.zeros(r, tq, dtype=torch.long, device=active.device)
        token[packed_row, j] = t_idx
        slot = None if n == r * tq else packed_row * tq + j
        return cls(rows, token, b_idx, t_idx, active.shape[0], n, slot)

    @property
    def all_rows(self) -> bool:
        return self.rows.numel() == self.batch_size

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` → ``[N, ...]``: the tokens in ``b_idx``/``t_idx`` order."""
        return x[self.b_idx, self.t_idx]

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` → ``[R, Tq, ...]``, zeros in the padding slots."""
        if self.slot is not None:
            flat = flat.new_zeros(self.token.numel(), *flat.shape[1:]).index_copy_(0, self.slot, flat)
        return flat.reshape(*self.token.shape, *flat.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, Tq, ...]`` → ``[N, ...]``: the tokens' rows in ``b_idx``/``t_idx`` order, padding dropped."""
        flat = x.reshape(-1, *x.shape[2:])
        return flat if self.slot is None else flat.index_select(0, self.slot)

    def select_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.all_rows else x.index_select(0, self.rows)


class KVAligner:
    """The ``layer_past`` object handed to every GPT-NeoX layer during one forward call.

    For pass ``i`` and layer ``l`` it keeps the aligned K/V of the new tokens, ``K̃^{i,l}`` (A3):
    ``where(m^i, K^{i,l}, K̃^{i-1,l})``. State is keyed by (pass, layer) and only written, never mutated,
    so recomputing a pass (activation checkpointing) reads the same inputs again. In cached inference the
    aligned K/V are written straight into the pass's cache slots (no intermediate tensor, no concatenation).
    """

    def __init__(self, num_layers: int, cache: PonderCache | None):
        self.num_layers = num_layers
        self.cache = cache
        self.fresh: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.pass_idx = 1
        self.active: torch.Tensor | None = None
        self.subset: TokenSubset | None = None

    def begin_pass(self, pass_idx: int, active: torch.Tensor | None, subset: TokenSubset | None = None):
        """``active`` [B, T] is m^i (None = all tokens); ``subset`` is set when only active tokens are computed."""
        self.pass_idx = pass_idx
        self.active = active
        self.subset = subset
        # Inference frees what no later pass reads: pass i only needs pass i-1's aligned K/V.
        if not torch.is_grad_enabled():
            for key in [k for k in self.fresh if k[0] < pass_idx - 1]:
                del self.fresh[key]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """``key``/``value``: ``[B, heads, T, hd]``, or ``[1, heads, N, hd]`` for the N active tokens of a compacted
        pass (``subset`` set), whose K/V are then those of the subset's rows (its attention's packed layout)."""
        i, s = self.pass_idx, self.subset
        prev = self.fresh.get((i - 1, layer_idx))
        if s is not None:
            key, value = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [N, heads, hd]
        if self.cache is not None and not torch.is_grad_enabled():
            k_new, v_new = self.cache.slots(i, layer_idx, prev[0] if s is not None else key)
            if s is not None:
                # Only active tokens were computed: the previous pass's aligned K/V, theirs scattered over it.
                k_new.copy_(prev[0])
                v_new.copy_(prev[1])
                k_new[s.b_idx, :, s.t_idx] = key
                v_new[s.b_idx, :, s.t_idx] = value
            elif prev is not None and self.active is not None:
                m = self.active[:, None, :, None]
                torch.where(m, key, prev[0], out=k_new)
                torch.where(m, value, prev[1], out=v_new)
            else:
                k_new.copy_(key)
                v_new.copy_(value)
            k_all, v_all = self.cache.view(i, layer_idx)
        else:
            if s is not None:
                k_new, v_new = prev[0].clone(), prev[1].clone()
                k_new[s.b_idx, :, s.t_idx] = key
                v_new[s.b_idx, :, s.t_idx] = value
            elif prev is not None and self.active is not None:
                m = self.active[:, None, :, None]
                k_new, v_new = torch.where(m, key, prev[0]), torch.where(m, value, prev[1])
            else:
                k_new, v_new = key, value
            k_all, v_all = (k_new, v_new) if self.cache is None else self.cache.append(i, layer_idx, k_new, v_new)
        # Written once per forward call. A pass that activation checkpointing recomputes during backward keeps
        # the first write: storing the recomputed K/V would keep that recomputation's graph, and every tensor it
        # saved, alive until backward ends — one more pass of activations for every pass recomputed.
        self.fresh.setdefault((i, layer_idx), (k_new, v_new))
        if s is not None:
            k_all, v_all = s.select_rows(k_all), s.select_rows(v_all)
        return k_all, v_all

    def carry_forward(self, pass_idx: int):
        """Pass ``pass_idx`` computes no token: every token reuses its previous aligned K/V (A15)."""
        self.begin_pass(pass_idx, None)
        for layer_idx in range(self.num_layers):
            k, v = self.fresh[(pass_idx - 1, layer_idx)]
            self.fresh[(pass_idx, layer_idx)] = (k, v)
            if self.cache is not None:
                self.cache.append(pass_idx, layer_idx, k, v)
