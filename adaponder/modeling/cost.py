"""What a model costs (A17): parameters by part, FLOPs per token from the realised exit passes, KV-cache bytes.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import torch


def _exit_passes(exit_pass, K: int) -> torch.Tensor:
    """``exit_pass`` as a flat float tensor on the CPU, after checking that it holds exit passes: whole numbers in
    ``[1, K]``. Anything else (a dict, a histogram, a share such as 0.5) would otherwise be averaged into a cost
    without a word."""
    if isinstance(exit_pass, (dict, str, bytes, set)) or not (
            isinstance(exit_pass, (torch.Tensor, list, tuple)) or hasattr(exit_pass, "__array__")):
        raise TypeError(f"exit_pass: expected a tensor of per-token exit passes (whole numbers 1..{K}), got "
                        f"{type(exit_pass).__name__}")
    try:
        D = torch.as_tensor(exit_pass).detach().reshape(-1).cpu()
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"exit_pass: expected a tensor of per-token exit passes (whole numbers 1..{K}), got "
                        f"{type(exit_pass).__name__} ({err})") from None
    if D.dtype == torch.bool or D.is_complex():
        raise TypeError(f"exit_pass: expected whole numbers 1..{K}, got a tensor of {D.dtype}")
    if D.numel() == 0:
        raise ValueError("exit_pass is empty; expected one exit pass per token (or None: K for every token)")
    D = D.float()
    bad = (D != D.round()) | (D < 1) | (D > K)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"exit_pass: token {i} has exit pass {D[i].item():g}; expected whole numbers 1..{K} "
                         f"(K = {K} passes)")
    return D


class CostAccounting:
    """Mixed into :class:`~.modeling_adaponder.AdaPonderForCausalLM` (it reads the model's parts and config)."""

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part: ``embedding`` (input embedding + output head), ``non_embedding``
        (layers and final norm), ``gates`` (A5), and ``total``. Works on the meta device."""
        emb = self.gpt_neox.embed_in.weight.numel()
        if self.lm_head.weight is not self.gpt_neox.embed_in.weight:
            emb += self.lm_head.weight.numel()
        layers = sum(p.numel() for p in self.gpt_neox.layers.parameters())
        layers += sum(p.numel() for p in self.gpt_neox.final_layer_norm.parameters())
        gates = sum(p.numel() for p in self.gates.parameters())
        heads = sum(p.numel() for name in ("halting_heads", "consistency_heads", "draft_head", "redraft_head",
                                           "early_redraft_heads")
                    if getattr(self, name, None) is not None for p in getattr(self, name).parameters())
        return {"embedding": emb, "non_embedding": layers, "gates": gates, "heads": heads,
                "total": emb + layers + gates + heads}

    def flops_per_token(self, exit_pass: torch.Tensor | None = None, context: int | None = None,
                        training: bool = False) -> dict[str, float]:
        """FLOPs per token from the realised exit passes (A17).

        Convention: a matmul of an ``m×n`` weight costs 2·m·n FLOPs per token (forward); attention adds
        2·2·ctx·d per layer (scores and weighted sum), no causal discount, with ``ctx`` the context
        length (default: ``max_position_embeddings``); layer norms, softmax and rotary are not counted.
        A token with exit pass D costs D backbone passes and D head products (2dV each), D−1 pondering
        products ``softmax(z)·Ẽ`` (2dV each), min(D, K−1) gate MLPs and, per bank of pass heads the model has
        (halting, consistency: A21, A23), min(D, K−1) products of 2d (the draft head, A24, runs only when
        drafting and is not counted here). ``training=True`` multiplies
        by 3 (forward + backward). ``exit_pass`` (any shape; padding excluded by the caller) defaults to
        K for every token. Returns the mean per token of each part, their ``total`` and ``mean_passes``.
        ``context`` counts real tokens; in ``pause`` mode (A19) each token occupies P+1 backbone positions,
        so the backbone runs P+1 times per token over a (P+1)× longer context, and the head once.
        """
        cfg = self.config
        d, L, V, K = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.num_passes
        stride = cfg.num_pauses + 1
        ctx = (context if context is not None else cfg.max_position_embeddings // stride) * stride
        ff = cfg.intermediate_size
        per_layer = (2 * (d * 3 * d + d * d + 2 * d * ff) + 4 * ctx * d) * stride
        D = torch.full((1,), float(K)) if exit_pass is None else _exit_passes(exit_pass, K)
        mean_d = float(D.mean())
        mean_gates = float(torch.clamp(D, max=K - 1).mean()) if cfg.gated else 0.0
        gate_cost = 2 * (d * cfg.gate_hidden_mult * d + cfg.gate_hidden_mult * d)
        pondering = float((D - 1).mean()) * 2 * d * V if cfg.ponders else 0.0
        parts = {
            "backbone": mean_d * L * per_layer,
            "head": mean_d * 2 * d * V,
            "pondering": pondering,
            "gates": mean_gates * gate_cost,
            "heads": float(torch.clamp(D, max=K - 1).mean()) * 2 * d * sum(
                getattr(self, name, None) is not None for name in ("halting_heads", "consistency_heads")),
        }
        mult = 3.0 if training else 1.0
        parts = {k: v * mult for k, v in parts.items()}
        parts["total"] = sum(parts.values())
        parts["mean_passes"] = mean_d
        return parts

    def kv_cache_bytes_per_token(self) -> int:
        """KV-cache bytes per token: ``K · L · 2 · d · bytes``, whatever the token's exit pass. The
        :class:`PonderCache` keeps K and V of every layer in every pass for every token (a token that halted
        at pass D holds its pass-D K/V in passes j > D, A15), so halting saves compute, not cache memory."""
        cfg = self.config
        return cfg.num_passes * cfg.num_hidden_layers * 2 * cfg.hidden_size * self.dtype.itemsize




__all__ = ["CostAccounting"]
