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
Neither set: a ``FileNotFoundError`` saying so (there is no default location). Online, lm-eval's
official tasks (``lambada_openai``, ``piqa``, ...) need no folder: they download the Hugging Face datasets.

A file that cannot be read as its benchmark's release is an ``adaponder`` data error naming the file and line
(``adaponder-eval`` prints it as one ``error:`` line): a line that is not a JSON object, an empty file, a record
without a key its task reads, a document whose text is empty (lm-eval would score it like any other), and a label
outside the task's choices (lm-eval would score it as always wrong).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets

from adaponder.data.errors import EmptyInputError, RecordError

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


def _lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every non-blank line; undecodable bytes and an empty file name the file."""
    out = []
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise RecordError(f"{path}:{n}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
            if line.strip():
                out.append((n, line))
    if not out:
        raise EmptyInputError(f"{path}: the file is empty; expected the benchmark's original release file")
    return out


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    """``(line number, record)`` of a JSON-lines file; a line that is not a JSON object names file and line."""
    out = []
    for n, line in _lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise RecordError(f"{path}:{n}: not a JSON line ({err.msg} at column {err.colno})") from None
        if not isinstance(rec, dict):
            raise RecordError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
        out.append((n, rec))
    return out


def _labels(path: Path, allowed: tuple[str, ...]) -> list[str]:
    """The labels of a ``.lst`` file, one per line, each one of ``allowed``."""
    out = []
    for n, line in _lines(path):
        if line.strip() not in allowed:
            raise RecordError(f"{path}:{n}: label {line.strip()!r} is out of range; expected one of {list(allowed)}")
        out.append(line.strip())
    return out


def _docs(path: Path, records: list[tuple[int, dict]], convert, labels: list | None = None) -> list[dict]:
    """``convert(record[, label])`` of every record; a missing key or a bad value names the file and line."""
    docs = []
    for i, (n, rec) in enumerate(records):
        try:
            docs.append(convert(rec) if labels is None else convert(rec, labels[i]))
        except KeyError as err:
            raise RecordError(f"{path}:{n}: the record has no key {err.args[0]!r}; expected the benchmark's "
                              f"original fields (see eval/tasks/README.md)") from None
        except (TypeError, ValueError) as err:
            raise RecordError(f"{path}:{n}: {err}") from None
    return docs


def _one_of(what: str, value, choices: list) -> None:
    # lm-eval scores a gold answer outside the choices as always wrong, without a word: refuse it here.
    if value not in choices:
        raise ValueError(f"{what} {value!r} is out of range; expected one of {choices}")


def _split(name: str, docs: list[dict]) -> datasets.DatasetDict:
    # Split names are the ones the official task evaluates on, so the YAMLs read like the originals.
    return datasets.DatasetDict({name: datasets.Dataset.from_list(docs)})


def _text(what: str, value) -> str:
    # lm-eval scores an empty document like any other (an empty context, a target of one space), and its score
    # enters the task's mean: refuse it here, naming the file and line
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} is {'empty' if isinstance(value, str) else type(value).__name__}; expected the "
                         "document's text (a non-empty string)")
    return value


# --- converters: original record -> HF-schema doc ---------


def lambada_doc(rec: dict) -> dict:
    # EleutherAI/lambada_openai "default" is this very OpenAI file: {"text"} only.
    return {"text": _text("text", rec["text"])}


def piqa_doc(rec: dict, label: str) -> dict:
    # baber/piqa (ybisk/piqa re-upload): labels live in a separate aligned .lst file.
    _one_of("label", str(label), ["0", "1"])
    return {"goal": _text("goal", rec["goal"]), "sol1": rec["sol1"], "sol2": rec["sol2"], "label": int(label)}


def arc_doc(rec: dict) -> dict:
    # allenai/ai2_arc flattens question.stem and turns the choice list into {text: [...], label: [...]};
    # answerKey is kept verbatim (A-E or 1-4), the official YAML indexes it into choices.label.
    choices = rec["question"]["choices"]
    _one_of("answerKey", rec["answerKey"], [c["label"] for c in choices])
    return {
        "id": rec["id"],
        "question": _text("question.stem", rec["question"]["stem"]),
        "choices": {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]},
        "answerKey": rec["answerKey"],
    }


def sciq_doc(rec: dict) -> dict:
    # allenai/sciq keeps the original field names.
    keys = ("question", "distractor3", "distractor1", "distractor2", "correct_answer", "support")
    _text("question", rec["question"])
    return {k: rec[k] for k in keys}


def winogrande_doc(rec: dict, label: str | None = None) -> dict:
    # allenai/winogrande drops qID and keeps `answer` as the string "1"/"2".
    answer = rec.get("answer") or label
    _one_of("answer", str(answer), ["1", "2"])
    return {"sentence": _text("sentence", rec["sentence"]), "option1": rec["option1"], "option2": rec["option2"], "answer": str(answer)}


def hellaswag_doc(rec: dict) -> dict:
    # Rowan/hellaswag stores `label` as a string ("" for the unlabeled test split).
    keys = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "split_type")
    _text("ctx", rec["ctx"])
    if str(rec.get("label", "")):
        _one_of("label", str(rec["label"]), [str(i) for i in range(len(rec["endings"]))])
    return {**{k: rec[k] for k in keys}, "label": str(rec.get("label", ""))}


# --- custom_dataset entry points -------------------------------------------------------------


def _load(root: Path, rel: str, split: str, convert) -> datasets.DatasetDict:
    path = _file(root, rel)
    return _split(split, _docs(path, _jsonl(path), convert))


def load_lambada_openai(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    return _load(data_dir(adaponder_eval_data), "lambada_openai/lambada_test.jsonl", "test", lambada_doc)


def load_piqa(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    root = data_dir(adaponder_eval_data)
    path, labels_path = _file(root, "piqa/valid.jsonl"), _file(root, "piqa/valid-labels.lst")
    recs, labels = _jsonl(path), _labels(labels_path, ("0", "1"))
    if len(recs) != len(labels):
        raise RecordError(f"{path} holds {len(recs)} questions but {labels_path} {len(labels)} labels; "
                          "expected one label per question")
    return _split("validation", _docs(path, recs, piqa_doc, labels))


def _load_arc(rel: str, adaponder_eval_data) -> datasets.DatasetDict:
    return _load(data_dir(adaponder_eval_data), rel, "test", arc_doc)


def load_arc_easy(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    return _load_arc("arc_easy/ARC-Easy-Test.jsonl", adaponder_eval_data)


def load_arc_challenge(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    return _load_arc("arc_challenge/ARC-Challenge-Test.jsonl", adaponder_eval_data)


def load_sciq(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    # sciq/test.json is one JSON array: a syntax error names its line, a bad record its index.
    path = _file(data_dir(adaponder_eval_data), "sciq/test.json")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise EmptyInputError(f"{path}: the file is empty; expected the benchmark's original release file")
    try:
        recs = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(recs, list) or not recs:
        raise RecordError(f"{path}: expected a non-empty JSON array of questions")
    docs = []
    for i, rec in enumerate(recs):
        try:
            docs.append(sciq_doc(rec))
        except (KeyError, TypeError) as err:
            raise RecordError(f"{path}: record {i} (0-based) lacks key {err.args[0]!r} or is not an object") from None
        except ValueError as err:
            raise RecordError(f"{path}: record {i} (0-based): {err}") from None
    return _split("test", docs)


def load_winogrande(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    # WinoGrande 1.1 dev == HF winogrande_xl "validation" (every HF config shares that split).
    root = data_dir(adaponder_eval_data)
    path = _file(root, "winogrande/dev.jsonl")
    recs = _jsonl(path)
    labels_path = root / "winogrande/dev-labels.lst"
    labels = _labels(labels_path, ("1", "2")) if labels_path.is_file() else [None] * len(recs)
    if len(recs) != len(labels):
        raise RecordError(f"{path} holds {len(recs)} questions but {labels_path} {len(labels)} labels; "
                          "expected one label per question")
    return _split("validation", _docs(path, recs, winogrande_doc, labels))


def load_hellaswag(adaponder_eval_data=None, **_) -> datasets.DatasetDict:
    # rowanz/hellaswag data/hellaswag_val.jsonl (not in the offline data pack; ~11 MB).
    return _load(data_dir(adaponder_eval_data), "hellaswag/hellaswag_val.jsonl", "validation", hellaswag_doc)
