"""The support table, walked: every combination of mode × schedule × draft × compile × left padding × sampling
either decodes as the eager token-by-token reference (transformers' ``generate`` on the cached forward) or is
refused before any forward with one line naming the nearest combination that works.

Each combination runs on a batch of 3 whose rows finish apart at an EOS, under the threshold rule at τ = 0.5 and
under an exit rule with memory written here against the public protocol (it counts passes in ``view.carry`` and
stops every token after pass 3; a decoder that lets a row's memory leak into its next token, or loses it between
passes, gives other exit passes). Sampling is checked at ``top_k=1``, whose distribution is the greedy one: the
sampling path must then give the reference's tokens. The unit layer walks the eager combinations under the rule
with memory; the integration layer walks them under the threshold rule too, and the compiled combinations under
both (each compiles its steps; their eager twins run the same step functions).
"""

from __future__ import annotations

import pytest
import torch

from adaponder.generation import DecodingConfig, GenerationRefused, SpeculativeConfig, markdown_table
from adaponder.generation.support import MODES, Combination, every_combination, nearest, refusal
from adaponder.modeling.run_settings import RunSettings
from conftest import tiny_model

NEW = 8
PROMPT = 7


class StopsAfterThree:
    """Counts passes in its own memory; every token stops after pass 3 (padding after pass 1)."""

    needs = frozenset({"valid"})
    carries = True

    def stops(self, view):
        count = (1 if view.carry is None else view.carry + 1) + torch.zeros_like(view.active, dtype=torch.long)
        view.next_carry = count
        return (count >= 3) | ~view.valid


_SETTINGS = {"tau0.5": RunSettings(tau=0.5), "memory": RunSettings(exit_rule=StopsAfterThree())}
#: The settings of each rule: one object each, so that compiled steps (kept per model and settings) compile once.
RULES = {name: (lambda s=s: s) for name, s in _SETTINGS.items()}

_MODELS: dict = {}


def model_of(mode):
    if mode not in _MODELS:
        extra = {} if mode in ("vanilla", "pause") else {"passes": 4}
        _MODELS[mode] = tiny_model(mode, seed=8 if mode == "pause" else 5, **extra)  # (continuations that vary)
    return _MODELS[mode]


def batch(padded: bool):
    """Three prompts of 7 tokens, left-padded by 0, 2 and 4 positions when ``padded``."""
    ids = torch.randint(1, 97, (3, PROMPT), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :2] = 0
        mask[2, :4] = 0
    return ids.masked_fill(mask == 0, 0), mask


_REFERENCE: dict = {}


def finishing_apart(new: torch.Tensor) -> int:
    """A token of the greedy continuations ``new`` ``[B, n]`` that, taken as EOS, ends the rows after different
    numbers of tokens, none before its second token."""
    for token in new[:, 1:-1].flatten().tolist():
        ends = [(row[:].tolist() + [token]).index(token) + 1 for row in new]
        if min(ends) >= 2 and len(set(ends)) > 1:
            return token
    raise AssertionError(f"no token of {new.tolist()} ends the rows apart")


def reference(mode, padded, rule):
    """The eager token-by-token reference, with an EOS at which its rows finish apart."""
    key = (mode, padded, rule)
    if key not in _REFERENCE:
        model, (ids, mask) = model_of(mode), batch(padded)
        with torch.no_grad():
            free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                  settings=RULES[rule]())
        eos = finishing_apart(free[:, PROMPT:])
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
                             decoding=DecodingConfig(), settings=RULES[rule]())
        with torch.no_grad():
            plain = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                                   pad_token_id=0, settings=RULES[rule]())
        assert torch.equal(out.sequences, plain)  # decoding=DecodingConfig() is transformers' generate
        assert len(set(out.new_tokens.tolist())) > 1 and int(out.new_tokens.min()) >= 2  # rows finish apart
        if rule == "memory" and mode != "pause":
            K = model.config.num_passes
            assert set(out.exit_pass[out.exit_pass > 0].tolist()) == {min(3, K)}
        _REFERENCE[key] = (out, eos)
    return _REFERENCE[key]


def run(c: Combination, rule: str):
    model, (ids, mask) = model_of(c.mode), batch(c.padded)
    _, eos = reference(c.mode, c.padded, rule)
    decoding = DecodingConfig(c.schedule, SpeculativeConfig(draft_passes=1, draft_tokens=3) if c.draft else None,
                              c.compile)
    sampling = dict(do_sample=True, top_k=1, generator=torch.Generator().manual_seed(0)) if c.sampling else {}
    if c.sampling and not c.draft:
        sampling.pop("generator")  # transformers' generate draws from the global generator
    return model.generate(ids, attention_mask=mask if c.padded else None, max_new_tokens=NEW, eos_token_id=eos,
                          pad_token_id=0, decoding=decoding, settings=RULES[rule](), **sampling)


def check(c: Combination, rule: str):
    model = model_of(c.mode)
    reference(c.mode, c.padded, rule)  # (its forwards before the hook that counts them)
    if refusal(c) is not None:
        calls = []
        hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
        try:
            with pytest.raises(GenerationRefused) as err:
                run(c, rule)
        finally:
            hook.remove()
        line = str(err.value)
        assert "\n" not in line and "nearest that works: " in line and nearest(c).spelled() in line
        assert not calls, "refused after a forward"
        return
    ref, _ = reference(c.mode, c.padded, rule)
    out = run(c, rule)
    assert torch.equal(out.sequences, ref.sequences), (c, out.strategy)
    assert torch.equal(out.exit_pass, ref.exit_pass), (c, out.strategy)
    assert torch.equal(out.new_tokens, ref.new_tokens)


EAGER = [c for c in every_combination() if not c.compile]
COMPILED = [c for c in every_combination() if c.compile]


def _id(c: Combination) -> str:
    return "-".join([c.mode, c.schedule] + [w for w, on in (("draft", c.draft), ("pad", c.padded),
                                                             ("sample", c.sampling)) if on])


@pytest.mark.parametrize("c", EAGER, ids=_id)
def test_every_eager_combination_decodes_as_the_reference_or_is_refused_in_one_line(c):
    check(c, "memory")  # the rule with memory: the one that tells a strategy's layouts apart


@pytest.mark.integration
@pytest.mark.parametrize("c", EAGER, ids=_id)
def test_every_eager_combination_decodes_as_the_reference_under_the_threshold_rule(c):
    check(c, "tau0.5")


@pytest.mark.integration
@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("c", [c for c in COMPILED if refusal(c) is None], ids=_id)
def test_every_compiled_combination_decodes_as_the_reference(c, rule):
    check(c, rule)


@pytest.mark.parametrize("c", [c for c in COMPILED if refusal(c) is not None], ids=_id)
def test_unsupported_compiled_combinations_are_refused_before_compiling(c):
    check(c, "memory")


def test_the_table_has_every_combination_decided_and_a_way_for_every_mode():
    lines = markdown_table().splitlines()
    assert len(lines) == 2 + 12  # schedule × draft × compile
    for mode in MODES:
        assert refusal(Combination(mode)) is None  # the reference runs everywhere
        for c in every_combination((mode,)):
            assert refusal(nearest(c)) is None


def test_the_readme_table_is_the_generated_one():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert markdown_table() in readme, "README's support table differs from adaponder.generation.markdown_table()"


def test_old_spellings_still_decode_and_return_the_sequences():
    model, (ids, mask) = model_of("ponderlm"), batch(True)
    settings = RunSettings(tau=0.5)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                             settings=settings)
    old = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, settings=settings,
                         speculative=SpeculativeConfig(draft_tokens=2))
    assert isinstance(old, torch.Tensor) and torch.equal(old, ref)
    assert not hasattr(model, "speculative_stats")  # nothing is left on the model
    unpadded, _ = batch(False)
    with torch.no_grad():
        ref = model.generate(unpadded, max_new_tokens=NEW, do_sample=False, pad_token_id=0, settings=settings)
    assert torch.equal(model.generate(unpadded, max_new_tokens=NEW, pad_token_id=0, settings=settings,
                                      speculative="pipelined"), ref)


def test_contradicting_spellings_are_refused():
    model, (ids, _) = model_of("ponderlm"), batch(False)
    with pytest.raises(TypeError, match="give decoding= alone"):
        model.generate(ids, decoding=DecodingConfig(), speculative=SpeculativeConfig())
    with pytest.raises(TypeError, match="disagree"):
        model.generate(ids, decoding=DecodingConfig(), settings=RunSettings(compile=True))
    with pytest.raises(TypeError, match="schedule must be one of"):
        DecodingConfig(schedule="tokens")
    with pytest.raises(TypeError, match="takes attention_mask"):
        model.generate(ids, decoding=DecodingConfig(schedule="depth"), num_beams=2)
