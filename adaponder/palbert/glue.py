"""GLUE data for PALBERT mode: loading the original GLUE TSV layout and batching for a GPT-NeoX classifier.

Layout (see ``shared/data/README.md``): ``<glue_dir>/<TaskDir>/{train,dev}.tsv``, tab-separated with
**no quoting** (quotes are ordinary characters, so lines are split on tabs only), UTF-8, MRPC's header
starting with a BOM, CoLA without a header. Labels follow GLUE / Hugging Face ``datasets``: RTE
``entailment`` = 0, ``not_entailment`` = 1; STS-B is a float score in [0, 5] (regression, one output).

Batches (B8: max length 128) are built tokenizer-agnostically from an ``encode: str -> list[int]``
callable: ``sentence1 + sep_ids + sentence2 (+ suffix_ids)``, truncated longest-first, right-padded
with ``pad_id``. GPT-NeoX classification pools the last non-padding token (B1), so right padding keeps
that token at ``attention_mask.sum(1) - 1``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adaponder.palbert.metrics import MAIN_METRIC, METRIC_NAMES, canonical_task, glue_metrics

__all__ = [
    "GlueDataError",
    "GlueTaskSpec",
    "GlueExample",
    "GLUE_TASKS",
    "get_task",
    "read_glue_tsv",
    "load_glue_split",
    "load_glue",
    "majority_label",
    "majority_baseline",
    "encode_pair",
    "encode_examples",
    "pad_batch",
    "tokenize_batch",
    "iter_batches",
]


class GlueDataError(ValueError):
    """A GLUE file is missing or malformed. ``path`` and (1-based) ``line`` locate the problem."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class GlueTaskSpec:
    """How one GLUE task is stored and scored.

    Attributes:
        name: canonical name (``"sst2"``).
        dirname: directory under the GLUE root (``"SST-2"``).
        header: expected header fields, or ``None`` when the file has no header (CoLA).
        num_fields: tab-separated fields per row.
        text_fields: column index of sentence1 and, for pair tasks, sentence2.
        label_field: column index of the label.
        label_map: raw label string -> class id; ``None`` for STS-B (float score).
        num_labels: classifier outputs (1 for regression).
        metric_names: keys returned by :func:`~adaponder.palbert.metrics.glue_metrics` (B8).
        main_metric: key to early-stop on (B8).
    """

    name: str
    dirname: str
    header: tuple[str, ...] | None
    num_fields: int
    text_fields: tuple[int, ...]
    label_field: int
    label_map: dict[str, int] | None
    num_labels: int
    metric_names: tuple[str, ...] = field(default=())
    main_metric: str = ""

    @property
    def is_regression(self) -> bool:
        return self.label_map is None

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2


def _spec(name: str, dirname: str, header: tuple[str, ...] | None, num_fields: int,
          text_fields: tuple[int, ...], label_field: int, label_map: dict[str, int] | None) -> GlueTaskSpec:
    num_labels = 1 if label_map is None else len(set(label_map.values()))
    return GlueTaskSpec(name, dirname, header, num_fields, text_fields, label_field, label_map,
                        num_labels, METRIC_NAMES[name], MAIN_METRIC[name])


_BINARY = {"0": 0, "1": 1}
_NLI_HEADER = ("index", "sentence1", "sentence2", "label")

GLUE_TASKS: dict[str, GlueTaskSpec] = {
    # CoLA: source, label, original (star) label, sentence; no header.
    "cola": _spec("cola", "CoLA", None, 4, (3,), 1, _BINARY),
    "sst2": _spec("sst2", "SST-2", ("sentence", "label"), 2, (0,), 1, _BINARY),
    "mrpc": _spec("mrpc", "MRPC", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), 5, (3, 4), 0,
                  _BINARY),
    "stsb": _spec("stsb", "STS-B", ("index", "genre", "filename", "year", "old_index", "source1", "source2",
                                    "sentence1", "sentence2", "score"), 10, (7, 8), 9, None),
    "rte": _spec("rte", "RTE", _NLI_HEADER, 4, (1, 2), 3, {"entailment": 0, "not_entailment": 1}),
    "wnli": _spec("wnli", "WNLI", _NLI_HEADER, 4, (1, 2), 3, _BINARY),
}

STSB_RANGE = (0.0, 5.0)


def get_task(task: str | GlueTaskSpec) -> GlueTaskSpec:
    """Look up a task spec by name (``"SST-2"``, ``"sst2"``, ``"STS-B"``... are all accepted)."""
    if isinstance(task, GlueTaskSpec):
        return task
    name = canonical_task(task)
    if name not in GLUE_TASKS:
        raise ValueError(f"GLUE task {task!r} has no loader; available: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[name]


@dataclass(frozen=True)
class GlueExample:
    """One row. ``label`` is an ``int`` class id, or a ``float`` score for STS-B; ``line`` is its 1-based file line."""

    text_a: str
    text_b: str | None
    label: int | float
    line: int


def read_glue_tsv(path: str | Path, task: str | GlueTaskSpec) -> list[GlueExample]:
    """Parse one GLUE TSV file of ``task``.

    Lines are split on ``"\\n"`` and then on tabs only (no quoting; a trailing ``"\\r"`` is dropped so
    CRLF copies also load). A final empty line is allowed; any other malformed row — wrong field
    count, empty text, unknown label, unparsable or out-of-range score, unexpected header — raises
    :class:`GlueDataError` naming the file and line.
    """
    spec = get_task(task)
    path = Path(path)
    try:
        # utf-8-sig strips MRPC's BOM; newline="" keeps "\r" inside fields untouched.
        with open(path, encoding="utf-8-sig", newline="") as fh:
            text = fh.read()
    except FileNotFoundError as err:
        raise GlueDataError(path, None, f"file not found (expected the GLUE layout "
                                        f"<glue_dir>/{spec.dirname}/{{train,dev}}.tsv)") from err
    except UnicodeDecodeError as err:
        raise GlueDataError(path, None, f"not valid UTF-8 ({err.reason} at byte {err.start})") from err

    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline
    examples: list[GlueExample] = []
    for lineno, raw in enumerate(lines, start=1):
        row = raw[:-1] if raw.endswith("\r") else raw
        fields = row.split("\t")
        if lineno == 1 and spec.header is not None:
            if tuple(fields) != spec.header:
                raise GlueDataError(path, lineno, f"unexpected header {fields!r}; expected {list(spec.header)!r}")
            continue
        if len(fields) != spec.num_fields:
            raise GlueDataError(path, lineno, f"expected {spec.num_fields} tab-separated fields for "
                                              f"{spec.dirname}, got {len(fields)}")
        texts = [fields[i] for i in spec.text_fields]
        for i, t in zip(spec.text_fields, texts):
            if not t.strip():
                raise GlueDataError(path, lineno, f"empty text in field {i}")
        examples.append(GlueExample(texts[0], texts[1] if spec.is_pair else None,
                                    _parse_label(spec, fields[spec.label_field], path, lineno), lineno))
    if not examples:
        raise GlueDataError(path, None, "no examples")
    return examples


def _parse_label(spec: GlueTaskSpec, raw: str, path: Path, lineno: int) -> int | float:
    if spec.label_map is not None:
        try:
            return spec.label_map[raw]
        except KeyError:
            raise GlueDataError(path, lineno, f"unknown label {raw!r} for {spec.dirname}; "
                                              f"expected one of {sorted(spec.label_map)}") from None
    try:
        score = float(raw)
    except ValueError:
        raise GlueDataError(path, lineno, f"score {raw!r} is not a number") from None
    lo, hi = STSB_RANGE
    if not (math.isfinite(score) and lo <= score <= hi):
        raise GlueDataError(path, lineno, f"score {raw!r} outside [{lo}, {hi}]")
    return score


def load_glue_split(glue_dir: str | Path, task: str | GlueTaskSpec, split: str = "train") -> list[GlueExample]:
    """Load ``<glue_dir>/<TaskDir>/<split>.tsv`` (``split`` is ``"train"`` or ``"dev"``)."""
    spec = get_task(task)
    if split not in ("train", "dev"):
        raise ValueError(f"split must be 'train' or 'dev' (GLUE test labels are not public), got {split!r}")
    return read_glue_tsv(Path(glue_dir) / spec.dirname / f"{split}.tsv", spec)


def load_glue(glue_dir: str | Path, task: str | GlueTaskSpec) -> dict[str, list[GlueExample]]:
    """Both labelled splits of ``task``: ``{"train": [...], "dev": [...]}``."""
    return {split: load_glue_split(glue_dir, task, split) for split in ("train", "dev")}


def majority_label(examples: Sequence[GlueExample]) -> int:
    """Most frequent class id (ties go to the smallest id). Classification tasks only."""
    labels = [ex.label for ex in examples]
    if not labels:
        raise ValueError("no examples")
    if any(isinstance(y, float) for y in labels):
        raise ValueError("majority_label is for classification; STS-B has float scores")
    counts = Counter(labels)
    return min(counts, key=lambda y: (-counts[y], y))


def majority_baseline(task: str | GlueTaskSpec, train: Sequence[GlueExample],
                      eval_examples: Sequence[GlueExample]) -> dict[str, float]:
    """GLUE metrics of the constant predictor fitted on ``train`` and scored on ``eval_examples`` (B8).

    Classification predicts the train majority class (the reference floor, and what models often
    collapse to on WNLI; MCC and F1 of a constant are 0). STS-B predicts the train mean, whose
    Pearson/Spearman are undefined (NaN) — a floor of "no correlation".
    """
    spec = get_task(task)
    labels = [ex.label for ex in eval_examples]
    if spec.is_regression:
        mean = sum(float(ex.label) for ex in train) / max(len(train), 1)
        return glue_metrics(spec.name, [mean] * len(labels), labels)
    return glue_metrics(spec.name, [majority_label(train)] * len(labels), labels)


# ---------------------------------------------------------------------------------------------- batching


def encode_pair(encode: Callable[[str], list[int]], text_a: str, text_b: str | None, *,
                sep_ids: Sequence[int], max_length: int = 128, suffix_ids: Sequence[int] = ()) -> list[int]:
    """Token ids of ``text_a + sep_ids + text_b + suffix_ids`` (single sentence: ``text_a + suffix_ids``).

    ``sep_ids`` and ``suffix_ids`` are never truncated. When the result is longer than ``max_length``
    the texts are truncated from the right, longest first, one token at a time (a tie trims ``text_b``),
    as Hugging Face's ``truncation="longest_first"`` does.
    """
    a = list(encode(text_a))
    b = None if text_b is None else list(encode(text_b))
    fixed = len(suffix_ids) + (len(sep_ids) if b is not None else 0)
    budget = max_length - fixed
    if budget < 1:
        raise ValueError(f"max_length={max_length} leaves no room for text after {fixed} separator/suffix ids")
    if b is None:
        a = a[:budget]
    else:
        excess = len(a) + len(b) - budget
        if excess > 0:
            # HF's token-by-token longest_first loop: trim the longer side, ties trim text_b.
            la, lb = len(a), len(b)
            for _ in range(excess):
                if la > lb:
                    la -= 1
                else:
                    lb -= 1
            a, b = a[:la], b[:lb]
    ids = a + ([] if b is None else list(sep_ids) + b) + list(suffix_ids)
    if not ids:
        raise ValueError(f"text {text_a!r} encodes to no tokens")
    return ids


def encode_examples(examples: Sequence[GlueExample], encode: Callable[[str], list[int]], *,
                    sep_ids: Sequence[int], max_length: int = 128,
                    suffix_ids: Sequence[int] = ()) -> list[list[int]]:
    """:func:`encode_pair` for every example (encode once, then batch many epochs with :func:`pad_batch`)."""
    return [encode_pair(encode, ex.text_a, ex.text_b, sep_ids=sep_ids, max_length=max_length,
                        suffix_ids=suffix_ids) for ex in examples]


def pad_batch(token_ids: Sequence[Sequence[int]], labels: Sequence[int | float], *, pad_id: int,
              pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad ``token_ids`` with ``pad_id`` into one batch.

    Returns ``input_ids`` ``[B, L]`` int64, ``attention_mask`` ``[B, L]`` int64 (1 on tokens),
    ``labels`` ``[B]`` — int64 for class ids, float32 when the labels are floats (STS-B).
    ``L`` is the longest sequence, or ``pad_to`` when given (static shapes).
    The model should locate the last token from ``attention_mask``, not by searching for ``pad_id``,
    since Pythia's pad/eos ids can also occur inside text.
    """
    if len(token_ids) != len(labels):
        raise ValueError(f"{len(token_ids)} sequences but {len(labels)} labels")
    if not token_ids:
        raise ValueError("empty batch")
    longest = max(len(ids) for ids in token_ids)
    length = longest if pad_to is None else pad_to
    if longest > length:
        raise ValueError(f"sequence of length {longest} exceeds pad_to={pad_to}")
    input_ids = torch.full((len(token_ids), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_ids), length), dtype=torch.long)
    for row, ids in enumerate(token_ids):
        input_ids[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    is_float = [isinstance(y, float) for y in labels]
    if any(is_float) and not all(is_float):
        raise ValueError("labels mix ints and floats")
    label_dtype = torch.float32 if all(is_float) else torch.long
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor(list(labels), dtype=label_dtype)}


def tokenize_batch(examples: Sequence[GlueExample], encode: Callable[[str], list[int]], *, pad_id: int,
                   sep_ids: Sequence[int], max_length: int = 128, suffix_ids: Sequence[int] = (),
                   pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Encode and pad ``examples`` into one batch (see :func:`encode_pair` and :func:`pad_batch`)."""
    ids = encode_examples(examples, encode, sep_ids=sep_ids, max_length=max_length, suffix_ids=suffix_ids)
    return pad_batch(ids, [ex.label for ex in examples], pad_id=pad_id, pad_to=pad_to)


def iter_batches(examples: Sequence[GlueExample], encode: Callable[[str], list[int]], *, pad_id: int,
                 sep_ids: Sequence[int], batch_size: int = 32, max_length: int = 128,
                 suffix_ids: Sequence[int] = (),
                 order: Sequence[int] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of ``batch_size`` (B8: 32) in ``order`` (default: file order; pass a permutation to shuffle).

    Each call encodes every example once; to reuse encodings across epochs call
    :func:`encode_examples` once and :func:`pad_batch` per batch. The last batch may be smaller.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = encode_examples(examples, encode, sep_ids=sep_ids, max_length=max_length, suffix_ids=suffix_ids)
    idx = list(range(len(examples))) if order is None else list(order)
    for start in range(0, len(idx), batch_size):
        chunk = idx[start : start + batch_size]
        yield pad_batch([ids[i] for i in chunk], [examples[i].label for i in chunk], pad_id=pad_id)
