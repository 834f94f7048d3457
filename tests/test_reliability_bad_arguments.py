"""One ``error:`` line and exit code 2 for every bad argument, before any work; nothing written, nothing lost.

Each case used to end in a traceback (``--limit -1``, ``--passes`` beyond the trained K, a benchmark's size or
checkpoint that does not exist, ``--max-hops 0``) or to be accepted without a word (``--max-tokens 0`` scoring
everything, an lm-eval document with empty text scored, a reasoning corpus with more symbols than training can
show, a dict taken for exit passes). Each test asserts the exit code, the one line naming the argument or field,
and that the files under the test's folder are the same before and after (the outputs it names not created).
The commands run in-process (``main(argv)``); the benchmarks are loaded from their files, one through
``adaponder bench`` as a user starts it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from helpers_evaluation import lm_eval_logging_restored, tiny_model, tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
K = 4


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A tiny gated checkpoint (K = 4, the Pythia tokenizer) and a text file, in one folder the tests snapshot."""
    root = tmp_path_factory.mktemp("bad_arguments")
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, max_position_embeddings=128,
               passes=K).save_pretrained(root / "ckpt")
    tiny_tokenizer().save_pretrained(root / "ckpt")
    (root / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 8)
    return root


@pytest.fixture(autouse=True)
def lm_eval_logging():
    yield from lm_eval_logging_restored()


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(code: int, capsys, *must: str) -> str:
    """Exit 2 and exactly one line on stderr, ``error: …`` naming ``must``; no traceback."""
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    for m in must:
        assert m in lines[0], (m, lines[0])
    return lines[0]


# -- the evaluation commands -------------------------------------------------------------------------------
def _perplexity(root: Path, *args: str) -> list[str]:
    return [str(root / "ckpt"), "--data", str(root / "text.txt"), "--device", "cpu", "--json",
            str(root / "out.json"), "--dump", str(root / "tokens.tsv"), *args]


@pytest.mark.parametrize("args, must", [
    (["--passes", "9"], ["--passes 9", f"gates for K = {K} passes", f"expected 1 <= --passes <= {K}"]),
    (["--passes", "0"], ["--passes 0", "expected 1 <= --passes"]),
    (["--exit-rule", "uniform", "--target-mean-exit", "7"], ["--target-mean-exit 7", f"({K} here)",
                                                             f"expected 1 <= --target-mean-exit <= {K}"]),
    (["--passes", "2", "--exit-rule", "geometric", "--target-mean-exit", "3"], ["--target-mean-exit 3", "(2 here)"]),
    (["--max-tokens", "0"], ["--max-tokens 0", "expected a number of tokens >= 1", "leave the option out"]),
    (["--max-tokens-per-doc", "-5"], ["--max-tokens-per-doc -5", "expected a number of tokens >= 1"]),
], ids=["passes-beyond-k", "passes-0", "target-beyond-k", "target-beyond-passes", "max-tokens-0",
        "max-tokens-per-doc-negative"])
def test_perplexity_refuses_recurrence_and_caps_it_cannot_honour(root, capsys, one_thread, args, must):
    before = _snapshot(root)
    from adaponder.cli import perplexity

    _refused(perplexity.main(_perplexity(root, *args)), capsys, *must)
    assert _snapshot(root) == before and not (root / "out.json").exists()


def test_dial_and_halting_name_passes_beyond_k_and_a_zero_cap(root, capsys, one_thread):
    from adaponder.cli import dial, halting

    before = _snapshot(root)
    data = ["--data", str(root / "text.txt")]
    _refused(dial.main([str(root / "ckpt"), *data, "--passes", "9", "--json", str(root / "d.json")]), capsys,
             f"this checkpoint has gates for {K} passes; passes=9 exceeds it", f"expected 1 <= passes <= {K}")
    _refused(dial.main([str(root / "ckpt"), *data, "--max-tokens", "0"]), capsys, "--max-tokens 0")
    _refused(halting.main([str(root / "ckpt"), *data, "--max-tokens", "0", "--dump", str(root / "t.tsv")]), capsys,
             "--max-tokens 0")
    assert _snapshot(root) == before


def _lambada(folder: Path, texts: list[str]) -> Path:
    path = folder / "lambada_openai" / "lambada_test.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_lm_eval_refuses_a_limit_below_one_example(root, tmp_path, capsys, one_thread, limit):
    from adaponder.cli import lm_eval

    _lambada(tmp_path / "data", ["one two three", "four five six"])
    before = _snapshot(tmp_path)
    code = lm_eval.main([str(root / "ckpt"), "--tasks", "adaponder_lambada_openai", "--limit", limit,
                         "--device", "cpu", "--output_path", str(tmp_path / "results"),
                         "--metadata", json.dumps({"adaponder_eval_data": str(tmp_path / "data")})])
    _refused(code, capsys, f"--limit {limit}", "expected a number of examples per task >= 1, or a fraction")
    assert _snapshot(tmp_path) == before and not (tmp_path / "results").exists()


def test_report_refuses_a_limit_below_one_example(root, tmp_path, capsys):
    from adaponder.cli import report

    code = report.main([str(root / "ckpt"), "--data", str(root / "text.txt"), "--out", str(tmp_path / "r"),
                        "--limit", "-3"])
    _refused(code, capsys, "--limit -3")
    assert not (tmp_path / "r").exists()


@pytest.mark.integration
@pytest.mark.integration  # lm-eval asks git for the commit (a process)
def test_lm_eval_refuses_a_document_with_empty_text(root, tmp_path, capsys, one_thread):
    from adaponder.cli import lm_eval

    path = _lambada(tmp_path / "data", ["one two three", "   ", "four five six"])
    before = _snapshot(tmp_path)
    code = lm_eval.main([str(root / "ckpt"), "--tasks", "adaponder_lambada_openai", "--limit", "3",
                         "--device", "cpu", "--output_path", str(tmp_path / "results"),
                         "--metadata", json.dumps({"adaponder_eval_data": str(tmp_path / "data")})])
    # (lm-eval logs its own progress lines before the data is read: the error is the one error line, and last)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err[-3000:]
    assert f"{path}:2: text is empty; expected the document's text" in errors[0]
    assert _snapshot(tmp_path) == before and not (tmp_path / "results").exists()


def test_every_task_loader_refuses_an_empty_document_text(tmp_path):
    from adaponder.data.errors import RecordError

    spec = importlib.util.spec_from_file_location("adaponder_eval_task_utils", REPO / "eval" / "tasks" / "utils.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    arc = {"id": "q", "question": {"stem": "", "choices": [{"text": "x", "label": "A"}]}, "answerKey": "A"}
    cases = [
        ("arc_easy/ARC-Easy-Test.jsonl", [arc], tasks.load_arc_easy, "question.stem is empty"),
        ("winogrande/dev.jsonl", [{"sentence": "", "option1": "a", "option2": "b", "answer": "1"}],
         tasks.load_winogrande, "sentence is empty"),
        ("hellaswag/hellaswag_val.jsonl", [{"ind": 0, "activity_label": "a", "ctx_a": "", "ctx_b": "", "ctx": " ",
                                            "endings": ["x", "y"], "source_id": "s", "split": "val",
                                            "split_type": "indomain", "label": "0"}],
         tasks.load_hellaswag, "ctx is empty"),
        ("lambada_openai/lambada_test.jsonl", [{"text": 7}], tasks.load_lambada_openai, "text is int"),
    ]
    for rel, records, load, message in cases:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        with pytest.raises(RecordError, match=f"{path}:1: {message}"):
            load(str(tmp_path))
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text(json.dumps({"goal": "", "sol1": "a", "sol2": "b"}) + "\n")
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n")
    with pytest.raises(RecordError, match="valid.jsonl:1: goal is empty"):
        tasks.load_piqa(str(tmp_path))
    (tmp_path / "sciq").mkdir()
    (tmp_path / "sciq" / "test.json").write_text(json.dumps([{"question": "", "distractor1": "a", "distractor2": "b",
                                                              "distractor3": "c", "correct_answer": "d",
                                                              "support": ""}]))
    with pytest.raises(RecordError, match=r"test.json: record 0 \(0-based\): question is empty"):
        tasks.load_sciq(str(tmp_path))


# -- the benchmarks -------------------------------------------------------------------------------------------
def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"adaponder_bench_{name}", REPO / "eval" / f"bench_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_refused(name: str, args: list[str], capsys, *must: str) -> None:
    with pytest.raises(SystemExit) as info:
        _bench(name).main(args)
    _refused(info.value.code, capsys, *must)


@pytest.mark.parametrize("name, args, must", [
    ("inference", ["--size", "7b"], ["--size '7b': no such Pythia size; expected one of 70m, 160m", "12b, tiny"]),
    ("inference", ["--size", "runs/demo/hf"], ["--size 'runs/demo/hf': no such Pythia size; it looks like a path"]),
    ("speculative", ["--checkpoint", "runs/no-such/hf"], ["--checkpoint runs/no-such/hf: no such folder (expected a checkpoint folder"]),
    ("speculative", ["--shapes", "7b:adaponder"], ["--shapes '7b': no such Pythia size"]),
    ("compiled", ["--shapes", "study,huge"], ["--shapes 'huge': no such Pythia size", "tiny, study"]),
    ("train", ["--size", "3b"], ["--size '3b': no such Pythia size"]),
    ("lm_eval", ["--checkpoint", "runs/no-such/hf"], ["--checkpoint runs/no-such/hf: no such folder (expected a checkpoint folder"]),
], ids=["inference-size", "inference-path-as-size", "speculative-checkpoint", "speculative-shape", "compiled-shape",
        "train-size", "lm-eval-checkpoint"])
def test_benchmarks_name_an_unknown_size_or_a_missing_checkpoint(tmp_path, capsys, monkeypatch, name, args, must):
    monkeypatch.chdir(tmp_path)
    _bench_refused(name, [*args, "--json", str(tmp_path / "rows.json")], capsys, *must)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_folder_without_a_model_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _bench_refused("speculative", ["--checkpoint", str(tmp_path / "empty")], capsys,
                   f"--checkpoint {tmp_path / 'empty'}: not a checkpoint folder (no config.json in it)")


@pytest.mark.integration
@pytest.mark.integration  # a benchmark runs as a child process
def test_adaponder_bench_passes_a_missing_checkpoint_on_as_one_line(tmp_path, capfd):
    from adaponder.cli import bench

    missing = tmp_path / "no-such" / "hf"
    assert bench.main(["speculative", "--checkpoint", str(missing)]) == 2
    err = capfd.readouterr().err
    assert err.strip() == f"error: --checkpoint {missing}: no such folder (expected a checkpoint folder with " \
                          "config.json)", err[-3000:]


# -- the reasoning corpus -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, must", [
    (["--max-hops", "0"], ["max_hops: 0, expected at least 1"]),
    (["--symbols", "100000"], ["symbols: 100000, more than the training split's 80000 one-hop queries",
                               "expected at most 80000 symbols, or more train_docs"]),
    (["--symbols", "64", "--train-docs", "10"], ["symbols: 64, more than the training split's 40 one-hop queries"]),
], ids=["max-hops-0", "symbols-absurd", "symbols-beyond-train-docs"])
def test_reasoning_data_refuses_a_corpus_that_cannot_work(tmp_path, capsys, args, must):
    from adaponder.cli import reasoning_data

    _refused(reasoning_data.main([str(tmp_path / "corpus"), *args]), capsys, *must)
    assert list(tmp_path.iterdir()) == []


# -- the model API ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exit_pass, error, message", [
    ({1: 3, 2: 5}, TypeError,
     f"exit_pass: expected a tensor of per-token exit passes (whole numbers 1..{K}), got dict"),
    ("1,2", TypeError, "got str"),
    (torch.tensor([1, 9]), ValueError, f"token 1 has exit pass 9; expected whole numbers 1..{K}"),
    (torch.tensor([0.5, 2.0]), ValueError, "token 0 has exit pass 0.5"),
    (torch.tensor([0, 1]), ValueError, "token 0 has exit pass 0"),
    (torch.tensor([True]), TypeError, "torch.bool"),
    (torch.tensor([], dtype=torch.long), ValueError, "exit_pass is empty"),
], ids=["dict", "str", "beyond-k", "share", "zero", "bool", "empty"])
def test_flops_per_token_takes_exit_passes_only(exit_pass, error, message):
    model = tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=97, passes=K)
    with pytest.raises(error) as info:
        model.flops_per_token(exit_pass)
    assert message in str(info.value)
    # exit passes as a tensor, a list or an array still count (the mean of [1, 3] is 2 passes)
    assert model.flops_per_token([1, 3])["mean_passes"] == model.flops_per_token(torch.tensor([2, 2]))["mean_passes"]


def test_fewer_passes_than_trained_are_refused_for_heads_shaped_by_k(tmp_path):
    # one head per pass: a model built for fewer passes could not load them (a transformers size-mismatch traceback)
    from conftest import tiny_config

    from adaponder.errors import UsageError
    from adaponder.evaluation.settings import load_for_eval, recurrence_overrides
    from adaponder.modeling import AdaPonderForCausalLM

    AdaPonderForCausalLM(tiny_config("ponderlm", passes=3, consistency_heads=True)).save_pretrained(tmp_path / "m")
    with pytest.raises(UsageError, match=r"^passes=2: this checkpoint's consistency_heads hold one head per pass of "
                                         r"the K=3 it was trained with; run it at passes=3$"):
        recurrence_overrides(tmp_path / "m", passes=2)
    model, _ = load_for_eval(tmp_path / "m", passes=3)
    assert model.config.num_passes == 3
