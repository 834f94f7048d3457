"""Evaluation by difficulty (adaponder.evaluation.difficulty) against a hand computation on a tiny gated model, its
command line, and a labelled corpus trained and evaluated through the ordinary commands."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaponder.data.reasoning import MultiHopSpec, read_token_labels, write_multihop
from adaponder.modeling.run_settings import RunSettings
from conftest import REPO

SPEC = MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32, train_docs=160, val_docs=12,
                    seed=3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("difficulty") / "data"
    write_multihop(folder, SPEC)
    return folder


TAU = RunSettings(tau=0.5)


def _tiny_gated_model():
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    torch.manual_seed(0)
    # Gate bias 0 and τ = 0.5: about half the tokens halt after each pass, so exit passes vary.
    cfg = AdaPonderConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          vocab_size=64, max_position_embeddings=64, mode="adaponder", passes=3, gate_init_bias=0.0)
    return AdaPonderForCausalLM(cfg).eval()


def test_tables_match_a_hand_computation(corpus):
    from scipy.stats import rankdata

    from adaponder.data import load_tokenizer
    from adaponder.evaluation.difficulty import evaluate_difficulty
    from adaponder.evaluation.perplexity import load_documents

    model = _tiny_gated_model()
    tok = load_tokenizer(corpus / "tokenizer.json")
    res = evaluate_difficulty(model, corpus, tok, batch_size=5, settings=TAU)
    # by hand: each document once, as [EOD] + tokens; position i predicts token i
    rows = []
    for doc, lab in zip(load_documents(corpus, tok, split="val"), read_token_labels(corpus, "val")):
        ids = torch.tensor([[tok.eod_id, *doc.ids.tolist()]])
        with torch.no_grad():
            out = model(input_ids=ids[:, :-1], use_cache=False, settings=TAU)
        nll = F.cross_entropy(out.logits[0], ids[0, 1:], reduction="none").numpy()
        hit = (out.logits[0].argmax(-1) == ids[0, 1:]).numpy()
        rows += list(zip(lab.tolist(), nll.tolist(), hit.tolist(), out.exit_pass[0].tolist()))
    lab, nll, hit, exits = (np.array(c) for c in zip(*rows))
    assert len(set(exits.tolist())) > 1  # the check below means something
    for level in res["levels"]:
        sel = lab == level["difficulty"]
        assert level["tokens"] == sel.sum() == SPEC.val_docs * SPEC.queries // SPEC.max_hops
        assert level["accuracy"] == pytest.approx(hit[sel].mean())
        assert level["mean_nll"] == pytest.approx(nll[sel].mean(), rel=1e-5)
        assert level["mean_exit"] == pytest.approx(exits[sel].mean())
    assert [lv["difficulty"] for lv in res["levels"]] == [1, 2, 3]
    filler = lab == -2
    assert res["classes"]["filler"]["pass_share"] == pytest.approx(exits[filler].sum() / exits.sum())
    assert res["classes"]["answer"]["tokens"] == (lab > 0).sum()
    a = lab > 0
    r1, r2 = rankdata(lab[a]), rankdata(exits[a])
    assert res["spearman_difficulty_exit"] == pytest.approx(np.corrcoef(r1, r2)[0, 1])
    # fixed pruning at the learned mean exit pass: one table per rule and seed, same answer counts
    for rule, runs in res["fixed_pruning"].items():
        assert [lv["tokens"] for lv in runs[0]["levels"]] == [lv["tokens"] for lv in res["levels"]]
        assert runs[0]["mean_exit"] == pytest.approx(res["mean_exit"], abs=0.3)


@pytest.mark.integration
def test_a_labelled_corpus_trains_and_evaluates_through_the_ordinary_commands(corpus, tmp_path):
    """pretrain on the generated folder (its word-level tokenizer picked up), export, then the difficulty CLI."""
    import yaml

    cfg = {"model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                     "vocab_size": 64, "max_position_embeddings": 64, "mode": "adaponder", "passes": 2},
           "data": {"path": str(corpus), "seq_len": SPEC.doc_tokens},
           "deepspeed": {"zero_stage": 0, "precision": "fp32"}, "checkpoint": {"every": 4, "keep": 1},
           "eval": {"every": 0, "max_batches": 2, "micro_batch": 4, "report": False},
           "logging": {"every": 2},
           "train": {"out_dir": str(tmp_path / "run"), "steps": 4, "micro_batch": 4, "global_batch": 4, "threads": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {**__import__("os").environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(tmp_path / "run.yaml")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    hf = tmp_path / "run" / "hf"
    assert json.loads((hf / "tokenizer.json").read_text())["model"]["type"] == "WordLevel"
    proc = subprocess.run([sys.executable, "-m", "adaponder.cli.difficulty", str(hf), "--data", str(corpus),
                           "--json", str(tmp_path / "d.json")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| difficulty | answers | accuracy |" in proc.stdout and "Spearman" in proc.stdout
    res = json.loads((tmp_path / "d.json").read_text())
    assert [lv["tokens"] for lv in res["levels"]] == [SPEC.val_docs * 2] * 3
    assert res["classes"]["filler"]["tokens"] == SPEC.val_docs * (SPEC.doc_tokens - 1 - 3 * SPEC.queries)


def test_unlabelled_data_is_a_clear_error(tmp_path):
    from adaponder.data.errors import DataError
    from adaponder.data.prepare import prepare
    from adaponder.evaluation.difficulty import evaluate_difficulty

    (tmp_path / "a.txt").write_text("some text " * 50)
    (tmp_path / "b.txt").write_text("more text " * 50)
    prepare([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], tmp_path / "prep", val_fraction=0.5, progress=False)
    with pytest.raises(DataError, match="no token labels"):
        evaluate_difficulty(_tiny_gated_model(), tmp_path / "prep", None)
