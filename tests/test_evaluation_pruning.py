"""Fixed pruning (iso-FLOPs control): target histograms, per-pass rates, and the realised mean exit pass."""

import math

import numpy as np
import pytest
import torch

from adaponder.evaluation.pruning import (
    FixedPruningPolicy,
    geometric_histogram,
    halting_rates,
    histogram_mean,
    make_policy,
    uniform_histogram,
)


@pytest.mark.parametrize("K", [2, 4, 6])
@pytest.mark.parametrize("frac", [0.0, 0.1, 0.35, 0.5, 0.8, 0.95, 1.0])
def test_target_histograms_have_the_requested_mean_and_shape(K, frac):
    D = 1.0 + frac * (K - 1)
    uni = uniform_histogram(K, D)
    geo, p = geometric_histogram(K, D)
    for hist in (uni, geo):
        assert len(hist) == K and min(hist) >= -1e-12 and math.isclose(sum(hist), 1.0, abs_tol=1e-12)
        assert math.isclose(histogram_mean(hist), D, abs_tol=1e-9)
    # uniform: equal mass on the early exits (D >= (K+1)/2) or on the late ones (D < (K+1)/2)
    interior = uni[:-1] if D >= (K + 1) / 2 else uni[1:]
    assert max(interior) - min(interior) < 1e-12
    # geometric: constant halting rate p, i.e. P(i+1) = (1-p) P(i) before the truncation at K
    for i in range(K - 2):
        assert math.isclose(geo[i + 1], (1 - p) * geo[i], rel_tol=1e-9, abs_tol=1e-15)
    rates = halting_rates(geo)
    assert all(math.isclose(r, p, abs_tol=1e-9) for r in rates if 0 < D < K)


def test_uniform_at_the_midpoint_is_uniform_over_all_passes():
    assert uniform_histogram(4, 2.5) == pytest.approx([0.25] * 4)


def test_means_outside_one_to_k_are_rejected():
    with pytest.raises(ValueError):
        uniform_histogram(4, 4.5)
    with pytest.raises(ValueError):
        geometric_histogram(4, 0.5)
    with pytest.raises(ValueError):
        make_policy("uniform", 4, None)
    assert make_policy("learned", 4, None) is None


def _simulate(policy, K, n_tokens, batch=(8, 64), pad_fraction=0.1, seed=1):
    """Exit passes of ``n_tokens`` non-padding tokens run through ``policy`` batch by batch (as the model does, by
    the pass driver's exit step)."""
    from adaponder.modeling.exit_rules import PassView
    from adaponder.modeling.pass_driver import exit_step

    g = torch.Generator().manual_seed(seed)
    exits = []
    while sum(e.numel() for e in exits) < n_tokens:
        valid = torch.rand(batch, generator=g) >= pad_fraction
        active = torch.ones(batch, dtype=torch.bool)
        exit_pass = torch.ones(batch, dtype=torch.long)
        for i in range(1, K):
            view = PassView(pass_idx=i, num_passes=K, active=active, gate=torch.rand(batch, generator=g), valid=valid)
            nxt = exit_step(policy, view)
            assert not bool((nxt & ~active).any()), "a halted token came back"
            exit_pass += nxt.long()
            active = nxt
        exits.append(exit_pass[valid])
    return torch.cat(exits).numpy()


@pytest.mark.parametrize("rule", ["uniform", "geometric"])
@pytest.mark.parametrize("D", [1.3, 2.2, 3.0, 3.8])
def test_fixed_pruning_hits_the_target_mean_within_2_percent(rule, D):
    K = 4
    policy = FixedPruningPolicy.from_rule(rule, K, D, seed=0)
    exits = _simulate(policy, K, 20_000)
    assert abs(exits.mean() - D) / D < 0.02
    realised = np.bincount(exits, minlength=K + 1)[1:] / len(exits)
    assert np.abs(realised - np.array(policy.histogram)).max() < 0.02  # the histogram's shape, not only its mean


def test_policy_is_reproducible_with_its_seed():
    a = FixedPruningPolicy.from_rule("geometric", 4, 2.0, seed=3)
    first = _simulate(a, 4, 2000)
    a.reset()
    assert np.array_equal(first, _simulate(a, 4, 2000))
    b = FixedPruningPolicy.from_rule("geometric", 4, 2.0, seed=4)
    assert not np.array_equal(first, _simulate(b, 4, 2000))


def test_fixed_pruning_through_the_model_hits_the_target():
    from adaponder.modeling import AdaPonderForCausalLM
    from adaponder.modeling.run_settings import RunSettings
    from conftest import tiny_config

    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", gate_init_bias=0.0)).eval()
    ids = torch.randint(0, 97, (16, 128))
    with torch.no_grad():
        for rule in ("uniform", "geometric"):
            policy = FixedPruningPolicy.from_rule(rule, 4, 2.7, seed=0)
            exits = torch.cat([model(input_ids=ids[i:i + 4], settings=RunSettings(exit_rule=policy)).exit_pass.reshape(-1)
                               for i in range(0, 16, 4)]).float()
            assert abs(float(exits.mean()) - 2.7) / 2.7 < 0.02, rule
