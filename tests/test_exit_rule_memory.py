"""An exit rule with memory (``carries``) gets the same exits and greedy tokens in every decoder.

The rules here are written against the public protocol only: they count the passes in their own memory
(``view.carry`` → ``view.next_carry``) and stop on that count — after pass 3 for every token, or after
``1 + id % K`` passes (a different pass per token, so the depth-batched and pipelined decoders hold rows at
different passes in one tick). The memory must start afresh at every element's pass 1: the depth-batched decoder
starts a row's next token in the same slot, and the pipeline starts and drops entries of a row as drafts are
accepted or rejected. Each decoder — the training forward, cached ``generate``, ``StaticDecoder``, draft-then-verify,
depth-batched and pipelined — must give the cached decoding's exit passes and ``generate()``'s greedy tokens, on a
batch of 3 (left-padded where the decoder takes padding; rows that finish apart at an EOS where it takes one).
Token-level Q-exit, which carries its survival and running exit probability, too.
"""

from __future__ import annotations

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.exit_rules import QExit
from adaponder.generation.pass_pipeline import PipelinedSpeculativeDecoder
from adaponder.modeling.pass_step import generate_positions
from adaponder.modeling.run_settings import RunSettings
from adaponder.generation.speculative import SelfSpeculativeDecoder, SpeculativeConfig
from adaponder.generation.static_decoding import StaticDecoder
from conftest import tiny_config, tiny_model

K = 4
NEW = 8
PROMPT = 7


class CountsToThree:
    """Counts the passes in its own memory and stops every token after pass 3 (padding after pass 1). It also
    records whether its memory ever disagreed with the pass an element is at (memory carried over from an earlier
    token, or lost between passes)."""

    needs = frozenset({"valid"})
    carries = True

    def __init__(self):
        self.inconsistent = 0

    def count(self, view) -> torch.Tensor:
        before = torch.zeros(view.active.shape, dtype=torch.long, device=view.active.device) \
            if view.carry is None else view.carry
        if view.carry is not None:  # where an element is past its pass 1, its memory holds the passes before it
            p = torch.as_tensor(view.pass_idx, device=before.device)
            self.inconsistent += int(((before != p - 1) & (p > 1)).sum())
        view.next_carry = before + 1
        return view.next_carry

    def stops(self, view):
        return (self.count(view) >= 3) | ~view.valid


class CountsToItsOwnLimit(CountsToThree):
    """Counts the passes in its memory and stops a token after ``1 + id % K`` of them (pass 1 to K)."""

    needs = frozenset({"token_ids"})

    def stops(self, view):
        return self.count(view) >= 1 + view.token_ids % K


def expected_exits(rule, inputs: torch.Tensor) -> torch.Tensor:
    """The exit pass of each token run on ``inputs`` under ``rule``."""
    if isinstance(rule, CountsToItsOwnLimit):
        return 1 + inputs % K
    return torch.full_like(inputs, 3)


RULES = pytest.mark.parametrize("rule_cls", [CountsToThree, CountsToItsOwnLimit], ids=["three", "own-limit"])


@pytest.fixture(scope="module")
def model():
    return tiny_model("adaponder", passes=K)


@pytest.fixture(scope="module")
def prompts():
    """Three prompts, left-padded by 0, 2 and 4 positions, and their attention mask."""
    ids = torch.randint(1, 97, (3, PROMPT), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    return ids.masked_fill(mask == 0, 0), mask


def cached_decode(model, ids, mask, new, settings):
    """Lockstep cached decoding, one token per step (the cached forward, A15): tokens and exit passes ``[B, new]``."""
    with torch.no_grad():
        length = ids.shape[1]
        out = model(ids, attention_mask=mask, position_ids=generate_positions(mask, 0, length), use_cache=True,
                    settings=settings)
        tokens, exits, cache = [out.logits[:, -1].argmax(-1)], [out.exit_pass[:, -1]], out.cache
        for j in range(1, new):
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            out = model(tokens[-1][:, None], attention_mask=mask,
                        position_ids=generate_positions(mask, length + j - 1, 1), cache=cache, use_cache=True,
                        settings=settings)
            cache = out.cache
            tokens.append(out.logits[:, -1].argmax(-1))
            exits.append(out.exit_pass[:, -1])
    return torch.stack(tokens, 1), torch.stack(exits, 1)


_REFERENCES: dict = {}


def reference(model, ids, mask, rule_cls):
    """``generate()``'s greedy tokens under a fresh rule, checked against lockstep cached decoding, whose exit passes
    are the rule's own count (computed once per model, prompts and rule)."""
    key = (id(model), ids.data_ptr(), mask.sum().item(), rule_cls)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(model, ids, mask, rule_cls)
    return _REFERENCES[key]


def _reference(model, ids, mask, rule_cls):
    rule = rule_cls()
    settings = RunSettings(exit_rule=rule)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, settings=settings,
                             pad_token_id=0)
    tokens, exits = cached_decode(model, ids, mask, NEW, RunSettings(exit_rule=rule_cls()))
    assert torch.equal(ref[:, ids.shape[1]:], tokens)
    inputs = torch.cat([ids[:, -1:], tokens[:, :-1]], 1)  # the token each generated one was predicted from
    assert torch.equal(exits, expected_exits(rule, inputs))
    assert rule.inconsistent == 0
    return ref, exits


def assert_rows(tokens, exits, ref_tokens, ref_exits, eos=None):
    """Row by row: the reference's tokens and exit passes up to the row's first EOS, then EOS with exit pass 0."""
    for b in range(tokens.shape[0]):
        r = ref_tokens[b].tolist()
        k = r.index(eos) + 1 if eos in r else len(r)
        assert tokens[b, :k].tolist() == r[:k], f"row {b}"
        assert exits[b, :k].tolist() == ref_exits[b, :k].tolist(), f"row {b}"
        if eos is not None:
            assert (tokens[b, k:] == eos).all() and (exits[b, k:] == 0).all(), f"row {b}"


@RULES
def test_the_training_forward_and_the_inference_forward(model, prompts, rule_cls):
    ids, mask = prompts
    expected = expected_exits(rule_cls(), ids)
    model.train()
    try:
        rule = rule_cls()
        out = model(ids, attention_mask=mask, labels=ids, settings=RunSettings(exit_rule=rule))
    finally:
        model.eval()
    real = mask.bool()
    assert torch.equal(out.exit_pass[real], expected[real])
    assert rule.inconsistent == 0
    with torch.no_grad():  # compacted (A16) and dense
        for compact in (True, False):
            rule = rule_cls()
            out = model(ids, attention_mask=mask, settings=RunSettings(exit_rule=rule, compact=compact))
            assert torch.equal(out.exit_pass[real], expected[real])
            assert rule.inconsistent == 0


@RULES
def test_cached_generate(model, prompts, rule_cls):
    ids, mask = prompts
    _, exits = reference(model, ids, mask, rule_cls)
    if rule_cls is CountsToThree:
        assert (exits == 3).all()


@RULES
@pytest.mark.parametrize("per_pass", [True, False], ids=["pass-by-pass", "whole-step"])
def test_static_decoder(model, prompts, rule_cls, per_pass):
    ids, mask = prompts
    ref, ref_exits = reference(model, ids, mask, rule_cls)
    rule = rule_cls()
    res = StaticDecoder(model, RunSettings(exit_rule=rule), per_pass=per_pass).generate(ids, mask, NEW)
    assert torch.equal(res.sequences, ref)
    assert torch.equal(res.exit_pass, ref_exits)
    assert rule.inconsistent == 0


@RULES
def test_draft_then_verify(model, prompts, rule_cls):
    ids, mask = prompts
    ref, _ = reference(model, ids, mask, rule_cls)
    for config in (SpeculativeConfig(1, 3), SpeculativeConfig(2, 2)):
        rule = rule_cls()
        out = SelfSpeculativeDecoder(model, config, RunSettings(exit_rule=rule)).generate(
            ids, attention_mask=mask, max_new_tokens=NEW)
        assert torch.equal(out, ref)
        assert rule.inconsistent == 0


@pytest.fixture(scope="module")
def unpadded():
    """Three unpadded prompts (the depth-batched and pipelined decoders take no padding)."""
    return torch.randint(1, 97, (3, PROMPT), generator=torch.Generator().manual_seed(4))


def eos_of(ref_tokens: torch.Tensor) -> int:
    """Row 0's third generated token: rows then finish apart (row 0 after three tokens, the others later or not)."""
    return int(ref_tokens[0, 2])


def unpadded_case(model, unpadded, rule_cls, with_eos):
    """The cached reference for an unpadded batch (sequences, their new tokens, exits), the EOS that makes its rows
    finish apart (or None) and a fresh rule."""
    ref, ref_exits = reference(model, unpadded, torch.ones_like(unpadded), rule_cls)
    ref_tokens = ref[:, PROMPT:]
    return ref, ref_tokens, ref_exits, (eos_of(ref_tokens) if with_eos else None), rule_cls()


@RULES
@pytest.mark.parametrize("with_eos", [False, True], ids=["all-tokens", "eos"])
def test_depth_batched(model, unpadded, rule_cls, with_eos):
    _, ref_tokens, ref_exits, eos, rule = unpadded_case(model, unpadded, rule_cls, with_eos)
    res = DepthBatchedDecoder(model, RunSettings(exit_rule=rule)).generate(unpadded, NEW, eos_token_id=eos)
    assert_rows(res.sequences[:, PROMPT:], res.exit_pass, ref_tokens, ref_exits, eos)
    assert rule.inconsistent == 0
    if rule_cls is CountsToThree and not with_eos:
        assert (res.exit_pass == 3).all()


@RULES
@pytest.mark.parametrize("with_eos", [False, True], ids=["all-tokens", "eos"])
def test_pipelined(model, unpadded, rule_cls, with_eos):
    ref, ref_tokens, ref_exits, eos, rule = unpadded_case(model, unpadded, rule_cls, with_eos)
    decoder = PipelinedSpeculativeDecoder(model, RunSettings(exit_rule=rule))
    res = decoder.generate(unpadded, NEW, eos_token_id=eos)
    assert_rows(res.sequences[:, PROMPT:], res.exit_pass, ref_tokens, ref_exits, eos)
    assert rule.inconsistent == 0
    assert decoder.stats.rejected > 0  # pass 1's drafts of random weights: entries were dropped and restarted
    if not with_eos:
        assert torch.equal(model.generate(unpadded, max_new_tokens=NEW, speculative="pipelined",
                                          settings=RunSettings(exit_rule=rule_cls())), ref)


@pytest.fixture(scope="module")
def q_model():
    """A ponderlm model with halting heads whose λ varies from token to token (Q-exit stops them at passes 1..K)."""
    torch.manual_seed(1)
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=K, halting_heads=True)).eval()
    with torch.no_grad():
        for p in model.halting_heads.parameters():
            p.normal_(0, 1.0)
    return model


def test_token_level_q_exit_in_the_depth_batched_and_pipelined_decoders(q_model, unpadded):
    settings = RunSettings(exit_rule=QExit(0.5, q_model.halting_heads))
    ones = torch.ones_like(unpadded)
    tokens, exits = cached_decode(q_model, unpadded, ones, NEW, settings)
    with torch.no_grad():
        ref = q_model.generate(unpadded, max_new_tokens=NEW, do_sample=False, settings=settings, pad_token_id=0)
    assert torch.equal(ref[:, PROMPT:], tokens)
    assert len(set(exits.flatten().tolist())) > 1  # tokens exit at different passes
    batched = DepthBatchedDecoder(q_model, settings).generate(unpadded, NEW)
    assert torch.equal(batched.sequences, ref)
    assert torch.equal(batched.exit_pass, exits)
    piped = PipelinedSpeculativeDecoder(q_model, settings).generate(unpadded, NEW)
    assert torch.equal(piped.sequences, ref)
    assert torch.equal(piped.exit_pass, exits)
