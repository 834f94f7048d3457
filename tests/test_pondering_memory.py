"""Chunked pondering embedding (A4) with recompute: same values and gradients as the naive form."""

import pytest
import torch

from adaponder.modeling.pondering import pondering_from_hidden


@pytest.mark.parametrize("chunk", [0, 1, 5, 64])
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_pondering_matches_naive_autograd(chunk, tied):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(13, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w_out = torch.randn(31, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w_emb = w_out if tied else torch.randn(31, 8, dtype=torch.float64, generator=g, requires_grad=True)
    up = torch.randn(13, 8, dtype=torch.float64, generator=g)
    ours = pondering_from_hidden(h, w_out, w_emb, alpha=2.5, chunk=chunk)
    grads = torch.autograd.grad((ours * up).sum(), [h, w_out] + ([] if tied else [w_emb]))
    naive = 2.5 * torch.softmax(h @ w_out.t(), -1) @ w_emb
    ref = torch.autograd.grad((naive * up).sum(), [h, w_out] + ([] if tied else [w_emb]))
    torch.testing.assert_close(ours, naive)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b)


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


def test_chunked_cross_entropy_matches_full_logits():
    from adaponder.modeling import AdaPonderForCausalLM
    from conftest import tiny_config

    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", gate_init_bias=0.0, halting_threshold=0.5,
                                             ponder_chunk_size=7)).train()
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
