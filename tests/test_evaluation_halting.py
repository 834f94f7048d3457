"""Halting analysis: per-token dump round trip, histogram, mean NLL by exit pass, and the τ dial."""

import math

import numpy as np
import pytest
import torch

from adaponder.evaluation.accounting import flops_summary
from adaponder.modeling.exits import exit_histogram
from adaponder.evaluation.dial import parse_taus, sweep_tau
from adaponder.evaluation.halting import nll_by_exit_pass
from adaponder.evaluation.perplexity import Document, TokenScores
from adaponder.evaluation.token_dump import read_token_dump, write_token_dump
from helpers_evaluation import tiny_tokenizer


def _scores():
    tok = tiny_tokenizer()
    ids = tok("Hello\tworld,\nnew line é 🍮", add_special_tokens=False).input_ids
    n = len(ids)
    return tok, TokenScores(doc=np.zeros(n, dtype=np.int32), position=np.arange(n), token=np.array(ids),
                            nll=np.linspace(0.5, 3.0, n), exit_pass=np.array([1, 2, 4, 4, 1, 2, 2, 4, 1, 1, 1][:n]),
                            context=np.full(n, n), passes=4)


@pytest.mark.parametrize("suffix", [".tsv", ".jsonl"])
def test_token_dump_round_trips(tmp_path, suffix):
    tok, scores = _scores()
    path = write_token_dump(scores, tok, tmp_path / f"tokens{suffix}", [Document("doc-a", scores.token, 1)])
    rows = read_token_dump(path)
    assert len(rows) == len(scores)
    assert [r["token_id"] for r in rows] == scores.token.tolist()
    assert [r["exit_pass"] for r in rows] == scores.exit_pass.tolist()
    np.testing.assert_allclose([r["nll"] for r in rows], scores.nll, atol=1e-6)
    assert all(r["doc"] == "doc-a" for r in rows)
    if suffix == ".jsonl":
        # each token's own text (a byte-level piece of a multi-byte character decodes to U+FFFD)
        assert [r["token"] for r in rows] == [tok.decode([i]) for i in scores.token.tolist()]
        assert "".join(r["token"] for r in rows).startswith("Hello\tworld,\nnew line é ")
    else:  # one line per token even for tokens holding tabs or newlines
        assert len(path.read_text(encoding="utf-8").splitlines()) == len(scores) + 1


def test_nll_by_exit_pass_and_histogram():
    _, scores = _scores()
    rows = nll_by_exit_pass(scores)
    assert [r["exit_pass"] for r in rows] == [1, 2, 3, 4]
    assert [r["tokens"] for r in rows] == exit_histogram(scores.exit_pass, 4)
    for r in rows:
        sel = scores.exit_pass == r["exit_pass"]
        if r["tokens"]:
            assert math.isclose(r["mean_nll"], scores.nll[sel].mean())
        else:
            assert math.isnan(r["mean_nll"])
    with pytest.raises(ValueError):
        exit_histogram([0, 1], 4)


def test_tau_dial_is_monotone_in_flops():
    from adaponder.modeling import AdaPonderForCausalLM
    from conftest import tiny_config

    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", gate_init_bias=0.0)).eval()
    before = model.config.to_dict()
    g = torch.Generator().manual_seed(0)
    docs = [Document(f"d{i}", torch.randint(1, 97, (120,), generator=g).numpy(), n_bytes=300) for i in range(4)]
    taus = parse_taus("0.0001,0.3,0.45,0.5,0.55,0.7,0.9999")
    rows = sweep_tau(model, docs, taus, window=64, stride=32, eod_id=0)
    assert model.config.to_dict() == before  # each τ is an argument of the calls: the config is not touched
    assert [r["tau"] for r in rows] == sorted(taus)
    flops = [r["flops"]["total"] for r in rows]
    exits = [r["mean_exit"] for r in rows]
    assert all(a >= b for a, b in zip(flops, flops[1:])), flops  # larger τ halts more: fewer FLOPs
    assert all(a >= b for a, b in zip(exits, exits[1:])), exits
    assert exits[0] == 4.0 and exits[-1] == 1.0 and flops[0] > flops[-1]
    assert len(set(exits)) > 2  # the dial actually moves in between
    assert all(math.isfinite(r["ppl"]) and r["bpb"] > 0 for r in rows)
    # FLOPs × one pass of the extremes: one pass plus one gate; all K passes
    one = flops_summary(model, np.ones(10, dtype=int), 64)
    assert math.isclose(rows[-1]["flops"]["x_one_pass"], one["x_one_pass"], rel_tol=0.05)
    with pytest.raises(ValueError):
        parse_taus("0,0.5")


def test_share_of_positions_whose_greedy_token_the_later_passes_change():
    from adaponder.evaluation.halting import greedy_changed_share
    from adaponder.modeling import AdaPonderForCausalLM
    from adaponder.modeling.exit_rules import FirstPassOnly
    from conftest import run_with, tiny_config

    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", passes=3, gate_init_bias=0.0)).eval()
    docs = [Document("a", np.arange(1, 30) % 97, 1), Document("b", np.arange(40, 51), 1)]
    share = greedy_changed_share(model, docs, window=8, batch_size=3, eod_id=0)
    # by hand: windows of 8 inputs over [EOD] + ids, pass-1 greedy vs output greedy
    changed = total = 0
    for d in docs:
        seq = torch.tensor([0, *d.ids.tolist()])[:-1]
        for b in range(0, len(seq), 8):
            with torch.no_grad():
                out = model(seq[None, b:b + 8], use_cache=False, return_pass_logits=True)
            changed += int((out.logits.argmax(-1) != out.pass_logits[0].argmax(-1)).sum())
            total += out.logits.shape[1]
    assert total == 29 + 11 and share == pytest.approx(changed / total) and 0 < share < 1
    run_with(model, exit_rule=FirstPassOnly())  # every token exits after pass 1: nothing can change
    assert greedy_changed_share(model, docs, window=8, batch_size=3, eod_id=0) == 0.0
