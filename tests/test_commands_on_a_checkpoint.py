"""Every command that loads a model runs end to end on a local checkpoint folder, in-process (``main(argv)``).

A command whose tests stopped at its argument checks could break on the first model it loaded without any test
seeing it (``adaponder dial`` passed ``load_for_eval``'s arguments by position and, once a parameter left that
function, failed on every local folder). One tiny checkpoint (the toy tokenizer's vocabulary, consistency heads
for ``calibrate``) serves them all; the difficulty evaluator gets a model of its labelled corpus's vocabulary.
The last test keeps the list whole: every command of ``adaponder --help`` is run here, named with the test that
runs it elsewhere (training commands), or loads no model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers_evaluation import lm_eval_logging_restored, tiny_model

REPO = Path(__file__).resolve().parents[1]
PASSES = 3


@pytest.fixture(scope="module")
def ckpt(data, tmp_path_factory) -> Path:
    """A saved AdaPonder model of the toy tokenizer's vocabulary, with that tokenizer and consistency heads."""
    from adaponder.train.export import save_tokenizer
    from helpers_train import TINY_VOCAB

    path = tmp_path_factory.mktemp("commands") / "ckpt"
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=TINY_VOCAB,
               max_position_embeddings=64, passes=PASSES, consistency_heads=True).save_pretrained(path)
    save_tokenizer(path, str(data["tokenizer"]))
    return path


def _ok(code: int, capsys_or_fd, *expected: str) -> str:
    out = capsys_or_fd.readouterr()
    text = out.out + out.err
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "error:" not in text, text[-3000:]
    for e in expected:
        assert e in text, (e, text[-3000:])
    return text


def test_dial_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli.main import main

    out = tmp_path / "dial.json"
    code = main(["dial", str(ckpt), "--data", str(data["data"]), "--taus", "0.01,0.1", "--window", "32",
                 "--max-tokens", "256", "--json", str(out)])
    _ok(code, capsys, f"passes K: {PASSES}")
    assert [row["tau"] for row in json.loads(out.read_text())] == [0.01, 0.1]


def test_perplexity_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli import perplexity

    out = tmp_path / "ppl.json"
    code = perplexity.main([str(ckpt), "--data", str(data["data"]), "--window", "32", "--max-tokens", "256",
                            "--exit-rule", "uniform", "--target-mean-exit", "1.5", "--device", "cpu",
                            "--json", str(out)])
    _ok(code, capsys, f"passes K: {PASSES} (trained with {PASSES})", "target mean exit pass 1.5000")
    assert json.loads(out.read_text())["settings"]["target_mean_exit"] == 1.5


def test_halting_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli import halting

    dump = tmp_path / "tokens.tsv"
    code = halting.main([str(ckpt), "--data", str(data["data"]), "--window", "32", "--max-tokens", "256",
                         "--device", "cpu", "--dump", str(dump)])
    _ok(code, capsys, "| exit pass | tokens |")
    assert len(dump.read_text().splitlines()) > 100


def test_report_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli import report

    code = report.main([str(ckpt), "--data", str(data["data"]), "--out", str(tmp_path / "r"), "--no-lm-eval",
                        "--window", "32", "--max-tokens", "128", "--device", "cpu"])
    _ok(code, capsys)
    assert (tmp_path / "r" / "report.md").is_file()


def test_calibrate_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    import shutil

    from adaponder.cli import calibrate

    own = tmp_path / "ckpt"  # (calibrate writes next to the checkpoint: a copy, so the module's stays as it was)
    shutil.copytree(ckpt, own)
    code = calibrate.main([str(own), "--data", str(data["data"]), "--split", "val", "--window", "16",
                           "--max-tokens", "512"])
    _ok(code, capsys, "consistency exit calibrated on")
    assert json.loads((own / "exit_calibration.json").read_text())["windows"] > 0


@pytest.fixture
def lm_eval_logging():
    yield from lm_eval_logging_restored()


@pytest.mark.integration
@pytest.mark.integration  # lm-eval asks git for the commit (a process)
def test_lm_eval_runs_on_a_local_checkpoint(ckpt, tmp_path, capsys, one_thread, lm_eval_logging):
    from adaponder.cli import lm_eval

    folder = tmp_path / "eval-data" / "lambada_openai"
    folder.mkdir(parents=True)
    texts = ["the model reads a short line of text", "a second line ends with one more word"]
    (folder / "lambada_test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    code = lm_eval.main([str(ckpt), "--tasks", "adaponder_lambada_openai", "--limit", "2", "--device", "cpu",
                         "--metadata", json.dumps({"adaponder_eval_data": str(folder.parent)})])
    _ok(code, capsys, "[adaponder] realised compute", f"passes K: {PASSES}")


def test_train_draft_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli import train_draft

    out = tmp_path / "drafted"
    code = train_draft.main([str(ckpt), "--data", str(data["data"]), "--out", str(out), "--steps", "2",
                             "--window", "16", "--batch", "2"])
    _ok(code, capsys, "agreement with the full model after")
    assert json.loads((out / "config.json").read_text())["draft_head"] is True


def test_train_report_runs_on_a_local_checkpoint(ckpt, data, tmp_path, capsys, one_thread):
    from adaponder.cli import train_report

    code = train_report.main(["--model", str(ckpt), "--data", str(data["data"]), "--seq-len", "32",
                              "--micro-batch", "4", "--max-batches", "2", "--out", str(tmp_path / "rep")])
    _ok(code, capsys)
    assert (tmp_path / "rep" / "report.md").is_file()


def test_difficulty_runs_on_a_local_checkpoint(tmp_path, capsys, one_thread):
    from adaponder.cli import difficulty
    from adaponder.data.reasoning import MultiHopSpec, write_multihop
    from adaponder.train.export import save_tokenizer

    corpus = tmp_path / "corpus"
    meta = write_multihop(corpus, MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32,
                                               train_docs=16, val_docs=6, seed=1))
    model = tmp_path / "ckpt"
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=meta["vocab_size"],
               max_position_embeddings=64, passes=PASSES).save_pretrained(model)
    save_tokenizer(model, str(corpus / "tokenizer.json"))
    out = tmp_path / "difficulty.json"
    code = difficulty.main([str(model), "--data", str(corpus), "--batch-size", "8", "--json", str(out)])
    _ok(code, capsys)
    assert out.is_file()


@pytest.mark.integration
@pytest.mark.integration  # a benchmark runs as a child process
def test_bench_runs_on_a_local_checkpoint(ckpt, tmp_path, capfd):
    from adaponder.cli import bench

    rows = tmp_path / "rows.json"  # (the benchmark runs in a child process: its output is read from the fds)
    code = bench.main(["speculative", "--checkpoint", str(ckpt), "--batches", "1", "--dtypes", "fp32", "--gammas",
                       "2", "--context", "8", "--new-tokens", "4", "--repeats", "1", "--threads", "1",
                       "--json", str(rows)])
    _ok(code, capfd, "self-speculative decoding")
    row = json.loads(rows.read_text())[0]
    assert row["model"] == str(ckpt) and row["K"] == PASSES and row["same_tokens"]  # the checkpoint, not a shape


# Commands that load a model and are run end to end by a test elsewhere (a training run of their own).
ELSEWHERE = {
    "export": "test_reliability_interrupts.py::test_a_kill_while_rotating_leaves_no_folder_named_like_a_checkpoint",
    "finetune": "test_palbert_finetune.py::test_finetune_smoke_rte_pabee_baseline_from_checkpoint",
    "pretrain": "test_continue_recipe.py::test_tiny_continue_runs_with_three_overrides",
    "study": "test_study.py::test_quick_profile_trains_and_reports_every_arm",
}
NO_MODEL = {"prepare", "reasoning-data", "plan", "build-extensions"}
LOADERS = re.compile(r"load_for_eval\(|from_pretrained\(|AdaPonderLM\b|from_backbone\(")


def test_every_command_that_loads_a_model_is_run_on_a_checkpoint():
    from adaponder.cli.main import COMMANDS

    here = Path(__file__).read_text(encoding="utf-8")
    tested = {c.name for c in COMMANDS if f"def test_{c.name.replace('-', '_')}_runs_on_a_local_checkpoint(" in here
              or (c.name == "eval" and "def test_lm_eval_runs_on_a_local_checkpoint(" in here)}
    assert {c.name for c in COMMANDS} == tested | set(ELSEWHERE) | NO_MODEL, "classify every command here"
    for name, where in ELSEWHERE.items():
        file, test = where.split("::")
        assert f"def {test}(" in (REPO / "tests" / file).read_text(encoding="utf-8"), where
    for c in COMMANDS:
        if c.name in NO_MODEL:
            code = (REPO / "adaponder" / "cli" / f"{c.module}.py").read_text(encoding="utf-8")
            code = code.split('"""', 2)[-1]  # (the code, not the module's docstring)
            assert not LOADERS.search(code), f"{c.name} loads a model: give it a test here"
