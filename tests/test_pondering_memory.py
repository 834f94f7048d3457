"""Chunked pondering embedding (A4) with recompute: same values and gradients as the naive form."""

import pytest
import torch

from adaponder.modeling import pythia_config
from adaponder.modeling.pondering import pondering_from_hidden, pondering_from_logits


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("chunk", [0, 1, 5, 64])
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_pondering_matches_naive_autograd(chunk, tied, recompute):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(13, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w_out = torch.randn(31, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w_emb = w_out if tied else torch.randn(31, 8, dtype=torch.float64, generator=g, requires_grad=True)
    up = torch.randn(13, 8, dtype=torch.float64, generator=g)
    ours = pondering_from_hidden(h, w_out, w_emb, alpha=2.5, chunk=chunk, recompute=recompute)
    grads = torch.autograd.grad((ours * up).sum(), [h, w_out] + ([] if tied else [w_emb]))
    naive = 2.5 * torch.softmax(h @ w_out.t(), -1) @ w_emb
    ref = torch.autograd.grad((naive * up).sum(), [h, w_out] + ([] if tied else [w_emb]))
    torch.testing.assert_close(ours, naive)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_pondering_from_logits_is_the_tail_of_pondering_from_hidden(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    h, w_out, w_emb = (torch.randn(*shape, generator=g).to(dtype) for shape in ((rows, 16), (300, 16), (300, 16)))
    z = h @ w_out.t()
    want = (torch.softmax(z.float(), -1) @ w_emb.float()) * 0.5
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(pondering_from_logits(z.clone(), w_emb, 0.5).float(), want, **tol)
        torch.testing.assert_close(pondering_from_hidden(h, w_out, w_emb, 0.5).float(), want, **tol)
    if dtype == torch.float32:  # in place: the logits become the probabilities
        zc = z.clone()
        pondering_from_logits(zc, w_emb, 0.5, in_place=True)
        torch.testing.assert_close(zc, torch.softmax(z, -1))


def test_chunked_pondering_keeps_no_vocab_sized_tensor():
    """What autograd saves for backward is O(N·d + V·d), not O(N·V)."""
    n, d, v = 64, 8, 4096
    h = torch.randn(n, d, requires_grad=True)
    w_out, w_emb = torch.randn(v, d, requires_grad=True), torch.randn(v, d, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pondering_from_hidden(h, w_out, w_emb, alpha=1.0, chunk=16).sum().backward()
    assert max(saved) <= v * d < n * v
    saved.clear()  # recompute=False: the probabilities are what is kept, n·v in all
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pondering_from_hidden(h, w_out, w_emb, alpha=1.0, chunk=16, recompute=False).sum().backward()
    assert sum(s for s in saved if s == 16 * v) == n * v


def test_chunked_cross_entropy_matches_full_logits():
    from adaponder.modeling import AdaPonderForCausalLM
    from conftest import run_with, tiny_config

    torch.manual_seed(0)
    model = run_with(AdaPonderForCausalLM(tiny_config("adaponder", gate_init_bias=0.0)).train(), tau=0.5,
                     chunk_size=7)
    ids = torch.randint(0, 97, (3, 11))
    labels = ids.clone()
    labels[1, :4] = -100
    grads = []
    for return_logits in (True, False):
        model.zero_grad()
        out = model(ids, labels=labels, return_logits=return_logits)
        assert (out.logits is None) != return_logits
        out.loss.backward()
        grads.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("chunk", [0, 4, 13])
def test_linear_cross_entropy_gradients_formed_in_forward_match_autograd(need, chunk):
    """A10: the loss's gradients are computed in its forward (no logits recompute); each subset of inputs
    that needs a gradient (a frozen head in the gates-only stage, A14) gets the autograd result, scaled by
    whatever multiplies the loss afterwards."""
    from adaponder.modeling.pondering import linear_cross_entropy

    g = torch.Generator().manual_seed(1)
    h = torch.randn(29, 8, dtype=torch.float64, generator=g, requires_grad=need[0])
    w = torch.randn(37, 8, dtype=torch.float64, generator=g, requires_grad=need[1])
    tgt = torch.randint(0, 37, (29,), generator=g)
    tgt[[0, 5, 6]] = -100
    inputs = [t for t in (h, w) if t.requires_grad]
    ours = linear_cross_entropy(h, w, tgt, chunk)
    got = torch.autograd.grad(3.5 * ours, inputs)
    ref = torch.nn.functional.cross_entropy(h @ w.t(), tgt, ignore_index=-100)
    want = torch.autograd.grad(3.5 * ref, inputs)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, tgt, chunk), ref.detach())


def test_bf16_pondering_and_loss_track_fp32():
    """bf16 weights/activations: probabilities and accumulations stay in fp32, so results track fp32."""
    from adaponder.modeling.pondering import linear_cross_entropy

    g = torch.Generator().manual_seed(2)
    h32 = torch.randn(40, 16, generator=g)
    w_out32, w_emb32 = torch.randn(300, 16, generator=g) / 4, torch.randn(300, 16, generator=g)
    tgt = torch.randint(0, 300, (40,), generator=g)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        h, w_out, w_emb = (t.detach().clone().to(dtype).requires_grad_() for t in (h32, w_out32, w_emb32))
        e = pondering_from_hidden(h, w_out, w_emb, alpha=1.5, chunk=16)
        loss = linear_cross_entropy(h, w_out, tgt, 16) + (e.float() * 0.01).sum()
        loss.backward()
        assert e.dtype == dtype and h.grad.dtype == dtype and w_out.grad.dtype == dtype
        results[dtype] = [loss.detach().float(), e.detach().float(), h.grad.float(), w_out.grad.float(),
                          w_emb.grad.float()]
    for a, b in zip(results[torch.float32], results[torch.bfloat16]):
        torch.testing.assert_close(b, a, rtol=3e-2, atol=3e-2)


def test_row_chunks_are_balanced_and_cover_all_rows():
    from adaponder.modeling.pondering import _row_chunks

    assert _row_chunks(512, 50304, 0) == [(0, 512)]  # 512 × 50304 < 2**25 entries: one block
    chunks = _row_chunks(4096, 50304, 0)
    sizes = [e - s for s, e in chunks]
    assert chunks[0][0] == 0 and chunks[-1][1] == 4096 and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert max(sizes) - min(sizes) <= 1 and max(sizes) * 50304 <= 1 << 25
    assert _row_chunks(10, 7, 3) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert _row_chunks(0, 7, 3) == []


def test_a_gpu_takes_larger_pondering_blocks_and_the_plan_counts_them():
    """A 70M micro-batch of 16k tokens: 25 blocks on the CPU, 7 on a CUDA device (fewer launches); an explicit
    chunk size wins on both; the GPU plan's workspace holds the larger block."""
    from adaponder.modeling.pondering import _row_chunks
    from adaponder.train import plan

    assert len(_row_chunks(16384, 50304, 0, "cpu")) == 25
    assert len(_row_chunks(16384, 50304, 0, "cuda")) == 7
    assert _row_chunks(16384, 50304, 4096, "cuda") == _row_chunks(16384, 50304, 4096, "cpu")
    mc = pythia_config("70m", mode="ponderlm", passes=4)
    cpu = plan.workspace_bytes(mc, 8, 2048, "bf16")
    gpu = plan.workspace_bytes(mc, 8, 2048, "bf16", block_entries=plan.CUDA_BLOCK_ENTRIES)
    assert gpu - cpu == 2 * (2668 - 667) * 50304 * (4 + 2)  # two blocks (pondering's backward has its own)


@pytest.mark.parametrize("rows", [1, 8, 9, 100, 256, 257])
def test_blocked_vocabulary_products_match_plain_ones(rows):
    """Up to VOCAB_ROWS rows, the head's logits and the pondering product with vocabulary-sized weights run by
    weight blocks (pondering.skinny); the values are those of the plain products, and the blocked path is the one
    taken exactly up to the cap (the backbone's small weights keep the SKINNY_ROWS cap)."""
    from adaponder.modeling import pondering as P

    g = torch.Generator().manual_seed(rows)
    vocab = P.VOCAB_SIZED + 37  # not a multiple of the block count: the remainder runs as a plain product
    h, w_out, w_emb = (torch.randn(*s, generator=g) for s in ((rows, 32), (vocab, 32), (vocab, 32)))
    with torch.no_grad():
        assert P.skinny(rows, w_out, w_emb) == (rows <= P.VOCAB_ROWS)
        assert P.skinny(rows, torch.randn(96, 32)) == (rows <= P.SKINNY_ROWS)
        torch.testing.assert_close(P.skinny_linear(h, w_out), h @ w_out.t(), rtol=1e-5, atol=1e-5)
        p = torch.softmax(h @ w_out.t(), -1)
        torch.testing.assert_close(P.embed_probs(p, w_emb), p @ w_emb, rtol=1e-5, atol=1e-6)
        want = 0.5 * torch.softmax(h @ w_out.t(), -1) @ w_emb
        torch.testing.assert_close(pondering_from_hidden(h, w_out, w_emb, 0.5), want, rtol=1e-5, atol=1e-6)
        # a configured chunk size still bounds the rows per [rows, V] block
        torch.testing.assert_close(pondering_from_hidden(h, w_out, w_emb, 0.5, chunk=7), want, rtol=1e-5, atol=1e-5)
    with torch.enable_grad():
        assert not P.skinny(rows, w_out, w_emb)  # training keeps the autograd-friendly products


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (torch's CPU builds have it)")
def test_products_of_a_few_rows_with_large_weights_run_on_a_packed_copy_kept_current():
    """From PACKED_MIN_ROWS entries (PACKED_MIN_ONE for one row) the head's logits and the pondering product run on a
    copy of the weight packed once: the values are the plain products', the copy is remade after an in-place update of
    the weight (an optimizer step), a tied weight keeps one copy per orientation, and the copies go with the weight."""
    import gc

    from adaponder.modeling import pondering as P

    g = torch.Generator().manual_seed(0)
    w = torch.randn(P.PACKED_MIN_ROWS // 64, 64, generator=g)  # W_out = W_E (tied)
    h = torch.randn(5, 64, generator=g)
    with torch.no_grad():
        assert P.packed_ok(5, w) and P.packed_ok(2, w) and not P.packed_ok(1, w)  # one row: the blocked GEMV
        assert not P.packed_ok(5, w[:, :32].contiguous())  # below the size: MKL
        assert not P.packed_ok(P.VOCAB_ROWS + 1, w)
        before = len(P._packed_cache)  # (other tests' copies live while their weights do)
        torch.testing.assert_close(P.skinny_linear(h, w), h @ w.t(), rtol=1e-5, atol=1e-5)
        p = torch.softmax(h @ w.t(), -1)
        torch.testing.assert_close(P.embed_probs(p, w), p @ w, rtol=1e-5, atol=1e-6)
        assert len(P._packed_cache) == before + 2  # one copy as W_out, one as W_E
        copy = P.packed_weight(w)
        assert P.packed_weight(w) is copy  # kept
        w.mul_(-2.0)  # an in-place update
        torch.testing.assert_close(P.skinny_linear(h, w), h @ w.t(), rtol=1e-5, atol=1e-5)
        assert P.packed_weight(w) is not copy
        torch.testing.assert_close(pondering_from_hidden(h, w, w, 0.5), 0.5 * torch.softmax(h @ w.t(), -1) @ w,
                                   rtol=1e-5, atol=1e-6)
    with torch.enable_grad():
        assert not P.packed_ok(5, w)  # training keeps the autograd-friendly products
    del w, copy
    gc.collect()
    assert len(P._packed_cache) == before  # the copies went with the weight
    try:
        P.use_packed_weights(False)  # off: the plain products, and no copy is kept
        w = torch.randn(P.PACKED_MIN_ROWS // 64, 64, generator=g)
        with torch.no_grad():
            assert not P.packed_ok(5, w) and len(P._packed_cache) == 0
            torch.testing.assert_close(P.skinny_linear(h, w), h @ w.t(), rtol=1e-5, atol=1e-5)
        assert len(P._packed_cache) == 0
    finally:
        P.use_packed_weights(True)
