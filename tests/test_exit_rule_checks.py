"""Exit rules are checked where they enter and after every pass; run-time config objects check their fields.

A rule's ``needs`` names only fields the driver knows (a misspelling is named with the closest one); its answer after
each pass is a boolean tensor of the view's shape — a float answer (0.3, which a cast would read as True and stop
every token silently), a wrong shape or a non-tensor is one :class:`ExitRuleError` naming the rule's class, what it
returned and what was expected, in every decoder (the check sits in the one exit step they share). ``RunSettings``
and ``SpeculativeConfig`` check every field's type and range when built: one :class:`SettingsError` naming each bad
field (bools are not integers).
"""

from __future__ import annotations

import pytest
import torch

from adaponder.errors import UsageError, is_user_error
from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.exit_rules import ExitRuleError, NoHalting, check_rule
from adaponder.generation.pass_pipeline import PipelinedSpeculativeDecoder
from adaponder.modeling.run_settings import RunSettings, SettingsError
from adaponder.generation.speculative import SelfSpeculativeDecoder, SpeculativeConfig
from adaponder.generation.static_decoding import StaticDecoder
from conftest import tiny_config


# -- needs, where the rule enters ---------------------------------------------------------------------------------
class MisspeltNeeds:
    needs = frozenset({"vaild"})
    carries = False

    def stops(self, view):
        return torch.zeros_like(view.active)


class NeedsAString(MisspeltNeeds):
    needs = "valid"


def test_a_misspelt_need_is_named_with_the_closest_known_field():
    with pytest.raises(ExitRuleError, match=r"MisspeltNeeds: needs names an unknown field 'vaild' "
                                            r"\(did you mean 'valid'\?\)") as err:
        RunSettings(exit_rule=MisspeltNeeds())
    assert isinstance(err.value, UsageError) and is_user_error(err.value)
    assert str(err.value).count("\n") == 0
    with pytest.raises(ExitRuleError, match="MisspeltNeeds"):
        check_rule(MisspeltNeeds())


def test_needs_must_be_a_set_of_names():
    with pytest.raises(ExitRuleError, match="NeedsAString: needs must be a set of field names.*got str 'valid'"):
        RunSettings(exit_rule=NeedsAString())


def test_the_classifier_checks_a_rule_where_it_enters():
    from adaponder.palbert.classifier import AdaPonderForSequenceClassification, PalbertConfig

    cfg = PalbertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                        vocab_size=97, max_position_embeddings=64, mode="ponderlm", palbert_passes=2, num_labels=2)
    clf = AdaPonderForSequenceClassification(cfg).eval()
    with pytest.raises(ExitRuleError, match="MisspeltNeeds"):
        clf.predict(torch.randint(0, 97, (2, 5)), rule=MisspeltNeeds())


# -- answers, after every pass --------------------------------------------------------------------------------------
class FloatAnswer:
    """Answers 0.3 everywhere: a probability, not a decision. With ``on_ticks`` only where elements sit at different
    passes (the depth-batched and pipelined decoders' ticks), so those are shown to check too."""

    needs = frozenset()
    carries = False
    on_ticks = False

    def stops(self, view):
        if self.on_ticks and not isinstance(view.pass_idx, torch.Tensor):
            return torch.zeros_like(view.active)
        return torch.full(view.active.shape, 0.3)


class WrongShape(FloatAnswer):
    def stops(self, view):
        if self.on_ticks and not isinstance(view.pass_idx, torch.Tensor):
            return torch.zeros_like(view.active)
        return torch.zeros(view.active.numel() + 1, dtype=torch.bool)


class NotATensor(FloatAnswer):
    def stops(self, view):
        if self.on_ticks and not isinstance(view.pass_idx, torch.Tensor):
            return torch.zeros_like(view.active)
        return True


EXPECTED = {FloatAnswer: r"returned a torch\.float32 tensor of shape .*; expected a torch\.bool tensor of the "
                         r"view's shape .*compare it",
            WrongShape: r"returned a torch\.bool tensor of shape \(\d+,\); expected a torch\.bool tensor of the "
                        r"view's shape \(",
            NotATensor: r"returned bool True; expected a torch\.bool tensor of the view's shape"}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AdaPonderForCausalLM(tiny_config("adaponder", passes=3)).eval()


IDS = torch.randint(1, 97, (2, 5), generator=torch.Generator().manual_seed(0))


def _forward(model, s):
    model(IDS, settings=s)


def _training_forward(model, s):
    model.train()
    try:
        with torch.enable_grad():
            model(IDS, labels=IDS, settings=s)
    finally:
        model.eval()


DECODERS = {
    "forward": _forward,
    "training-forward": _training_forward,
    "generate": lambda model, s: model.generate(IDS, max_new_tokens=2, do_sample=False, settings=s, pad_token_id=0),
    "static": lambda model, s: StaticDecoder(model, s, per_pass=False).generate(IDS, max_new_tokens=2),
    "draft-then-verify": lambda model, s: SelfSpeculativeDecoder(model, SpeculativeConfig(1, 2), s).generate(
        IDS, max_new_tokens=3),
}
TICK_DECODERS = {
    "depth-batched": lambda model, s: DepthBatchedDecoder(model, s).generate(IDS, 4),
    "pipelined": lambda model, s: PipelinedSpeculativeDecoder(model, s).generate(IDS, 4),
}


@pytest.mark.parametrize("rule_cls", [FloatAnswer, WrongShape, NotATensor])
@pytest.mark.parametrize("where", list(DECODERS) + list(TICK_DECODERS))
def test_a_bad_answer_is_one_error_naming_the_rule_in_every_decoder(model, rule_cls, where):
    rule = rule_cls()
    rule.on_ticks = where in TICK_DECODERS
    run = {**DECODERS, **TICK_DECODERS}[where]
    with torch.no_grad(), pytest.raises(ExitRuleError, match=f"exit rule {rule_cls.__name__}: stops\\(view\\).* "
                                                             f"{EXPECTED[rule_cls]}") as err:
        run(model, RunSettings(exit_rule=rule))
    assert isinstance(err.value, UsageError) and is_user_error(err.value)
    # the tick decoders' rows sit at their own passes: the answer was checked there, not only in the prefill
    assert ("each element at its own pass" in str(err.value)) == (where in TICK_DECODERS)


class ScalarMemory:
    needs = frozenset()
    carries = True

    def stops(self, view):
        view.next_carry = torch.tensor(1)
        return torch.zeros_like(view.active)


def test_memory_that_does_not_follow_the_elements_is_named(model):
    expected = (r"ScalarMemory: the memory it wrote \(view\.next_carry\) is a torch\.int64 tensor of shape \(\); "
                r"expected a tensor whose leading dimensions are the view's shape")
    with torch.no_grad(), pytest.raises(ExitRuleError, match=expected):
        model(IDS, settings=RunSettings(exit_rule=ScalarMemory()))


class UndeclaredMemory(ScalarMemory):
    carries = False

    def stops(self, view):
        view.next_carry = torch.zeros(view.active.shape)
        return torch.zeros_like(view.active)


def test_memory_of_a_rule_that_does_not_declare_it_is_named(model):
    with torch.no_grad(), pytest.raises(ExitRuleError, match=r"UndeclaredMemory: the memory it wrote .* is set, but "
                                                             r"the rule does not declare carries = True"):
        model(IDS, settings=RunSettings(exit_rule=UndeclaredMemory()))


def test_good_rules_still_run(model):
    with torch.no_grad():
        out = model(IDS, settings=RunSettings(exit_rule=NoHalting()))
    assert (out.exit_pass == 3).all()


# -- run-time config objects ----------------------------------------------------------------------------------------
def test_speculative_config_names_a_fractional_draft_length():
    with pytest.raises(SettingsError, match=r"^SpeculativeConfig: draft_tokens must be an integer >= 1, got 2\.5 "
                                            r"\(float\)$") as err:
        SpeculativeConfig(draft_tokens=2.5)
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError) and is_user_error(err.value)


def test_speculative_config_names_every_bad_field_at_once():
    with pytest.raises(SettingsError) as err:
        SpeculativeConfig(draft_passes=True, draft_tokens=0, adaptive="yes", probe_every=2.0, min_gain=float("nan"))
    message = str(err.value)
    assert message.startswith("SpeculativeConfig: 5 bad fields: ") and "\n" not in message
    for part in ("draft_passes must be an integer >= 1, got True (bool)", "draft_tokens must be an integer >= 1, got 0",
                 "adaptive must be True or False, got 'yes' (str)", "probe_every must be an integer >= 1, got 2.0",
                 "min_gain must be a number > 0, got nan"):
        assert part in message
    assert err.value.problems and len(err.value.problems) == 5


def test_speculative_config_keeps_its_cross_field_and_model_checks():
    with pytest.raises(SettingsError, match=r"max_draft_tokens \(2\) must be >= draft_tokens \(4\) when adaptive"):
        SpeculativeConfig(draft_tokens=4, adaptive=True, max_draft_tokens=2)
    SpeculativeConfig(draft_tokens=4, max_draft_tokens=2)  # not adaptive: the bound does not apply
    with pytest.raises(SettingsError, match=r"draft_passes must lie in \[1, K\) = \[1, 3\), got 3"):
        SpeculativeConfig(draft_passes=3).check(3)
    assert SpeculativeConfig(draft_tokens=torch.tensor(3).item()).draft_tokens == 3


def test_run_settings_name_every_bad_field_at_once():
    with pytest.raises(SettingsError) as err:
        RunSettings(tau=1, passes=True, compact="always", chunk_size=2.0, recompute="no", compile=1)
    message = str(err.value)
    assert message.startswith("RunSettings: 6 bad fields: ") and "\n" not in message
    for part in ("τ (tau, the halting threshold of A6) must lie in (0, 1), got 1 (int)",
                 "passes must be an integer >= 1 or None, got True (bool)",
                 "compact must be True, False or 'auto', got 'always'",
                 "chunk_size (0 = the default block) must be an integer >= 0, got 2.0 (float)",
                 "recompute must be True or False, got 'no' (str)", "compile must be True or False, got 1 (int)"):
        assert part in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError) and is_user_error(err.value)


def test_run_settings_name_a_bad_rule_with_the_other_bad_fields():
    with pytest.raises(SettingsError, match=r"RunSettings: 2 bad fields: exit rule MisspeltNeeds: .*'vaild'.*; "
                                            r"passes must be an integer >= 1 or None, got 0"):
        RunSettings(passes=0, exit_rule=MisspeltNeeds())
    with pytest.raises(ExitRuleError, match="exit_rule must be an ExitRule .*got function"):
        RunSettings(exit_rule=lambda view: None)


def test_good_settings_are_kept():
    s = RunSettings(tau=0.25, passes=2, compact="auto", chunk_size=0, recompute=False, compile=False)
    assert (s.tau, s.passes, s.chunk_size) == (0.25, 2, 0) and type(s.passes) is int
    assert s.replace(passes=None).passes is None
