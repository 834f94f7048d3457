"""The static cache every static-shape strategy decodes over: one preallocated tensor
``[layers, 2, K, B, heads, capacity, head_dim]`` holding the keys (``[l, 0]``) and values (``[l, 1]``) of every layer
and pass. The cached prefill fills it in place through a :class:`~adaponder.modeling.ponder_cache.PonderCache` over it
(:func:`cache_over`); decode steps write each new token's K/V at one slot, so nothing grows or is concatenated, and
entries of all layers move in one indexed operation.
"""

from __future__ import annotations

import torch

from ..modeling.ponder_cache import PonderCache, starts_at  # noqa: F401  (starts_at: for the decoders)


def new_static_kv(model, batch: int, capacity: int, device=None) -> torch.Tensor:
    """A zeroed static cache for ``batch`` rows and ``capacity`` positions of ``model`` (its dtype and device)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    param = next(model.parameters())
    shape = (cfg.num_hidden_layers, 2, cfg.num_passes, batch, heads, capacity, cfg.hidden_size // heads)
    return torch.zeros(shape, dtype=param.dtype, device=param.device if device is None else device)


def cache_over(kv: torch.Tensor) -> PonderCache:
    """An empty :class:`PonderCache` that fills ``kv`` in place (the cached forward writes the prefill there);
    ``cache.pass_buffers`` is ``kv``."""
    num_layers, _, num_passes = kv.shape[:3]
    cache = PonderCache(num_passes, num_layers)
    for p in range(num_passes):
        for layer in range(num_layers):
            cache.pass_layer(p + 1, layer).adopt(kv[layer, 0, p], kv[layer, 1, p])
    cache.pass_buffers = kv
    return cache


def pass_buffers(kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The keys and values of every (layer, pass) of a static cache as separate ``[B, heads, capacity, hd]`` views,
    layer-major: ``buffers[2·(l·K + p) + j]`` (``j`` 0: keys, 1: values). A compiled step writes into each of them
    in place; written through views of the one cache tensor, inductor would copy the whole cache back at every
    write."""
    L, _, K = kv.shape[:3]
    return tuple(kv[layer, j, p] for layer in range(L) for p in range(K) for j in range(2))


__all__ = ["cache_over", "new_static_kv", "pass_buffers", "starts_at"]
