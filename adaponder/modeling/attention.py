"""Attention for the pass loop: the causal mask over cache slots, and the attention of a compacted pass (its
active tokens flat, regrouped by row), routed through transformers' ``AttentionInterface``.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import contextlib

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


class AttentionRoute:
    """The layers' view of the model's config: every field is the config's own except ``_attn_implementation``,
    which names the attention a pass routes to (packed, per row) while one is set, and the config's otherwise.

    transformers' attention modules look their attention function up in ``self.config._attn_implementation`` on
    every call and take no argument for it. Each layer gets this view at construction (:class:`PythiaBackbone`),
    so a pass chooses its attention with :meth:`routed` and the model's config is never written: anyone reading
    ``model.config`` during a pass — another thread, a checkpoint save — sees the implementation it was built with.
    """

    def __init__(self, config):
        self._config = config
        self._route: str | None = None

    def __getattr__(self, name: str):
        # Only called for what the view does not hold itself; dunder lookups (copy, pickle) stay the view's own, and
        # an unpickled view asks before its _config is back.
        config = self.__dict__.get("_config")
        if config is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(config, name)

    @property
    def _attn_implementation(self) -> str | None:
        return self._route or self._config._attn_implementation

    @contextlib.contextmanager
    def routed(self, name: str):
        """Within the block, the layers' attention is ``name`` (an ``AttentionInterface`` registration)."""
        previous, self._route = self._route, name
        try:
            yield
        finally:
            self._route = previous


__all__ = ["PACKED_ATTENTION", "AttentionRoute", "causal_slot_mask", "packed_attention"]
