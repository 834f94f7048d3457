"""Cached inference with KV reuse: A15–A18.

Teacher-forced cached decoding must reproduce the training-mode forward (A18) — logits and exit passes —
for tokens that halt early at various passes; prefill with compaction (A16) must equal it too; greedy
``generate()`` must equal greedy decoding by full recomputation.
"""

import math

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from adaponder.modeling import AdaPonderForCausalLM, PonderCache
from conftest import run_with, settings_for, tiny_config


def calibrate_gates(model, ids, halted_total):
    """Set each gate's output bias so that about ``halted_total`` of all tokens halt before the last pass,
    spread over the gates (each halts the same share of the tokens still active at its pass; gate logit
    below logit(τ)). Gates are calibrated in order, as halting compounds."""
    tau = settings_for(model).tau
    halt_per_gate = 1 - (1 - halted_total) ** (1 / len(model.gates))
    target = math.log(tau / (1 - tau))
    for i, gate in enumerate(model.gates):
        logits = []
        hook = gate.fc_out.register_forward_hook(lambda m, a, out: logits.append(out.detach().squeeze(-1)))
        with torch.no_grad():
            out = model(ids, use_cache=False)
        hook.remove()
        active = out.gate_mask[..., i].reshape(-1)
        flat = logits[0].reshape(-1)
        # Without gradients the model computes only active tokens (A16): the gate saw exactly those.
        pre = (flat[active] if flat.numel() == active.numel() else flat) - gate.fc_out.bias.detach()
        q = torch.quantile(pre, halt_per_gate)
        with torch.no_grad():
            gate.fc_out.bias.fill_(float(target - q))


def random_model(seed, halt_per_gate):
    g = torch.Generator().manual_seed(seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=g))]  # noqa: E731
    cfg = tiny_config(
        "adaponder",
        passes=pick([2, 3, 4]),
        hidden_size=pick([32, 64]),
        num_attention_heads=pick([2, 4]),
        num_hidden_layers=pick([1, 2, 3]),
        rotary_pct=pick([0.25, 1.0]),
        use_parallel_residual=pick([True, False]),
        input_scale=pick([1.0, 2.0]),
    )
    tau = pick([1e-4, 0.3])
    torch.manual_seed(seed)
    model = run_with(AdaPonderForCausalLM(cfg).eval(), tau=tau)
    ids = torch.randint(0, cfg.vocab_size, (3, 16), generator=g)
    calibrate_gates(model, ids, halt_per_gate)
    return model, ids


@pytest.mark.parametrize("seed,halt", [(0, 0.3), (1, 0.5), (2, 0.2), (3, 0.4), (4, 0.6)])
def test_teacher_forced_decoding_reproduces_training_forward(seed, halt):
    model, ids = random_model(seed, halt)
    with torch.no_grad():
        ref = model(ids, use_cache=False)
        halted = (ref.exit_pass < model.config.passes).float().mean().item()
        assert abs(halted - halt) < 0.1, f"calibration gave {halted:.2f} halted tokens"
        if model.config.passes > 2:
            assert len(ref.exit_pass.unique()) >= 3  # tokens halt at various passes
        cache, logits, exits = None, [], []
        for t in range(ids.shape[1]):  # A15, one token at a time
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits)
            exits.append(out.exit_pass)
    assert isinstance(cache, PonderCache) and cache.get_seq_length() == ids.shape[1]
    torch.testing.assert_close(torch.cat(logits, 1), ref.logits, rtol=0, atol=1e-5)
    assert torch.equal(torch.cat(exits, 1), ref.exit_pass)


@pytest.mark.parametrize("seed", [5, 6])
def test_prefill_with_compaction_equals_training_forward(seed):
    model, ids = random_model(seed, 0.4)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding too
    with torch.no_grad():
        torch.set_grad_enabled(True)  # the training-mode forward: every token computed, masks applied
        ref = model(ids, attention_mask=mask, use_cache=False)
        torch.set_grad_enabled(False)
        compacted = model(ids, attention_mask=mask, use_cache=True)  # A16: only active tokens computed
        chunked = model(ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        rest = model(ids[:, 7:], attention_mask=mask, cache=chunked.cache)
    real = mask.bool()
    torch.testing.assert_close(compacted.logits[real], ref.logits.detach()[real], rtol=0, atol=1e-5)
    assert torch.equal(compacted.exit_pass[real], ref.exit_pass[real])
    both = torch.cat([chunked.logits, rest.logits], 1)
    torch.testing.assert_close(both[real], ref.logits.detach()[real], rtol=0, atol=1e-5)


def test_compaction_really_skips_halted_tokens():
    """Passes after the first compute only still-active tokens: count the rows the first layer sees."""
    model, ids = random_model(7, 0.5)
    seen = []
    hook = model.gpt_neox.layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(args[0].shape[0] * args[0].shape[1]), with_kwargs=True)
    with torch.no_grad():
        out = model(ids[:1], use_cache=True)
    hook.remove()
    active_per_pass = (out.active_fraction * ids.shape[1]).round().long().tolist()
    computed = seen + [0] * (len(active_per_pass) - len(seen))
    assert computed[0] == ids.shape[1]
    assert computed[1:] == [n for n in active_per_pass[1:]], (computed, active_per_pass)


def test_greedy_generate_equals_full_recompute():
    torch.manual_seed(0)
    cfg = tiny_config("adaponder", gate_init_bias=0.0, pad_token_id=1, eos_token_id=0, bos_token_id=0)
    model = run_with(AdaPonderForCausalLM(cfg).eval(), tau=0.5)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 97, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 1, 0  # prompts of different lengths, left padded
    ids[2, :1], mask[2, :1] = 1, 0
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None)
    seq, m = ids.clone(), mask.clone()
    with torch.no_grad():
        for _ in range(10):  # the reference re-runs the whole sequence for every new token
            pos = (m.cumsum(-1) - 1).clamp(min=0)
            logits = model(seq, attention_mask=m, position_ids=pos, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True)
            seq, m = torch.cat([seq, nxt], 1), torch.cat([m, torch.ones_like(nxt)], 1)
    assert torch.equal(out, seq)


def test_sampling_and_stopping_criteria_work():
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", eos_token_id=0, pad_token_id=1)).eval()
    ids = torch.randint(2, 97, (2, 5))
    torch.manual_seed(1)
    a = model.generate(ids, max_new_tokens=6, do_sample=True, top_k=20)
    torch.manual_seed(1)
    b = model.generate(ids, max_new_tokens=6, do_sample=True, top_k=20)
    assert torch.equal(a, b) and a.shape == (2, 11)
    class StopAtEight(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 8, dtype=torch.bool)

    stop = model.generate(ids, max_new_tokens=50, do_sample=False, stopping_criteria=StoppingCriteriaList([StopAtEight()]))
    assert stop.shape[1] == 8


def test_kv_cache_memory_accounting():
    model = AdaPonderForCausalLM(tiny_config("adaponder")).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 97, (2, 9)), use_cache=True)
    per_token = model.kv_cache_bytes_per_token()
    assert per_token == 4 * 2 * 2 * 64 * 4  # K passes · L layers · (K and V) · d · fp32 bytes
    assert out.cache.kv_bytes() == per_token * 2 * 9
