"""Hugging Face ``datasets`` as a data source, offline: ``adaponder-prepare --hf-dataset`` on a dataset saved with
``save_to_disk`` and on a local folder of data files (streamed), and GLUE through ``datasets`` in the official
nyu-mll/glue schema giving exactly the TSV loader's examples.
"""

import json

import numpy as np
import pytest

from conftest import SHARED_DATA

from adaponder.cli.prepare import main as prepare_main
from adaponder.data.prepare import prepare

TEXTS = {
    "train": [f"Document number {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(12)] + [""],
    "validation": [f"Held-out text {i}, with punctuation; and numbers {i * 7}." for i in range(5)],
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import datasets

    root = tmp_path_factory.mktemp("hf")
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v, "id": list(range(len(v)))})
                               for k, v in TEXTS.items()})
    dd.save_to_disk(str(root / "saved"))
    files = root / "files"
    files.mkdir()
    for split, texts in TEXTS.items():
        with open(files / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for t in texts:
                fh.write(json.dumps({"text": t}) + "\n")
    return root


def _tokens(folder):
    from adaponder.data.layout import open_shards, read_meta

    meta = read_meta(folder)
    return np.concatenate([np.asarray(m) for split in ("train", "val") for m in open_shards(folder, meta, split)])


def test_prepare_hf_dataset_saved_to_disk_with_a_split(saved, tmp_path, capsys):
    out = tmp_path / "val_only"
    assert prepare_main(["--hf-dataset", str(saved / "saved"), "--split", "validation", "-o", str(out),
                         "--val-fraction", "0", "-j", "1", "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["documents"] == len(TEXTS["validation"])
    src = meta["sources"][0]
    assert src["format"] == "hf_hub" and src["split"] == "validation" and src["splits"] == ["validation"]
    # the same documents as from a JSONL file of the same texts
    ref = tmp_path / "ref"
    prepare([str(saved / "files" / "validation.jsonl")], ref, val_fraction=0, num_workers=1, progress=False)
    assert np.array_equal(_tokens(out), _tokens(ref))
    assert "prepared 5 documents" in capsys.readouterr().out


def test_prepare_hf_dataset_all_splits_streamed_from_local_files(saved, tmp_path):
    out = tmp_path / "all"
    assert prepare_main(["--hf-dataset", str(saved / "files"), "--streaming", "-o", str(out), "--val-fraction", "0",
                         "-j", "1", "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["documents"] == len(TEXTS["train"]) - 1 + len(TEXTS["validation"])  # the empty one is skipped
    assert meta["skipped_empty"] == 1 and meta["sources"][0]["streaming"] is True
    saved_all = tmp_path / "saved_all"
    assert prepare_main(["--hf-dataset", str(saved / "saved"), "--streaming", "-o", str(saved_all),
                         "--val-fraction", "0", "-j", "1", "--no-progress"]) == 0
    assert np.array_equal(_tokens(out), _tokens(saved_all))


@pytest.mark.integration
def test_prepare_hf_dataset_errors_are_clear(saved, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = prepare_main(["--hf-dataset", "adaponder-test/no-such-dataset", "--hf-config", "x", "-o",
                         str(tmp_path / "a"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot load dataset 'adaponder-test/no-such-dataset' (config 'x')" in err
    assert "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set" in err and not (tmp_path / "a").exists()
    code = prepare_main(["--hf-dataset", str(saved / "saved"), "--split", "test", "-o", str(tmp_path / "b"),
                         "--no-progress"])
    assert code == 2 and "no split 'test' (splits: train, validation)" in capsys.readouterr().err
    code = prepare_main(["--hf-dataset", str(saved / "saved"), "--text-field", "body", "-o", str(tmp_path / "c"),
                         "--no-progress"])
    assert code == 2 and "no column 'body'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare_main(["--split", "train", "-o", str(tmp_path / "d")])
    assert "apply to --hf-dataset" in capsys.readouterr().err


# -- GLUE ---------------------------------------------------------------------------------------------------
TASKS = ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]


@pytest.fixture(scope="module")
def glue_saved(tmp_path_factory):
    """Every task's TSVs as an official-schema DatasetDict saved to disk (<root>/<task>)."""
    from adaponder.palbert.glue_datasets import tsv_to_dataset

    if not (SHARED_DATA / "glue").is_dir():
        pytest.skip(f"GLUE TSVs not found at {SHARED_DATA / 'glue'}")
    shared_data = SHARED_DATA
    root = tmp_path_factory.mktemp("glue_hf")
    for task in TASKS:
        tsv_to_dataset(shared_data / "glue", task).save_to_disk(str(root / task))
    return root


def _content(examples, float32=False):
    """(texts, label) per example; ``float32``: STS-B scores as float32 (nyu-mll/glue stores them so; training
    turns them into float32 tensors either way, so both paths train on the same numbers)."""
    if float32:
        return [(e.text_a, e.text_b, float(np.float32(e.label))) for e in examples]
    return [(e.text_a, e.text_b, e.label) for e in examples]


@pytest.mark.parametrize("task", TASKS)
def test_glue_through_datasets_gives_the_tsv_examples(task, glue_saved, shared_data):
    import datasets

    from adaponder.palbert.glue_datasets import SCHEMA, load_glue_dataset_split, load_glue_examples
    from adaponder.palbert.glue import load_glue_split

    saved = datasets.load_from_disk(str(glue_saved / task))
    assert set(saved) == {"train", "validation"}
    assert saved["train"].column_names == [*SCHEMA[task]["text"], "label", "idx"]  # nyu-mll/glue's columns
    if SCHEMA[task]["labels"]:
        assert saved["train"].features["label"].names == SCHEMA[task]["labels"]
    for split in ("train", "dev"):
        tsv = load_glue_split(shared_data / "glue", task, split)
        hf = load_glue_dataset_split(glue_saved, task, split)  # the folder of per-task folders
        assert _content(hf, task == "stsb") == _content(tsv, task == "stsb")
        if task == "stsb":  # scores with <= 6 decimals (all but a few) come back as the TSV's exact decimal
            same = sum(a.label == b.label for a, b in zip(hf, tsv))
            assert same >= 0.95 * len(tsv)
        assert all(type(a.label) is type(b.label) for a, b in zip(hf, tsv))
    one = load_glue_examples(task, "validation", hf_dataset=glue_saved / task)  # one task's folder
    assert _content(one, True) == _content(load_glue_split(shared_data / "glue", task, "dev"), True)


def test_glue_dataset_errors(glue_saved, tmp_path, monkeypatch):
    import datasets

    from adaponder.palbert.glue_datasets import GlueDatasetError, load_glue_dataset_split, load_glue_examples

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(GlueDatasetError, match="from dataset 'adaponder-test/no-glue'.*HF_DATASETS_OFFLINE"):
        load_glue_dataset_split("adaponder-test/no-glue", "rte", "dev")
    with pytest.raises(GlueDatasetError, match="no saved GLUE dataset for 'rte'"):
        load_glue_dataset_split(tmp_path, "rte", "dev")
    with pytest.raises(GlueDatasetError, match=r"no GLUE data: give a TSV folder \(--data-dir / \$ADAPONDER_GLUE_DIR\)"):
        load_glue_examples("rte", "dev")
    bad = datasets.DatasetDict({"validation": datasets.Dataset.from_dict(
        {"sentence1": ["a"], "sentence2": ["b"], "label": [-1], "idx": [0]})})
    bad.save_to_disk(str(tmp_path / "rte"))
    with pytest.raises(GlueDatasetError, match="row 0 has no label"):
        load_glue_dataset_split(tmp_path, "rte", "dev")
