"""Heads that read the passes (docs/method.md A21–A24) and the exit rules built on them.

- The per-pass losses reach every pass: PonderNet's exit-distribution loss (A21) sends gradient into every pass's
  states and every halting head; its detached form (A22) and the consistency and draft heads (A23, A24) train their
  heads while the backbone's gradients stay exactly plain PonderLM's.
- Token-level Q-exit on given λ is PALBERT's Q-exit (B9) computed per example on the same values; through the
  model's forward it stops each token where ``q_exit(exit_distribution(λ))`` says.
- The calibrated consistency exit, on a synthetic model whose disagreement curve is known, keeps the true
  disagreement ≤ δ in at least the stated share of calibration draws (and does stop tokens early).
- A ``ponderlm`` with every head (the draft included) computes PonderLM's forward: the same logits as the plain
  model with its weights; self-speculative decoding with the draft head gives ordinary greedy decoding's tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adaponder.evaluation.exit_calibration import choose_threshold, hoeffding_bentkus_p_value
from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError, AdaPonderForCausalLM
from adaponder.modeling.exit_rules import ConsistencyExit, PassView, QExit
from adaponder.modeling.pass_heads import PassSupervision
from adaponder.modeling.run_settings import RunSettings
from adaponder.generation.speculative import SpeculativeConfig
from adaponder.palbert.pondernet import exit_distribution, q_exit
from conftest import tiny_config

K = 4
HEADS = dict(halting_heads=True, consistency_heads=True, draft_head=True, redraft_head=True, early_redraft_heads=True)


def _model(**extra):
    torch.manual_seed(0)
    return AdaPonderForCausalLM(tiny_config("ponderlm", passes=K, init="pythia", **extra))


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))


def _backbone_grads(model, ids, supervision=None, with_heads=True):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids[:, :-1], shift_labels=ids[:, 1:], use_cache=False, return_logits=False,
                pass_supervision=supervision)
    loss = out.loss + (sum(out.aux_losses.values()) if with_heads and out.aux_losses else 0)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if n.startswith("gpt_neox") and p.grad is not None}


def test_pondernet_loss_reaches_every_pass_and_every_halting_head(ids):
    model = _model(halting_heads=True)
    states = []
    original = model.run_pass

    def recording(*args, **kwargs):  # keep each pass's output state and its gradient
        h, pre = original(*args, **kwargs)
        h.retain_grad()
        states.append(h)
        return h, pre

    model.run_pass = recording
    out = model(input_ids=ids[:, :-1], shift_labels=ids[:, 1:], use_cache=False, return_logits=False,
                pass_supervision=PassSupervision("pondernet"))
    (out.loss + sum(out.aux_losses.values())).backward()
    assert len(states) == K
    for i, h in enumerate(states, 1):  # the expected loss scores pass i through its own logits (A21)
        assert h.grad is not None and h.grad.abs().sum() > 0, f"no gradient reached pass {i}"
    grad = model.halting_heads.weight.grad
    assert grad is not None and (grad.abs().sum(1) > 0).all()  # every pass's halting head learns
    assert "halting_kl" in out.aux_losses


def test_detached_supervision_and_the_heads_leave_the_backbone_as_plain_ponderlm(ids):
    plain = _model()
    reference = _backbone_grads(plain, ids)
    model = _model(**HEADS)
    model.load_state_dict(plain.state_dict(), strict=False)
    got = _backbone_grads(model, ids, PassSupervision("pondernet-detached"))
    assert reference.keys() == got.keys()
    for name in reference:  # A22–A24 add no gradient to the shared weights
        torch.testing.assert_close(got[name], reference[name], rtol=1e-5, atol=1e-7)
    for name in ("halting_heads.weight", "consistency_heads.weight", "draft_head.fc_out.weight",
                 "redraft_head.fc_out.weight", "early_redraft_heads.0.fc_out.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    # while the attached form changes them: early passes are scored on the final target
    changed = _backbone_grads(model, ids, PassSupervision("pondernet"))
    assert any(not torch.allclose(changed[n], reference[n]) for n in reference)


@pytest.mark.integration
def test_ponderlm_with_every_head_computes_ponderlms_forward(ids):
    plain = _model().eval()
    model = _model(**HEADS).eval()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in plain.state_dict().items())  # same backbone init
    with torch.no_grad():
        model.draft_head.fc_out.weight.normal_()  # a trained draft: nothing of it may reach the forward
        a, b = plain(ids), model(ids)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.exit_pass, b.exit_pass)
    prompt = ids[:1, :5]
    ordinary = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    drafted = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0,
                             speculative=SpeculativeConfig(1, 3))
    assert torch.equal(drafted, ordinary)
    compiled = model.generate(prompt, max_new_tokens=10, pad_token_id=0, speculative=SpeculativeConfig(1, 3),
                              settings=RunSettings(compile=True))
    assert torch.equal(compiled, ordinary)
    with torch.no_grad():  # the draft reads the draft head: pass 1's own logits are not what it drafts
        h = torch.randn(3, model.config.hidden_size)
        assert not torch.allclose(model.draft_logits(h), model.lm_head(h))
        assert torch.equal(model.draft_logits(h, draft_passes=2), model.lm_head(h))


def test_token_level_q_exit_is_the_classifiers_q_exit_on_the_same_values():
    g = torch.Generator().manual_seed(0)
    lam = torch.rand(500, K - 1, generator=g)
    lam[:50] = torch.tensor([0.5, 0.0, 0.25])  # exact ties with q: Σ p reaches 0.5 at pass 1, not beyond it
    for q in (0.3, 0.5, 0.75):
        offline = q_exit(exit_distribution(torch.cat([lam, torch.ones(500, 1)], 1)), q) + 1  # per example (B9)
        rule, carry, exits = QExit(q, head=lambda h: h), None, torch.full((500,), K)
        active = torch.ones(500, dtype=torch.bool)
        for i in range(1, K):  # per token, pass by pass, as the pass driver calls it
            view = PassView(pass_idx=i, num_passes=K, active=active, hidden=torch.logit(lam[:, i - 1]).double(),
                            carry=carry)
            stop = rule.stops(view) & active
            exits[stop] = i
            active = active & ~stop
            carry = view.next_carry
        assert torch.equal(exits, offline), q


def test_q_exit_through_the_forward_stops_where_the_exit_distribution_says(ids):
    model = _model(halting_heads=True).eval()
    with torch.no_grad():  # λ_i fixed per pass: 0.2, 0.3, 0.6 -> Σ p = 0.2, 0.44, 0.776
        model.halting_heads.weight.zero_()
        model.halting_heads.bias.copy_(torch.logit(torch.tensor([0.2, 0.3, 0.6])))
        for q, expected in ((0.1, 1), (0.3, 2), (0.5, 3), (0.9, 4)):
            out = model(ids, settings=RunSettings(exit_rule=QExit(q, model.halting_heads)))
            assert (out.exit_pass == expected).all(), (q, out.exit_pass)


def test_consistency_exit_stops_above_its_threshold(ids):
    model = _model(consistency_heads=True).eval()
    with torch.no_grad():
        model.consistency_heads.weight.zero_()
        model.consistency_heads.bias.copy_(torch.logit(torch.tensor([0.5, 0.9, 0.99])))
        for t, expected in ((0.4, 1), (0.7, 2), (0.95, 3), (1.0, 4)):
            out = model(ids, settings=RunSettings(exit_rule=ConsistencyExit(t, model.consistency_heads)))
            assert (out.exit_pass == expected).all(), t
    with pytest.raises(ValueError, match="threshold"):
        ConsistencyExit(1.5, model.consistency_heads)


def _true_risk(t: float) -> float:
    """The synthetic model: a token's score s ~ U(0, 1); it exits when s > t; an exiting token disagrees with
    probability g(s) = 0.4·(1 − s). Risk(t) = ∫_t^1 0.4 (1 − s) ds = 0.2 (1 − t)²."""
    return 0.2 * (1.0 - t) ** 2


def _draw_risks(rng, windows: int, tokens: int, thresholds) -> np.ndarray:
    s = rng.random((windows, tokens))
    wrong = rng.random((windows, tokens)) < 0.4 * (1 - s)
    return np.stack([((s > t) & wrong).mean(1) for t in thresholds], axis=1)


def test_calibrated_threshold_keeps_the_disagreement_within_delta_at_the_stated_confidence():
    delta, confidence, draws = 0.05, 0.9, 300
    thresholds = [1.0 - k / 40 for k in range(41)]  # most conservative first
    rng = np.random.default_rng(0)
    chosen = [choose_threshold(_draw_risks(rng, 200, 32, thresholds), thresholds, delta, 1 - confidence)[0]
              for _ in range(draws)]
    risks = np.array([_true_risk(t) for t in chosen])
    violations = float((risks > delta).mean())
    # the guarantee: P(risk > δ) ≤ ε; with 300 draws, allow three standard errors of a rate ε
    eps = 1 - confidence
    assert violations <= eps + 3 * math.sqrt(eps * (1 - eps) / draws), violations
    # and it is not the trivial rule: it stops tokens early, spending a good part of the tolerance
    assert np.mean(chosen) < 0.75 and risks.mean() > 0.3 * delta
    # the best threshold the procedure could aim for is t* = 1 − sqrt(δ / 0.2) = 0.5: it stays above it
    assert min(chosen) >= 1 - math.sqrt(delta / 0.2) - 0.1


def test_p_values_and_the_fixed_sequence():
    assert hoeffding_bentkus_p_value(0.06, 100, 0.05) == 1.0  # r̂ ≥ δ: never rejected
    assert hoeffding_bentkus_p_value(0.0, 1000, 0.05) < 1e-10
    assert hoeffding_bentkus_p_value(0.02, 50, 0.05) > hoeffding_bentkus_p_value(0.02, 500, 0.05)
    risks = np.array([[0.0, 0.0, 0.2, 0.0]] * 400)  # the third threshold fails: testing stops there
    assert choose_threshold(risks, [0.9, 0.8, 0.7, 0.6], 0.05, 0.05) == (0.8, 1)
    assert choose_threshold(np.ones((10, 2)), [0.9, 0.8], 0.05, 0.05) == (1.0, None)


def test_heads_need_a_looped_model_and_halting_heads_no_gates():
    base = {k: v for k, v in tiny_config("ponderlm").to_diff_dict().items() if k in AdaPonderConfig.known_keys()}
    with pytest.raises(AdaPonderConfigError, match="'draft_head' reads the passes of a looped model"):
        AdaPonderConfig.from_mapping({**base, "mode": "vanilla", "passes": 1, "draft_head": True})
    with pytest.raises(AdaPonderConfigError, match="'redraft_head' reads pass K−1, which at passes=2 is pass 1"):
        AdaPonderConfig.from_mapping({**base, "passes": 2, "redraft_head": True})
    with pytest.raises(AdaPonderConfigError, match="set 'redraft_head: true' too") as err:
        AdaPonderConfig.from_mapping({**base, "passes": 3, "early_redraft_heads": True})
    assert "none at passes=3" in str(err.value)  # every problem in one error
    with pytest.raises(AdaPonderConfigError, match="mode 'adaponder' halts by its gates"):
        AdaPonderConfig.from_mapping({**base, "mode": "adaponder", "halting_heads": True})
    with pytest.raises(ValueError, match="halting heads"):
        _model()(torch.ones(1, 4, dtype=torch.long), labels=torch.ones(1, 4, dtype=torch.long),
                 pass_supervision=PassSupervision("pondernet"))


def test_a_draft_head_trained_on_the_frozen_model_learns_and_changes_nothing_else():
    from adaponder.train.draft_head import draft_agreement, train_draft_head

    model = _model(draft_head=True, redraft_head=True, early_redraft_heads=True).eval()
    assert list(model.redraft_heads()) == [2, 3]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stream = np.random.default_rng(0).integers(0, 97, 4000)
    start = draft_agreement(model, stream, window=32, max_windows=8)
    train_draft_head(model, stream, steps=60, window=32, batch=4, lr=3e-3, progress=False)
    after = draft_agreement(model, stream, window=32, max_windows=8)
    assert after["draft_head"] > start["draft_head"] + 0.05, (start, after)
    assert after["redraft_head"] > start["redraft_head"] + 0.05, (start, after)  # pass K−1's head learns too
    assert after["redraft_pass2"] > start["redraft_pass2"] + 0.05, (start, after)  # and pass 2's
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert {k.split(".")[0] for k in changed} == {"draft_head", "redraft_head", "early_redraft_heads"}
    assert after["pass1_logits"] == start["pass1_logits"]


def test_draft_heads_train_on_the_models_own_greedy_text():
    from adaponder.train.draft_head import greedy_agreement, greedy_windows, train_draft_head

    model = _model(draft_head=True, redraft_head=True).eval()
    model.generation_config.eos_token_id = 5  # greedy_windows decodes every row to its full length regardless
    stream = np.random.default_rng(1).integers(0, 97, 3000)
    greedy = greedy_windows(model, stream, 12, prompt=10, new=14, batch=5, seed=3, progress=False)
    assert greedy.shape == (12, 24) and model.generation_config.eos_token_id == 5
    rng = np.random.default_rng(3)
    first = rng.integers(0, len(stream) - 10, 12)[0]
    prompt = torch.from_numpy(np.asarray(stream[first:first + 10], dtype=np.int64))[None]
    with torch.no_grad():  # each window is its prompt and the model's greedy continuation of it
        assert torch.equal(torch.from_numpy(greedy[0]), decode_greedy(model, prompt, 14)[0])
    start = greedy_agreement(model, greedy, 10)
    assert start["positions"] == 12 * 14
    train_draft_head(model, stream, steps=40, window=24, batch=2, lr=3e-3, progress=False, greedy=greedy)
    after = greedy_agreement(model, greedy, 10)
    assert after["draft_head"] > start["draft_head"] + 0.05, (start, after)


def decode_greedy(model, prompt, new):
    """Plain greedy cached decoding, one token at a time (no generate, no EOS)."""
    from adaponder.modeling import PonderCache

    cache = PonderCache(model.config.num_passes, model.config.num_hidden_layers)
    out = model(prompt, cache=cache, use_cache=True)
    seq = [prompt]
    for _ in range(new):
        seq.append(out.logits[:, -1:].argmax(-1))
        out = model(seq[-1], cache=cache, use_cache=True)
    return torch.cat(seq, 1)


@pytest.mark.integration
def test_train_draft_refuses_a_model_without_passes(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    torch.manual_seed(0)
    AdaPonderForCausalLM(tiny_config("vanilla", passes=1)).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    out = subprocess.run([sys.executable, "-m", "adaponder.cli.main", "train-draft", str(tmp_path / "ckpt"), "--data",
                          str(tmp_path / "data"), "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "no passes to draft from" in out.stderr
    assert out.stderr.count("error:") == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("flags, passes, message", [(["--early-redraft"], 4, "give --redraft too"),
                                                    (["--redraft", "--early-redraft"], 3, "passes 2..K−2 are none")])
def test_train_draft_names_early_re_draft_heads_it_cannot_add(tmp_path, capsys, flags, passes, message):
    from adaponder.cli.train_draft import main

    torch.manual_seed(0)
    AdaPonderForCausalLM(tiny_config("ponderlm", passes=passes)).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    assert main([str(tmp_path / "ckpt"), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1
    assert not (tmp_path / "out").exists()  # refused before anything is written
