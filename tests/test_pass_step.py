"""The pass step has one definition (first input A1 in ``adaponder.modeling.pass_step``; the exit step A6 and the
feedback A4/A7 in ``adaponder.modeling.pass_driver``): the model's forward, the depth-batched decoder and the PALBERT
classifier agree with a reference loop written only from them."""

from __future__ import annotations

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM, pythia_config
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.exit_rules import PassView, ThresholdExit
from adaponder.modeling.pass_driver import exit_step, feed_back
from adaponder.modeling.pass_step import first_input
from adaponder.modeling.pondering import pondering_from_logits
from adaponder.modeling.run_settings import RunSettings
from adaponder.palbert.classifier import (AdaPonderForSequenceClassification, PalbertConfig, PooledLayout,
                                         last_token_index)

SHAPE = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
             max_position_embeddings=64)
TAU = 0.5


def goes_on(s, tau, active=None):
    """A6 through the exit step: the elements whose gate lets them go on to the next pass."""
    active = torch.ones_like(s, dtype=torch.bool) if active is None else active
    return exit_step(ThresholdExit(tau), PassView(pass_idx=1, num_passes=3, active=active, gate=s))


def gate_weighted(e, s):
    """A7: the feedback ``s·e`` (``e`` itself where no gate weighs it)."""
    return e if s is None else e * s[..., None]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = AdaPonderForCausalLM(pythia_config("tiny", mode="adaponder", passes=3, input_scale=0.7, **SHAPE)).eval()
    with torch.no_grad():  # gates that halt some tokens at τ = 0.5
        for gate in m.gates:
            for p in gate.parameters():
                p.normal_(0, 0.5)
    return m


def reference_forward(model, ids, tau):
    """A1–A9 from the pass-step functions alone, on the full token grid (no compaction, no cache). The stack
    itself is the model's ``run_pass`` with the same active mask, so halted tokens reuse their K/V (A15) as in
    the forward."""
    from adaponder.modeling.ponder_cache import KVAligner

    cfg = model.config
    ctx = model.pass_context(ids)
    assert torch.equal(ctx.E0, first_input(model.gpt_neox.embed_in(ids), cfg.first_pass_scale))  # A1
    E, active = ctx.E0, torch.ones_like(ids, dtype=torch.bool)
    exit_pass = torch.ones_like(ids)
    aligner = KVAligner(cfg.num_hidden_layers, None)
    h_hat = None
    for i in range(1, cfg.num_passes + 1):
        h_flat, _ = model.run_pass(E, ctx, i, aligner, active if i > 1 else None)
        h = h_flat.reshape(*ids.shape, -1)
        h_hat = h if h_hat is None else torch.where(active[..., None], h, h_hat)
        if i == cfg.num_passes:
            break
        s = model.gates[i - 1](h_flat).reshape(ids.shape)  # A5
        nxt = goes_on(s, tau, active)  # A6
        e = model.ponder_from_hidden(h_flat).reshape(*ids.shape, -1)  # A4
        E = E + gate_weighted(e, nxt.to(s.dtype) * s)  # A7
        exit_pass = exit_pass + nxt.long()
        active = nxt
    return model.lm_head(h_hat), exit_pass


@pytest.mark.parametrize("compact", [True, False])
def test_the_forward_agrees_with_the_pass_step(model, compact):
    ids = torch.randint(0, 97, (3, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(ids, use_cache=False, settings=RunSettings(tau=TAU, compact=compact))
        logits, exit_pass = reference_forward(model, ids, TAU)
    assert 1 < exit_pass.float().mean() < model.config.num_passes  # some tokens halt, some go on
    assert torch.equal(out.exit_pass, exit_pass)
    torch.testing.assert_close(out.logits, logits, rtol=1e-5, atol=1e-5)


def test_the_depth_batched_decoder_feeds_back_and_halts_by_the_pass_step(model):
    decoder = DepthBatchedDecoder(model, settings=RunSettings(tau=TAU))
    g = torch.Generator().manual_seed(4)
    E = torch.randn(5, 32, generator=g)
    z = torch.randn(5, 97, generator=g)
    s = torch.rand(5, generator=g)
    idx = torch.tensor([0, 2, 3])
    expected = E.clone()
    e = pondering_from_logits(z[idx].clone(), model.gpt_neox.embed_in.weight, model.config.embedding_scale)
    expected[idx] += gate_weighted(e, s[idx])
    with torch.no_grad():
        # the decoder's feedback: the rows that go on, from their logits (softmax in place)
        torch.testing.assert_close(feed_back(model, E, dest=idx, logits=z[idx].clone(), in_place=True,
                                             weight=s[idx]), expected)
    ids = torch.randint(0, 97, (2, 4), generator=g)
    with torch.no_grad():
        out = decoder.generate(ids, max_new_tokens=5)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                             settings=RunSettings(tau=TAU))
    assert torch.equal(out.sequences, ref)
    # A NaN gate halts in both (the decoder used to test s < τ, which a NaN fails, while the model tests s ≥ τ)
    assert not goes_on(torch.tensor([float("nan")]), TAU).item()


def test_the_classifier_feeds_back_by_the_pass_step():
    torch.manual_seed(0)
    cfg = PalbertConfig(**SHAPE, mode="ponderlm", palbert_passes=3, palbert_method="palbert", num_labels=2)
    clf = AdaPonderForSequenceClassification(cfg).eval()
    g = torch.Generator().manual_seed(5)
    E = torch.randn(2, 6, 32, generator=g)
    h = torch.randn(12, 32, generator=g)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, :2] = False  # left padding in the second row: its input is kept
    e = clf.core.ponder_from_hidden(h).reshape(2, 6, 32)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 6), generator=g)
    ctx = clf.core.pass_context(ids, valid.long())
    layout = PooledLayout(clf, ctx, last_token_index(valid.long(), 2, 6, E.device), training=True)
    layout.E, layout.i, layout.c = E, 1, None
    with torch.no_grad():
        out = feed_back(clf.core, **layout.feedback(h, h, None)).view(2, 6, 32)
    torch.testing.assert_close(out[valid], (E + gate_weighted(e, None))[valid])
    assert torch.equal(out[~valid], E[~valid])
