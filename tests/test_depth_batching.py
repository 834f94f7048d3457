"""Depth-wise continuous batching: every row at its own pass, the same tokens as decoding alone.

Rows of a batch halt at different passes; the decoder lets a halted row start its next token while others
ponder. Each row's greedy tokens and exit passes must equal those of the cached ``forward`` decoding that row
by itself (A15 K/V reuse included), for gated, ungated and one-pass models.
"""

import pytest
import torch
import torch.nn.functional as F

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DecoderPrefill, DepthBatchedDecoder, RowPlan, TickGates, row_attention
from conftest import settings_for, tiny_config
from helpers_decoding import run_with_eos
from test_cached_inference import random_model


@torch.no_grad()
def decode_alone(model, prompt, new_tokens, eos=None):
    """Reference: the cached forward, one row, lockstep passes."""
    out = model(prompt[None], use_cache=True)
    tokens, exits = [int(out.logits[0, -1].argmax())], [int(out.exit_pass[0, -1])]
    cache = out.cache
    while len(tokens) < new_tokens and tokens[-1] != eos:
        step = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
        cache = step.cache
        tokens.append(int(step.logits[0, -1].argmax()))
        exits.append(int(step.exit_pass[0, -1]))
    return tokens, exits


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_row_decodes_as_it_would_alone(seed):
    model, ids = random_model(seed, halt_per_gate=0.5)
    prompts = torch.cat([ids, ids.flip(0)])[:, :12]  # 6 rows
    new = 10
    res = DepthBatchedDecoder(model, settings_for(model)).generate(prompts, new)
    assert res.sequences.shape == (6, 12 + new)
    assert torch.equal(res.sequences[:, :12], prompts)
    for b in range(prompts.shape[0]):
        tokens, exits = decode_alone(model, prompts[b], new)
        assert res.sequences[b, 12:].tolist() == tokens, f"row {b}"
        assert res.exit_pass[b].tolist() == exits, f"row {b}"
    # the ticks computed exactly the token-passes of the generated tokens (after the prefill's first token)
    assert res.token_passes == int(res.exit_pass[:, 1:].sum())
    assert 0 < res.pondering_ticks <= res.ticks and 0 < res.gate_runs <= res.ticks * len(model.gates)


def test_rows_really_run_at_different_passes():
    model, ids = random_model(5, halt_per_gate=0.5)
    K = model.config.num_passes
    res = DepthBatchedDecoder(model, settings_for(model)).generate(ids[:, :8], 12)
    assert len(set(res.exit_pass[:, 1:].reshape(-1).tolist())) > 1  # tokens halt at different passes ...
    assert res.ticks < 11 * K  # ... and a halted row did not wait for the others: fewer ticks than lockstep
    assert res.ticks >= int(res.exit_pass[:, 1:].sum(1).max())


@pytest.mark.parametrize("mode", ["ponderlm", "vanilla"])
def test_ungated_modes_equal_decoding_alone(mode):
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config(mode, **({"passes": 3} if mode == "ponderlm" else {}))).eval()
    prompts = torch.randint(0, model.config.vocab_size, (3, 9))
    res = DepthBatchedDecoder(model, settings_for(model)).generate(prompts, 6)
    for b in range(3):
        tokens, exits = decode_alone(model, prompts[b], 6)
        assert res.sequences[b, 9:].tolist() == tokens
        assert res.exit_pass[b].tolist() == exits == [model.config.num_passes] * 6
    K = model.config.num_passes
    assert res.ticks == 5 * K  # lockstep: nothing halts early
    # what the ticks read (the benchmark's bytes model): W_E in the ticks before pass K, no gates, and each row the
    # keys of its prompt and tokens so far (positions 9..13 attend to 10..14 keys) in every pass
    assert (res.pondering_ticks, res.gate_runs) == (5 * (K - 1), 0)
    assert res.attended == K * 3 * sum(range(10, 15))


def test_eos_ends_a_row_and_pads_it():
    model, prompts, eos, res = run_with_eos(DepthBatchedDecoder)
    for b in range(prompts.shape[0]):
        tokens, exits = decode_alone(model, prompts[b], 8, eos=eos)
        n = len(tokens)
        assert res.sequences[b, 10:10 + n].tolist() == tokens
        assert (res.sequences[b, 10 + n:] == eos).all() and (res.exit_pass[b, n:] == 0).all()
        assert res.exit_pass[b, :n].tolist() == exits
    assert len(decode_alone(model, prompts[0], 8, eos=eos)[0]) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_attention_equals_sdpa_over_each_rows_own_slice(dtype):
    """One tick's rows at different passes and positions, attended by index in one call per product, equal SDPA over
    each row's own pass slice up to its position — whatever the buffers hold past it (NaN here)."""
    torch.manual_seed(0)
    K, B, heads, cap, hd = 3, 5, 4, 16, 8
    keys = torch.full((K, B, heads, cap, hd), float("nan"))
    values = torch.full((K, B, heads, cap, hd), float("nan"))
    rows, passes, positions = [4, 0, 2, 3], [2, 1, 3, 2], [9, 7, 11, 0]
    for r, p, t in zip(rows, passes, positions):
        keys[p - 1, r, :, :t + 1] = torch.randn(heads, t + 1, hd)
        values[p - 1, r, :, :t + 1] = torch.randn(heads, t + 1, hd)
    keys, values = keys.to(dtype), values.to(dtype)
    q = torch.randn(len(rows), heads, 1, hd, dtype=dtype)
    plan = RowPlan(*(torch.tensor(x) for x in (rows, passes, positions)), max(positions) + 1, batch=B, heads=heads,
                   head_dim=hd, capacity=cap)
    out, _ = row_attention(None, q, keys.transpose(-1, -2).contiguous(), values, scaling=hd ** -0.5,
                           ponder_rows=plan)
    assert out.shape == (len(rows), 1, heads, hd) and out.dtype == dtype
    for i, (r, p, t) in enumerate(zip(rows, passes, positions)):
        want = F.scaled_dot_product_attention(q[i:i + 1], keys[p - 1, r:r + 1, :, :t + 1],
                                              values[p - 1, r:r + 1, :, :t + 1])
        tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out[i, 0], want[0, :, 0], **tol)


def test_tick_gates_give_each_row_the_gate_of_its_own_pass():
    model, _ = random_model(0, halt_per_gate=0.5)
    K = model.config.num_passes
    h = torch.randn(7, model.config.hidden_size)
    passes = [min(p, K) for p in (3, 1, 4, 2, 1, 3, 2)]  # several passes, K among them
    with torch.no_grad():
        s = TickGates(model.gates)(h, passes)
        for i, p in enumerate(passes):
            want = model.gates[p - 1](h[i:i + 1])[0] if p < K else torch.tensor(0.0)
            torch.testing.assert_close(s[i], want)
        same = TickGates(model.gates)(h, [1] * 7)  # one pass: that gate alone
        torch.testing.assert_close(same, model.gates[0](h))


def test_bad_arguments_are_named():
    model = AdaPonderForCausalLM(tiny_config("loop", passes=2)).eval()
    with pytest.raises(ValueError, match="modes vanilla, ponderlm and adaponder"):
        DepthBatchedDecoder(model, settings_for(model))
    model = AdaPonderForCausalLM(tiny_config("adaponder")).eval()
    with pytest.raises(ValueError, match="max_new_tokens"):
        DepthBatchedDecoder(model, settings_for(model)).generate(torch.zeros(1, 3, dtype=torch.long), 0)


def test_max_ticks_stops_with_whole_tokens_only():
    model, ids = random_model(2, halt_per_gate=0.5)
    prompts = ids[:, :8]
    full = DepthBatchedDecoder(model, settings_for(model)).generate(prompts, 12)
    part = DepthBatchedDecoder(model, settings_for(model)).generate(prompts, 12, max_ticks=9)
    assert part.ticks == 9
    for b in range(prompts.shape[0]):
        n = int(part.new_tokens[b])
        assert 1 <= n < 12 and int(part.exit_pass[b, 1:n].sum()) <= 9  # completed tokens fit in the ticks
        assert part.sequences[b, 8:8 + n].tolist() == full.sequences[b, 8:8 + n].tolist()
        assert part.exit_pass[b, :n].tolist() == full.exit_pass[b, :n].tolist()
        assert (part.exit_pass[b, n:] == 0).all()


def test_prefill_fills_the_decoders_layout_without_a_copy():
    model, ids = random_model(3, halt_per_gate=0.5)
    dec = DepthBatchedDecoder(model, settings_for(model))
    prompts = ids[:, :10]
    cache = dec.new_cache(prompts.shape[0], 10 + 6)
    with torch.no_grad():
        out = model(prompts, cache=cache, use_cache=True)
    assert dec._layout(out.cache, 16) is cache.pass_buffers  # every (pass, layer) was written in place
    with torch.no_grad():
        reference = model(prompts, use_cache=True)  # an ordinary cache: same K/V
    for p in range(1, model.config.num_passes + 1):
        for layer in range(model.config.num_hidden_layers):
            for a, b in zip(out.cache.view(p, layer), reference.cache.view(p, layer)):
                torch.testing.assert_close(a, b)
    with_prefill = dec.generate(prompts, 6, prefill=out)
    assert torch.equal(with_prefill.sequences, dec.generate(prompts, 6).sequences)
    # the decoder's own prefill: the cache's values read in place, its keys transposed into a buffer of their own
    pre = dec.prefill(prompts, 16)
    assert pre.values.data_ptr() == pre.output.cache.pass_buffers[0, 1].data_ptr() and pre.capacity == 16
    torch.testing.assert_close(pre.keys_t[..., :10], pre.output.cache.pass_buffers[:, 0, ..., :10, :].transpose(-1, -2))
    assert torch.equal(dec.generate(prompts, 6, prefill=pre).sequences, with_prefill.sequences)
    assert torch.equal(dec.generate(prompts, 6, prefill=pre).sequences, with_prefill.sequences)  # reusable
    # an ordinary cache's K/V are copied into the layout first
    assert torch.equal(dec.generate(prompts, 6, prefill=reference).sequences, with_prefill.sequences)
    # lockstep decoding from a cache in this layout appends in place while there is room
    with torch.no_grad():
        step = model(out.logits[:, -1:].argmax(-1), cache=out.cache, use_cache=True)
    assert step.cache.view(1, 0)[0].data_ptr() == cache.pass_buffers[0, 0, 0].data_ptr()
    assert step.cache.get_seq_length() == 11


@pytest.mark.slow
def test_buffers_grow_as_the_ticks_reach_their_end(monkeypatch):
    # Rows of the transposed keys span the whole capacity, so the buffers start small and double; growing must not
    # change a token, and a prefill decoded past its room stays reusable.
    model, ids = random_model(4, halt_per_gate=0.5)
    dec = DepthBatchedDecoder(model, settings_for(model))
    prompts = ids[:, :8]
    roomy = dec.generate(prompts, 14)  # room for everything from the start (GROWTH 64)
    monkeypatch.setattr(DepthBatchedDecoder, "GROWTH", 2)
    grown, original = [], DecoderPrefill.grown
    monkeypatch.setattr(DecoderPrefill, "grown",
                        lambda self, capacity: grown.append((self.capacity, capacity)) or original(self, capacity))
    small = dec.generate(prompts, 14)
    assert torch.equal(small.sequences, roomy.sequences) and torch.equal(small.exit_pass, roomy.exit_pass)
    assert grown == [(10, 20), (20, 22)]  # 8 + 2, doubled, then only what the 14 tokens need (8 + 14)
    pre = dec.prefill(prompts, 8)  # no room at all: the first tick grows it
    for _ in range(2):
        again = dec.generate(prompts, 14, prefill=pre)
        assert torch.equal(again.sequences, roomy.sequences) and pre.capacity == 8
    for b in range(prompts.shape[0]):
        assert small.sequences[b, 8:].tolist() == decode_alone(model, prompts[b], 14)[0]
