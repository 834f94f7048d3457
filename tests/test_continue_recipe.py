"""Continued pretraining from a local checkpoint folder on local data with at most three overrides
(``configs/tiny-continue.yaml``, ``configs/pythia*-continue.yaml``): data format told apart on disk, the tokenizer
and the positions taken from the backbone folder."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import REPO
from helpers_train import TINY_VOCAB

from adaponder.data.training_source import tokenizer_path
from adaponder.train.config import TrainConfigError, load_config


def _neox(folder: Path, tokenizer: Path | None, positions: int = 128, vocab: int = TINY_VOCAB) -> Path:
    """A GPT-NeoX checkpoint folder as save_pretrained writes it (+ the tokenizer, as Pythia's folders hold it)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=vocab, max_position_embeddings=positions,
                                     rotary_pct=0.25, use_parallel_residual=True,
                                     tie_word_embeddings=False)).save_pretrained(folder)
    if tokenizer is not None:
        shutil.copy(tokenizer, folder / "tokenizer.json")
    return folder


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_tiny_continue_runs_with_three_overrides(data, launcher, tmp_path):
    backbone = _neox(tmp_path / "neox", data["tokenizer"])
    overrides = [f"init.backbone={backbone}", f"data.path={data['data']}", f"train.out_dir={tmp_path / 'run'}"]
    argv = ["--config", str(REPO / "configs" / "tiny-continue.yaml")]
    for o in overrides:
        argv += ["--set", o]
    code, out = launcher.run(*argv)
    assert code == 0, out
    assert argv.count("--set") <= 3
    train = [r for r in _metrics(tmp_path / "run") if r.get("kind") == "train"]
    stages = [r["stage"] for r in train]
    assert stages[0] == "gates_only" and stages[-1] == "joint" and train[-1]["step"] == 40
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    state = json.loads(sorted((tmp_path / "run" / "checkpoints").glob("step*/trainer_state.json"))[-1].read_text())
    assert state["tokenizer"] == str(backbone / "tokenizer.json")  # the backbone's vocabulary, not the bundled one
    saved = load_config(tmp_path / "run" / "config.yaml")
    assert saved.data.format == "packed"  # resolved from what data.path holds
    assert (tmp_path / "run" / "hf" / "config.json").is_file()


def test_continue_presets_need_only_backbone_and_data(data, tmp_path):
    backbone = _neox(tmp_path / "neox", None, positions=2048)
    for size in ("410m", "1.4b", "2.8b"):
        cfg = load_config(REPO / "configs" / f"pythia{size}-continue.yaml",
                          [f"init.backbone={backbone}", f"data.path={data['data']}"])
        assert cfg.data.format == "packed" and cfg.data.val_path is None  # validated on the folder's own split
    # Pythia's indexed stream: the same preset, told apart by PREFIX.idx on disk
    prefix = tmp_path / "pile" / "document"
    prefix.parent.mkdir()
    for suffix in (".bin", ".idx"):
        prefix.with_suffix(suffix).write_bytes(b"")
    cfg = load_config(REPO / "configs" / "pythia410m-continue.yaml",
                      [f"init.backbone={backbone}", f"data.path={prefix}", f"data.val_path={data['data']}"])
    assert cfg.data.format == "indexed"


def test_backbone_positions_and_tokenizer(data, tmp_path):
    short = _neox(tmp_path / "short", data["tokenizer"], positions=64)
    with pytest.raises(TrainConfigError, match=r"data.seq_len: 128 tokens exceed the max_position_embeddings of "
                                                r"init.backbone .*short \(64\)"):
        load_config(REPO / "configs" / "tiny-continue.yaml", [f"init.backbone={short}", f"data.path={data['data']}"])
    cfg = load_config(REPO / "configs" / "tiny-continue.yaml",
                      [f"init.backbone={short}", f"data.path={data['data']}", "data.seq_len=64"])
    assert tokenizer_path(cfg.data, cfg.init.backbone) == str(short / "tokenizer.json")
    cfg.data.tokenizer = "explicit.json"  # an explicit tokenizer wins; without a backbone's: the bundled (None)
    assert tokenizer_path(cfg.data, cfg.init.backbone) == "explicit.json"
    cfg.data.tokenizer = None
    assert tokenizer_path(cfg.data, None) is None
