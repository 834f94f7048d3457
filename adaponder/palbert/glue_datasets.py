"""GLUE through Hugging Face ``datasets`` (``nyu-mll/glue``: the official columns and splits), giving exactly the
examples (:class:`adaponder.palbert.glue.GlueExample`) that the TSV loader gives for the same rows.

Sources, first match wins:

* a local folder written by ``DatasetDict.save_to_disk`` for one task (it holds ``dataset_dict.json``), or a
  folder with one such sub-folder per task (``<folder>/<task>/dataset_dict.json``, task names as in
  ``nyu-mll/glue``: ``cola``, ``sst2``, ``mrpc``, ``stsb``, ``rte``, ``wnli``);
* a Hugging Face dataset name (default ``nyu-mll/glue``), loaded with ``datasets.load_dataset(name, task,
  split=...)`` through the datasets cache (offline: ``HF_DATASETS_OFFLINE=1`` and only what is cached).

Official schema (``nyu-mll/glue``): ``cola``/``sst2`` ``sentence``; the pair tasks ``sentence1``, ``sentence2``
(``mrpc``, ``stsb``, ``rte``, ``wnli``); ``label`` (a ``ClassLabel``, or ``float32`` for ``stsb``); ``idx``.
Splits ``train``, ``validation``, ``test`` (test labels are -1: not public). The TSV split ``dev`` is
``validation``. Class ids are the same in both (RTE ``entailment`` = 0; the others 0/1 as in the TSVs);
STS-B's float32 scores are read back to the decimal the TSV holds (``3.8``, not ``3.799999952316284``); a TSV
score with more digits than float32 keeps (``2.11111111111111``) comes back as its float32 value
(``2.1111112``) — the number fine-tuning uses from either path, since labels become float32 tensors.

:func:`tsv_to_dataset` builds the official-schema ``DatasetDict`` from the TSV files (what the tests save to
disk to check that both paths give identical examples).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from adaponder.palbert.glue import GlueExample, get_task, load_glue_split

DEFAULT_HF_GLUE = "nyu-mll/glue"
SPLITS = {"train": "train", "dev": "validation"}
#: The official column names and label names of nyu-mll/glue (label names index = class id).
SCHEMA: dict[str, dict[str, Any]] = {
    "cola": {"text": ("sentence",), "labels": ["unacceptable", "acceptable"]},
    "sst2": {"text": ("sentence",), "labels": ["negative", "positive"]},
    "mrpc": {"text": ("sentence1", "sentence2"), "labels": ["not_equivalent", "equivalent"]},
    "stsb": {"text": ("sentence1", "sentence2"), "labels": None},
    "rte": {"text": ("sentence1", "sentence2"), "labels": ["entailment", "not_entailment"]},
    "wnli": {"text": ("sentence1", "sentence2"), "labels": ["not_entailment", "entailment"]},
}


class GlueDatasetError(ValueError):
    """A GLUE dataset cannot be loaded or does not have the official schema."""


def _task(task: str) -> str:
    return get_task(task).name


def features(task: str):
    """The ``datasets.Features`` of ``task`` in nyu-mll/glue."""
    import datasets  # seconds to import: only GLUE read through Hugging Face datasets needs it

    schema = SCHEMA[_task(task)]
    cols = {c: datasets.Value("string") for c in schema["text"]}
    cols["label"] = (datasets.Value("float32") if schema["labels"] is None
                     else datasets.ClassLabel(names=schema["labels"]))
    cols["idx"] = datasets.Value("int32")
    return datasets.Features(cols)


def tsv_to_dataset(glue_dir: str | os.PathLike[str], task: str):
    """The TSV files ``<glue_dir>/<TaskDir>/{train,dev}.tsv`` of ``task`` as a ``DatasetDict`` in the official
    schema (splits ``train`` and ``validation``)."""
    import datasets  # seconds to import: only GLUE read through Hugging Face datasets needs it

    name = _task(task)
    schema = SCHEMA[name]
    out = {}
    for tsv_split, hf_split in SPLITS.items():
        rows = {c: [] for c in (*schema["text"], "label", "idx")}
        for i, ex in enumerate(load_glue_split(glue_dir, name, tsv_split)):
            rows[schema["text"][0]].append(ex.text_a)
            if len(schema["text"]) == 2:
                rows[schema["text"][1]].append(ex.text_b)
            rows["label"].append(ex.label)
            rows["idx"].append(i)
        out[hf_split] = datasets.Dataset.from_dict(rows, features=features(name))
    return datasets.DatasetDict(out)


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def open_split(source: str | os.PathLike[str] | None, task: str, split: str, revision: str | None = None):
    """The ``datasets.Dataset`` of ``task``'s ``split`` (``train``/``dev``/``validation``) from ``source``."""
    import datasets  # seconds to import: only GLUE read through Hugging Face datasets needs it

    name = _task(task)
    hf_split = SPLITS.get(split, split)
    source = os.fspath(source) if source is not None else DEFAULT_HF_GLUE
    local = Path(source).expanduser()
    if local.is_dir():
        folder = local if (local / "dataset_dict.json").is_file() else local / name
        if not (folder / "dataset_dict.json").is_file():
            raise GlueDatasetError(f"{local}: no saved GLUE dataset for {name!r} (expected {local}/dataset_dict.json "
                                   f"or {local}/{name}/dataset_dict.json, written by DatasetDict.save_to_disk)")
        loaded = datasets.load_from_disk(str(folder))
        if hf_split not in loaded:
            raise GlueDatasetError(f"{folder}: no split {hf_split!r} (splits: {', '.join(loaded)})")
        return loaded[hf_split]
    try:
        return datasets.load_dataset(source, name, split=hf_split, revision=revision)
    except Exception as exc:  # datasets raises many kinds (ConnectionError, FileNotFoundError, ValueError, ...)
        hint = (" HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set and it is not in the datasets cache: load it once "
                "online, or save it with save_to_disk and pass that folder, or use the TSV files"
                if _offline() else "")
        raise GlueDatasetError(f"cannot load GLUE task {name!r} split {hf_split!r} from dataset {source!r}: "
                               f"{type(exc).__name__}: {exc}.{hint}") from exc


def _score(value: float) -> float:
    """A float32 score back to the shortest decimal that reads as the same float32 (the TSV's value)."""
    return float(str(np.float32(value)))


def load_glue_dataset_split(source: str | os.PathLike[str] | None, task: str, split: str = "train",
                            revision: str | None = None) -> list:
    """The examples of ``task``'s ``split`` from a ``datasets`` source, as :class:`GlueExample` objects equal
    (texts, label, order) to :func:`adaponder.palbert.glue.load_glue_split`'s; ``line`` is the 1-based row."""
    name = _task(task)
    schema = SCHEMA[name]
    ds = open_split(source, name, split, revision)
    where = f"GLUE {name!r} {SPLITS.get(split, split)!r} from {source or DEFAULT_HF_GLUE}"
    missing = [c for c in (*schema["text"], "label") if c not in ds.column_names]
    if missing:
        raise GlueDatasetError(f"{where}: no column(s) {', '.join(missing)} (columns: {', '.join(ds.column_names)}); "
                               f"expected the nyu-mll/glue schema")
    label_feature = ds.features["label"]
    names = getattr(label_feature, "names", None)
    if schema["labels"] is not None and names is not None and list(names) != schema["labels"]:
        raise GlueDatasetError(f"{where}: label names {list(names)} differ from nyu-mll/glue's {schema['labels']}")
    out = []
    data = ds.select_columns([*schema["text"], "label"]).to_dict()
    for i, label in enumerate(data["label"]):
        if schema["labels"] is None:
            label = _score(label)
        elif label is None or int(label) < 0:
            raise GlueDatasetError(f"{where}: row {i} has no label ({label}); the test split's labels are not public")
        else:
            label = int(label)
        texts = [data[c][i] for c in schema["text"]]
        for c, t in zip(schema["text"], texts):
            if not isinstance(t, str) or not t.strip():
                raise GlueDatasetError(f"{where}: row {i} has an empty {c!r}")
        out.append(GlueExample(texts[0], texts[1] if len(texts) == 2 else None, label, i + 1))
    if not out:
        raise GlueDatasetError(f"{where}: no examples")
    return out


def load_glue_examples(task: str, split: str, *, glue_dir: str | os.PathLike[str] | None = None,
                       hf_dataset: str | os.PathLike[str] | None = None, revision: str | None = None) -> list:
    """One entry point for both paths: ``hf_dataset`` (name or saved folder) through ``datasets``, else the TSVs of
    ``glue_dir``; neither given is an error naming both options (no default location outside the checkout)."""
    if hf_dataset is not None:
        return load_glue_dataset_split(hf_dataset, task, split, revision)
    if glue_dir is None:
        raise GlueDatasetError("no GLUE data: give a TSV folder (--data-dir / $ADAPONDER_GLUE_DIR) or a datasets "
                               f"name or saved folder (e.g. {DEFAULT_HF_GLUE})")
    return load_glue_split(glue_dir, task, split)


__all__ = ["DEFAULT_HF_GLUE", "SCHEMA", "SPLITS", "GlueDatasetError", "features", "tsv_to_dataset", "open_split",
           "load_glue_dataset_split", "load_glue_examples"]
