"""Pass-pipelined self-speculative decoding: the same tokens as ordinary greedy decoding, on the pipeline's schedule.

Token t + 1 is drafted from token t's first pass and runs its passes while token t runs its later ones; a rejected
draft drops what was computed on it. Whatever the drafts, every row's tokens and exit passes must be those of the
cached forward decoding it alone (A15 K/V reuse and halting included); with drafts that are always right the
sequence gains a token per tick once the pipeline is full, with drafts that are always wrong a token per K ticks.
"""

import pytest
import torch

from adaponder.generation import DecodingConfig, GenerationRefused
from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.exit_rules import QExit
from adaponder.modeling.pass_driver import drive
from adaponder.generation.pass_pipeline import PipelinedSpeculativeDecoder, PipelineLayout
from adaponder.modeling.run_settings import RunSettings
from conftest import settings_for, tiny_config
from helpers_decoding import run_with_eos
from test_cached_inference import random_model
from test_depth_batching import decode_alone


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_row_decodes_as_it_would_alone(seed):
    """Gated models whose tokens halt at different passes; drafts from pass 1's own logits (mostly wrong on random
    weights: the rejection path runs)."""
    model, ids = random_model(seed, halt_per_gate=0.5)
    prompts = torch.cat([ids, ids.flip(0)])[:, :12]
    decoder = PipelinedSpeculativeDecoder(model, settings_for(model))
    res = decoder.generate(prompts, 10)
    assert res.sequences.shape == (6, 22) and torch.equal(res.sequences[:, :12], prompts)
    for b in range(prompts.shape[0]):
        tokens, exits = decode_alone(model, prompts[b], 10)
        assert res.sequences[b, 12:].tolist() == tokens, f"row {b}"
        assert res.exit_pass[b].tolist() == exits, f"row {b}"
    st = decoder.stats
    assert st.ticks > 0 and st.accepted + st.rejected <= st.drafted


def test_ponderlm_with_a_draft_head_generates_what_greedy_generate_does():
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=3, draft_head=True)).eval()
    with torch.no_grad():
        model.draft_head.fc_out.weight.normal_()  # a draft that is not pass 1's own logits
    prompts = torch.randint(0, model.config.vocab_size, (3, 9))
    ref = model.generate(prompts, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = model.generate(prompts, max_new_tokens=12, decoding=DecodingConfig(schedule="pipelined"), pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    st = out.stats
    assert st.rejected > 0 and st.wasted > 0  # random drafts: the drop-and-restart path ran


def test_eos_ends_a_row_and_generate_pads_it():
    model, prompts, eos, res = run_with_eos(PipelinedSpeculativeDecoder)
    for b in range(prompts.shape[0]):
        tokens, exits = decode_alone(model, prompts[b], 8, eos=eos)
        n = len(tokens)
        assert res.sequences[b, 10:10 + n].tolist() == tokens and int(res.new_tokens[b]) == n
        assert (res.sequences[b, 10 + n:] == eos).all() and res.exit_pass[b, :n].tolist() == exits
    out = model.generate(prompts, max_new_tokens=8, speculative="pipelined", eos_token_id=eos, pad_token_id=-1,
                         settings=settings_for(model))
    n = len(decode_alone(model, prompts[0], 8, eos=eos)[0])
    assert n == 3 and (out[0, 10 + n:] == -1).all()


def _schedule(model, prompts, new, draft, redraft=None):
    """Decode with every draft of pass 1 replaced by ``draft(true next token)`` (and every re-draft by
    ``redraft(...)``, or by ``redraft[p](...)`` at pass p); returns the layout."""
    reference = [decode_alone(model, p, new)[0] for p in prompts]
    length = prompts.shape[1]

    class Drafted(PipelineLayout):
        def feedback(self, h, state, going):
            args = super().feedback(h, state, going)
            rules = redraft if isinstance(redraft, dict) else dict.fromkeys(self.redraft_at, redraft)
            for which, at in [(self.first, None), *((self.late, p) for p in rules)]:
                for i in which:
                    if at is not None and self.passes[i] != at:
                        continue
                    b, t = self.live[i], self.positions[i] + 1
                    self.guess_h[i] = (draft if at is None else rules[at])(reference[b][t - length])
            return args

    decoder = PipelinedSpeculativeDecoder(model)
    prefill = decoder.batched.prefill(prompts, length + new)
    K = model.config.num_passes
    layout = Drafted(decoder.batched, prefill, prompts, K, length + new, new, None)
    with torch.no_grad():
        drive(model, layout, decoder.settings.rule)
    assert [t for t in layout.tokens] == reference  # right or wrong drafts, the full model's tokens
    return layout


@pytest.mark.parametrize("K", [2, 4])
def test_right_drafts_fill_the_pipeline_and_wrong_ones_cost_its_depth(K):
    torch.manual_seed(K)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=K)).eval()
    prompts = torch.randint(0, model.config.vocab_size, (2, 6))
    new = 9
    right = _schedule(model, prompts, new, lambda y: y)
    # token 0 comes from the prefill; token 1 after K ticks; then one per tick
    assert right.ticks == K + new - 2
    assert (right.stats.accepted, right.stats.rejected, right.stats.wasted) == (2 * (new - 2), 0, 0)
    wrong = _schedule(model, prompts, new, lambda y: (y + 1) % model.config.vocab_size)
    assert wrong.ticks == K * (new - 1)  # each token waits for the one before it to finish all K passes
    assert wrong.stats.accepted == 0 and wrong.stats.rejected == 2 * (new - 2)
    # each rejection drops the entries behind the finished token, the j-th behind it after K − j passes (fewer
    # entries near the end: none is started past the last position whose prediction is wanted)
    dropped = sum(K - j for left in range(1, new - 1) for j in range(1, min(K - 1, left) + 1))
    assert wrong.stats.wasted == 2 * dropped
    assert wrong.token_passes == 2 * (new - 1) * K + wrong.stats.wasted == right.token_passes + wrong.stats.wasted


@pytest.mark.parametrize("K", [3, 4])
def test_a_re_draft_of_pass_k_minus_1_restarts_a_wrong_draft_early(K):
    torch.manual_seed(K)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=K, redraft_head=True)).eval()
    prompts = torch.randint(0, model.config.vocab_size, (2, 6))
    new, V = 9, model.config.vocab_size
    fixed = _schedule(model, prompts, new, lambda y: (y + 1) % V, redraft=lambda y: y)
    # every first draft is wrong and every re-draft right: token j + 1 starts K − 1 ticks after token j
    assert fixed.ticks == K + (K - 1) * (new - 2) < K * (new - 1)
    assert fixed.stats.redrafted == 2 * (new - 2) and fixed.stats.rejected == 0
    assert fixed.stats.accepted == 2 * (new - 2)
    # a re-draft that is wrong where the first draft was right costs what a rejection costs
    spoiled = _schedule(model, prompts, new, lambda y: y, redraft=lambda y: (y + 1) % V)
    assert spoiled.ticks == K * (new - 1) and spoiled.stats.rejected == 2 * (new - 2)


def test_re_drafts_at_every_pass_from_two_drop_a_wrong_draft_after_one_tick():
    K = 4
    torch.manual_seed(K)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=K, redraft_head=True, early_redraft_heads=True)).eval()
    prompts = torch.randint(0, model.config.vocab_size, (2, 6))
    new, V = 9, model.config.vocab_size
    right, wrong = (lambda y: y), (lambda y: (y + 1) % V)
    # every first draft wrong, pass 2's re-draft right: token j + 1 starts 2 ticks after token j
    early = _schedule(model, prompts, new, wrong, redraft={2: right, 3: right})
    assert early.ticks == K + 2 * (new - 2)
    assert early.stats.redrafted == 2 * (new - 2) and early.stats.rejected == 0
    assert early.stats.wasted == 2 * (new - 2)  # each wrong draft ran its first pass only
    # pass 2's re-draft as wrong as the draft, pass 3's right: the late head's schedule
    late = _schedule(model, prompts, new, wrong, redraft={2: wrong, 3: right})
    assert late.ticks == K + (K - 1) * (new - 2)
    # pass 2's re-draft wrong in another way: replaced, then replaced again by pass 3's
    twice = _schedule(model, prompts, new, wrong, redraft={2: lambda y: (y + 2) % V, 3: right})
    assert twice.ticks == late.ticks and twice.stats.redrafted == 2 * 2 * (new - 2)
    # each token's two wrong starts ran one pass each; pass 3's head alone leaves more behind the wrong draft
    assert twice.stats.wasted == 2 * early.stats.wasted < late.stats.wasted


def test_a_trained_re_draft_head_keeps_greedy_output():
    torch.manual_seed(1)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=4, draft_head=True, redraft_head=True,
                                             early_redraft_heads=True)).eval()
    with torch.no_grad():
        for head in model.redraft_heads().values():
            head.fc_out.weight.normal_()
    prompts = torch.randint(0, model.config.vocab_size, (3, 8))
    ref = model.generate(prompts, max_new_tokens=14, do_sample=False, pad_token_id=0)
    out = model.generate(prompts, max_new_tokens=14, decoding=DecodingConfig(schedule="pipelined"))
    assert torch.equal(out.sequences, ref)
    assert out.stats.redrafted > 0


@pytest.mark.parametrize("new", [1, 2])
def test_the_shortest_generations_equal_greedy(new):
    """One new token is the prefill's alone (no tick runs: the depth-batched decoder starts with no live row)."""
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=4, draft_head=True, redraft_head=True)).eval()
    prompts = torch.randint(0, model.config.vocab_size, (2, 7))
    ref = model.generate(prompts, max_new_tokens=new, do_sample=False, pad_token_id=0)
    out = model.generate(prompts, max_new_tokens=new, decoding=DecodingConfig(schedule="pipelined"))
    assert torch.equal(out.sequences, ref)
    assert torch.equal(DepthBatchedDecoder(model).generate(prompts, new).sequences, ref)
    assert out.stats.ticks == (0 if new == 1 else model.config.num_passes)


def test_bad_arguments_are_named():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="ponderlm or adaponder"):
        PipelinedSpeculativeDecoder(AdaPonderForCausalLM(tiny_config("loop", passes=2)).eval())
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=2, halting_heads=True)).eval()
    # (Q-exit, a rule with memory, runs here: its memory is kept per entry — tests/test_exit_rule_memory.py)
    PipelinedSpeculativeDecoder(model, RunSettings(exit_rule=QExit(0.5, model.halting_heads)))
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    with pytest.raises(GenerationRefused, match="decodes greedily"):
        model.generate(ids, max_new_tokens=3, speculative="pipelined", do_sample=True)
    mask = torch.ones_like(ids)
    mask[0, -1] = 0  # right padding: a zero after the row's first token
    with pytest.raises(ValueError, match="left padding only"):
        model.generate(ids, attention_mask=mask, max_new_tokens=3, speculative="pipelined")
    with pytest.raises(ValueError, match="'pipelined'"):
        model.generate(ids, max_new_tokens=3, speculative="pipeline")
