"""Models by name: ``init.backbone`` takes a local folder or a hub id + ``init.revision``
resolved through the Hugging Face cache; the ``configs/pythia*-continue.yaml`` presets start continued
pretraining (gates-only stage, then joint) from a tiny GPT-NeoX saved by the test.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_train import REPO, TINY_VOCAB, cpu_env, read_metrics, tiny_data


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    root = tmp_path_factory.mktemp("byname")
    torch.manual_seed(0)
    neox = root / "tiny-neox"
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=TINY_VOCAB, max_position_embeddings=64,
                                     rotary_pct=0.25)).save_pretrained(neox)
    # A Hugging Face cache holding revision "step5" of the hub id "adaponder-test/tiny-neox" (as
    # snapshot_download leaves it: refs/<revision> -> commit, snapshots/<commit>/files).
    cache = root / "hf-cache"
    repo = cache / "models--adaponder-test--tiny-neox"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(neox, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "step5").write_text(commit)
    return {"neox": neox, "cache": cache, "data": tiny_data(root / "data"), "root": root}


def _continue(setup, out, *sets, env=None):
    d = setup["data"]
    args = [sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(REPO / "configs" / "pythia410m-continue.yaml")]
    for kv in (*sets, "data.format=packed", f"data.path={d['data']}", f"data.tokenizer={d['tokenizer']}", "data.seq_len=32",
               "data.val_path=null", "data.val_split=val", "train.tokens=null", "train.steps=2", "train.micro_batch=2",
               "train.global_batch=2", "init.gates_only_tokens=64", "deepspeed.precision=fp32", "eval.max_batches=1",
               "eval.micro_batch=2", "eval.report=false", "logging.wandb=false", "logging.every=1",
               "logging.progress_bar=false", "checkpoint.export_hf=false", "train.threads=1", f"train.out_dir={out}",
               "hardware.requires=any"):  # the preset is sized for GPUs; this test runs it tiny on a CPU
        args += ["--set", kv]
    proc = subprocess.run(args, cwd=str(setup["root"]), env=cpu_env(HF_HUB_CACHE=str(setup["cache"]), **(env or {})),
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.integration
def test_continue_preset_starts_from_a_local_gpt_neox_folder(setup, tmp_path):
    out = tmp_path / "run"
    code, log = _continue(setup, out, f"init.backbone={setup['neox']}")
    assert code == 0, log[-4000:]
    assert "init.revision step143000 applies to hub ids" in log  # the preset's revision, not used for a folder
    steps = read_metrics(out)
    assert [r["stage"] for r in steps] == ["gates_only", "joint"]  # 64 tokens = one gates-only step, then joint
    cfg = json.loads(json.dumps(__import__("yaml").safe_load((out / "config.yaml").read_text())))
    assert cfg["model"].get("size") is None and cfg["init"]["backbone"] == str(setup["neox"])


@pytest.mark.integration
def test_hub_id_with_revision_resolves_through_the_cache_offline(setup, tmp_path):
    out = tmp_path / "run"
    code, log = _continue(setup, out, "init.backbone=adaponder-test/tiny-neox", "init.revision=step5")
    assert code == 0, log[-4000:]
    assert [r["stage"] for r in read_metrics(out)] == ["gates_only", "joint"]


@pytest.mark.integration
def test_hub_id_not_cached_offline_is_a_clear_error(setup, tmp_path):
    code, log = _continue(setup, tmp_path / "run")  # the preset's EleutherAI/pythia-410m-deduped, step143000
    assert code == 2, log[-4000:]
    assert "EleutherAI/pythia-410m-deduped (revision step143000) is not in the Hugging Face cache" in log
    assert "HF_HUB_OFFLINE" in log and not (tmp_path / "run" / "checkpoints").exists()


def test_config_accepts_hub_ids_and_model_size_null(setup):
    from adaponder.hub import HubError, is_hub_id, resolve_pretrained
    from adaponder.train.config import TrainConfigError, load_config

    cfg = load_config(REPO / "configs" / "pythia2.8b-continue.yaml", ["model.size=null"])
    assert cfg.init.backbone == "EleutherAI/pythia-2.8b-deduped" and cfg.init.revision == "step143000"
    assert cfg.model_overrides() == ("adaponder", {"passes": 4, "input_scale": 3.0})
    with pytest.raises(TrainConfigError) as err:
        load_config(REPO / "configs" / "pythia410m-continue.yaml", ["init.backbone=null", "model.size=410m",
                                                                        "init.gates_only_tokens=0"])
    assert "init.revision: applies to a hub id in init.backbone" in str(err.value)
    with pytest.raises(TrainConfigError, match="model.size: cannot be set together with init.backbone"):
        load_config(REPO / "configs" / "pythia410m-continue.yaml", ["model.size=410m"])
    with pytest.raises(TrainConfigError, match="not a Hugging Face checkpoint folder .* nor a hub id"):
        load_config(REPO / "configs" / "pythia410m-continue.yaml", ["init.backbone=./no/such/folder"])
    assert is_hub_id("EleutherAI/pythia-70m") and not is_hub_id(str(setup["neox"])) and not is_hub_id("a/b/c")
    assert resolve_pretrained(setup["neox"]) == Path(setup["neox"])
    with pytest.raises(HubError, match="a revision .* applies to a Hugging Face hub id"):
        resolve_pretrained(setup["neox"], "step1")
    with pytest.raises(HubError, match="no such checkpoint folder"):
        resolve_pretrained(setup["root"] / "missing")
