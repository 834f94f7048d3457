"""Static-shape decoding (adaponder.generation.static_decoding): the eager static step equals generate() in every mode,
the compiled step equals the eager one, the static cache equals the dynamic one, no host read happens inside a
step, and compilation is not repeated while halting varies."""

from __future__ import annotations

import pytest
import torch

from adaponder.generation import DecodingConfig
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
from adaponder.modeling.pass_step import generate_positions
from adaponder.modeling.ponder_cache import PonderCache
from adaponder.modeling.run_settings import RunSettings
from adaponder.generation.static_decoding import StaticDecoder, decode_step, pass_buffers
from helpers_decoding import record_host_reads

SHAPE = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
             max_position_embeddings=256)
MODES = ["vanilla", "ponderlm", "loop", "adaponder"]
TAU = RunSettings(tau=0.5)


def _model(mode: str) -> AdaPonderForCausalLM:
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(AdaPonderConfig(mode=mode, **SHAPE)).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():  # gates whose values spread around τ = 0.5: tokens exit at every pass
        for gate in model.gates:
            gate.fc_out.weight.normal_(0, 2.0)
            gate.fc_out.bias.zero_()
    return model


def _prompts():
    ids = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, :1] = 0
    return ids, mask


@pytest.fixture(scope="module", params=MODES)
def decoded(request):
    """Per mode: the model, generate()'s greedy tokens and logits, and the eager static decoder's."""
    model = _model(request.param)
    ids, mask = _prompts()
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, settings=TAU,
                         output_logits=True, return_dict_in_generate=True)
    static = StaticDecoder(model, TAU).generate(ids, mask, 10, output_logits=True)
    return model, ref, static


@pytest.mark.parametrize("per_pass", [True, False], ids=["pass-by-pass", "whole-step"])
def test_the_eager_static_step_decodes_as_generate(decoded, per_pass):
    model, ref, _ = decoded
    ids, mask = _prompts()
    static = StaticDecoder(model, TAU, per_pass=per_pass).generate(ids, mask, 10, output_logits=True)
    assert torch.equal(static.sequences, ref.sequences)
    torch.testing.assert_close(static.logits, torch.stack(ref.logits, 1), rtol=0, atol=1e-5)
    if model.config.mode == "adaponder":  # halting happened, at different passes
        assert 1 < static.exit_pass.float().mean() < 4 and len(static.exit_pass.unique()) >= 3


@pytest.mark.slow
def test_the_compiled_step_decodes_as_the_eager_one(decoded):
    torch._dynamo.reset()
    model, _, static = decoded
    ids, mask = _prompts()
    # the one switch: generate() with DecodingConfig(compile=True), and its older spelling
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, settings=TAU, decoding=DecodingConfig(compile=True))
    assert torch.equal(out.sequences, static.sequences)
    assert torch.equal(out.exit_pass, static.exit_pass)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=10, settings=TAU.replace(compile=True)),
                       static.sequences)
    compiled = StaticDecoder(model, TAU.replace(compile=True)).generate(ids, mask, 10, output_logits=True)
    torch.testing.assert_close(compiled.logits, static.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_pass", [True, False], ids=["pass-by-pass", "whole-step"])
def test_the_static_cache_equals_the_dynamic_one_at_every_pass_and_layer(per_pass):
    model = _model("adaponder")
    ids, mask = _prompts()
    decoder = StaticDecoder(model, TAU, per_pass=per_pass)
    kv_seen = {}
    new_cache = decoder.new_cache
    decoder.new_cache = lambda *a, **k: kv_seen.setdefault("kv", new_cache(*a, **k))
    out = decoder.generate(ids, mask, 6)
    kv = kv_seen["kv"]
    # the eager cached forward, token by token, with generate()'s positions
    positions = generate_positions(mask, 0, mask.shape[1])
    res = model(ids, attention_mask=mask, position_ids=positions, use_cache=True, settings=TAU)
    cache, m = res.cache, mask
    for t in range(5):
        nxt = out.sequences[:, ids.shape[1] + t, None]
        m = torch.cat([m, torch.ones_like(nxt)], 1)
        res = model(nxt, attention_mask=m, position_ids=(m.cumsum(-1) - 1)[:, -1:], cache=cache, use_cache=True,
                    settings=TAU)
        cache = res.cache
    assert isinstance(cache, PonderCache)
    length = cache.get_seq_length()
    assert length == ids.shape[1] + 5
    for p in range(model.config.num_passes):
        for layer in range(model.config.num_hidden_layers):
            k, v = cache.view(p + 1, layer)
            torch.testing.assert_close(kv[layer, 0, p, :, :, :length], k, rtol=0, atol=1e-6)
            torch.testing.assert_close(kv[layer, 1, p, :, :, :length], v, rtol=0, atol=1e-6)
    assert not kv[:, :, :, :, :, length:].any()  # nothing written past the slots decoded


def test_a_decode_step_reads_nothing_back_to_the_host(monkeypatch):
    model = _model("adaponder")
    ids, mask = _prompts()
    decoder = StaticDecoder(model, TAU)
    kv = decoder.new_cache(3, 128)
    key_ok = torch.zeros(3, 128, dtype=torch.bool)
    key_ok[:, :9] = mask.bool()
    reads = record_host_reads(monkeypatch)
    with torch.no_grad():
        logits, exit_pass = decode_step(model, TAU, pass_buffers(kv), key_ok, ids[:, -1], torch.tensor([9]),
                                        torch.full((3,), 9))
    monkeypatch.undo()
    assert reads == []
    assert logits.shape == (3, 97) and exit_pass.shape == (3,)


@pytest.mark.slow
@pytest.mark.parametrize("per_pass", [True, False], ids=["pass-by-pass", "whole-step"])
def test_compilation_is_not_repeated_while_halting_varies(per_pass):
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = _model("adaponder")
    ids, mask = _prompts()
    decoder = StaticDecoder(model, TAU.replace(compile=True), per_pass=per_pass)
    out = decoder.generate(ids, mask, 64)
    counts = torch.stack([(out.exit_pass == d).sum() for d in range(1, 5)])
    assert (counts > 0).sum() >= 3  # tokens exited at three passes or more over the 64 tokens
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= (model.config.num_passes if per_pass else 1)  # one per pass index, or one for the step
    other = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(7))
    again = decoder.generate(other, mask, 64)  # other tokens, other exits: nothing new to compile
    assert counters["stats"]["unique_graphs"] == graphs
    assert not torch.equal(again.exit_pass, out.exit_pass)
    eager = StaticDecoder(model, TAU, per_pass=per_pass).generate(ids, mask, 64)
    assert torch.equal(out.sequences, eager.sequences) and torch.equal(out.exit_pass, eager.exit_pass)


def test_sampling_on_the_static_step_draws_from_the_warped_distribution():
    """Sampling on the static step: the second token of 4,000 copies of one prompt, drawn after a fixed first token
    (top_k=1 there would be greedy; here temperature 0.7 and top-k 5), has the frequencies of softmax(z/0.7) over
    the five largest logits, z the eager step's logits; nothing outside the top 5 is drawn."""
    model = _model("adaponder")
    ids, mask = _prompts()
    prompt, pmask = ids[:1].expand(4000, -1), mask[:1].expand(4000, -1)
    decoder = StaticDecoder(model, TAU)
    greedy = decoder.generate(prompt[:1], pmask[:1], 2, output_logits=True)
    z = greedy.logits[0, 1]  # the logits after the greedy first token
    first = greedy.sequences[:, -2:-1].expand(4000, -1)
    out = decoder.generate(torch.cat([prompt, first], 1), torch.cat([pmask, torch.ones_like(first)], 1), 1,
                           do_sample=True, temperature=0.7, top_k=5, generator=torch.Generator().manual_seed(0))
    drawn = out.sequences[:, -1]
    top = torch.topk(z, 5)
    expected = (top.values / 0.7).softmax(-1)
    observed = torch.stack([(drawn == t).float().mean() for t in top.indices])
    assert bool(torch.isin(drawn, top.indices).all())
    torch.testing.assert_close(observed, expected, atol=0.03, rtol=0)
