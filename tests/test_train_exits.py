"""Exits applied in training (docs/method.md A25).

- The training forward (gradients on, per-pass supervision) with a fixed set of exits gives, token for token, the
  logits and exit passes of cached decoding with the same exits (A15: a halted token's K/V reused in later passes);
  and those exits change what later tokens compute, so the match is not the trivial one of a model that ignores them.
- Sampled exits draw each token's exit pass from its exit distribution (A21); none are applied at rate 0; the same
  generator seed draws the same exits (a resumed run's steps).
- The share of tokens whose exits are applied is 0 before S0 and 1 from S1 on; the trainer's settings follow it.
"""

from __future__ import annotations

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.modeling.exit_rules import GivenExits, NoHalting, SampledExit
from adaponder.modeling.pass_heads import PassSupervision, exit_distribution_log
from adaponder.modeling.run_settings import RunSettings
from adaponder.train.schedule import exit_rate
from conftest import tiny_config

K = 4


def _model(seed=0):
    torch.manual_seed(seed)
    return AdaPonderForCausalLM(tiny_config("ponderlm", passes=K, init="pythia", halting_heads=True,
                                            consistency_heads=True))


@pytest.mark.parametrize("seed,kind", [(0, "pondernet-anchored"), (1, "pondernet"), (2, "pondernet-anchored")])
def test_training_forward_with_given_exits_equals_cached_decoding(seed, kind):
    model = _model(seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (3, 14), generator=g)
    exits = torch.randint(1, K + 1, ids.shape, generator=g)
    model.train()
    out = model(input_ids=ids[:, :-1], shift_labels=ids[:, 1:], use_cache=False, return_logits=True,
                settings=RunSettings(exit_rule=GivenExits(exits[:, :-1]), compact=False),
                pass_supervision=PassSupervision(kind))
    assert out.logits.requires_grad and torch.isfinite(out.loss)
    assert torch.equal(out.exit_pass, exits[:, :-1])
    model.eval()
    with torch.no_grad():
        full = model(input_ids=ids[:, :-1], use_cache=False, settings=RunSettings(exit_rule=NoHalting()))
        cache, logits, passes = None, [], []
        for t in range(ids.shape[1] - 1):  # A15, one token at a time, each stopping at its given pass
            step = model(ids[:, t:t + 1], cache=cache, use_cache=True,
                         settings=RunSettings(exit_rule=GivenExits(exits[:, t:t + 1])))
            cache = step.cache
            logits.append(step.logits)
            passes.append(step.exit_pass)
    torch.testing.assert_close(out.logits.detach(), torch.cat(logits, 1), rtol=0, atol=1e-5)
    assert torch.equal(torch.cat(passes, 1), exits[:, :-1])
    # the exits matter: tokens that ran every pass read the halted tokens' reused K/V, not their later passes'
    ran_all = exits[:, :-1] == K
    ran_all[:, 0] = False  # (the first token reads only itself)
    diff = (out.logits.detach() - full.logits).abs().amax(-1)
    assert diff[ran_all].max() > 1e-3


def test_sampled_exits_follow_the_exit_distribution():
    model = _model()
    with torch.no_grad():
        model.halting_heads.weight.zero_()
        model.halting_heads.bias.copy_(torch.tensor([-0.5, 0.3, -1.0]))
    ids = torch.randint(0, 97, (16, 64), generator=torch.Generator().manual_seed(5))

    def exits(rate, seed):
        with torch.no_grad():
            rule = SampledExit(model.halting_heads, rate, torch.Generator().manual_seed(seed))
            return model(input_ids=ids, use_cache=False, settings=RunSettings(exit_rule=rule)).exit_pass

    drawn = exits(1.0, 0)
    p = exit_distribution_log(model.halting_heads.bias[None].detach()).exp()[0]
    hist = torch.bincount(drawn.reshape(-1) - 1, minlength=K).float() / drawn.numel()
    assert (hist - p).abs().max() < 0.05, (hist, p)  # 1,024 draws: a few standard errors
    assert torch.equal(drawn, exits(1.0, 0))  # the same seed draws the same exits
    assert not torch.equal(drawn, exits(1.0, 1))
    assert (exits(0.0, 0) == K).all()  # nothing applied: every token runs every pass
    half = exits(0.5, 0)
    assert 0.5 * (1 - p[-1]) - 0.08 < (half < K).float().mean() < 0.5 * (1 - p[-1]) + 0.08


def test_exit_rate_ramps_from_s0_to_s1():
    assert exit_rate(0, s0=10, s1=20) == 0.0 and exit_rate(9, s0=10, s1=20) == 0.0
    assert exit_rate(15, s0=10, s1=20) == pytest.approx(0.5)
    assert exit_rate(20, s0=10, s1=20) == 1.0 and exit_rate(99, s0=10, s1=20) == 1.0
    assert exit_rate(10, s0=10, s1=10) == 1.0


def test_sampled_exits_need_a_per_pass_exit_distribution_and_leave_other_fingerprints_alone():
    from adaponder.train.config import TrainConfigError, load_config
    from conftest import REPO

    tiny = REPO / "configs" / "tiny.yaml"
    with pytest.raises(TrainConfigError) as info:
        load_config(tiny, ["model.mode=ponderlm", "schedule.train_exits=sampled"])
    assert "schedule.train_exits" in str(info.value)
    heads = ["model.mode=ponderlm", "model.halting_heads=true", "schedule.per_pass=pondernet"]
    cfg = load_config(tiny, heads + ["schedule.train_exits=sampled"])
    assert cfg.schedule.train_exits == "sampled"
    plain = load_config(tiny, heads)
    assert load_config(tiny, heads + ["schedule.train_exits=none"]).fingerprint() == plain.fingerprint()
    assert cfg.fingerprint() != plain.fingerprint()
