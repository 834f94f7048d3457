"""Where fine-tuning reads its inputs from: GLUE through Hugging Face ``datasets`` (``--hf-dataset``, a
``save_to_disk`` copy of the TSVs) gives the TSV loader's examples and the same fine-tuning result with the same
seed (acceptance 2); ``--init`` takes a hub id with a revision, resolved offline through a Hugging Face cache, and
gives the same result as the local folder it is a snapshot of.

Each run is the tiny smoke recipe on RTE from a tiny GPT-NeoX checkpoint, in a worker process whose Hugging Face
cache (``HF_HUB_CACHE``) holds that checkpoint as revision ``step5`` of ``adaponder-test/tiny-neox`` (the layout
``snapshot_download`` leaves, as in tests/test_models_by_name.py).
"""

import json
import shutil

import pytest

from conftest import SHARED_DATA
from helpers_finetune import FinetuneWorker, finetune_argv

HUB_ID, REVISION = "adaponder-test/tiny-neox", "step5"
# No timing (wall-clock numbers differ between any two runs); a short max length keeps the runs quick.
RECIPE = ["timing.enabled=false", "data.max_length=64"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from adaponder.palbert.glue_datasets import tsv_to_dataset

    if not (SHARED_DATA / "glue").is_dir():
        pytest.skip(f"GLUE TSVs not found at {SHARED_DATA / 'glue'}")
    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    neox = root / "tiny-neox"
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=50304)).save_pretrained(neox)
    cache = root / "hf-cache"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    shutil.copytree(neox, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / REVISION).write_text(commit)
    saved = root / "glue-hf" / "rte"
    tsv_to_dataset(SHARED_DATA / "glue", "rte").save_to_disk(str(saved))
    with pytest.MonkeyPatch.context() as mp:  # the worker's environment is this process's at its start
        mp.setenv("HF_HUB_CACHE", str(cache))
        worker = FinetuneWorker()
    yield {"root": root, "neox": neox, "saved": saved, "glue": SHARED_DATA / "glue", "worker": worker}
    worker.close()


def _finetune(setup, name: str, *argv: str) -> dict:
    out = setup["root"] / name
    code, log = setup["worker"].run(finetune_argv("rte", out, *RECIPE) + list(argv))
    assert code == 0, log[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def reference(setup):
    """TSV files, the local checkpoint folder."""
    return _finetune(setup, "tsv-local", "--init", str(setup["neox"]), "--data-dir", str(setup["glue"]))


def _same_run(a: dict, b: dict) -> None:
    assert a["complete"] and b["complete"]
    for key in ("train", "dev", "online"):
        assert {k: v for k, v in a[key].items() if k not in ("seconds", "checkpoint_dir")} == \
            {k: v for k, v in b[key].items() if k not in ("seconds", "checkpoint_dir")}, key
    assert a["majority_baseline"] == b["majority_baseline"]
    assert {k: a["data"][k] for k in ("train_examples", "dev_examples")} == \
        {k: b["data"][k] for k in ("train_examples", "dev_examples")} == {"train_examples": 64, "dev_examples": 48}


@pytest.mark.integration
def test_glue_through_datasets_gives_the_tsv_examples_and_the_same_result(setup, reference):
    from adaponder.palbert.glue_datasets import load_glue_examples

    for split in ("train", "dev"):
        tsv = load_glue_examples("rte", split, glue_dir=setup["glue"])
        hf = load_glue_examples("rte", split, hf_dataset=setup["saved"])
        assert [(e.text_a, e.text_b, e.label) for e in hf] == [(e.text_a, e.text_b, e.label) for e in tsv]

    res = _finetune(setup, "hf-local", "--init", str(setup["neox"]), "--hf-dataset", str(setup["saved"]))
    assert res["data"]["hf_dataset"] == str(setup["saved"]) and res["data"]["dir"] is None
    assert reference["data"]["dir"] == str(setup["glue"]) and reference["data"]["hf_dataset"] is None
    _same_run(res, reference)
    assert len(res["train"]["history"]) == 2 and res["online"]["exit_agreement"] == 1.0


@pytest.mark.integration
def test_init_from_a_hub_id_and_revision_equals_the_local_folder(setup, reference):
    res = _finetune(setup, "tsv-hub", "--init", HUB_ID, "--init-revision", REVISION, "--data-dir", str(setup["glue"]))
    assert res["init"] == HUB_ID and res["init_revision"] == REVISION and res["core_mode"] == "loop"
    _same_run(res, reference)
