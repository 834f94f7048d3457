"""The pondering embedding (A4) computed in chunks, without keeping a B×T×V tensor for backward.

``e = α · softmax(h W_outᵀ) · W_E``. Done naively, autograd keeps the probabilities P (B×T×V) of every
pondering pass until backward — at a 50k vocabulary that dominates training memory. Here the forward
runs over chunks of rows and saves only ``h``; backward recomputes each chunk's probabilities. The price
is one extra ``h W_outᵀ`` product per pondering pass in backward.

This file travels with saved checkpoints: torch only.
"""

from __future__ import annotations

import torch


def _chunk_probs(h: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    logits = h @ w_out.t()
    # softmax in at least fp32 (bf16 logits over 50k entries lose the tail mass)
    return torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


class _ChunkedPondering(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w_out, w_emb, alpha: float, chunk: int):
        out = torch.empty(h.shape[0], w_emb.shape[1], dtype=h.dtype, device=h.device)
        for start in range(0, h.shape[0], chunk):
            probs = _chunk_probs(h[start:start + chunk], w_out).to(w_emb.dtype)
            out[start:start + chunk] = (probs @ w_emb) * alpha
        ctx.save_for_backward(h, w_out, w_emb)
        ctx.alpha, ctx.chunk = alpha, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, w_out, w_emb = ctx.saved_tensors
        alpha, chunk = ctx.alpha, ctx.chunk
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w_out = torch.zeros_like(w_out, dtype=torch.promote_types(w_out.dtype, torch.float32)) if ctx.needs_input_grad[1] else None
        grad_w_emb = torch.zeros_like(w_emb, dtype=torch.promote_types(w_emb.dtype, torch.float32)) if ctx.needs_input_grad[2] else None
        for start in range(0, h.shape[0], chunk):
            hc, g = h[start:start + chunk], grad_out[start:start + chunk] * alpha
            probs = _chunk_probs(hc, w_out)  # recomputed: P is never stored
            if grad_w_emb is not None:
                grad_w_emb += (probs.to(g.dtype).t() @ g).to(grad_w_emb.dtype)
            d_probs = (g @ w_emb.t()).to(probs.dtype)
            d_logits = probs * (d_probs - (d_probs * probs).sum(-1, keepdim=True))  # softmax backward
            d_logits = d_logits.to(h.dtype)
            if grad_h is not None:
                grad_h[start:start + chunk] = d_logits @ w_out
            if grad_w_out is not None:
                grad_w_out += (d_logits.t() @ hc).to(grad_w_out.dtype)
        cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
        return grad_h, cast(grad_w_out, w_out), cast(grad_w_emb, w_emb), None, None


def pondering_from_hidden(h: torch.Tensor, w_out: torch.Tensor, w_emb: torch.Tensor, alpha: float,
                          chunk: int = 0) -> torch.Tensor:
    """``α · softmax(h W_outᵀ) W_E`` for ``h`` of shape ``[N, d]`` (A4).

    ``chunk`` rows at a time (0 = a default that bounds the probability block to ~16 M entries). With
    gradients, probabilities are recomputed in backward instead of stored.
    """
    n, vocab = h.shape[0], w_out.shape[0]
    chunk = chunk or max(1, min(n, (1 << 24) // max(vocab, 1)))
    if torch.is_grad_enabled() and (h.requires_grad or w_out.requires_grad or w_emb.requires_grad):
        return _ChunkedPondering.apply(h, w_out, w_emb, float(alpha), chunk)
    parts = [(_chunk_probs(h[s:s + chunk], w_out).to(w_emb.dtype) @ w_emb) for s in range(0, n, chunk)]
    e = parts[0] if len(parts) == 1 else torch.cat(parts)
    return e * alpha if alpha != 1.0 else e


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean CE of ``h W_outᵀ`` against ``targets`` (-100 ignored), chunked, logits recomputed in backward."""

    @staticmethod
    def forward(ctx, h, w_out, targets, chunk: int):
        n_valid = (targets != -100).sum().clamp(min=1)  # a tensor: no host sync, no graph break
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        for start in range(0, h.shape[0], chunk):
            logits = h[start:start + chunk] @ w_out.t()
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            tgt = targets[start:start + chunk]
            ok = tgt != -100
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, tgt.clamp(min=0)[:, None]).squeeze(1)
            total += ((lse - picked) * ok).sum().double()
        ctx.save_for_backward(h, w_out, targets)
        ctx.chunk, ctx.n_valid = chunk, n_valid
        return (total / n_valid).to(torch.promote_types(h.dtype, torch.float32))

    @staticmethod
    def backward(ctx, grad):
        h, w_out, targets = ctx.saved_tensors
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(w_out, dtype=torch.promote_types(w_out.dtype, torch.float32)) \
            if ctx.needs_input_grad[1] else None
        scale = grad / ctx.n_valid
        for start in range(0, h.shape[0], ctx.chunk):
            hc, tgt = h[start:start + ctx.chunk], targets[start:start + ctx.chunk]
            probs = _chunk_probs(hc, w_out)
            ok = (tgt != -100)
            probs[torch.arange(len(tgt), device=h.device), tgt.clamp(min=0)] -= 1.0
            d_logits = (probs * (ok[:, None] * scale).to(probs.dtype)).to(h.dtype)
            if grad_h is not None:
                grad_h[start:start + ctx.chunk] = d_logits @ w_out
            if grad_w is not None:
                grad_w += (d_logits.t() @ hc).to(grad_w.dtype)
        return grad_h, None if grad_w is None else grad_w.to(w_out.dtype), None, None


def linear_cross_entropy(h: torch.Tensor, w_out: torch.Tensor, targets: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """A10 without materialising the ``[N, V]`` logits: mean CE of ``h W_outᵀ`` over targets ≠ -100."""
    chunk = chunk or max(1, min(h.shape[0], (1 << 24) // max(w_out.shape[0], 1)))
    return _ChunkedLinearCrossEntropy.apply(h, w_out, targets, chunk)
