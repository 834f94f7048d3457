"""PALBERT mode, model level: AdaPonderForSequenceClassification on the recurrent core.

docs/method.md (b): pooling (B1), shared head (B2), Lambda layer (B3), exit distribution and loss (B4–B7),
exit rules with passes after the exit never computed (B9). The math of pondernet.py is covered by
test_palbert_math.py; here the model: pooling, online == offline, backbone rows actually computed,
training, regression, save/load, configuration errors.
"""

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.palbert.classifier import (
    AdaPonderForSequenceClassification,
    PalbertConfig,
    last_token_index,
    offline_exit,
)
from adaponder.palbert.pondernet import EXIT_RULES, exit_distribution, pondernet_loss, rules_for_method
from conftest import tiny_config

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=97,
             max_position_embeddings=128, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


def make(method="palbert", mode="ponderlm", passes=4, num_labels=3, seed=0, spread=True, **kw):
    """A random classifier; ``spread`` scales the Lambda layer's output so exit passes vary across examples."""
    torch.manual_seed(seed)
    cfg = PalbertConfig(**SHAPE, mode=mode, palbert_passes=passes, palbert_method=method, num_labels=num_labels,
                        **kw)
    model = AdaPonderForSequenceClassification(cfg).eval()
    if spread and model.lambda_layer is not None:
        with torch.no_grad():
            model.lambda_layer.out.weight.normal_(0.0, 3.0)
            model.lambda_layer.out.bias.fill_(-0.5)
    return model


def padded_batch(batch=8, length=12, seed=0, left=False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 97, (batch, length), generator=g)
    lengths = torch.randint(3, length + 1, (batch,), generator=g)
    lengths[0] = length
    pos = torch.arange(length)[None]
    mask = (pos >= length - lengths[:, None]) if left else (pos < lengths[:, None])
    return ids, mask.long()


class RowCounter:
    """Counts the batch rows (and row×position) entering the first GPT-NeoX layer: one entry per pass run."""

    def __init__(self, model):
        self.rows, self.tokens = [], 0
        self.handle = model.core.gpt_neox.layers[0].register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.rows.append(args[0].shape[0])
        self.tokens += args[0].shape[0] * args[0].shape[1]

    def close(self):
        self.handle.remove()


# -- B1 -------------------------------------------------------------------------------------------------
def test_last_token_index_right_left_and_none():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert last_token_index(mask, 4, 5).tolist() == [2, 4, 4, 0]
    assert last_token_index(None, 2, 7).tolist() == [6, 6]
    with pytest.raises(ValueError):
        last_token_index(torch.zeros(1, 3, dtype=torch.long), 1, 3)


@pytest.mark.parametrize("left", [False, True])
def test_pooling_B1_is_the_last_real_tokens_final_ln_state(left):
    model = make(num_labels=2)
    ids, mask = padded_batch(left=left)
    captured = []
    orig = model.core.run_pass

    def spy(E, ctx, pass_idx, *a, **k):
        h, pre = orig(E, ctx, pass_idx, *a, **k)
        captured.append(h.view(ctx.batch, ctx.length, -1))
        return h, pre

    model.core.run_pass = spy
    with torch.no_grad():
        out = model(ids, mask)
    last = last_token_index(mask, *ids.shape)
    for i, h in enumerate(captured):
        c = h[torch.arange(ids.shape[0]), last]
        torch.testing.assert_close(out.pass_logits[:, i], model.heads[0](c))
    # Padding content (ids, and whatever a padded position computes) does not reach the prediction.
    junk = torch.where(mask.bool(), ids, torch.randint(2, 97, ids.shape))
    model.core.run_pass = orig
    with torch.no_grad():
        torch.testing.assert_close(model(junk, mask).pass_logits, out.pass_logits)


def test_pass_one_equals_hf_gpt_neox_pooling():
    """A GPT-NeoX checkpoint loaded in vanilla mode: c_1 is GPTNeoXModel's final-LN state at the last token."""
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=128, vocab_size=97, max_position_embeddings=128)).eval()
    model = AdaPonderForSequenceClassification.from_backbone(neox, num_labels=2, palbert_passes=3,
                                                             classifier_dropout=0.0).eval()
    assert model.config.mode == "vanilla"
    ids, mask = padded_batch()
    with torch.no_grad():
        ref = neox.gpt_neox(ids, attention_mask=mask).last_hidden_state
        out = model(ids, mask)
    c1 = ref[torch.arange(ids.shape[0]), last_token_index(mask, *ids.shape)]
    torch.testing.assert_close(out.pass_logits[:, 0], model.heads[0](c1), atol=1e-5, rtol=1e-5)


# -- B2–B7 ----------------------------------------------------------------------------------------------
def test_forward_shapes_p_and_loss_B4_B7():
    model = make(ponder_beta=0.3, ponder_lambda_p=0.2, kl_direction="p_to_prior")
    ids, mask = padded_batch()
    labels = torch.randint(0, 3, (ids.shape[0],))
    out = model(ids, mask, labels=labels)
    b, n = ids.shape[0], 4
    assert out.pass_logits.shape == (b, n, 3) and out.logits.shape == (b, 3)
    assert out.lambdas.shape == (b, n) and torch.all(out.lambdas[:, -1] == 1)
    torch.testing.assert_close(out.p.sum(1), torch.ones(b))
    torch.testing.assert_close(out.p, exit_distribution(out.lambdas))
    want, parts = pondernet_loss(out.pass_logits, labels, out.p, beta=0.3, lambda_p=0.2, direction="p_to_prior")
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(out.reg, parts["reg"].detach())
    out.loss.backward()
    assert model.lambda_layer.out.weight.grad is not None and model.heads[0].weight.grad is not None


def test_pondernet_baseline_lambda_reads_c_i_only():
    model = make(method="pondernet")
    assert sum(isinstance(m, torch.nn.Linear) for m in model.lambda_layer.modules()) == 1
    assert model.lambda_layer.out.in_features == SHAPE["hidden_size"]


def test_pabee_method_has_a_head_per_pass_and_its_loss():
    model = make(method="pabee", passes=3)
    assert len(model.heads) == 3 and model.lambda_layer is None
    ids, mask = padded_batch()
    labels = torch.randint(0, 3, (ids.shape[0],))
    out = model(ids, mask, labels=labels)
    ce = torch.stack([torch.nn.functional.cross_entropy(out.pass_logits[:, i], labels) for i in range(3)])
    torch.testing.assert_close(out.loss, (ce * torch.tensor([1.0, 2.0, 3.0])).sum() / 6)
    with pytest.raises(ValueError, match="Lambda"):
        model.predict(ids, mask, rule="q")


def test_param_groups_give_lambda_its_own_lr():
    model = make(mode="loop")
    groups = model.param_groups(1e-5, 1e-3)
    assert [g["lr"] for g in groups] == [1e-5, 1e-3]
    lam = {id(p) for p in model.lambda_layer.parameters()}
    assert {id(p) for p in groups[1]["params"]} == lam
    main = {id(p) for p in groups[0]["params"]}
    assert not (main & lam) and id(model.core.lm_head.weight) not in main  # loop mode never uses the LM head
    assert id(model.heads[0].weight) in main and id(model.core.gpt_neox.embed_in.weight) in main


@pytest.mark.parametrize("method", ["palbert", "pabee"])
def test_loss_goes_down(method):
    model = make(method=method, mode="loop", passes=3, num_labels=2, spread=False).train()
    ids, mask = padded_batch(batch=16, seed=3)
    labels = (ids[:, 0] % 2).long()  # learnable from the first token
    opt = torch.optim.Adam(model.param_groups(3e-3, 3e-3))
    losses = []
    for _ in range(12):
        out = model(ids, mask, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


# -- B9: online early exit ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ponderlm", "loop", "vanilla"])
@pytest.mark.parametrize("rule", EXIT_RULES)
def test_online_early_exit_equals_offline_rule(mode, rule):
    model = make(mode=mode)
    ids, mask = padded_batch(batch=10, seed=1)
    with torch.no_grad():
        full = model(ids, mask)
    off_out, off_idx = offline_exit(full, rule, q=0.5, patience=1, generator=torch.Generator().manual_seed(5))
    res = model.predict(ids, mask, rule, q=0.5, patience=1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(res.exit_pass, off_idx + 1)
    torch.testing.assert_close(res.outputs, off_out, atol=1e-5, rtol=1e-5)
    assert torch.equal(res.preds, off_out.argmax(-1))


def test_trimming_trailing_padding_is_exact():
    model = make()
    ids, mask = padded_batch(batch=10, seed=2)
    a = model.predict(ids, mask, "q", trim=True)
    b = model.predict(ids, mask, "q", trim=False)
    assert torch.equal(a.exit_pass, b.exit_pass)
    torch.testing.assert_close(a.outputs, b.outputs, atol=1e-5, rtol=1e-5)
    assert a.token_rows <= b.token_rows


@pytest.mark.parametrize("rule", ["q", "sample", "pabee", "last", "expectation"])
def test_passes_after_exit_are_not_run(rule):
    """Count the rows entering the first GPT-NeoX layer: each example is computed in exactly its
    exit_pass passes, nothing more (and always-last / expectation run all N)."""
    model = make(method="pabee" if rule == "pabee" else "palbert", passes=5)  # PABEE: heads differ per pass
    ids, mask = padded_batch(batch=12, seed=4)
    counter = RowCounter(model)
    res = model.predict(ids, mask, rule, patience=1, generator=torch.Generator().manual_seed(0))
    counter.close()
    assert sum(counter.rows) == int(res.exit_pass.sum()) == res.pass_rows
    assert counter.tokens == res.token_rows
    # The rows of pass i are the examples whose exit pass is >= i.
    assert counter.rows == [int((res.exit_pass >= i).sum()) for i in range(1, len(counter.rows) + 1)]
    assert len(counter.rows) == int(res.exit_pass.max())
    if rule in ("last", "expectation"):
        assert counter.rows == [12] * 5
    else:  # the test is not vacuous: examples exit at different passes, before the last
        assert int(res.exit_pass.min()) < 5 and len(set(res.exit_pass.tolist())) > 1


def test_online_sampling_follows_p():
    """PonderNet sampling run online, examples leaving the batch: exit frequencies of one input repeated
    4000 times match its p (B4) — a chi-square goodness-of-fit test."""
    from scipy.stats import chisquare

    model = make(passes=4)
    with torch.no_grad():
        model.lambda_layer.out.bias.fill_(-1.0)
    ids, mask = padded_batch(batch=1, seed=6)
    with torch.no_grad():
        p = model(ids, mask).p[0].double()
    reps = 4000
    res = model.predict(ids.expand(reps, -1), mask.expand(reps, -1), "sample",
                        generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(res.exit_pass - 1, minlength=4).double()
    assert counts.sum() == reps and torch.all(p > 0.02), p
    assert chisquare(counts.numpy(), (p / p.sum() * reps).numpy()).pvalue > 1e-3, (counts / reps, p)


def test_everyone_exits_at_pass_one_runs_one_pass():
    model = make(spread=False)
    with torch.no_grad():
        model.lambda_layer.out.bias.fill_(20.0)  # λ_1 ≈ 1 → CDF > q after pass 1
    ids, mask = padded_batch()
    counter = RowCounter(model)
    res = model.predict(ids, mask, "q")
    counter.close()
    assert counter.rows == [ids.shape[0]] and torch.all(res.exit_pass == 1)


# -- regression (STS-B) -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["palbert", "pabee"])
def test_regression_path(method):
    model = make(method=method, num_labels=1)
    assert model.config.is_regression
    ids, mask = padded_batch()
    labels = torch.rand(ids.shape[0]) * 5
    out = model.train()(ids, mask, labels=labels)
    assert out.pass_logits.shape == (ids.shape[0], 4, 1) and torch.isfinite(out.loss)
    if method == "palbert":
        mse = (out.pass_logits[..., 0] - labels[:, None]) ** 2
        torch.testing.assert_close(out.rec, (out.p * mse).sum(1).mean().detach())
    out.loss.backward()
    model.eval()
    with torch.no_grad():
        full = model(ids, mask)
    for rule in rules_for_method(method):
        res = model.predict(ids, mask, rule, patience=1, generator=torch.Generator().manual_seed(0))
        off, idx = offline_exit(full, rule, patience=1, regression=True, regression_threshold=0.2,
                                generator=torch.Generator().manual_seed(0))
        assert res.preds.dtype == torch.float32 and res.preds.shape == (ids.shape[0],)
        torch.testing.assert_close(res.outputs.reshape(-1), off.reshape(-1), atol=1e-5, rtol=1e-5)
        assert torch.equal(res.exit_pass, idx + 1)


# -- construction, save/load, config errors ---------------------------------------------------------------
def test_from_backbone_adaponder_becomes_ponderlm_without_gates(tmp_path):
    torch.manual_seed(0)
    core = AdaPonderForCausalLM(tiny_config("adaponder", passes=3))
    model = AdaPonderForSequenceClassification.from_backbone(core, num_labels=2, palbert_passes=5,
                                                             lambda_init_bias=-2.0)
    assert model.config.mode == "ponderlm" and len(model.core.gates) == 0 and model.config.palbert_passes == 5
    assert model.config.first_pass_scale == core.config.first_pass_scale
    torch.testing.assert_close(model.lambda_layer.out.bias, torch.tensor([-2.0]))
    for name, p in core.gpt_neox.named_parameters():
        assert torch.equal(p, model.core.gpt_neox.get_parameter(name))
    model.save_pretrained(tmp_path)
    again = AdaPonderForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask).pass_logits, model.eval()(ids, mask).pass_logits)
    # A saved classifier can also seed a new one (its core is reused).
    fresh = AdaPonderForSequenceClassification.from_backbone(tmp_path, num_labels=3, palbert_method="pabee")
    assert fresh.config.mode == "ponderlm" and len(fresh.heads) == 4


def test_config_errors_are_reported_together():
    with pytest.raises(Exception) as err:  # AdaPonderConfigError, wrapped by the strict dataclass
        PalbertConfig(**SHAPE, mode="adaponder", palbert_method="act", ponder_lambda_p=1.5,
                      kl_direction="forward", palbert_passes=0)
    text = str(err.value)
    for needle in ("'mode'", "palbert_method", "ponder_lambda_p", "kl_direction", "palbert_passes"):
        assert needle in text, text
