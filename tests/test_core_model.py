"""The recurrent core: parity with HF GPT-NeoX, PonderLM reference, gates, loop, losses.

Equations: docs/method.md (part a), A1–A12.
"""

import math

import pytest
import torch
from torch import nn
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXModel

from adaponder.modeling.run_settings import RunSettings
from adaponder.modeling import AdaPonderForCausalLM, ponder_loss
from adaponder.modeling.modeling_adaponder import PythiaBackbone, SkinnyLinear
from conftest import tiny_config

NEOX_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
             "max_position_embeddings", "use_parallel_residual", "tie_word_embeddings", "layer_norm_eps")


def hf_twin(model: AdaPonderForCausalLM, attn="sdpa") -> GPTNeoXForCausalLM:
    """A transformers GPTNeoXForCausalLM with the same shape and weights as ``model``'s backbone."""
    cfg = model.config
    neox_cfg = GPTNeoXConfig(**{k: getattr(cfg, k) for k in NEOX_KEYS}, rope_parameters=dict(cfg.rope_parameters))
    neox_cfg._attn_implementation = attn
    ref = GPTNeoXForCausalLM(neox_cfg).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("gates.")}
    ref.load_state_dict(state, strict=True)
    return ref


def batch_with_padding(vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    return ids, mask


def make(mode="adaponder", seed=0, **kw):
    torch.manual_seed(seed)
    return AdaPonderForCausalLM(tiny_config(mode, **kw)).eval()


def test_backbone_is_gpt_neox_with_skinny_linears_holding_the_same_weights():
    """The backbone builds its layers with SkinnyLinear maps where transformers builds nn.Linear ones: names, state
    dict and (seeded) initial weights stay transformers' own, and no plain nn.Linear is in the layers."""
    cfg = tiny_config("vanilla")
    torch.manual_seed(0)
    ours = PythiaBackbone(cfg)
    torch.manual_seed(0)
    ref = GPTNeoXModel(GPTNeoXConfig(**{k: getattr(cfg, k) for k in NEOX_KEYS},
                                     rope_parameters=dict(cfg.rope_parameters)))
    a, b = ours.state_dict(), ref.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    linears = [m for m in ours.layers.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is SkinnyLinear for m in linears)
    assert len(linears) == sum(isinstance(m, nn.Linear) for m in ref.layers.modules())


# -- acceptance 1: vanilla == transformers.GPTNeoXForCausalLM --------------------------------------
@pytest.mark.parametrize("rotary_pct", [0.25, 1.0])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_vanilla_matches_hf_gpt_neox(rotary_pct, parallel, attn):
    model = make("vanilla", rotary_pct=rotary_pct, use_parallel_residual=parallel)
    model.config._attn_implementation = attn
    ref = hf_twin(model, attn)
    ids, mask = batch_with_padding()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, use_cache=False).logits
        theirs = ref(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real])
    assert torch.isfinite(ours).all()  # padded positions stay finite (no NaN reaches a loss)


def test_vanilla_matches_hf_loss():
    model = make("vanilla")
    ref = hf_twin(model)
    ids, _ = batch_with_padding()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, labels=ids).loss, ref(ids, labels=ids).loss)


# -- acceptance 2: ponderlm == an independent reference built on HF GPT-NeoX -------------------------
def ponderlm_reference(ref: GPTNeoXForCausalLM, ids, mask, passes, c, alpha):
    """PonderLM as its public code does it: run the HF model K times, feeding back softmax(z)·Ẽ (A1, A4, A7)."""
    w_tilde = alpha * ref.gpt_neox.embed_in.weight
    E = c * w_tilde[ids]
    for i in range(passes):
        logits = ref(inputs_embeds=E, attention_mask=mask).logits
        if i < passes - 1:
            E = E + torch.softmax(logits, dim=-1) @ w_tilde
    return logits


@pytest.mark.parametrize("passes,c", [(2, 1.0), (4, 3.0)])
def test_ponderlm_matches_reference(passes, c):
    model = make("ponderlm", passes=passes, input_scale=c)
    ref = hf_twin(model)
    ids, mask = batch_with_padding()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, use_cache=False).logits
        theirs = ponderlm_reference(ref, ids, mask, passes, c, math.sqrt(model.config.hidden_size))
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real])


# -- acceptance 3: adaponder ------------------------------------------------------------------------
def force_gates(model, value):
    """Gates output exactly ``value`` (sigmoid saturates: bias ±100, zero weights)."""
    for gate in model.gates:
        torch.nn.init.zeros_(gate.fc_out.weight)
        torch.nn.init.constant_(gate.fc_out.bias, 100.0 if value == 1 else -100.0)


def test_adaponder_gates_open_equal_ponderlm():
    model = make("adaponder")
    force_gates(model, 1)
    twin = AdaPonderForCausalLM(tiny_config("ponderlm")).eval()
    twin.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("gates.")})
    ids, mask = batch_with_padding()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=False)
        ref = twin(ids, attention_mask=mask, use_cache=False)
    assert torch.equal(out.logits, ref.logits)
    assert (out.exit_pass == 4).all()


class HaltChosen:
    """Forward hook on gate 1: force s = 0 (< τ) for chosen tokens, s = 1 for the rest."""

    def __init__(self, halt):
        self.halt = halt

    def __call__(self, module, args, output):
        halt = self.halt.reshape(-1)  # gates see the computed tokens flattened to [N]
        return torch.where(halt, torch.zeros_like(output), torch.ones_like(output))


def capture_aligners(model):
    """Hooks on the attention modules that record the ``layer_past`` (K/V aligner) each layer receives."""
    seen = []

    def pre_hook(module, args, kwargs):
        seen.append(kwargs["layer_past"])

    handles = [layer.attention.register_forward_pre_hook(pre_hook, with_kwargs=True)
               for layer in model.gpt_neox.layers]
    return seen, handles


def test_halted_tokens_freeze_logits_and_kv():
    model = make("adaponder")
    ids, mask = batch_with_padding()
    halt = torch.zeros_like(ids, dtype=torch.bool)
    halt[0, [2, 5, 7]] = True
    halt[2, [0, 3]] = True
    model.gates[0].register_forward_hook(HaltChosen(halt))
    seen, handles = capture_aligners(model)
    out = model(ids, attention_mask=mask, use_cache=False, return_pass_logits=True)
    for h in handles:
        h.remove()
    # Halted tokens exit after pass 1 and are scored on their pass-1 logits (A8, A9).
    assert (out.exit_pass[halt] == 1).all() and (out.exit_pass[~halt] == 4).all()
    torch.testing.assert_close(out.logits[halt], out.pass_logits[0][halt], rtol=0, atol=0)
    assert not torch.allclose(out.logits[~halt], out.pass_logits[0][~halt])
    # The K/V that every later pass attends to are their pass-1 K/V (A3), in every layer.
    aligner = seen[0]
    for layer in range(model.config.num_hidden_layers):
        k1, v1 = aligner.fresh[(1, layer)]
        for p in range(2, 5):
            kp, vp = aligner.fresh[(p, layer)]
            sel = halt[:, None, :, None].expand_as(kp)
            assert torch.equal(kp[sel], k1[sel]) and torch.equal(vp[sel], v1[sel])
            assert not torch.allclose(kp[~sel], k1[~sel])  # active tokens do get fresh K/V


def test_halting_mask_is_monotone_and_gates_get_gradients():
    model = make("adaponder", gate_init_bias=0.0)
    model.train()
    ids, mask = batch_with_padding()
    out = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), settings=RunSettings(tau=0.5))
    gm = out.gate_mask
    assert 0 < gm.float().mean() < 1, "the test needs some tokens to halt"
    assert (gm[..., 1:] <= gm[..., :-1]).all()  # A6: once halted, always halted
    assert (out.active_fraction[1:] <= out.active_fraction[:-1]).all()
    assert (out.exit_pass >= 1).all() and (out.exit_pass <= 4).all()
    # D_t = number of passes a token was active in = 1 + evaluated gates that said "continue"
    real = mask.bool()
    said_continue = (gm & (out.gate_values >= 0.5)).sum(-1)
    assert torch.equal(out.exit_pass[real], 1 + said_continue[real])
    loss = out.loss + 0.1 * ponder_loss(out.gate_values, out.gate_mask, 0.1)
    loss.backward()
    for gate in model.gates:
        assert gate.fc_in.weight.grad is not None and gate.fc_in.weight.grad.abs().sum() > 0


def test_ponder_loss_bottom_k_of_active_gates_only():
    values = torch.tensor([[[0.9, 0.2, 0.05], [0.3, 0.01, 0.0]]])
    mask = torch.tensor([[[True, True, False], [True, False, False]]])  # 0.05, 0.01, 0.0 are not in G
    # G = {0.9, 0.2, 0.3}; k = 0.5 → ⌈1.5⌉ = 2 smallest → (0.2 + 0.3) / 2
    torch.testing.assert_close(ponder_loss(values, mask, 0.5), torch.tensor(0.25))
    torch.testing.assert_close(ponder_loss(values, mask, 0.1), torch.tensor(0.2))  # ⌈0.3⌉ = 1
    torch.testing.assert_close(ponder_loss(values, mask, 1.0), torch.tensor(1.4 / 3))
    assert ponder_loss(values, mask, 0.0).item() == 0.0


def test_ponder_loss_on_model_output_uses_pool():
    model = make("adaponder", gate_init_bias=0.0)
    ids, mask = batch_with_padding()
    out = model(ids, attention_mask=mask, use_cache=False, settings=RunSettings(tau=0.5))
    pool = out.gate_values[out.gate_mask]
    n = math.ceil(0.3 * pool.numel())
    expected = pool.sort().values[:n].mean()
    torch.testing.assert_close(ponder_loss(out.gate_values, out.gate_mask, 0.3), expected)
    # padding never enters the pool
    assert not out.gate_mask[~mask.bool()].any()


# -- acceptance 4: loop -------------------------------------------------------------------------------
def test_loop_trains_and_equals_vanilla_at_one_pass():
    loop1 = make("loop", passes=1)
    vanilla = AdaPonderForCausalLM(tiny_config("vanilla")).eval()
    vanilla.load_state_dict(loop1.state_dict())
    ids, mask = batch_with_padding()
    with torch.no_grad():
        assert torch.equal(loop1(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits)
    loop = make("loop", passes=3).train()
    opt = torch.optim.AdamW(loop.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        out = loop(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        grads = [p.grad for p in loop.parameters() if p.grad is not None]
        assert torch.isfinite(out.loss) and all(torch.isfinite(g).all() for g in grads)
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0]
    assert (out.exit_pass == 3).all()


def test_pass_checkpointing_gives_same_gradients():
    model = make("adaponder", gate_init_bias=0.0).train()
    ids, mask = batch_with_padding()
    grads = []
    for ckpt in (False, True):
        model.zero_grad()
        model.gradient_checkpointing_enable() if ckpt else model.gradient_checkpointing_disable()
        out = model(ids, attention_mask=mask, labels=ids, settings=RunSettings(tau=0.5))
        (out.loss + 0.1 * ponder_loss(out.gate_values, out.gate_mask, 0.2)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
