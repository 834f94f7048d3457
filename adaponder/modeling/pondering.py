"""The pondering embedding (A4) and the LM loss (A10) over a 50k vocabulary, without keeping B×T×V tensors.

``e = α · softmax(h W_outᵀ) · W_E``. Done naively, autograd keeps the probabilities P (B×T×V) of every
pondering pass until backward — at a 50k vocabulary that dominates training memory. Here the forward
runs over chunks of rows and saves only ``h`` and ``e``; backward recomputes each chunk's probabilities
(one extra ``h W_outᵀ`` product per pondering pass — the price of bounded memory; ``ponder_recompute:
false`` keeps them instead when memory allows).

The loss needs no recompute: it is the end of the graph, so its gradients w.r.t. ``h`` and ``W_out`` are
formed chunk by chunk in the forward (while the chunk's probabilities exist) and only scaled in backward.

Both are written for speed on the matmul library: balanced chunks, weight gradients accumulated inside
the GEMM (``addmm_``), softmax backward in place, and ``P·(W_E g)`` reduced through the saved output
(``Σ_v p_v (g·W_E[v]) = g·e/α``) instead of a second B×T×V pass.

This file travels with saved checkpoints: torch only.
"""

from __future__ import annotations

import math
import threading
import weakref

import torch

#: Default cap on the probabilities held at once (entries of one [rows, V] block): 2**25 fp32 = 128 MiB. On the
#: CPU larger blocks gain nothing (a 128 MiB block already runs at the GEMM's speed, and page faults grow).
DEFAULT_BLOCK = 1 << 25
#: The cap on a CUDA device: 2**27 fp32 = 512 MiB. Each block is a few kernel launches per pass and direction,
#: and at the 70M shape (V = 50304) a 16k-token micro-batch in 2**25-entry blocks is 25 blocks of ~670 rows —
#: launches and their host round trips the GPU waits on; at 2**27 it is 7 blocks of ~2,700 rows.
CUDA_BLOCK = 1 << 27


def block_entries(device: torch.device | str) -> int:
    """The default cap on one ``[rows, V]`` block on ``device`` (``RunSettings(chunk_size=0)``)."""
    return CUDA_BLOCK if torch.device(device).type == "cuda" else DEFAULT_BLOCK

_local = threading.local()


def _buffer(slot: str, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable scratch block for [rows, V] intermediates. On CPU a fresh 100 MB tensor costs more in
    page faults than the softmax over it, so one buffer per slot is kept per thread and reused across
    chunks, passes and steps (at most a few DEFAULT_BLOCK-sized blocks). CUDA's caching allocator
    already reuses memory, so there it is a plain allocation."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    numel = shape[0] * shape[1]
    buf = cache.get((slot, dtype))
    if buf is None or buf.numel() < numel:
        buf = cache[(slot, dtype)] = torch.empty(numel, dtype=dtype)
    return buf[:numel].view(shape)


def _row_chunks(n: int, vocab: int, chunk: int, device: torch.device | str = "cpu") -> list[tuple[int, int]]:
    """Row ranges of at most ``chunk`` rows (0: at most :func:`block_entries` / V rows), sizes differing by ≤ 1."""
    cap = chunk or max(1, block_entries(device) // max(vocab, 1))
    pieces = max(1, math.ceil(n / cap))
    bounds = [i * (n // pieces) + min(i, n % pieces) for i in range(pieces + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _cast(t: torch.Tensor, dtype: torch.dtype, slot: str) -> torch.Tensor:
    """``t`` as ``dtype``, in the scratch block ``slot`` when a conversion is needed."""
    return t if t.dtype == dtype else _buffer(slot, tuple(t.shape), dtype, t.device).copy_(t)


def _logits(h: torch.Tensor, w: torch.Tensor, slot: str) -> torch.Tensor:
    """``h wᵀ`` in a scratch block, in at least fp32 (bf16 logits over 50k entries lose the tail mass)."""
    z = torch.mm(h, w.t(), out=_buffer(slot, (h.shape[0], w.shape[0]), h.dtype, h.device))
    return _cast(z, _wide(z.dtype), slot)


def _probs(h: torch.Tensor, w_out: torch.Tensor, slot: str) -> torch.Tensor:
    """``softmax(h W_outᵀ)`` (≥ fp32) in a scratch block."""
    z = _logits(h, w_out, slot)
    return torch.softmax(z, dim=-1, out=z)


def _softmax_lse_(z: torch.Tensor) -> torch.Tensor:
    """Turn ``z`` into ``softmax(z)`` in place; returns ``logsumexp(z)`` (no [rows, V] temporaries)."""
    m = z.amax(dim=-1, keepdim=True)
    total = z.sub_(m).exp_().sum(dim=-1, keepdim=True)
    z.div_(total)
    return (m + total.log()).squeeze(1)


#: Weights (entries) from which a compiled graph takes the blocked product (a call of the custom operator, ~30 µs on
#: the 2-core machine, costs more than inductor's own product of a smaller matrix).
COMPILED_BLOCKED_MIN = 1 << 18
#: Row counts up to which a product with a weight matrix takes the blocked path of :func:`skinny` (decoding).
SKINNY_ROWS = 8
#: Weights with at least this many output rows are vocabulary-sized (the head ``W_out``, the embedding ``W_E``).
VOCAB_SIZED = 8192
#: Row counts up to which a product with vocabulary-sized weights takes the blocked path. Measured on the 2-core
#: benchmark machine (V = 50304, d = 512, fp32, best of 5, ms per row, plain → blocked): the logits at 64 / 128 /
#: 192 / 256 / 448 rows 0.59 → 0.45, 0.50 → 0.33, 0.46 → 0.42, 0.43 → 0.42, 0.42 → 0.41; the product with W_E
#: 1.08–1.16× faster at all of them. Compacted passes (A16) and batched decoding run such row counts.
VOCAB_ROWS = 256


#: Weights (entries) from which a product of 2 to ``VOCAB_ROWS`` rows, and of one row, takes a copy of the weight packed
#: once for oneDNN (:func:`packed_ok`). MKL's GEMM packs its operands on every call: with a few rows and a weight of
#: millions of entries that repacking is the product's cost (2 rows cost 2–3× one). Measured on the 2-core benchmark
#: machine (fp32, one thread, ms; MKL or the blocked product → packed): W_out 4096 × 128 at 3 / 5 rows, cold caches
#: 0.20 → 0.10, 0.22 → 0.11, one row 0.07 → 0.09 (kept blocked); 16384 × 256 one row 1.30 → 0.39, 4 rows 2.69 → 0.51;
#: 50304 × 512 one row 9.2 → 6.9 (two threads 8.9 → 4.3), 8 rows 18.2 → 7.0, 128 rows 93 → 61. The layers' own
#: weights (≤ 2**16 entries at width 128) are faster through MKL: oneDNN's call alone costs ~18 µs.
PACKED_MIN_ROWS = 1 << 19
PACKED_MIN_ONE = 1 << 21

_packed_cache: dict[tuple, tuple] = {}  # (id(w), transposed) → (weak reference to w, (version, address), copy)
_packed_lock = threading.Lock()


def _onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


_ONEDNN = _onednn()


def use_packed_weights(enabled: bool = True) -> None:
    """Switch the packed copies (:func:`packed_ok`) on or off for this process; off frees the ones made. For the
    memory they take at a large vocabulary, or to measure a decoder without them."""
    global _ONEDNN
    _ONEDNN = bool(enabled) and _onednn()
    if not _ONEDNN:
        with _packed_lock:
            _packed_cache.clear()


def packed_ok(rows: int, w: torch.Tensor) -> bool:
    """Whether a product of ``rows`` activations with the fp32 CPU weight ``w`` (no gradients, not compiling) runs on
    a packed copy of ``w`` (see :data:`PACKED_MIN_ROWS`)."""
    if not _ONEDNN or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    big = w.numel() >= (PACKED_MIN_ONE if rows == 1 else PACKED_MIN_ROWS)
    return (big and 0 < rows <= VOCAB_ROWS and w.device.type == "cpu" and w.dtype == torch.float32
            and w.is_contiguous())


def packed_weight(w: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """``w`` (``[out, in]``; ``transposed``: ``[in, out]``, used as ``x w``) packed for oneDNN's linear, made once and
    kept while ``w`` lives and is unchanged (an in-place update — an optimizer step, a loaded state dict — bumps its
    version and the copy is made again). The copies hold as much memory as the weights they pack: at Pythia-410M's
    vocabulary, 206 MB each for W_out and W_E."""
    slot, key = (id(w), bool(transposed)), (w._version, w.data_ptr())
    with _packed_lock:
        entry = _packed_cache.get(slot)
        if entry is None or entry[0]() is not w or entry[1] != key:
            source = w.detach().t().contiguous() if transposed else w.detach()
            ref = weakref.ref(w, lambda _, s=slot: _packed_cache.pop(s, None))  # freed with the weight
            entry = _packed_cache[slot] = (ref, key, torch.ops.mkldnn._reorder_linear_weight(source, None))
        return entry[2]


def packed_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, transposed: bool = False
                  ) -> torch.Tensor:
    """``x wᵀ (+ b)`` (``transposed``: ``x w``) for ``x`` ``[n, in]`` on :func:`packed_weight`'s copy of ``w``."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed_weight(w, transposed), b, "none", [], "")


def skinny(rows: int, *weights: torch.Tensor) -> bool:
    """Whether a product of ``rows`` (1 to ``SKINNY_ROWS``; to ``VOCAB_ROWS`` when every weight is vocabulary-sized)
    activations with fp32 weights ``[out, in]`` on the CPU,
    without gradients, may run as one batched GEMM over blocks of weight rows (:func:`_blocks`). MKL runs such a
    product as a GEMV (or skinny GEMM) that streams the weight at ~10 GB/s on one thread whatever the thread count;
    the batched form streams it 2–3× faster and uses every thread. Measured on the 2-core benchmark machine (AMD
    EPYC, 2 threads): one row's logits (V = 50304, d = 512) 10 → 4 ms, its pondering product (A4) 24 → 10 ms, the
    24 layer passes of a 70M decode step 32 → 16 ms; 8 rows' logits 18 → 9 ms. A decode step at batch 1 is mostly
    such products. (bf16 goes through oneDNN, already fast there.)"""
    if torch.compiler.is_compiling():  # a graph reaches the blocks through one operator (skinny_linear)
        return False
    return _skinny_shape(rows, *weights)


def _skinny_shape(rows: int, *weights: torch.Tensor) -> bool:
    cap = VOCAB_ROWS if all(w.shape[0] >= VOCAB_SIZED for w in weights) else SKINNY_ROWS
    return (0 < rows <= cap and not torch.is_grad_enabled()
            and all(w.device.type == "cpu" and w.dtype == torch.float32 and w.is_contiguous() for w in weights))


def _blocks(rows: int, out_features: int) -> tuple[int, int, int] | None:
    """How a skinny product splits the weight's ``out_features`` rows: (blocks, rows per block, rows in the blocks;
    the rest is one plain product), or None when splitting does not pay. One row: 4 blocks, computed as ``w xᵀ``,
    the orientation MKL streams fastest. Several rows (vocabulary-sized weights only): blocks of ≥ 1024 weight rows
    (up to 48), computed as ``x wᵀ``: there MKL packs the operands, so the result does not depend on the weights'
    memory alignment (a model loaded from a memory-mapped checkpoint computes what the one it was saved from did; a
    one-row product depends on it in any form, the plain GEMV too)."""
    k = min(4, out_features // 64) if rows == 1 else min(48, out_features // 1024) if out_features >= VOCAB_SIZED else 0
    return (k, out_features // k, out_features - out_features % k) if k >= 2 else None


def skinny_linear_(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor) -> bool:
    """``out`` ``[n, out]`` ← ``x wᵀ (+ b)`` for ``x`` ``[n, in]`` by blocks of ``w`` (see :func:`skinny`); returns
    False, writing nothing, when the product is better left to a plain GEMM."""
    (v, d), n = w.shape, x.shape[0]
    if packed_ok(n, w) and x.dtype == w.dtype and (b is None or b.dtype == w.dtype):
        out.copy_(packed_linear(x, w, b))
        return True
    plan = _blocks(n, v)
    if plan is None:
        return False
    k, size, main = plan
    whole = main == v  # the blocks cover w: no slicing (a decode step runs this ~100 times)
    w_main, b_main = (w, b) if whole else (w[:main], None if b is None else b[:main])
    if n == 1:
        z = out.view(v)
        w_b, x_b = w_main.view(k, size, d), x.t().expand(k, d, 1)
        z_b = (z if whole else z[:main]).view(k, size, 1)
        if b is None:
            torch.bmm(w_b, x_b, out=z_b)
        else:
            torch.baddbmm(b_main.view(k, size, 1), w_b, x_b, out=z_b)
        if not whole:
            rest = z[main:]
            torch.mv(w[main:], x[0], out=rest) if b is None else torch.addmv(b[main:], w[main:], x[0], out=rest)
        return True
    w_b, x_b = w_main.view(k, size, d).transpose(1, 2), x.expand(k, n, d)
    z_b = torch.bmm(x_b, w_b) if b is None else torch.baddbmm(b_main.view(k, 1, size), x_b, w_b)  # [k, n, size]
    out[:, :main].view(n, k, size).copy_(z_b.transpose(0, 1))  # to [n, V]: n·V entries, small next to w
    if not whole:
        rest = out[:, main:]
        torch.addmm(b[main:], x, w[main:].t(), out=rest) if b is not None else torch.mm(x, w[main:].t(), out=rest)
    return True


def skinny_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``, by blocks of ``w`` for a few rows of ``x`` (CPU, no gradients: see :func:`skinny`).
    Under ``torch.compile`` the blocked product is one opaque operator of the graph (:func:`_skinny_op`)."""
    rows = x.shape[:-1].numel()
    if torch.compiler.is_compiling():  # large weights only: for small ones the operator's call costs more
        if w.numel() >= COMPILED_BLOCKED_MIN and _blocked_ok(rows, x, w, b, compiling=True):
            return _skinny_op(x, w, b)
        return torch.nn.functional.linear(x, w, b)
    if packed_ok(rows, w) and x.dtype == w.dtype and (b is None or b.dtype == w.dtype):
        return packed_linear(x.reshape(rows, -1), w, b).view(*x.shape[:-1], w.shape[0])
    if _blocked_ok(rows, x, w, b):
        return _blocked_linear(x, w, b)
    return torch.nn.functional.linear(x, w, b)


def _blocked_ok(rows: int, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, compiling: bool = False) -> bool:
    return ((skinny(rows, w) if not compiling else _skinny_shape(rows, w)) and x.dtype == w.dtype
            and (b is None or b.dtype == w.dtype) and _blocks(rows, w.shape[0]) is not None)


def _blocked_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    rows = x.shape[:-1].numel()
    out = x.new_empty(*x.shape[:-1], w.shape[0])
    skinny_linear_(x.reshape(rows, -1).contiguous(), w, b, out.view(rows, -1))
    return out


def _register_op(name: str, fn, fake):
    """``fn`` as the custom operator ``adaponder::name``, so that a compiled graph calls it as it is (inductor would
    otherwise lower a one-row product with a vocabulary-sized weight to its own kernels, or to MKL's GEMV — the slow
    paths :func:`skinny` exists to avoid). Registered once per process: a checkpoint's copy of this file, loaded
    beside the installed one, reuses the operator."""
    existing = getattr(getattr(torch.ops, "adaponder", None), name, None)
    if existing is not None:
        return existing
    op = torch.library.custom_op(f"adaponder::{name}", mutates_args=())(fn)
    op.register_fake(fake)
    return op


def _blocked_linear_op(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return _blocked_linear(x, w, b)


def embed_probs(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``p w`` for probabilities ``p`` ``[n, V]`` and ``W_E`` ``[V, d]`` of one dtype, the second product of A4; for a
    few rows (:func:`skinny`) the partial products of 4 vocabulary blocks in one batched GEMM, then summed."""
    (v, d), n = w.shape, p.shape[0]
    if packed_ok(n, w) and p.dtype == w.dtype:
        return packed_linear(p, w, transposed=True)
    if not (skinny(n, w) and p.dtype == w.dtype and p.stride(-1) == 1 and v >= 256):
        return p @ w
    size = v // 4
    main = 4 * size
    out = torch.bmm(p[:, :main].view(n, 4, size).transpose(0, 1), w[:main].view(4, size, d)).sum(0)
    return out.addmm_(p[:, main:], w[main:]) if main < v else out


def _accumulate(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a @ b`` in ``acc``'s (fp32) precision; the first call allocates. Same dtypes: inside the GEMM."""
    if acc is None:
        return (a @ b).to(_wide(a.dtype))
    if a.dtype == b.dtype == acc.dtype:
        return acc.addmm_(a, b)
    return acc.add_(a @ b)


class _ChunkedPondering(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w_out, w_emb, alpha: float, chunk: int, recompute: bool):
        out = torch.empty(h.shape[0], w_emb.shape[1], dtype=h.dtype, device=h.device)
        chunks = _row_chunks(h.shape[0], w_out.shape[0], chunk, h.device)
        kept = []
        for s, e in chunks:
            probs = _probs(h[s:e], w_out, "z")
            if not recompute:  # keep P (a fresh tensor: the scratch block is reused)
                probs = probs.clone()
                kept.append(probs)
            torch.mm(_cast(probs, w_emb.dtype, "z"), w_emb, out=out[s:e])
        if alpha != 1.0:
            out.mul_(alpha)
        ctx.save_for_backward(h, w_out, w_emb, out, *kept)
        ctx.alpha, ctx.chunks = alpha, chunks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, w_out, w_emb, out, *kept = ctx.saved_tensors
        alpha = ctx.alpha
        need_h, need_w_out, need_w_emb = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w_out = grad_w_emb = None
        for i, (s, e) in enumerate(ctx.chunks):
            hc, g = h[s:e], (grad_out[s:e] * alpha).to(w_emb.dtype)
            probs = kept[i] if kept else _probs(hc, w_out, "z")  # recomputed unless kept
            if need_w_emb:  # (the low-precision copy may reuse block "z": the logits are no longer needed)
                grad_w_emb = _accumulate(grad_w_emb, _cast(probs, w_emb.dtype, "z").t(), g)
            # softmax backward, in place: dz = P ⊙ (g W_Eᵀ − g·e/α), using Σ_v p_v (g·W_E[v]) = g·e/α
            d = _logits(g, w_emb, "d")
            row_dot = (g.to(d.dtype) * out[s:e].to(d.dtype)).sum(-1, keepdim=True) / alpha
            d = _cast(d.sub_(row_dot).mul_(probs), h.dtype, "d")
            if need_h:
                torch.mm(d, w_out, out=grad_h[s:e])
            if need_w_out:
                grad_w_out = _accumulate(grad_w_out, d.t(), hc)
        cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
        return grad_h, cast(grad_w_out, w_out), cast(grad_w_emb, w_emb), None, None, None


def pondering_from_logits(z: torch.Tensor, w_emb: torch.Tensor, alpha: float, in_place: bool = False) -> torch.Tensor:
    """``α · softmax(z) W_E`` (the end of A4) for logits ``z`` ``[n, V]`` already computed (decoding shares them with
    the exit). The softmax runs in at least fp32 — in ``z`` itself when ``in_place`` and ``z`` is that wide — and the
    product in the wider of the two dtypes (no gradients: the training path is :func:`pondering_from_hidden`)."""
    dtype, wide = torch.promote_types(z.dtype, w_emb.dtype), _wide(z.dtype)
    probs = torch.softmax(z, dim=-1, out=z) if in_place and z.dtype == wide else torch.softmax(z.to(wide), dim=-1)
    out = embed_probs(probs.to(dtype), w_emb.to(dtype))
    return out.mul_(alpha) if alpha != 1.0 else out


def pondering_from_hidden(h: torch.Tensor, w_out: torch.Tensor, w_emb: torch.Tensor, alpha: float,
                          chunk: int = 0, recompute: bool = True) -> torch.Tensor:
    """``α · softmax(h W_outᵀ) W_E`` for ``h`` of shape ``[N, d]`` (A4).

    At most ``chunk`` rows at a time (0 = the device's default block, :func:`block_entries`).
    With gradients, probabilities are recomputed in backward (``recompute``, memory O(N·d + V·d)) or kept
    (one product less per call, N·V fp32 held until backward).
    """
    if torch.is_grad_enabled() and (h.requires_grad or w_out.requires_grad or w_emb.requires_grad):
        return _ChunkedPondering.apply(h, w_out, w_emb, float(alpha), chunk, bool(recompute))
    dtype = torch.promote_types(h.dtype, w_emb.dtype)
    if torch.compiler.is_compiling():
        if _skinny_shape(h.shape[0], w_out, w_emb) and h.dtype == w_out.dtype and not chunk:
            return _ponder_op(h, w_out, w_emb, float(alpha))  # a few rows: the blocked products, as one operator
        probs = torch.softmax((h @ w_out.t()).to(_wide(h.dtype)), dim=-1)  # no scratch blocks, no out= products
        return (probs.to(dtype) @ w_emb.to(dtype)) * alpha
    # a few fp32 rows (decoding, late compacted passes): blocked, one chunk (within the configured chunk size)
    if skinny(h.shape[0], w_out, w_emb) and h.dtype == w_out.dtype and (not chunk or h.shape[0] <= chunk):
        z = _buffer("z", (h.shape[0], w_out.shape[0]), h.dtype, h.device)
        if not skinny_linear_(h, w_out, None, z):
            torch.mm(h, w_out.t(), out=z)
        return pondering_from_logits(z, w_emb, alpha, in_place=True)
    out = torch.empty(h.shape[0], w_emb.shape[1], dtype=dtype, device=h.device)
    for s, e in _row_chunks(h.shape[0], w_out.shape[0], chunk, h.device):
        torch.mm(_cast(_probs(h[s:e], w_out, "z"), out.dtype, "z"), w_emb.to(out.dtype), out=out[s:e])
    return out.mul_(alpha) if alpha != 1.0 else out


def _ce_chunk(z: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed CE of logits ``z`` (turned into probabilities in place) and the mask of counted rows."""
    ok = tgt != -100
    picked = z.gather(1, tgt.clamp(min=0)[:, None]).squeeze(1)
    lse = _softmax_lse_(z)
    return ((lse - picked) * ok).sum().double(), ok


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of ``h W_outᵀ`` against ``targets`` (-100 ignored), chunked; gradients formed in forward."""

    @staticmethod
    def forward(ctx, h, w_out, targets, chunk: int, need_h: bool, need_w: bool):
        n_valid = (targets != -100).sum().clamp(min=1)  # a tensor: no host sync, no graph break
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = None
        for s, e in _row_chunks(h.shape[0], w_out.shape[0], chunk, h.device):
            hc, tgt = h[s:e], targets[s:e]
            probs = _logits(hc, w_out, "z")
            part, ok = _ce_chunk(probs, tgt)
            total += part
            # d(sum of CE)/dz = softmax(z) − onehot, zero on ignored rows; in place over the probabilities
            probs[torch.arange(e - s, device=h.device), tgt.clamp(min=0)] -= 1.0
            d = _cast(probs.mul_(ok[:, None]), h.dtype, "z")
            if need_h:
                torch.mm(d, w_out, out=grad_h[s:e])
            if need_w:
                grad_w = _accumulate(grad_w, d.t(), hc)
        ctx.grads = (grad_h, grad_w)
        ctx.n_valid = n_valid
        ctx.dtypes = (h.dtype, w_out.dtype)
        return (total / n_valid).to(_wide(h.dtype))

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_w = ctx.grads
        ctx.grads = None
        scale = grad / ctx.n_valid
        grad_h = None if grad_h is None else (grad_h * scale).to(ctx.dtypes[0])
        grad_w = None if grad_w is None else (grad_w * scale).to(ctx.dtypes[1])
        return grad_h, grad_w, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, w_out: torch.Tensor, targets: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """A10 without materialising the ``[N, V]`` logits: mean CE of ``h W_outᵀ`` over targets ≠ -100.

    With gradients enabled, the gradients are computed in this forward call (and held until backward:
    ``[N, d]`` and ``[V, d]``), which saves recomputing the logits; backward only scales them.
    """
    need_h = torch.is_grad_enabled() and h.requires_grad
    need_w = torch.is_grad_enabled() and w_out.requires_grad
    if need_h or need_w:
        return _LinearCrossEntropy.apply(h, w_out, targets, chunk, need_h, need_w)
    n_valid = (targets != -100).sum().clamp(min=1)
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    for s, e in _row_chunks(h.shape[0], w_out.shape[0], chunk, h.device):
        total += _ce_chunk(_logits(h[s:e], w_out, "z"), targets[s:e])[0]
    return (total / n_valid).to(_wide(h.dtype))


def _ponder_rows_op(h: torch.Tensor, w_out: torch.Tensor, w_emb: torch.Tensor, alpha: float) -> torch.Tensor:
    with torch.no_grad():
        return pondering_from_hidden(h, w_out, w_emb, alpha)


_skinny_op = _register_op("skinny_linear", _blocked_linear_op,
                          lambda x, w, b: x.new_empty(*x.shape[:-1], w.shape[0]))
_ponder_op = _register_op("ponder_rows", _ponder_rows_op,
                          lambda h, w_out, w_emb, alpha: h.new_empty(h.shape[0], w_emb.shape[1],
                                                                     dtype=torch.promote_types(h.dtype, w_emb.dtype)))
