"""Attention for the pass loop: the causal mask over cache slots, and the attention of a compacted pass (its
active tokens flat, regrouped by row), routed through transformers' ``AttentionInterface``.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import eager_attention_forward

from .ponder_cache import TokenSubset


def causal_slot_mask(
    q_slot: torch.Tensor, kv_len: int, key_padding: torch.Tensor | None, impl: str, dtype: torch.dtype
) -> torch.Tensor | None:
    """Causal mask over cache slots for queries at cache positions ``q_slot`` ``[B', Tq]``.

    A query may attend to keys at slots ≤ its own that are not padding. Padded queries still see
    themselves, so no row is empty (no NaN that a 0-weight could carry into the loss).
    """
    if impl == "flash_attention_2":
        return key_padding.long() if key_padding is not None else None
    kpos = torch.arange(kv_len, device=q_slot.device)
    q = q_slot[:, None, :, None]
    allowed = kpos <= q
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]
    allowed = allowed | (kpos == q)
    if impl == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return allowed


PACKED_ATTENTION = "adaponder_packed"


def packed_attention(module, query, key, value, attention_mask, ponder_subset: TokenSubset, ponder_impl: str,
                     **kwargs):
    """Attention of a compacted pass, whose projections ran on its N active tokens flat (``query``
    ``[1, heads, N, hd]``): the queries go to their rows' packed layout ``[R, heads, Tq, hd]`` (zeros in the padding
    slots), attend to those rows' K/V (``key``/``value`` ``[R, heads, S, hd]``, from :class:`KVAligner`) under the
    pass's mask with the model's own attention implementation ``ponder_impl``, and come back flat,
    ``[1, N, heads, hd]``. Routed here through ``AttentionInterface`` while the pass runs."""
    s, heads, hd = ponder_subset, query.shape[1], query.shape[3]
    q = s.pad(query[0].transpose(0, 1)).transpose(1, 2)  # [N, heads, hd] → [R, Tq, heads, hd] → [R, heads, Tq, hd]
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(ponder_impl, eager_attention_forward)
    out, _ = inner(module, q, key, value, attention_mask, **kwargs)  # [R, Tq, heads, hd]
    return s.unpad(out.reshape(*s.token.shape, heads, hd))[None], None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)


#: The attention of a depth-batched tick (one row per sequence, each at its own pass), registered by
#: :mod:`.depth_batching`, which defines it.
ROW_ATTENTION = "adaponder_rows"


def attention_for(kwargs, built: str | None) -> str | None:
    """The ``AttentionInterface`` name a layer's attention runs with for one call: the packed attention of a
    compacted pass when the call brings its tokens (``ponder_subset``), the per-row attention of a depth-batched
    tick when it brings its plan (``ponder_rows``), else ``built``, the implementation the model was built with.
    The choice travels with the call's own arguments, so a pass recomputed in backward (gradient checkpointing)
    chooses as it did forward, and nothing is written anywhere."""
    if kwargs.get("ponder_subset") is not None:
        return PACKED_ATTENTION
    if kwargs.get("ponder_rows") is not None:
        return ROW_ATTENTION
    return built


__all__ = ["PACKED_ATTENTION", "ROW_ATTENTION", "attention_for", "causal_slot_mask", "packed_attention"]
