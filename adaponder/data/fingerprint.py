"""Which data a run trained on, as a short fingerprint a checkpoint records and a resume compares.

Cheap and stable: no token file is re-read in full.

* a prepared folder (``adaponder-prepare``): the SHA-256 of what ``meta.json`` records about the split — the
  tokenizer fingerprint, the dtype and every shard's name, token count and content SHA-256 (hashed once, at
  preparation);
* an indexed dataset (``PREFIX.bin``/``PREFIX.idx``): the SHA-256 of the whole ``.idx`` (item and document sizes;
  about 12 bytes per item), the ``.bin`` size and 16 sampled 1 MiB blocks of the ``.bin`` (all of a ``.bin`` up to
  16 MiB). A change confined to unsampled tokens of a larger ``.bin``, sizes unchanged, goes unnoticed.

Two datasets of the same tokenizer and size but other content get different fingerprints; the same files moved
to another folder keep theirs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DataError, TokenizerMismatchError
from .layout import read_meta, split_info, verify_shards
from .tokenizer import as_tokenizer

if TYPE_CHECKING:
    from .config import DataConfig

_BLOCK = 1 << 20
_BLOCKS = 16


def _digest(path: Path, h: Any, sample: bool) -> None:
    """Feed ``h`` with the size of ``path`` and its content: all of it, or with ``sample`` (and above
    ``_BLOCKS`` blocks) ``_BLOCKS`` evenly spaced blocks of ``_BLOCK`` bytes."""
    size = path.stat().st_size
    h.update(f"{path.suffix}:{size};".encode())
    with open(path, "rb") as fh:
        if not sample or size <= _BLOCK * _BLOCKS:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
            return
        for i in range(_BLOCKS):
            fh.seek(i * (size - _BLOCK) // (_BLOCKS - 1))
            h.update(fh.read(_BLOCK))


def indexed_fingerprint(prefix: str | os.PathLike[str]) -> str:
    """Fingerprint of the indexed dataset ``PREFIX.idx`` (all of it: the sizes of every item and document) and
    ``PREFIX.bin`` (its size and sampled blocks: the tokens are re-read by no resume)."""
    from .indexed import bin_path, idx_path  # imports torch: this module stays torch-free for data preparation

    h = hashlib.sha256(b"adaponder.indexed/v1;")
    for path, sample in ((idx_path(prefix), False), (bin_path(prefix), True)):
        try:
            _digest(path, h, sample)
        except OSError as err:
            raise DataError(f"{path}: cannot read it to fingerprint the data ({err.strerror or err})") from None
    return h.hexdigest()[:16]


def packed_fingerprint(folder: str | os.PathLike[str], split: str) -> str:
    """Fingerprint of one split of a prepared folder, from its ``meta.json`` (shard hashes of preparation)."""
    meta = read_meta(folder)
    info = split_info(meta, split, folder)
    what = {"tokenizer": meta.get("tokenizer_fingerprint"), "dtype": meta.get("dtype"),
            "shards": [[s.get("file"), s.get("tokens"), s.get("sha256")] for s in info.get("shards", [])]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def source_identity(kind: str, path: str, split: str | None = None) -> dict[str, Any]:
    """``{"kind", "path", "split"?, "fingerprint"}`` of one data source (a prepared split, or an indexed prefix)."""
    if kind == "indexed":
        return {"kind": kind, "path": str(path), "fingerprint": indexed_fingerprint(path)}
    return {"kind": kind, "path": str(path), "split": split, "fingerprint": packed_fingerprint(path, split or "train")}


def data_identity(data: DataConfig, with_validation: bool = True) -> dict[str, Any]:
    """``{"train": identity, "val": identity or None}`` of a ``data:`` section (see
    :mod:`adaponder.data.training_source`); ``val`` is None when the run validates on nothing."""
    from .training_source import training_source, validation_source  # imports torch (as .indexed above)

    sources = {"train": training_source(data), "val": validation_source(data) if with_validation else None}
    return {name: src and source_identity(src.kind, src.path, src.split) for name, src in sources.items()}


def examples_fingerprint(examples: Any) -> str:
    """Fingerprint of labelled text examples (anything with ``text_a``, ``text_b``, ``label``: a GLUE split)."""
    h = hashlib.sha256(b"adaponder.examples/v1;")
    for ex in examples:
        h.update(json.dumps([ex.text_a, ex.text_b, ex.label]).encode() + b"\n")
    return h.hexdigest()[:16]


def labels_fingerprint(labels_file: str | os.PathLike[str], shards: list[dict[str, Any]]) -> str:
    """Fingerprint binding a label array to the tokens it labels: the label file's bytes and the recorded SHA-256
    of every shard of its split. Labels of another corpus (even of the same length), or this file beside other
    shards, give another fingerprint."""
    h = hashlib.sha256(b"adaponder.labels/v1;")
    h.update(json.dumps([s.get("sha256") for s in shards]).encode())
    _digest(Path(labels_file), h, sample=False)
    return h.hexdigest()[:16]


def check_corpus_tokenizer(data_dir: str | os.PathLike[str], tokenizer: Any, meta: dict[str, Any] | None = None) -> None:
    """A prepared folder read by an evaluation must hold the ids of ``tokenizer`` (the model's), as training checks
    (:class:`~.loader.PackedLoader`): ids of another tokenizer score as text nobody wrote, and when they fit the
    vocabulary nothing else notices. :class:`TokenizerMismatchError` names the folder and both tokenizers."""
    meta = read_meta(data_dir) if meta is None else meta
    tok = as_tokenizer(tokenizer)
    recorded = meta.get("tokenizer_fingerprint")
    if tok.fingerprint != recorded:
        corpus_name = (meta.get("tokenizer") or {}).get("name", "unknown")
        raise TokenizerMismatchError(
            f"{data_dir}: the model's tokenizer ({tok.name!r}, fingerprint {tok.fingerprint[:16]}) is not the "
            f"corpus's ({corpus_name!r}, fingerprint {str(recorded)[:16]}), which it was prepared with; evaluate a "
            "model trained on this data (its checkpoint carries the tokenizer), or prepare the data again with the "
            "model's tokenizer (adaponder prepare --tokenizer CHECKPOINT)")


def check_labelled_corpus(data_dir: str | os.PathLike[str], split: str, tokenizer: Any = None) -> None:
    """Before a difficulty evaluation: the split's shards are those ``meta.json`` records, its labels are the
    ones written with them (the fingerprint stored at generation), and ``tokenizer`` (the model's) is the
    corpus's. A corpus written before labels were fingerprinted has its shards and tokenizer checked only.
    :class:`DataError` names what does not belong."""
    folder = Path(data_dir)
    meta = read_meta(folder)
    if tokenizer is not None:
        check_corpus_tokenizer(folder, tokenizer, meta)
    info = split_info(meta, split, folder)
    verify_shards(folder, split)
    stored = info.get("labels_fingerprint")
    if stored is None or "labels" not in info:
        return
    now = labels_fingerprint(folder / info["labels"], info.get("shards", []))
    if now != stored:
        raise DataError(f"{folder / info['labels']}: these labels do not belong to the corpus's {split} split "
                        f"(fingerprint {now}, {'meta.json'} records {stored}): labels of another corpus, or "
                        "edited after generation; regenerate the corpus (adaponder-reasoning-data)")


def describe(identity: dict[str, Any] | None) -> str:
    """``fingerprint (path[, split])`` for messages."""
    if not identity:
        return "none recorded"
    where = identity.get("path", "?") + (f", split {identity['split']}" if identity.get("split") else "")
    return f"{identity.get('fingerprint')} ({where})"


__all__ = ["check_corpus_tokenizer", "check_labelled_corpus", "data_identity", "describe", "examples_fingerprint",
           "indexed_fingerprint", "labels_fingerprint", "packed_fingerprint", "source_identity"]
