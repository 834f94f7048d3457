"""On-disk layout of a prepared data directory (written by ``prepare``, read by ``PackedLoader``).

::

    output_dir/
      meta.json              written last; its presence means the directory is complete
      train-00000.bin        raw little-endian token ids (uint16 if vocab_size <= 65536, else uint32),
      train-00001.bin        at most ``shard_tokens`` tokens per shard; shards concatenate to the split stream
      train.docs.npy         int64 document start offsets into the split stream (n_docs + 1 entries)
      val-00000.bin
      val.docs.npy

Each split stream is its documents in order, each followed by the EOD token, so packed windows never
need to know where a document came from. A split without documents has no shard files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ShardError

FORMAT = "adaponder.packed/v1"
META_FILE = "meta.json"
SPLITS = ("train", "val")


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def docs_name(split: str) -> str:
    return f"{split}.docs.npy"


def read_meta(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and sanity-check ``meta.json``; :class:`ShardError` if missing, unreadable or foreign."""
    path = Path(data_dir) / META_FILE
    if not Path(data_dir).is_dir():
        raise ShardError(f"prepared data directory {data_dir} does not exist; run adaponder-prepare first")
    if not path.is_file():
        raise ShardError(
            f"{path} is missing: {data_dir} is not a (complete) prepared data directory; "
            "run adaponder-prepare (an interrupted run never writes meta.json)"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: unreadable metadata ({exc}); expected the JSON written by adaponder-prepare") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ShardError(f"{path}: format {found!r}, expected {FORMAT!r}")
    return meta


def split_info(meta: dict[str, Any], split: str, data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    splits = meta.get("splits", {})
    if split not in splits:
        raise ShardError(f"{data_dir}: no split {split!r} in {META_FILE} (splits: {', '.join(splits)})")
    return splits[split]


def open_shards(
    data_dir: str | os.PathLike[str], meta: dict[str, Any], split: str, verify_checksums: bool = False
) -> list[np.memmap]:
    """Memory-map a split's shards, checking each exists with exactly the recorded size (and hash)."""
    dtype = np.dtype(meta["dtype"])
    maps = []
    for shard in split_info(meta, split, data_dir)["shards"]:
        path = Path(data_dir) / shard["file"]
        expected = int(shard["tokens"]) * dtype.itemsize
        if not path.is_file():
            raise ShardError(f"shard {path} is missing; expected {expected} bytes ({shard['tokens']} tokens)")
        actual = path.stat().st_size
        if actual != expected:
            what = "truncated" if actual < expected else "longer than recorded"
            raise ShardError(
                f"shard {path} is {what}: {actual} bytes, expected {expected} ({shard['tokens']} {dtype.name} "
                "tokens); re-run adaponder-prepare"
            )
        if verify_checksums:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            if h.hexdigest() != shard["sha256"]:
                raise ShardError(f"shard {path}: sha256 {h.hexdigest()} differs from the recorded {shard['sha256']}")
        maps.append(np.memmap(path, dtype=dtype, mode="r"))
    return maps


def verify_shards(data_dir: str | os.PathLike[str], split: str) -> int:
    """Re-hash every shard of ``split`` against the SHA-256 that ``meta.json`` recorded at preparation (sizes
    first: a size mismatch needs no hashing). Returns the bytes hashed; :class:`ShardError` names the first shard
    whose content changed since it was prepared."""
    meta = read_meta(data_dir)
    del open_shards(data_dir, meta, split)[:]  # a missing or resized shard is named as such, before any hashing
    hashed = 0
    for shard in split_info(meta, split, data_dir)["shards"]:
        path = Path(data_dir) / shard["file"]
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as err:
            raise ShardError(f"shard {path}: cannot read it to verify it ({err.strerror or err})") from None
        hashed += path.stat().st_size
        if shard.get("sha256") and digest != shard["sha256"]:
            raise ShardError(f"shard {path} changed after preparation: its sha256 is {digest}, {META_FILE} "
                             f"records {shard['sha256']}; re-run adaponder-prepare (a run trains only on the data "
                             f"its {META_FILE} describes)")
    return hashed


def split_stream(data_dir: str | os.PathLike[str], split: str) -> np.ndarray:
    """A prepared split's whole token stream (its shards concatenated, each size checked)."""
    shards = open_shards(data_dir, read_meta(data_dir), split)
    return np.concatenate([np.asarray(s) for s in shards]) if shards else np.zeros(0, dtype=np.int64)


def split_documents(data_dir: str | os.PathLike[str], split: str) -> Iterator[np.ndarray]:
    """The documents of a prepared split in order (int64 ids), each without the EOD token that ends it in the
    stream; one document, the whole stream, when the split has no ``<split>.docs.npy``."""
    meta = read_meta(data_dir)
    stream = split_stream(data_dir, split)
    offsets_file = Path(data_dir) / docs_name(split)
    offsets = np.load(offsets_file) if offsets_file.is_file() else np.array([0, len(stream)])
    eod = int(meta["eod_id"])
    for i in range(len(offsets) - 1):
        ids = stream[int(offsets[i]):int(offsets[i + 1])].astype(np.int64)
        yield ids[:-1] if len(ids) and ids[-1] == eod else ids


__all__ = [
    "FORMAT",
    "META_FILE",
    "SPLITS",
    "dtype_for_vocab",
    "shard_name",
    "docs_name",
    "read_meta",
    "split_info",
    "open_shards",
    "split_documents",
    "split_stream",
    "verify_shards",
]
