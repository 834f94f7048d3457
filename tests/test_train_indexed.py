"""Training from a Megatron/GPT-NeoX indexed dataset (``data.format: indexed``): two DeepSpeed ranks on the CPU
read Pythia's order (global batch b = items b·G … b·G+G−1, checked row by row against megatron-core's reader
through the batch trace) and validate on a separate indexed source (``data.val_path``, documents order).
"""

import hashlib
import json
import warnings

import numpy as np
import pytest
import torch

from helpers_train import REPO, TINY_VOCAB, cpu_env, read_metrics, tiny_data

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

SEQ = 32
PORT = 29761


def _prepared_stream(folder, split):
    from adaponder.data.layout import open_shards, read_meta

    meta = read_meta(folder)
    tokens = np.concatenate([np.asarray(m) for m in open_shards(folder, meta, split)])
    starts = np.load(folder / f"{split}.docs.npy")
    return tokens, starts


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    data = tiny_data(root)
    tokens, _ = _prepared_stream(data["data"], "train")
    train = root / "pile_like"
    b = IndexedDatasetBuilder(f"{train}.bin", dtype=np.uint16)
    for i in range(len(tokens) // (SEQ + 1)):  # ready samples of SEQ + 1 tokens, one document each
        b.add_item(torch.as_tensor(tokens[i * (SEQ + 1):(i + 1) * (SEQ + 1)].astype(np.int64)))
        b.end_document()
    b.finalize(f"{train}.idx")
    val_tokens, starts = _prepared_stream(data["data"], "val")
    val = root / "val_text_document"
    b = IndexedDatasetBuilder(f"{val}.bin", dtype=np.uint16)
    for k in range(len(starts) - 1):  # documents (they end with EOD already)
        b.add_item(torch.as_tensor(val_tokens[starts[k]:starts[k + 1]].astype(np.int64)))
        b.end_document()
    b.finalize(f"{val}.idx")
    return {"train": str(train), "val": str(val), "tokenizer": data["tokenizer"], "root": root}


def _overrides(indexed, out_dir, **extra):
    values = {
        "model.vocab_size": TINY_VOCAB, "model.hidden_size": 32, "model.num_attention_heads": 4,
        "model.intermediate_size": 64, "model.max_position_embeddings": 64,
        "data.format": "indexed", "data.path": indexed["train"], "data.prepare": "null",
        "data.tokenizer": indexed["tokenizer"], "data.seq_len": SEQ, "data.val_path": indexed["val"],
        "data.val_order": "documents",
        "train.out_dir": out_dir, "train.steps": 3, "train.micro_batch": 2, "train.global_batch": 8,
        "train.threads": 1, "checkpoint.export_hf": "false", "eval.max_batches": 2, "eval.micro_batch": 2,
        "eval.report": "false", "logging.every": 1, "logging.progress_bar": "false", "debug.trace_batches": "true",
    }
    values.update(extra)
    return [x for k, v in values.items() for x in ("--set", f"{k}={v}")]


@pytest.mark.deepspeed
def test_two_deepspeed_ranks_train_on_pythia_order_from_an_indexed_dataset(indexed, tmp_path):
    import shutil
    import subprocess
    import sys

    out = tmp_path / "run"
    exe = shutil.which("deepspeed", path=str(__import__("pathlib").Path(sys.executable).parent)) or "deepspeed"
    cmd = [exe, "--num_gpus", "2", "--master_port", str(PORT), str(REPO / "launch" / "pretrain.py"),
           "--config", str(REPO / "configs" / "tiny.yaml"), *_overrides(indexed, out)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=cpu_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]

    ref = MegatronDataset(indexed["train"])
    micro, world = 2, 2
    for rank in range(world):
        lines = [json.loads(x) for x in (out / "trace" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert len(lines) == 3 * 2  # 3 steps × 2 accumulation micro-steps
        for k, line in enumerate(lines):
            items = [k * micro * world + rank * micro + i for i in range(micro)]
            want = [hashlib.sha1(ref[i].astype(np.int64).tobytes()).hexdigest()[:16] for i in items]
            assert line["rows"] == want, (rank, k)
    train = read_metrics(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in train)
    # MFU against the CPU peak measured at start-up, as a percentage, never above 100 %
    assert "MFU peak:" in proc.stdout + proc.stderr and all(0 < r.get("mfu_pct", 1) <= 100 for r in train)
    final = read_metrics(out, "eval")[-1]
    assert final["final"] and np.isfinite(final["val_loss"])
    tag = sorted((out / "checkpoints").glob("step*"))[-1]
    state = torch.load(tag / "rank00000.pt", weights_only=True)  # the loader state saved is the indexed loader's
    assert state["loader"]["format"] == "adaponder.IndexedLoader/v1" and state["loader"]["position"] == 6 * micro


def test_config_of_the_indexed_format(indexed, tmp_path):
    from adaponder.train.config import TrainConfigError, load_config

    cfg = load_config(REPO / "configs" / "tiny.yaml", _overrides(indexed, tmp_path)[1::2])
    assert cfg.data.format == "indexed" and cfg.data.order == "sequences" and cfg.data.val_path == indexed["val"]
    with pytest.raises(TrainConfigError) as err:
        load_config(REPO / "configs" / "tiny.yaml", ["data.format=indexed", "data.path=x"])
    text = str(err.value)
    assert "data.prepare: prepares packed shards" in text and "data.val_path: required with data.format indexed" in text
    with pytest.raises(TrainConfigError, match="data.order: must be 'sequences' | 'documents'"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.order=random"])


def test_validation_source_is_told_apart_by_what_is_on_disk(indexed, tmp_path):
    from adaponder.data.errors import DataError
    from adaponder.data.config import DataConfig
    from adaponder.data.training_source import DataSource, validation_source

    packed = indexed["root"] / "prepared"
    assert validation_source(DataConfig(path=str(packed))).kind == "packed"
    assert validation_source(DataConfig(format="indexed", path=indexed["train"], val_path=indexed["val"] + ".bin")) \
        == DataSource("indexed", indexed["val"], order="sequences")
    assert validation_source(DataConfig(path=indexed["train"], val_path=str(packed), val_split="train")) \
        == DataSource("packed", str(packed), split="train")
    with pytest.raises(DataError, match="neither a prepared data folder"):
        validation_source(DataConfig(path=str(packed), val_path=str(tmp_path / "nope")))
