"""The training step never waits on the device inside the model.

A host synchronisation — ``.item()``, ``bool()``/``int()`` of a tensor, ``.tolist()``/``.cpu()``, or an op whose
output shape depends on tensor values (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``,
``repeat_interleave`` without a size) — stalls a GPU's queue once per call. On the ``meta`` device every one of
them raises, because there are no values to read; so the training forward (the pass loop, A1–A10), the ponder
loss (A11–A12) and backward run here on meta tensors, in every mode, with and without per-pass checkpointing,
exactly as the trainer calls them. The last test proves the check bites: an ``.item()`` added inside the pass
loop makes it fail.
"""

import math

import pytest
import torch

from conftest import tiny_config

from adaponder.modeling import AdaPonderForCausalLM, PonderGate, ponder_loss


class HostSync(AssertionError):
    pass


def training_step_on_meta(mode: str, checkpointing: bool = False, **overrides) -> None:
    """Forward as the trainer runs it (no attention mask, shifted labels, chunked loss), ponder loss, backward."""
    with torch.device("meta"):
        model = AdaPonderForCausalLM(tiny_config(mode, **overrides)).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    ids = torch.randint(0, 97, (2, 16), device="meta")
    try:
        out = model(input_ids=ids[:, :-1], shift_labels=ids[:, 1:], use_cache=False, return_logits=False)
        loss = out.loss
        if out.gate_values is not None:
            loss = loss + 0.1 * ponder_loss(out.gate_values, out.gate_mask, 0.1)
        loss.backward()
    except (RuntimeError, NotImplementedError) as err:  # what meta tensors raise when a value is read
        raise HostSync(f"{mode}: the training step reads a tensor value on the host: {err}") from err


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("mode,overrides", [("adaponder", {}), ("ponderlm", {}), ("loop", {}), ("vanilla", {}),
                                            ("pause", {"pause_tokens": 2}), ("adaponder", {"passes": 2})])
def test_training_step_has_no_host_sync(mode, overrides, checkpointing):
    training_step_on_meta(mode, checkpointing, **overrides)


def test_ponder_loss_on_meta_equals_cpu_semantics():
    """The sync-free bottom-k (sort + prefix) selects what ``topk`` of the masked pool would."""
    g = torch.Generator().manual_seed(0)
    values = torch.rand(3, 7, 4, generator=g, requires_grad=True)
    mask = torch.rand(3, 7, 4, generator=g) > 0.3
    for k in (0.05, 0.3, 1.0):
        pool = values[mask]
        expected = torch.topk(pool, math.ceil(k * pool.numel()), largest=False).values.mean()
        torch.testing.assert_close(ponder_loss(values, mask, k), expected)
    (grad,) = torch.autograd.grad(ponder_loss(values, mask, 0.3), values)
    assert not grad[~mask].any() and grad.sum() == pytest.approx(1.0)  # only pool members, weights 1/n


def test_check_catches_an_item_in_the_pass_loop(monkeypatch):
    original = PonderGate.forward

    def gate_with_sync(self, hidden, logit_floor=None):
        s = original(self, hidden, logit_floor)
        if float(s.mean().item()) < 0:  # a host read, as a debugging line would add
            raise AssertionError("unreachable")
        return s

    monkeypatch.setattr(PonderGate, "forward", gate_with_sync)
    with pytest.raises(HostSync, match="item"):
        training_step_on_meta("adaponder")


def test_check_catches_a_data_dependent_shape(monkeypatch):
    original = PonderGate.forward
    monkeypatch.setattr(PonderGate, "forward", lambda self, h, floor=None: original(self, h)[original(self, h) > -1])
    with pytest.raises(HostSync):
        training_step_on_meta("adaponder")


# -- cached decoding (A15): the step the inference benchmark times ------------------------------------------------
def _decode_setup(batch=4, passes=4):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("bench_inference", REPO / "eval" / "bench_inference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", passes=passes)).eval()
    ids = torch.randint(0, 97, (batch, 24))
    bench.calibrate(model, ids, 0.5)  # half of the token-passes skipped: compaction in every pass
    return bench, model, ids


@torch.no_grad()
def test_cached_decode_step_syncs_once_per_pondering_pass():
    """Compaction needs the size of the next pass on the host: one synchronisation per pass that can halt tokens,
    plus the input-id range check at the top of ``forward`` (none of them inside a layer)."""
    bench, model, ids = _decode_setup()
    out = model(ids[:, :16], use_cache=True)
    cache, worst = out.cache, 0
    for t in range(16, 24):
        with bench.HostSyncCounter() as counter:
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
        cache, worst = out.cache, max(worst, counter.count)
    assert worst <= (model.config.passes - 1) + 1


@torch.no_grad()
def test_cached_decode_writes_the_cache_in_place():
    """After the first decoding step has made room, steps write into the same buffers (no concatenation)."""
    _, model, ids = _decode_setup()
    out = model(ids[:, :16], use_cache=True)
    out = model(ids[:, 16:17], cache=out.cache, use_cache=True)  # grows the room once
    cache = out.cache
    storage = [layer.keys.data_ptr() for layer in cache.layers]
    for t in range(17, 24):
        cache = model(ids[:, t:t + 1], cache=cache, use_cache=True).cache
    assert [layer.keys.data_ptr() for layer in cache.layers] == storage
    assert cache.get_seq_length() == 24 and cache.kv_bytes() == model.kv_cache_bytes_per_token() * 4 * 24
