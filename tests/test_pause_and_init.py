"""Pause-token baseline (docs/method.md A19) and Pythia-faithful initialisation (A20)."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, tiny_config


def _model(mode="pause", seed=0, **overrides):
    from adaponder.modeling import AdaPonderForCausalLM

    torch.manual_seed(seed)
    return AdaPonderForCausalLM(tiny_config(mode, **overrides)).eval()


# -- A19: pause tokens ---------------------------------------------------------------------------------------
def test_zero_pauses_equal_vanilla_exactly(one_thread):
    vanilla = _model("vanilla")
    pause0 = _model("pause", pause_tokens=0)
    pause0.load_state_dict(vanilla.state_dict())
    ids = torch.randint(0, 97, (3, 17))
    a, b = vanilla(ids, labels=ids), pause0(ids, labels=ids)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert pause0.config.num_pauses == 0 and pause0.pause_embeddings is None


def test_default_pauses_and_config_errors():
    from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError

    assert tiny_config("pause").num_pauses == 3  # K − 1 for the default K = 4
    shape = tiny_config("vanilla").to_diff_dict()
    shape = {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    with pytest.raises(AdaPonderConfigError) as err:
        AdaPonderConfig.from_mapping({**shape, "mode": "ponderlm", "pause_tokens": 2, "init": "xavier"}, "x.yaml")
    assert "pause_tokens" in str(err.value) and "'init' must be one of hf, pythia" in str(err.value)
    with pytest.raises(AdaPonderConfigError) as err:
        AdaPonderConfig.from_mapping({**shape, "mode": "pause", "passes": 2})
    assert "one pass" in str(err.value)


@pytest.mark.parametrize("pauses", [1, 3])
def test_prediction_is_read_at_the_last_pause_and_pauses_carry_no_loss(one_thread, pauses):
    """Reference: run the plain (vanilla) backbone on the hand-built interleaved sequence; the pause model's
    logits are its outputs at the last pause after each token, and the loss is the CE of those alone."""
    from adaponder.modeling import AdaPonderForCausalLM

    model = _model("pause", pause_tokens=pauses)
    vanilla = AdaPonderForCausalLM(tiny_config("vanilla")).eval()
    vanilla.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("pause")})
    ids = torch.randint(0, 97, (2, 11))
    stride = pauses + 1
    emb = model.gpt_neox.embed_in(ids)
    seq = torch.cat([emb[:, :, None], model.pause_embeddings.weight[None, None].expand(2, 11, -1, -1)], dim=2)
    ref = vanilla(inputs_embeds=seq.reshape(2, 11 * stride, -1)).logits
    out = model(ids, labels=ids)
    torch.testing.assert_close(out.logits, ref[:, stride - 1::stride], rtol=0, atol=1e-5)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    # Gradient check: a loss on the real-token positions only reaches the outputs at the last pauses.
    out.loss.backward()
    assert model.pause_embeddings.weight.grad is not None
    assert model.pause_embeddings.weight.grad.abs().sum() > 0


def test_padding_masks_follow_the_tokens(one_thread):
    model = _model("pause", pause_tokens=2)
    ids = torch.randint(2, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding of the second row
    padded = model(ids, attention_mask=mask).logits
    alone = model(ids[1:, 4:]).logits
    torch.testing.assert_close(padded[1, 4:], alone[0], rtol=0, atol=1e-5)


def test_cached_generate_with_pauses_equals_uncached(one_thread):
    model = _model("pause", pause_tokens=3)
    prompts = torch.randint(2, 97, (2, 7))
    mask = torch.ones_like(prompts)
    mask[0, :3] = 0
    prompts[0, :3] = 1
    with torch.no_grad():
        got = model.generate(prompts, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=1)
        cur, cur_mask = prompts, mask
        for _ in range(8):  # greedy, recomputing everything without a cache
            logits = model(cur, attention_mask=cur_mask, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True)
            cur, cur_mask = torch.cat([cur, nxt], 1), torch.cat([cur_mask, torch.ones_like(nxt)], 1)
    assert torch.equal(got, cur)
    # teacher-forced decoding with the cache reproduces the full forward's logits token by token
    ids = torch.randint(2, 97, (1, 12))
    full = model(ids, use_cache=False).logits
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        steps, cache = [out.logits], out.cache
        for t in range(5, 12):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


def test_pause_flops_count_the_longer_sequence():
    model = _model("pause", pause_tokens=3)
    vanilla = _model("vanilla")
    cfg = model.config
    d, L, V, ff = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    ctx = 20
    layer = 2 * (4 * d * d + 2 * d * ff)
    f = model.flops_per_token(context=ctx)
    assert f["backbone"] == 4 * L * (layer + 4 * (4 * ctx) * d)  # 4 positions per token, 4× the context
    assert f["head"] == 2 * d * V and f["pondering"] == 0
    assert vanilla.flops_per_token(context=ctx)["backbone"] == L * (layer + 4 * ctx * d)


# -- A20: initialisation ---------------------------------------------------------------------------------------
def _truncated_std(sigma):
    """Standard deviation of N(0, σ²) truncated at ±3σ."""
    a = 3.0
    phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    z = math.erf(a / math.sqrt(2))
    return sigma * math.sqrt(1 - 2 * a * phi / z)


@pytest.mark.parametrize("mode", ["vanilla", "pause", "ponderlm", "adaponder"])
def test_pythia_init_standard_deviations_match_hand_computation(mode):
    d, L, K = 128, 4, 4
    model = _model(mode, hidden_size=d, num_hidden_layers=L, intermediate_size=4 * d, vocab_size=1000,
                   init="pythia", **({"passes": K} if mode in ("ponderlm", "adaponder") else {}))
    small = math.sqrt(2 / (5 * d))
    if mode in ("ponderlm", "adaponder"):  # PonderLM: truncated normal, outputs ÷ sqrt(2·L·K)
        want_in, want_out, bound_in = _truncated_std(small), _truncated_std(small / math.sqrt(2 * L * K)), 3 * small
    else:  # GPT-NeoX small_init / wang_init
        want_in, want_out, bound_in = small, 2 / (L * math.sqrt(d)), None
    groups = {"input": [], "output": []}
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            if "fc_out" not in name:
                assert torch.count_nonzero(p) == 0, name
            continue
        if "layernorm" in name or "layer_norm" in name:
            assert torch.all(p == 1), name
        elif "attention.dense" in name or "dense_4h_to_h" in name:
            groups["output"].append(p.detach().flatten())
        elif "fc_out" not in name:  # the gate's last layer keeps N(0, 0.02) and its s ≈ 1 bias
            groups["input"].append(p.detach().flatten())
    for role, want in (("input", want_in), ("output", want_out)):
        got = torch.cat(groups[role]).std().item()
        assert abs(got - want) / want < 0.02, (role, got, want)
    if bound_in is not None:
        assert model.gpt_neox.embed_in.weight.abs().max() <= bound_in + 1e-7
    if mode == "adaponder":
        assert torch.all(model.gates[0].fc_out.bias == model.config.gate_init_bias)


def test_hf_init_is_unchanged_by_default():
    model = _model("adaponder", hidden_size=128, vocab_size=1000)
    assert model.config.init == "hf"
    assert abs(model.gpt_neox.layers[0].attention.dense.weight.std().item() - 0.02) < 0.002


def test_training_config_checks_sequence_length_against_positions():
    """data.seq_len × (1 + pauses) must fit model.max_position_embeddings; the error names both keys."""
    from adaponder.train.config import TrainConfigError, load_config

    with pytest.raises(TrainConfigError) as err:
        load_config(REPO / "configs/tiny.yaml", ["data.seq_len=512"])
    assert "data.seq_len: 512 tokens exceed model.max_position_embeddings (256)" in str(err.value)
    with pytest.raises(TrainConfigError) as err:
        load_config(REPO / "configs/tiny.yaml", ["model.mode=pause", "model.passes=1"])
    assert "128 tokens × (1 + 3 pauses) = 512 positions exceed model.max_position_embeddings (256)" in str(err.value)
    assert load_config(REPO / "configs/tiny.yaml", ["model.mode=pause", "model.passes=1", "model.pause_tokens=1"])
