"""Loaders that turn the ORIGINAL release files of each benchmark into the documents lm-eval's
official task expects, i.e. the schema of the Hugging Face dataset the official YAML downloads.

Every ``load_*`` function is used as ``custom_dataset`` by one YAML in this folder.  lm-eval
0.4.13 calls it as ``custom_dataset(**task_metadata, **dataset_kwargs)`` (``api/task.py``,
``ConfigurableTask.download``); the task metadata also carries ``--metadata`` / ``TaskManager``
metadata and, via ``simple_evaluate``, the model args, hence the ``**_`` catch-all.

Data folder, first match wins:
  1. metadata key ``adaponder_eval_data`` (``lm_eval ... --metadata adaponder_eval_data=/path``,
     or ``TaskManager(include_path=..., metadata={"adaponder_eval_data": "/path"})``);
  2. environment variable ``ADAPONDER_EVAL_DATA``.
Neither set: a ``FileNotFoundError`` saying so (no default location outside the checkout). Online, lm-eval's
official tasks (``lambada_openai``, ``piqa``, ...) need no folder: they download the Hugging Face datasets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets

ENV_VAR = "ADAPONDER_EVAL_DATA"
METADATA_KEY = "adaponder_eval_data"


def data_dir(adaponder_eval_data: str | os.PathLike | None = None) -> Path:
    where = adaponder_eval_data or os.environ.get(ENV_VAR)
    if not where:
        raise FileNotFoundError(
            f"no data folder for the AdaPonder eval tasks: set ${ENV_VAR}=/path (the folder holding "
            "lambada_openai/, piqa/, arc_easy/, arc_challenge/, sciq/, winogrande/ in their original release "
            f"formats) or pass --metadata {METADATA_KEY}=/path (see eval/tasks/README.md); online, lm-eval's "
            "official tasks (lambada_openai, piqa, arc_easy, arc_challenge, sciq, winogrande) need no folder")
    return Path(where).expanduser()


def _file(root: Path, rel: str) -> Path:
    path = root / rel
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Point the AdaPonder eval tasks at the folder holding the original "
            f"benchmark files with ${ENV_VAR} or --metadata {METADATA_KEY}=/path (see eval/tasks/README.md)."
        )
    return path


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _labels(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


def _split(name: str, docs: list[dict]) -> datasets.DatasetDict:
    # Split names are the ones the official task evaluates on, so the YAMLs read like the originals.
    return datasets.DatasetDict({name: datasets.Dataset.from_list(docs)})


# --- converters: original record -> HF-schema doc ---------


def lambada_doc(rec: dict) -> dict:
    # EleutherAI/lambada_openai "default" is this very OpenAI file: {"text"} only.
    return {"text": rec["text"]}


def piqa_doc(rec: dict, label: str) -> dict:
    # baber/piqa (ybisk/piqa re-upload): labels live in a separate aligned .lst file.
    return {"goal": rec["goal"], "sol1": rec["sol1"], "sol2": rec["sol2"], "label": int(label)}


def arc_doc(rec: dict) -> dict:
    # allenai/ai2_arc flattens question.stem and turns the choice list into {text: [...], label: [...]};
    # answerKey is kept verbatim (A-E or 1-4), the official YAML indexes it into choices.label.
    choices = rec["question"]["choices"]
    return {
        "id": rec["id"],
        "question": rec["question"]["stem"],
        "choices": {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]},
        "answerKey": rec["answerKey"],
    }


def sciq_doc(rec: dict) -> dict:
    # allenai/sciq keeps the original field names.
    keys = ("question", "distractor3", "distractor1", "distractor2", "correct_answer", "support")
    return {k: rec[k] for k in keys}


def winogrande_doc(rec: dict, label: str | None = None) -> dict:
    # allenai/winogrande drops qID and keeps `answer` as the string "1"/"2".
    answer = rec.get("answer") or label
    return {"sentence": rec["sentence"], "option1": rec["option1"], "option2": rec["option2"], "answer": str(answer)}


def hellaswag_doc(rec: dict) -> dict:
    # Rowan/hellaswag stores `label` as a string ("" for the unlabeled test split).
    keys = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "split_type")
    return {**{k: rec[k] for k in keys}, "label": str(rec.get("label", ""))}


# --- custom_dataset entry points -------------------------------------------------------------


def load_lambada_openai(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    root = data_dir(adaponder_eval_data)
    return _split("test", [lambada_doc(r) for r in _jsonl(_file(root, "lambada_openai/lambada_test.jsonl"))])


def load_piqa(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    root = data_dir(adaponder_eval_data)
    recs = _jsonl(_file(root, "piqa/valid.jsonl"))
    labels = _labels(_file(root, "piqa/valid-labels.lst"))
    if len(recs) != len(labels):
        raise ValueError(f"piqa: {len(recs)} questions but {len(labels)} labels")
    return _split("validation", [piqa_doc(r, y) for r, y in zip(recs, labels)])


def _load_arc(rel: str, adaponder_eval_data) -> datasets.DatasetDict:
    root = data_dir(adaponder_eval_data)
    return _split("test", [arc_doc(r) for r in _jsonl(_file(root, rel))])


def load_arc_easy(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    return _load_arc("arc_easy/ARC-Easy-Test.jsonl", adaponder_eval_data)


def load_arc_challenge(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    return _load_arc("arc_challenge/ARC-Challenge-Test.jsonl", adaponder_eval_data)


def load_sciq(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    root = data_dir(adaponder_eval_data)
    with _file(root, "sciq/test.json").open(encoding="utf-8") as fh:
        return _split("test", [sciq_doc(r) for r in json.load(fh)])


def load_winogrande(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    # WinoGrande 1.1 dev == HF winogrande_xl "validation" (every HF config shares that split).
    root = data_dir(adaponder_eval_data)
    recs = _jsonl(_file(root, "winogrande/dev.jsonl"))
    labels_path = root / "winogrande/dev-labels.lst"
    labels = _labels(labels_path) if labels_path.is_file() else [None] * len(recs)
    return _split("validation", [winogrande_doc(r, y) for r, y in zip(recs, labels, strict=True)])


def load_hellaswag(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    # rowanz/hellaswag data/hellaswag_val.jsonl (not in the offline data pack; ~11 MB).
    root = data_dir(adaponder_eval_data)
    return _split("validation", [hellaswag_doc(r) for r in _jsonl(_file(root, "hellaswag/hellaswag_val.jsonl"))])
