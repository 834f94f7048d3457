"""``adaponder train-draft`` prints no load report for the draft heads it adds (they are missing from the checkpoint
by design), yet a checkpoint that lacks one of its own weights is still reported; its ``--help`` shows the
defaults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from helpers_evaluation import subprocess_env, tiny_model

pytestmark = pytest.mark.integration  # every test runs the command in a process


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from adaponder.train.export import save_tokenizer
    from helpers_train import TINY_VOCAB, tiny_data

    root = tmp_path_factory.mktemp("draft")
    data = tiny_data(root / "toy")
    ckpt = root / "ckpt"
    tiny_model(mode="ponderlm", hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=TINY_VOCAB,
               max_position_embeddings=64, passes=3).save_pretrained(ckpt)
    save_tokenizer(ckpt, str(data["tokenizer"]))
    return root, ckpt, data["data"]


def _draft(ckpt: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaponder.cli.main", "train-draft", str(ckpt), "--data", str(data),
                           "--out", str(out), "--steps", "2", "--window", "16", "--batch", "2", "--threads", "1",
                           *extra], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)


def test_new_draft_heads_load_without_a_report_and_the_weights_are_the_checkpoint_s(setup, tmp_path):
    import torch
    from safetensors.torch import load_file

    root, ckpt, data = setup
    p = _draft(ckpt, data, tmp_path / "out", "--redraft")
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    assert "LOAD REPORT" not in text and "MISSING" not in text, text[-3000:]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["draft_head"] is True and config["redraft_head"] is True
    before, after = load_file(ckpt / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(after) - set(before) and all(k.startswith(("draft_head.", "redraft_head.")) for k in set(after) - set(before))
    assert all(torch.equal(before[k], after[k]) for k in before)  # every weight of the checkpoint kept as it is


def test_a_weight_missing_from_the_checkpoint_itself_is_still_reported(setup, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    root, ckpt, data = setup
    damaged = tmp_path / "ckpt"
    shutil.copytree(ckpt, damaged)
    weights = load_file(damaged / "model.safetensors")
    dropped = next(k for k in weights if ".mlp." in k)
    save_file({k: v for k, v in weights.items() if k != dropped}, damaged / "model.safetensors", metadata={"format": "pt"})
    p = _draft(damaged, data, tmp_path / "out")
    text = p.stdout + p.stderr
    assert "LOAD REPORT" in text and dropped in text, text[-3000:]
    assert "draft_head" not in text.split("LOAD REPORT")[1].split("agreement")[0]  # the added head is not listed


def test_help_shows_the_defaults():
    p = subprocess.run([sys.executable, "-m", "adaponder.cli.main", "train-draft", "--help"], cwd=REPO,
                       env=subprocess_env(), capture_output=True, text=True, timeout=300)
    text = " ".join(p.stdout.split())
    assert p.returncode == 0
    for shown in ("(default: 1500)", "(default: 256)", "(default: 2)", "(default: 0.001)", "(default: 0)"):
        assert shown in text, shown


def test_data_of_another_tokenizer_is_refused_before_anything_is_written(setup, tmp_path):
    from adaponder.data.prepare import prepare
    from helpers_train import TINY_VOCAB

    root, ckpt, data = setup
    other = tmp_path / "other"
    prepare([root / "toy" / "corpus"], other, val_fraction=0.1, progress=False, train_tokenizer=TINY_VOCAB)
    p = _draft(ckpt, other, tmp_path / "out")
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert str(other) in errors[0] and "is not the corpus's" in errors[0]
    assert not (tmp_path / "out").exists()
