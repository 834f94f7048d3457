"""User errors on the command line: one ``error:`` line naming the culprit and exit code 2,
no traceback unless ``--debug``; genuine bugs keep their traceback. Token ids outside the vocabulary and empty
input are a ValueError naming the id and the vocabulary size; the packed loader range-checks every batch.

The CLIs run in-process (``main(argv)``) on a tiny checkpoint whose 1000-id vocabulary is smaller than its
(Pythia) tokenizer's; the pretraining case runs ``launch/pretrain.py`` in a worker process (DeepSpeed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaponder.cli import lm_eval as eval_cli
from adaponder.cli import perplexity
from adaponder.cli import prepare as prepare_cli
from adaponder.cli.errors import UsageError, cli_main, is_user_error, one_line
from adaponder.data import errors as data_errors
from adaponder.data.loader import PackedLoader
from adaponder.modeling.modeling_adaponder import TokenIdError
from helpers_evaluation import tiny_model, tiny_tokenizer
from helpers_train import LauncherWorker, tiny_train_config, write_config

VOCAB, CONTEXT = 1000, 128


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint (1000 ids, context 128) saved with the Pythia tokenizer (ids up to 50k)."""
    path = tmp_path_factory.mktemp("cli_errors") / "ckpt"
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=VOCAB,
               max_position_embeddings=CONTEXT).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli_error_files")
    (root / "empty.txt").write_text("")
    (root / "text.txt").write_text("The quick brown fox jumps over the lazy dog.\n")
    (root / "not-a-checkpoint").mkdir()
    return {"root": root, "empty": root / "empty.txt", "text": root / "text.txt",
            "folder": root / "not-a-checkpoint", "missing": root / "missing.txt"}


def _ppl(ckpt, *args):
    return perplexity.main, [str(ckpt), *map(str, args), "--device", "cpu"]


# case id -> (main, argv, strings the one error line must hold); built from the fixtures.
def _cases(ckpt: Path, f: dict[str, Path]) -> dict[str, tuple]:
    nope = f["root"] / "no-such-ckpt"
    return {
        "perplexity-missing-checkpoint": (*_ppl(nope, "--data", f["text"]),
                                          [f"checkpoint {nope}: no such folder", "config.json"]),
        "perplexity-folder-without-config": (*_ppl(f["folder"], "--data", f["text"]),
                                             [f"checkpoint {f['folder']}: not a checkpoint folder (no config.json"]),
        "perplexity-missing-data": (*_ppl(ckpt, "--data", f["missing"]),
                                    [f"--data {f['missing']}: no such file or folder"]),
        "perplexity-empty-file": (*_ppl(ckpt, "--data", f["empty"]), [f"no tokens to score in {f['empty']}"]),
        "perplexity-window-beyond-context": (*_ppl(ckpt, "--data", f["text"], "--window", 4096),
                                             ["--window 4096", f"max_position_embeddings {CONTEXT}"]),
        "perplexity-stride-beyond-window": (*_ppl(ckpt, "--data", f["text"], "--window", 16, "--stride", 32),
                                            ["--stride 32", "window (16)"]),
        "perplexity-ids-outside-vocabulary": (*_ppl(ckpt, "--data", f["text"]),
                                              [f"{f['text']}: token 1 has id ", f"vocabulary (size {VOCAB})"]),
        "eval-missing-checkpoint": (eval_cli.main, [str(nope), "--tasks", "adaponder_lambada_openai", "--limit", "2"],
                                    [f"checkpoint {nope}: no such folder (expected a checkpoint folder with "
                                     "config.json)"]),
        "eval-model-args-missing-checkpoint": (eval_cli.main, ["--model_args", f"checkpoint={nope},passes=2",
                                                               "--tasks", "adaponder_lambada_openai"],
                                               [f"checkpoint {nope}: no such folder"]),
        "prepare-missing-input": (prepare_cli.main, [str(f["missing"]), "--output", str(f["root"] / "prepared"),
                                                     "--no-progress"], [f"input {f['missing']} does not exist"]),
    }


CASE_IDS = list(_cases(Path("c"), {k: Path(k) for k in ("root", "empty", "text", "folder", "missing")}))


@pytest.mark.parametrize("case", CASE_IDS)
def test_user_error_is_one_line_naming_the_culprit_and_exit_2(case, ckpt, files, capsys, one_thread):
    main, argv, expected = _cases(ckpt, files)[case]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, (text, err)


def test_debug_shows_the_traceback_of_a_user_error(ckpt, files, capsys, monkeypatch):
    argv = [str(files["root"] / "no-such-ckpt"), "--data", str(files["text"])]
    with pytest.raises(UsageError, match="no such folder"):
        perplexity.main([*argv, "--debug"])
    monkeypatch.setenv("ADAPONDER_DEBUG", "1")
    with pytest.raises(UsageError, match="no such folder"):
        perplexity.main(argv)
    monkeypatch.delenv("ADAPONDER_DEBUG")
    assert perplexity.main(argv) == 2  # --debug did not stick


@pytest.mark.parametrize("bug", [RuntimeError("boom"), KeyError("boom"), ValueError("boom"), IndexError("boom")])
def test_a_genuine_bug_keeps_its_traceback(bug, ckpt, files, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(perplexity, "load_tokenizer_for", broken)
    with pytest.raises(type(bug), match="boom"):
        perplexity.main([str(ckpt), "--data", str(files["text"]), "--device", "cpu"])
    assert "error:" not in capsys.readouterr().err


def test_token_id_error_from_the_model_is_a_user_error_on_the_command_line(capsys):
    model = tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=VOCAB)

    @cli_main
    def main(argv):
        model(torch.tensor([[1, 2, VOCAB + 7]]))
        return 0

    assert main([]) == 2
    assert capsys.readouterr().err == (f"error: token id {VOCAB + 7} at position (0, 2) is outside the vocabulary "
                                       f"(size {VOCAB}: ids 0..{VOCAB - 1})\n")


def test_only_rank_0_prints_and_lists_become_one_line(capsys, monkeypatch):
    from adaponder.train.config import TrainConfigError

    @cli_main
    def main(argv):
        raise TrainConfigError(["optim.lr: expected a number", "train.steps: expected an integer"], source="x.yaml")

    assert main([]) == 2
    assert capsys.readouterr().err == ("error: 2 problem(s) in the training configuration in x.yaml: optim.lr: "
                                       "expected a number; train.steps: expected an integer\n")
    monkeypatch.setenv("RANK", "1")
    assert main([]) == 2 and capsys.readouterr().err == ""
    assert one_line("a\n\n  b  \n") == "a; b"
    assert not is_user_error(RuntimeError("x")) and is_user_error(FileNotFoundError("x"))


# -- the model: ids outside the vocabulary, empty input ----------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=VOCAB)


@pytest.mark.parametrize("call, message", [
    (lambda m: m(torch.tensor([[5, 9, 1003, 4]])), f"token id 1003 at position (0, 2) is outside the vocabulary "
                                                   f"(size {VOCAB}: ids 0..{VOCAB - 1})"),
    (lambda m: m(torch.tensor([[5, 9], [3, -1]])), "token id -1 at position (1, 1) is outside the vocabulary"),
    (lambda m: m(torch.tensor([[5, 9, 4]]), labels=torch.tensor([[5, -100, 4000]])),
     "labels value 4000 at position (0, 2) is outside the vocabulary"),
    (lambda m: m.generate(torch.tensor([[5, 50400]]), max_new_tokens=2),
     "token id 50400 at position (0, 1) is outside the vocabulary"),
    (lambda m: m(torch.zeros(1, 0, dtype=torch.long)), "the input is empty (shape (1, 0))"),
    (lambda m: m(torch.zeros(0, 3, dtype=torch.long)), "the input is empty (shape (0, 3))"),
    (lambda m: m.generate(torch.zeros(2, 0, dtype=torch.long), max_new_tokens=2), "the input is empty"),
], ids=["forward", "forward-negative", "labels", "generate", "forward-empty", "forward-no-rows", "generate-empty"])
def test_model_rejects_ids_outside_the_vocabulary_and_empty_input(model, call, message):
    with pytest.raises(TokenIdError) as info:
        call(model)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_ignored_labels_and_the_last_id_are_accepted(model):
    out = model(torch.tensor([[0, VOCAB - 1]]), labels=torch.tensor([[-100, VOCAB - 1]]))
    assert out.logits.shape == (1, 2, VOCAB) and torch.isfinite(out.loss)


# -- the packed loader: damaged shard content ---------------------------------------------------------------
def _damaged_copy(data: dict, dest: Path, split: str, token: int) -> Path:
    """A copy of the prepared folder with id 65535 written over token ``token`` of ``split``'s first shard (the
    size stays right)."""
    import shutil

    out = dest / "damaged"
    if not out.exists():
        shutil.copytree(data["data"], out)
    shard = out / f"{split}-00000.bin"
    with open(shard, "r+b") as fh:
        fh.seek(token * 2)  # uint16 ids
        fh.write(b"\xff\xff")
    return shard


def test_loader_names_the_shard_and_offset_of_damaged_content(data, tmp_path):
    shard = _damaged_copy(data, tmp_path, "train", 100)
    clean = PackedLoader(data["data"], "train", seq_len=32, micro_batch_size=4, shuffle=False, infinite=False)
    assert sum(len(b) for b in clean) == clean.num_samples  # no false alarm on intact data
    loader = PackedLoader(shard.parent, "train", seq_len=32, micro_batch_size=4, shuffle=False, infinite=False)
    limit = loader.meta["max_token_id"]
    expected = (f"shard {shard} is damaged: token 100 (byte 200) is 65535, above the largest id recorded at "
                f"preparation ({limit})")
    with pytest.raises(data_errors.ShardError) as info:
        list(loader)
    assert str(info.value).startswith(expected)
    with pytest.raises(data_errors.ShardError, match="token 100 "):
        loader.sample(3)  # tokens 96..128
    assert loader.sample(0).max() <= limit


@pytest.mark.integration
def test_pretrain_on_a_damaged_shard_is_one_line_and_exit_2(data, tmp_path):
    _damaged_copy(data, tmp_path, "val", 5)
    damaged = tmp_path / "damaged"
    config = write_config(tmp_path / "run.yaml", tiny_train_config(damaged, data["tokenizer"], tmp_path / "run"))
    worker = LauncherWorker()
    try:
        code, out = worker.run("--config", config)
    finally:
        worker.close()
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in out, out
    # the start-up verification against meta.json's hashes names the shard before any token is read
    assert errors == [errors[0]] and f"shard {damaged / 'val-00000.bin'} changed after prepar" in errors[0]
