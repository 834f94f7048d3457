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


class PonderCache(Cache):
    """A KV cache keyed by (pass, layer): pass ``i`` (1-based) of layer ``l`` lives in ``layers[(i-1)·L + l]``.

    Every pass holds the *aligned* K/V (A3) of every past token, so a token that halted at pass ``D``
    appears in passes ``j > D`` with its pass-``D`` K/V — written once, never recomputed (A15).
    The generic ``Cache`` operations (``crop``, ``reorder_cache``, ``batch_select_indices``, …) act on all
    passes alike, so beam search and assisted decoding keep working.
    """

    def __init__(self, num_passes: int, num_layers: int):
        super().__init__(layers=[DynamicLayer() for _ in range(num_passes * num_layers)])
        self.num_passes = num_passes
        self.num_layers = num_layers

    def pass_layer(self, pass_idx: int, layer_idx: int) -> DynamicLayer:
        return self.layers[(pass_idx - 1) * self.num_layers + layer_idx]

    def append(self, pass_idx: int, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        """Append the new tokens' aligned K/V; returns the full cached K/V of that (pass, layer)."""
        layer = self.pass_layer(pass_idx, layer_idx)
        if not layer.is_initialized or layer.keys.numel() == 0:
            # First write (prefill): keep the tensors as they are instead of copying them into a
            # concatenation; later passes may share one tensor (a halted token's reused K/V).
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            return keys, values
        return layer.update(keys, values)

    def get_seq_length(self, layer_idx: int = 0) -> int:  # every (pass, layer) holds the same tokens
        return self.layers[0].get_seq_length() if self.layers[0].is_initialized else 0

    def kv_bytes(self) -> int:
        """Bytes held by the cache (keys and values of every pass and layer)."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:
                total += layer.keys.numel() * layer.keys.element_size()
                total += layer.values.numel() * layer.values.element_size()
        return total


@dataclass
class TokenSubset:
    """Still-active tokens of a ``[B, T]`` chunk packed into ``[R, Tq]`` (rows that have any, left-aligned).

    ``rows[r]`` is the batch row of packed row ``r``; ``token[r, j]`` the position in the chunk of its
    ``j``-th active token; ``valid[r, j]`` whether that slot holds a token (rows are padded to ``Tq``).
    ``b_idx``/``t_idx`` list the active tokens in the same (row-major) order as ``packed[valid]``.
    """

    rows: torch.Tensor
    token: torch.Tensor
    valid: torch.Tensor
    b_idx: torch.Tensor
    t_idx: torch.Tensor
    batch_size: int

    @classmethod
    def from_mask(cls, active: torch.Tensor) -> "TokenSubset":
        b_idx, t_idx = active.nonzero(as_tuple=True)
        counts = active.sum(dim=1)
        rows = (counts > 0).nonzero(as_tuple=True)[0]
        tq = int(counts.max()) if rows.numel() else 0
        packed_row = torch.cumsum(counts > 0, 0) - 1
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(b_idx.numel(), device=active.device) - starts[b_idx]
        token = torch.zeros(rows.numel(), tq, dtype=torch.long, device=active.device)
        valid = torch.zeros(rows.numel(), tq, dtype=torch.bool, device=active.device)
        token[packed_row[b_idx], slot] = t_idx
        valid[packed_row[b_idx], slot] = True
        return cls(rows, token, valid, b_idx, t_idx, active.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.b_idx.numel())

    @property
    def all_rows(self) -> bool:
        return self.rows.numel() == self.batch_size

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` → ``[R, Tq, ...]``."""
        return x[self.rows[:, None], self.token]

    def select_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.all_rows else x.index_select(0, self.rows)


class KVAligner:
    """The ``layer_past`` object handed to every GPT-NeoX layer during one forward call.

    For pass ``i`` and layer ``l`` it keeps the aligned K/V of the new tokens, ``K̃^{i,l}`` (A3):
    ``where(m^i, K^{i,l}, K̃^{i-1,l})``. State is keyed by (pass, layer) and only written, never mutated,
    so recomputing a pass (activation checkpointing) reads the same inputs again.
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
        i, prev = self.pass_idx, self.fresh.get((self.pass_idx - 1, layer_idx))
        if self.subset is not None:
            # Only active tokens were computed: scatter them over the previous pass's aligned K/V.
            s = self.subset
            k_new, v_new = prev[0].clone(), prev[1].clone()
            valid = s.valid
            k_new[s.b_idx, :, s.t_idx] = key.transpose(1, 2)[valid]
            v_new[s.b_idx, :, s.t_idx] = value.transpose(1, 2)[valid]
        elif prev is not None and self.active is not None:
            m = self.active[:, None, :, None]
            k_new, v_new = torch.where(m, key, prev[0]), torch.where(m, value, prev[1])
        else:
            k_new, v_new = key, value
        self.fresh[(i, layer_idx)] = (k_new, v_new)
        if self.cache is not None:
            k_all, v_all = self.cache.append(i, layer_idx, k_new, v_new)
        else:
            k_all, v_all = k_new, v_new
        if self.subset is not None:
            k_all, v_all = self.subset.select_rows(k_all), self.subset.select_rows(v_all)
        return k_all, v_all

    def carry_forward(self, pass_idx: int):
        """Pass ``pass_idx`` computes no token: every token reuses its previous aligned K/V (A15)."""
        self.begin_pass(pass_idx, None)
        for layer_idx in range(self.num_layers):
            k, v = self.fresh[(pass_idx - 1, layer_idx)]
            self.fresh[(pass_idx, layer_idx)] = (k, v)
            if self.cache is not None:
                self.cache.append(pass_idx, layer_idx, k, v)
