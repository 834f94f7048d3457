"""The measured choice between compacting the active tokens and a dense masked pass (``RunSettings(compact="auto")``):
the same results whichever way runs, dense where compaction measures dearer, compaction again after a probe."""

from __future__ import annotations

import pytest
import torch

from adaponder.modeling.compaction_choice import CompactionChoice
from adaponder.modeling.run_settings import RunSettings
from helpers_decoding import gated_model

CPU = torch.device("cpu")


def test_compaction_runs_until_measured_then_the_cheaper_way_and_probes_again():
    choice = CompactionChoice(probe_every=2)
    total = 64
    assert choice.wants_timing(CPU, total, compact=False)  # pass 1 is dense: the dense cost is measured first
    choice.record(CPU, total, False, total, 1.0)
    assert choice.choose(CPU, total, 40) and choice.wants_timing(CPU, total, compact=True)  # not yet measured
    choice.record(CPU, total, True, 40, 2.0)  # compaction of 40 of 64 tokens took twice a dense pass
    ways = [choice.choose(CPU, total, 40) for _ in range(7)]
    assert ways == [False, True, False, False, False, True, False]  # probes after 2, then 4 decisions (doubling)
    assert choice.probing is False
    ways = [choice.choose(CPU, total, 40) for _ in range(7)]
    assert ways == [False] * 6 + [True]  # the third probe comes 8 decisions after the second
    assert choice.probing and choice.wants_timing(CPU, total, compact=True)
    choice.record(CPU, total, True, 10, 0.1)  # few tokens now: compaction is cheap (the line through both points)
    assert choice.choose(CPU, total, 10) and not choice.probing
    assert choice.choose(CPU, total, 12)


def test_the_linear_fit_predicts_from_compacted_passes_of_several_sizes():
    choice = CompactionChoice()
    choice.record(CPU, 256, False, 256, 1.0)
    choice.record(CPU, 256, True, 64, 0.5)   # overhead 0.3 + 0.003125 per token
    choice.record(CPU, 256, True, 192, 0.9)
    size = choice.sizes[("cpu", 256 .bit_length())]
    assert size.predicted_compacted(128) == pytest.approx(0.7)
    assert choice.choose(CPU, 256, 200)        # 0.925 < 1.0
    assert not choice.choose(CPU, 256, 240)    # 1.05 > 1.0
    assert ("cpu", 300 .bit_length()) == ("cpu", 256 .bit_length())  # grids within a factor of two share


@pytest.fixture(scope="module")
def gated():
    return gated_model(passes=4)  # gates that halt a share of the tokens at τ = 0.5


def _subsets(model, ids, mask, settings):
    """The ``subset`` argument of every pass the forward runs (None: a dense pass), and the output."""
    seen = []
    plain = model.run_pass

    def spy(*args, **kwargs):
        seen.append(args[5] if len(args) > 5 else kwargs.get("subset"))
        return plain(*args, **kwargs)

    model.run_pass = spy
    try:
        with torch.no_grad():
            out = model(ids, attention_mask=mask, settings=settings)
    finally:
        del model.run_pass
    return seen, out


@pytest.mark.parametrize("compaction_costs", [0.01, 100.0])
def test_auto_compacts_or_runs_dense_as_measured_with_identical_results(gated, compaction_costs):
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    choice = CompactionChoice(probe_every=1000)
    total = ids.numel()
    choice.record(CPU, total, False, total, 1.0)
    for n in (10, 30):  # measured compacted passes: per token far cheaper, or far dearer, than a dense pass
        choice.record(CPU, total, True, n, compaction_costs * n / total)
    gated._compaction_choice = choice
    try:
        auto_seen, auto = _subsets(gated, ids, mask, RunSettings(tau=0.5, compact="auto"))
    finally:
        del gated._compaction_choice
    _, dense = _subsets(gated, ids, mask, RunSettings(tau=0.5, compact=False))
    compact_seen, compacted = _subsets(gated, ids, mask, RunSettings(tau=0.5, compact=True))
    assert any(s is not None for s in compact_seen)  # tokens halt: compaction has something to skip
    if compaction_costs < 1:
        assert [s is None for s in auto_seen] == [s is None for s in compact_seen]
    else:
        assert all(s is None for s in auto_seen)  # dense every pass
    assert torch.equal(auto.exit_pass, dense.exit_pass) and torch.equal(auto.exit_pass, compacted.exit_pass)
    torch.testing.assert_close(auto.logits, dense.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(auto.logits, compacted.logits, rtol=1e-5, atol=1e-5)


def test_a_bad_compact_setting_is_named():
    with pytest.raises(ValueError, match="compact must be True, False or 'auto', got 'always'"):
        RunSettings(compact="always")
    with pytest.raises(ValueError, match="compact must be True, False or 'auto', got 1"):
        RunSettings(compact=1)
