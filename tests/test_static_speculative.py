"""Self-speculative decoding on the static cache (adaponder.generation.static_speculative): the eager draft and verify
steps give generate()'s greedy tokens in every looped mode, with halting, left padding and batch 3; compiled, the
same tokens from one graph per draft step and one per verification, compiled once; neither step reads the host."""

from __future__ import annotations

import pytest
import torch

from adaponder.generation import DecodingConfig, GenerationRefused
from adaponder.modeling.run_settings import RunSettings
from adaponder.generation.speculative import SpeculativeConfig
from adaponder.generation.static_decoding import StaticDecoder, pass_buffers
from adaponder.generation.static_speculative import StaticSpeculativeDecoder, draft_step, verify_step
from helpers_decoding import DRAFT_OR_NOT, StopAfterPassOne, record_host_reads
from test_static_decoding import TAU, _model, _prompts  # the same models and prompts as static decoding


@pytest.mark.parametrize("mode", ["ponderlm", "loop", "adaponder"])
@pytest.mark.parametrize("draft_passes,draft_tokens", [(1, 4), (2, 3), (1, 1)])
def test_the_eager_static_draft_and_verify_decode_as_generate(mode, draft_passes, draft_tokens):
    model = _model(mode)
    ids, mask = _prompts()
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, settings=TAU)
    decoder = StaticSpeculativeDecoder(model, SpeculativeConfig(draft_passes, draft_tokens), TAU)
    out = decoder.generate(ids, mask, 14)
    assert torch.equal(out, ref)
    stats = decoder.stats
    assert stats.cycles > 0 and stats.accepted <= stats.drafted
    if (draft_passes, draft_tokens) == (1, 4):  # a random model's pass 1 is a poor draft: some cycles cut short
        assert 0 < stats.accepted < stats.drafted


@pytest.mark.integration
def test_the_compiled_draft_and_verify_decode_as_the_eager_ones_and_compile_once():
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = _model("adaponder")
    ids, mask = _prompts()
    config = SpeculativeConfig(1, 4)
    eager = StaticSpeculativeDecoder(model, config, TAU).generate(ids, mask, 40)
    # the one switch: generate(decoding=DecodingConfig(draft=..., compile=True))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=40, settings=TAU,
                         decoding=DecodingConfig(draft=config, compile=True))
    compiled = out.sequences
    assert torch.equal(compiled, eager)
    assert out.stats.cycles >= 10
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2  # one draft graph and one verification graph, whatever the halting and acceptance
    other = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(7))
    again = model.generate(other, attention_mask=mask, max_new_tokens=40, speculative=config,
                           settings=TAU.replace(compile=True))
    assert counters["stats"]["unique_graphs"] == graphs  # other tokens, other exits: nothing new to compile
    with torch.no_grad():
        assert torch.equal(again, model.generate(other, attention_mask=mask, max_new_tokens=40, do_sample=False,
                                                 settings=TAU))


def test_draft_and_verify_steps_read_nothing_back_to_the_host(monkeypatch):
    model = _model("adaponder")
    ids, mask = _prompts()
    kv = StaticDecoder(model, TAU).new_cache(3, 128)
    key_ok = torch.zeros(3, 128, dtype=torch.bool)
    key_ok[:, :9] = mask.bool()
    buffers = pass_buffers(kv)
    reads = record_host_reads(monkeypatch)
    with torch.no_grad():
        logits, *state = draft_step(model, TAU, buffers, key_ok, ids[:, -1], torch.tensor([9]), torch.full((3,), 9), 1)
        token = logits.argmax(-1)
        block = torch.stack([ids[:, -1], token], 1)
        _, *state2 = draft_step(model, TAU, buffers, key_ok, token, torch.tensor([10]), torch.full((3,), 10), 1)
        flat = [None if a is None else torch.stack([a, b], 1).flatten(0, 1) for a, b in zip(state, state2)]
        full, exits = verify_step(model, TAU, buffers, key_ok, block, torch.tensor([9, 10]),
                                  torch.tensor([[9, 10]] * 3), *flat, 1)
    monkeypatch.undo()
    assert reads == []
    assert full.shape == (3, 2, 97) and exits.shape == (3, 2) and isinstance(state[0], torch.Tensor)


def test_adaptive_draft_length_moves_by_powers_of_two_with_the_same_tokens():
    """Every draft accepted (two draft passes of this model agree with all four): γ doubles from 1 up to its
    maximum from one cycle to the next (ordinary steps may come between: the schedule times both ways), each γ
    one verification graph when compiled; the tokens stay generate()'s."""
    model = _model("adaponder")
    ids, mask = _prompts()
    config = SpeculativeConfig(2, 1, adaptive=True, max_draft_tokens=8, probe_every=2,
                               min_gain=0.01)  # drafting is timed whatever the depth
    decoder = StaticSpeculativeDecoder(model, config, TAU)
    out = decoder.generate(ids, mask, 40)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, settings=TAU)
    assert torch.equal(out, ref)
    advances = decoder.stats.advances  # every cycle accepted whole: each advance is that cycle's γ
    assert len(advances) >= 3 and advances[0] == 1
    assert all(b == min(2 * a, 8) for a, b in zip(advances, advances[1:]))


def static_adaptive_speculation(exit_rule, draft_tokens, new_tokens):
    """ponderlm's ``new_tokens`` greedy tokens under ``exit_rule``, decoded by the static decoder with adaptive
    speculation (pass-1 drafts, γ from ``draft_tokens``): the same as generate()'s. Returns the stats."""
    model = _model("ponderlm")
    ids, mask = _prompts()
    settings = RunSettings(exit_rule=exit_rule)
    decoder = StaticSpeculativeDecoder(model, SpeculativeConfig(1, draft_tokens, adaptive=True), settings)
    out = decoder.generate(ids, mask, new_tokens)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, settings=settings)
    assert torch.equal(out, ref)
    return decoder.stats


def test_compiled_adaptive_speculation_never_drafts_where_tokens_exit_after_the_draft_passes():
    stats = static_adaptive_speculation(StopAfterPassOne(), 4, 12)
    assert stats.cycles == 0 and stats.plain_steps == 11


@DRAFT_OR_NOT
def test_static_adaptive_speculation_starts_once_two_positions_are_decoded(exit_rule, drafts):
    """As test_speculative.py's test_drafting_starts_once_two_positions_are_decoded, on the static decoder."""
    stats = static_adaptive_speculation(exit_rule, 2, 4)
    assert (stats.plain_steps, stats.cycles) == ((2, 1) if drafts else (3, 0))


def test_sampling_with_the_static_draft_and_verify_steps_keeps_the_full_models_distribution():
    """Two-token continuations of one prompt, 3,000 times over, sampled (temperature 1.5, so drafts are often
    rejected) by draft-then-verify on the static steps (eager: the functions the compiled graphs run) and by
    transformers' generate: the first and the second token have the same frequencies (a draft rejected or kept
    changes nothing of the distribution)."""
    model = _model("adaponder")
    ids, mask = _prompts()
    prompt, pmask = ids[1:2].expand(3000, -1), mask[1:2].expand(3000, -1)
    kw = dict(do_sample=True, temperature=1.5, top_k=6)
    spec = StaticSpeculativeDecoder(model, SpeculativeConfig(1, 2), TAU).generate(
        prompt, pmask, 2, generator=torch.Generator().manual_seed(0), **kw)
    torch.manual_seed(0)
    with torch.no_grad():
        ref = model.generate(prompt, attention_mask=pmask, max_new_tokens=2, settings=TAU, pad_token_id=0, **kw)
    for j in (-2, -1):
        tokens = torch.cat([spec[:, j], ref[:, j]]).unique()
        freq = lambda x: torch.stack([(x == t).float().mean() for t in tokens])  # noqa: E731
        torch.testing.assert_close(freq(spec[:, j]), freq(ref[:, j]), atol=0.04, rtol=0)


def test_rows_that_emit_eos_are_padded_as_generate_pads_them():
    model = _model("adaponder")
    ids, mask = _prompts()
    with torch.no_grad():
        free = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, settings=TAU)
        eos = int(free[0, ids.shape[1] + 2])  # a token row 0 emits early
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, settings=TAU,
                             eos_token_id=eos, pad_token_id=0)
    out = StaticSpeculativeDecoder(model, SpeculativeConfig(1, 4), TAU).generate(ids, mask, 20, eos, 0)
    assert (ref[:, ids.shape[1]:] == eos).any(1)[0]
    assert torch.equal(out[:, :ref.shape[1]], ref) and (out[:, ref.shape[1]:] == 0).all()
