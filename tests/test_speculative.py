"""Self-speculative decoding (draft with the first passes, verify with the rest): greedy output and caches equal
ordinary decoding's; sampling keeps the model's distribution."""

from __future__ import annotations

import math

import pytest
import torch

from adaponder.generation import DecodingConfig
from adaponder.modeling.run_settings import RunSettings

from adaponder.modeling import AdaPonderForCausalLM, PonderCache, pythia_config
from adaponder.generation.speculative import SelfSpeculativeDecoder, SpeculativeConfig, warp
from helpers_decoding import DRAFT_OR_NOT

SHAPE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
             max_position_embeddings=128)
TAU = 0.5


def make(mode, vocab=97, seed=0):
    torch.manual_seed(seed)
    model = AdaPonderForCausalLM(pythia_config("tiny", mode=mode, passes=3, vocab_size=vocab, **SHAPE)).eval()
    if mode == "adaponder":  # gates that halt a share of the tokens at τ = 0.5
        with torch.no_grad():
            for gate in model.gates:
                for p in gate.parameters():
                    p.normal_(0, 0.5)
    return model


def prompts(batch=3, length=6, seed=1):
    ids = torch.randint(1, 97, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding of different widths
    mask[2, :4] = 0
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ponderlm", "loop", "adaponder"])
@pytest.mark.parametrize("draft_passes,draft_tokens,adaptive", [(1, 1, False), (1, 4, False), (2, 3, False),
                                                                  (1, 2, True)])
def test_greedy_output_equals_ordinary_generate(mode, draft_passes, draft_tokens, adaptive):
    model = make(mode)
    ids, mask = prompts()
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, settings=RunSettings(tau=TAU),
                             pad_token_id=0)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=14, settings=RunSettings(tau=TAU), pad_token_id=0,
                             decoding=DecodingConfig(draft=SpeculativeConfig(draft_passes, draft_tokens, adaptive, 6)))
    assert torch.equal(out.sequences, ref)
    stats = out.stats
    assert stats.cycles > 0 and stats.drafted > 0
    assert stats.accepted <= stats.drafted
    if adaptive:  # both ways were timed: ordinary decoding steps took part, giving the same tokens
        assert stats.plain_steps >= 1
    if (draft_passes, draft_tokens) == (1, 4):  # pass 1 of a random model is a poor draft: both branches ran
        assert 0 < stats.accepted < stats.drafted
        assert stats.uneven > 0  # rows verified different numbers of tokens in some cycle


def ordinary_cache(model, ids, mask, new_tokens):
    """The cache of plain cached decoding: the prompt, then each new token but the last, one at a time."""
    cache = PonderCache(model.config.num_passes, model.config.num_hidden_layers)
    full = torch.cat([mask, torch.ones_like(new_tokens)], dim=1)
    pos = (full.cumsum(-1) - 1).masked_fill(full == 0, 1)
    T = ids.shape[1]
    model(ids, attention_mask=mask, position_ids=pos[:, :T], cache=cache, use_cache=True, settings=RunSettings(tau=TAU))
    for j in range(new_tokens.shape[1] - 1):
        model(new_tokens[:, j:j + 1], attention_mask=full[:, :T + j + 1], position_ids=pos[:, T + j:T + j + 1],
              cache=cache, use_cache=True, settings=RunSettings(tau=TAU))
    return cache


def test_the_cache_after_a_speculative_run_equals_ordinary_decodings():
    model = make("adaponder")
    ids, mask = prompts()
    cache = PonderCache(model.config.num_passes, model.config.num_hidden_layers)
    with torch.no_grad():
        out = SelfSpeculativeDecoder(model, SpeculativeConfig(1, 3), settings=RunSettings(tau=TAU)).generate(
            ids, attention_mask=mask, max_new_tokens=10, cache=cache)
        ref = ordinary_cache(model, ids, mask, out[:, ids.shape[1]:])
    assert cache.get_seq_length() == ref.get_seq_length() == ids.shape[1] + 9
    for p in range(1, model.config.num_passes + 1):
        for layer in range(model.config.num_hidden_layers):
            for a, b in zip(cache.view(p, layer), ref.view(p, layer)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_eos_pads_the_rest_of_a_row_as_generate_does():
    model = make("ponderlm")
    ids, mask = prompts()
    with torch.no_grad():
        free = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
        eos = int(free[0, ids.shape[1] + 3])  # a token row 0 emits: the row must end there
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=0,
                             speculative=SpeculativeConfig(1, 4))
    assert torch.equal(out[:, :ref.shape[1]], ref)
    assert (out[:, ref.shape[1]:] == 0).all()


@pytest.mark.parametrize("mode", ["ponderlm", "adaponder"])
def test_sampling_keeps_the_models_distribution(mode):
    """Chi-square of the joint (2nd, 3rd) new tokens of 6,000 speculative samples against the model's exact
    distribution (a vocabulary of 8, so 64 outcomes), with temperature and top-k in play."""
    vocab, n = 8, 6000
    model = make(mode, vocab=vocab, seed=3)
    prompt = torch.tensor([[1, 5, 2, 7, 3]])
    kw = dict(temperature=0.8, top_k=6)
    with torch.no_grad():
        # exact p(y1) p(y2 | y1) p(y3 | y1, y2) over all 512 continuations, marginalised over y1
        grid = torch.cartesian_prod(*[torch.arange(vocab)] * 3)  # [512, 3]
        seqs = torch.cat([prompt.expand(len(grid), -1), grid[:, :2]], dim=1)
        logp = warp(model(seqs, use_cache=False, settings=RunSettings(tau=TAU)).logits[:, -3:], **kw)
        joint = (logp[:, 0].gather(1, grid[:, :1]) + logp[:, 1].gather(1, grid[:, 1:2])
                 + logp[:, 2].gather(1, grid[:, 2:3])).exp().squeeze(1)
        exact = joint.reshape(vocab, vocab * vocab).sum(0)  # over y1: p(y2, y3)
        decoder = SelfSpeculativeDecoder(model, SpeculativeConfig(1, 2), settings=RunSettings(tau=TAU))
        g = torch.Generator().manual_seed(0)
        out = decoder.generate(prompt.expand(n, -1), max_new_tokens=3, do_sample=True, generator=g, **kw)
    assert 0.05 < decoder.stats.acceptance_rate < 0.99  # both the accept and the reject branch ran
    seen = torch.bincount(out[:, -2] * vocab + out[:, -1], minlength=vocab * vocab).double()
    expected = exact.double() * n
    keep = expected >= 5  # (the usual rule for the chi-square approximation; the rest pooled)
    observed = torch.cat([seen[keep], seen[~keep].sum()[None]])
    expect = torch.cat([expected[keep], expected[~keep].sum()[None]])
    chi2 = float(((observed - expect) ** 2 / expect.clamp(min=1e-9)).sum())
    df = int(keep.sum())  # (cells - 1, plus the pooled cell)
    # the 0.999 quantile of chi-square(df), Wilson–Hilferty
    z = 3.09
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < limit, f"chi2 {chi2:.1f} over {df} degrees of freedom (limit {limit:.1f})"


def test_the_adaptive_schedule_decodes_the_faster_way_and_probes_the_other():
    from adaponder.generation.way_choice import FIRST_LOOK, WayChooser

    chooser = WayChooser(("draft", "plain"), probe_every=4, device=torch.device("cpu"))
    cost = {"draft": 0.02, "plain": 0.01}
    ways = []
    for _ in range(FIRST_LOOK + 12):
        way = chooser.next_way()
        ways.append(way)
        chooser.measured(way, cost[way], 1)  # one token per step
    # the first way run is in use; the other is timed after FIRST_LOOK steps, and takes over as clearly faster
    assert ways[:FIRST_LOOK + 1] == ["draft"] * FIRST_LOOK + ["plain"]
    rest = ways[FIRST_LOOK + 1:]
    assert rest.count("plain") >= 9 and "draft" in rest  # ordinary decoding wins; drafting is tried again
    assert chooser.current == "plain" and chooser.interval == 8  # the probe lost: the next one waits twice as long


@pytest.mark.parametrize("probe_cost,switches", [(0.95, False), (0.8, True)])
def test_a_probe_takes_over_only_when_clearly_faster(probe_cost, switches):
    """One timing of the other way that beats the median of the way in use by less than the margin does not
    switch (nor does a slow first call of the way in use let it); a clearly faster one does, and the probe
    interval starts again."""
    from adaponder.generation.way_choice import FIRST_LOOK, MARGIN, WayChooser

    assert FIRST_LOOK == 3 and 0.8 < 1 - MARGIN < 0.95
    chooser = WayChooser(("draft", "plain"), probe_every=2, device=torch.device("cpu"))
    for cost in (3.0, 1.0, 0.9):  # the way in use: a slow first call, then median 1.0
        assert chooser.next_way() == "draft"
        chooser.measured("draft", cost, 1)
    assert chooser.next_way() == "plain"  # the first look at the other way
    chooser.measured("plain", probe_cost, 1)
    assert chooser.next_way() == ("plain" if switches else "draft")
    assert chooser.interval == (2 if switches else 4)


def test_a_ways_cost_is_measured_at_its_current_setting():
    """A draft length's cost is not averaged with another's (the window starts again when the setting changes),
    yet every run counts toward the first look at the other way, so a draft length that keeps changing cannot put
    ordinary decoding's first timing off for ever."""
    from adaponder.generation.way_choice import FIRST_LOOK, WayChooser

    chooser = WayChooser(("draft", "plain"), probe_every=100, device=torch.device("cpu"))
    for gamma, cost in zip((2, 4, 8), (3.0, 2.0, 1.0)):
        assert chooser.next_way() == "draft"
        chooser.measured("draft", cost, gamma, setting=gamma)
    assert chooser.cost("draft") == 1.0  # γ = 8's own, not the median over γ = 2, 4, 8
    assert FIRST_LOOK == 3 and chooser.next_way() == "plain"
    chooser.measured("plain", 1.5, 1)
    assert chooser.next_way() == "draft"  # 1.5 is slower than γ = 8's 1.0 (the median over the ramp was 2.0)


def test_a_way_the_caller_does_not_run_is_neither_in_use_nor_judged():
    """Where the caller runs ordinary decoding instead of the draft it was asked for (drafting cannot pay yet),
    nothing is in use: the draft is asked for again at the next step, and once run it is the way in use; a probe
    the caller does not run counts as lost (the next one waits twice as long)."""
    from adaponder.generation.way_choice import FIRST_LOOK, WayChooser

    chooser = WayChooser(("draft", "plain"), probe_every=2, device=torch.device("cpu"))
    for _ in range(3):
        assert chooser.next_way() == "draft"
        chooser.measured("plain", 1.0, 1)  # not yet
    assert chooser.current is None
    for _ in range(FIRST_LOOK):
        assert chooser.next_way() == "draft"
        chooser.measured("draft", 0.5, 1)
    assert chooser.current == "draft" and chooser.next_way() == "plain"  # the first look
    chooser.measured("draft", 0.5, 1)  # ... which the caller did not take
    assert chooser.next_way() == "draft" and chooser.interval == 4


def adaptive_speculation(exit_rule, new_tokens, **config):
    """ponderlm's ``new_tokens`` greedy tokens under ``exit_rule``, decoded with adaptive speculation (pass-1
    drafts, γ from 2; ``config`` the rest of the SpeculativeConfig): the same as generate()'s. Returns the stats."""
    model = make("ponderlm")
    ids, mask = prompts()
    settings = RunSettings(exit_rule=exit_rule)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, settings=settings,
                             pad_token_id=0)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, settings=settings, pad_token_id=0,
                             decoding=DecodingConfig(draft=SpeculativeConfig(1, 2, adaptive=True, **config)))
    assert torch.equal(out.sequences, ref)
    return out.stats


@DRAFT_OR_NOT
def test_the_adaptive_schedule_drafts_only_where_drafting_could_pay(exit_rule, drafts):
    """Tokens that all exit after pass 1 cost ordinary decoding what a pass-1 draft costs: the adaptive schedule
    never times a cycle there (every step ordinary); a model whose tokens take all K passes drafts."""
    stats = adaptive_speculation(exit_rule, 12, probe_every=4)
    assert stats.plain_steps >= 1  # ordinary decoding is timed too (or is all there is)
    assert (stats.cycles > 0) == drafts
    if not drafts:
        assert stats.plain_steps == 11


@DRAFT_OR_NOT
def test_drafting_starts_once_two_positions_are_decoded(exit_rule, drafts):
    """The prompt does not count (a model halts otherwise on text it reads than on its own continuation): two
    ordinary steps give two decoded positions, then a model whose tokens take all K passes drafts; one whose
    tokens exit after the draft passes never does."""
    stats = adaptive_speculation(exit_rule, 4)  # three decoded steps after the prefill's token
    assert (stats.plain_steps, stats.cycles) == ((2, 1) if drafts else (3, 0))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"draft_passes must lie in \[1, K\) = \[1, 3\), got 3"):
        SelfSpeculativeDecoder(make("ponderlm"), SpeculativeConfig(draft_passes=3))
    with pytest.raises(ValueError, match="needs a looped model"):
        SelfSpeculativeDecoder(AdaPonderForCausalLM(pythia_config("tiny", mode="vanilla", vocab_size=97, **SHAPE)))
    with pytest.raises(TypeError, match=r"DecodingConfig\(draft=SpeculativeConfig\(...\)\) takes attention_mask"):
        make("ponderlm").generate(torch.ones(1, 3, dtype=torch.long), num_beams=2, speculative=SpeculativeConfig())
