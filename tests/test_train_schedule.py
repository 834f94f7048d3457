"""A13 schedule and loss, learning-rate schedule, A14 stages (pure functions; no DeepSpeed)."""

import math

import pytest
import torch

from adaponder.train.schedule import learning_rate, ponder_schedule, stage
from adaponder.train.trainer import training_loss


def test_learning_rate_warmup_then_cosine_to_min():
    kw = dict(lr=1e-3, total_steps=1000, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, **kw) == pytest.approx(1e-4)
    assert learning_rate(9, **kw) == pytest.approx(1e-3)
    assert learning_rate(10, **kw) == pytest.approx(1e-3)
    assert learning_rate(999, **kw) == pytest.approx(1e-4)
    mid = learning_rate(10 + (999 - 10) // 2, **kw)
    assert mid == pytest.approx(0.55e-3, rel=1e-2)
    values = [learning_rate(s, **kw) for s in range(10, 1000)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    assert learning_rate(500, **{**kw, "decay": "constant"}) == 1e-3
    assert learning_rate(999, **{**kw, "decay": "linear"}) == pytest.approx(1e-4)


def test_ponder_schedule_ramps_k_linearly_between_s0_and_s1():
    kw = dict(s0=100, s1=300, k_max=0.1, weight=0.5)
    for step in (0, 50, 99):
        st = ponder_schedule(step, **kw)
        assert st.k == 0 and st.weight == 0 and not st.active
    assert ponder_schedule(100, **kw).k == 0  # the ramp starts at 0
    for step in range(100, 301, 20):
        assert ponder_schedule(step, **kw).k == pytest.approx(0.1 * (step - 100) / 200)
        assert ponder_schedule(step, **kw).weight == 0.5
    assert ponder_schedule(300, **kw).k == pytest.approx(0.1)
    assert ponder_schedule(10_000, **kw).k == pytest.approx(0.1)
    assert ponder_schedule(7, s0=7, s1=7, k_max=0.2, weight=1.0).k == 0.2  # no ramp: a step at S0


def test_stages_of_continued_pretraining():
    assert [stage(s, 3) for s in range(5)] == ["gates_only"] * 3 + ["joint"] * 2
    assert stage(0, 0) == "joint"


@pytest.fixture(scope="module")
def tiny_output():
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    torch.manual_seed(0)
    cfg = AdaPonderConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          vocab_size=97, max_position_embeddings=64, mode="adaponder", passes=4, gate_init_bias=0.0)
    model = AdaPonderForCausalLM(cfg)
    x = torch.randint(0, 97, (2, 17))
    return model(input_ids=x[:, :-1], shift_labels=x[:, 1:], use_cache=False)


def test_loss_is_ce_alone_before_s0(tiny_output):
    out = tiny_output
    loss, lm, pl = training_loss(out, ponder_schedule(3, s0=10, s1=20, k_max=0.1, weight=0.5))
    assert torch.equal(loss, out.loss) and torch.equal(lm, out.loss)
    assert float(pl) == 0.0


def test_loss_adds_lambda_times_bottom_k_after_s0(tiny_output):
    out = tiny_output
    ps = ponder_schedule(15, s0=10, s1=20, k_max=0.2, weight=0.5)  # halfway: k = 0.1
    assert ps.k == pytest.approx(0.1)
    loss, lm, pl = training_loss(out, ps)
    pool = out.gate_values[out.gate_mask]
    n = math.ceil(ps.k * pool.numel())
    expected = torch.sort(pool).values[:n].mean()  # A12: mean of the ceil(k|G|) smallest gates
    torch.testing.assert_close(pl, expected)
    torch.testing.assert_close(loss, out.loss + 0.5 * expected)
    # The ponder term pushes exactly the bottom-k gates down.
    grads = torch.autograd.grad(pl, out.gate_values, retain_graph=True)[0]
    assert int((grads[out.gate_mask] != 0).sum()) == n


def test_models_without_gates_train_on_ce_alone():
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    cfg = AdaPonderConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                          vocab_size=97, max_position_embeddings=64, mode="ponderlm", passes=3)
    x = torch.randint(0, 97, (1, 9))
    out = AdaPonderForCausalLM(cfg)(input_ids=x[:, :-1], shift_labels=x[:, 1:], use_cache=False)
    loss, lm, pl = training_loss(out, ponder_schedule(50, s0=0, s1=10, k_max=0.1, weight=0.1))
    assert pl is None and torch.equal(loss, out.loss)
