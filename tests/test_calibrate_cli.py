"""``adaponder calibrate`` as a user meets it, and the one check every evaluation makes of a prepared corpus: a corpus
prepared with another tokenizer than the model's is refused with one ``error:`` line naming the corpus and both
tokenizers, writing nothing (calibration, perplexity in both packings); the corpus of the model's own tokenizer is
calibrated, with a progress bar and a default token cap stated in ``--help``; Ctrl-C stops it with one line and exit
code 130, writing nothing."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from helpers_evaluation import ctrl_c_while_calibrating, subprocess_env

pytestmark = pytest.mark.integration  # every test runs the command in a process


def _texts(folder: Path) -> Path:
    """Six documents cut from the bundled Alice in Wonderland."""
    text = gzip.decompress((REPO / "adaponder" / "assets" / "corpus" / "11-0.txt.gz").read_bytes()).decode("utf-8")
    folder.mkdir(parents=True)
    for i in range(6):
        (folder / f"part{i}.txt").write_text(text[20000 + i * 12000: 20000 + (i + 1) * 12000], encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A ponderlm checkpoint with consistency heads and the bundled Pythia tokenizer; the same texts prepared with
    that tokenizer (``own``) and with a 300-entry BPE trained on them (``other``)."""
    from transformers import PreTrainedTokenizerFast

    from adaponder.data import load_tokenizer
    from adaponder.data.prepare import prepare
    from helpers_evaluation import tiny_model

    root = tmp_path_factory.mktemp("calibrate")
    texts = _texts(root / "texts")
    ckpt = root / "ckpt"
    tiny_model(mode="ponderlm", passes=2, consistency_heads=True, hidden_size=32,
               intermediate_size=64).save_pretrained(ckpt)
    PreTrainedTokenizerFast(tokenizer_object=load_tokenizer()._backend, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>", pad_token="<|padding|>").save_pretrained(ckpt)
    prepare([texts], root / "own", val_fraction=0.34, progress=False)
    prepare([texts], root / "other", val_fraction=0.34, progress=False, train_tokenizer=300)
    return root, ckpt


def _run(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaponder.cli.main", *map(str, args)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_error(p: subprocess.CompletedProcess, *must: str) -> str:
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, p.stderr[-3000:]
    for m in must:
        assert m in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("command", [
    ["calibrate", "--split", "val", "--test-split", "val", "--max-tokens", "512"],
    ["perplexity", "--max-tokens", "512"],
    ["perplexity", "--packing", "stream", "--window", "32", "--max-tokens", "512"],
], ids=["calibrate", "perplexity", "perplexity-stream"])
def test_a_corpus_of_another_tokenizer_is_refused_naming_both_and_nothing_is_written(setup, command):
    root, ckpt = setup
    other = root / "other"
    corpus_tokenizer = json.loads((other / "meta.json").read_text())["tokenizer"]["name"]
    before = _snapshot(root)
    line = _one_error(_run(command[0], ckpt, "--data", other, *command[1:]),
                      f"error: {other}: the model's tokenizer", str(ckpt), "is not the corpus's",
                      repr(corpus_tokenizer), "which it was prepared with")
    assert "fingerprint" in line
    assert _snapshot(root) == before and not (ckpt / "exit_calibration.json").exists()


def test_the_model_s_own_corpus_is_calibrated_with_a_progress_bar(setup, tmp_path):
    import shutil

    root, ckpt = setup
    own = tmp_path / "ckpt"
    shutil.copytree(ckpt, own)
    p = _run("calibrate", own, "--data", root / "own", "--split", "val", "--test-split", "val", "--max-tokens", "1024",
             "--window", "32")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "calibrating (20 thresholds)" in p.stderr and "window" in p.stderr  # the progress bar, on stderr
    assert f"{root / 'own'}: read the first 1024 tokens of split 'val'" in p.stdout
    saved = json.loads((own / "exit_calibration.json").read_text())
    assert saved["windows"] == 16 and saved["tokens"] == 512 and saved["test"]["windows"] == 16


def test_help_states_the_default_token_cap():
    p = _run("calibrate", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert "(default 16384; 0 = all of it)" in text and "(default: 0.05)" in text and "(default: 64)" in text
    # a default stated in the text is not repeated by the formatter
    assert text.count("default dev") == 1 and "(default: dev)" not in text


def test_a_negative_token_cap_is_one_error():
    _one_error(_run("calibrate", "CKPT", "--data", "x", "--max-tokens", "-1"), "--max-tokens -1")


def test_ctrl_c_stops_calibration_with_one_line_and_writes_nothing(setup, tmp_path):
    import shutil

    root, ckpt = setup
    own = tmp_path / "ckpt"
    shutil.copytree(ckpt, own)
    before = _snapshot(own)
    code, out, text, lines = ctrl_c_while_calibrating(
        [sys.executable, "-m", "adaponder.cli.main", "calibrate", str(own), "--data", str(root / "own"), "--split",
         "val", "--test-split", "val"], REPO, subprocess_env())
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert lines == ["adaponder calibrate: stopped by Ctrl-C; nothing was written"], text[-3000:]
    assert "written:" not in out and _snapshot(own) == before
