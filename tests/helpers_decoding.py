"""Shared helpers of the decoding tests (not a test module): small gated models, an exit rule that stops every
token after pass 1, a record of what a call reads back to the host, and a decoder's run with an EOS."""

from __future__ import annotations

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM, pythia_config
from conftest import settings_for


def gated_model(passes: int) -> AdaPonderForCausalLM:
    """A tiny AdaPonder model of ``passes`` passes whose gates (weights drawn from N(0, 0.5²)) halt a share of the
    tokens at τ = 0.5."""
    torch.manual_seed(0)
    cfg = pythia_config("tiny", mode="adaponder", passes=passes, vocab_size=97, hidden_size=32, num_attention_heads=4,
                        intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
    model = AdaPonderForCausalLM(cfg).eval()
    with torch.no_grad():
        for gate in model.gates:
            for p in gate.parameters():
                p.normal_(0, 0.5)
    return model


class StopAfterPassOne:
    """An exit rule under which every token exits after pass 1 (where a pass-1 draft costs what decoding does)."""

    needs = frozenset()
    carries = False

    def stops(self, view):
        return torch.ones_like(view.active)


#: ``exit_rule, drafts``: tokens that all exit after pass 1 are never worth drafting; tokens that take all K passes
#: (the default rule at the default τ) are.
DRAFT_OR_NOT = pytest.mark.parametrize("exit_rule,drafts", [(StopAfterPassOne(), False), (None, True)])

#: The tensor methods that read a value back to the host.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy")


def record_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch every method of :data:`HOST_READS` to append its name to the returned list (and still run);
    ``monkeypatch.undo()`` ends the record."""
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _f=original, **k: (reads.append(_n),
                                                                                                 _f(self, *a, **k))[1])
    return reads


def run_with_eos(decoder_cls, new_tokens: int = 8):
    """A random gated model's prompts (10 tokens) decoded by ``decoder_cls`` with row 0's third generated token as
    EOS (found by a first run without one). Returns ``(model, prompts, eos, result)``."""
    from test_cached_inference import random_model

    model, ids = random_model(1, halt_per_gate=0.3)
    prompts = ids[:, :10]
    first = decoder_cls(model, settings_for(model)).generate(prompts, new_tokens)
    eos = int(first.sequences[0, 12])
    res = decoder_cls(model, settings_for(model)).generate(prompts, new_tokens, eos_token_id=eos)
    return model, prompts, eos, res


__all__ = ["DRAFT_OR_NOT", "HOST_READS", "StopAfterPassOne", "gated_model", "record_host_reads", "run_with_eos"]
