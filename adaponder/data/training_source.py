"""The training and validation data of a run, from the ``data:`` section of a training configuration.

``data.format: packed`` (default) reads a folder prepared by ``adaponder-prepare`` with
:class:`~adaponder.data.loader.PackedLoader`; ``data.format: indexed`` reads a Megatron/GPT-NeoX indexed
dataset (``PREFIX.bin``/``PREFIX.idx``) with :class:`~adaponder.data.indexed.IndexedLoader` in ``data.order``.

The tokenizer: :func:`tokenizer_path`.

Validation: ``data.val_path`` names a separate source — a prepared folder (its ``data.val_split``) or an
indexed PREFIX (all of it, in ``data.val_order`` or else ``data.order``), told apart by what is on disk —;
without it, the ``val`` split of the packed ``data.path``.

The functions take any object with the ``data:`` fields (a :class:`adaponder.train.config.DataConfig`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .errors import DataError


def _get(data: Any, key: str, default: Any = None) -> Any:
    return getattr(data, key, default)


def train_loader(data: Any, *, seq_len: int, micro_batch: int, rank: int, world_size: int, seed: int, tokenizer,
                 vocab_size: int | None):
    """The infinite, shuffled (packed / documents) or stored-order (sequences), rank-sharded training loader."""
    if _get(data, "format", "packed") == "indexed":
        from .indexed import IndexedLoader

        return IndexedLoader(data.path, _get(data, "order", "sequences"), seq_len, micro_batch, rank, world_size,
                             seed, vocab_size, eod_id=tokenizer.eod_id, append_eod=_get(data, "append_eod"))
    from .loader import PackedLoader

    return PackedLoader(data.path, split="train", seq_len=seq_len, micro_batch_size=micro_batch, rank=rank,
                        world_size=world_size, seed=seed, tokenizer_fingerprint=tokenizer.fingerprint,
                        vocab_size=vocab_size)


def tokenizer_path(data: Any, backbone: str | None = None) -> str | None:
    """The run's tokenizer file: ``data.tokenizer``; else the one saved next to the prepared shards (trained by
    ``adaponder-prepare --train-tokenizer``); else a local ``backbone`` checkpoint folder's ``tokenizer.json``
    (the vocabulary its embeddings were trained on); else ``None``, the bundled Pythia tokenizer."""
    from .prepare import TOKENIZER_FILE

    if _get(data, "tokenizer") is not None:
        return data.tokenizer
    for folder in (data.path, backbone):
        if folder is not None and (Path(folder) / TOKENIZER_FILE).is_file():
            return str(Path(folder) / TOKENIZER_FILE)
    return None


def validation_source(data: Any) -> dict[str, Any]:
    """``{"kind": "packed"|"indexed", "path": ..., "split"|"order": ...}`` of the validation data."""
    from .indexed import is_indexed_prefix, strip_suffix

    val_path = _get(data, "val_path")
    if val_path:
        if (Path(val_path) / "meta.json").is_file():
            return {"kind": "packed", "path": val_path, "split": _get(data, "val_split", "val")}
        if is_indexed_prefix(val_path):
            return {"kind": "indexed", "path": strip_suffix(val_path),
                    "order": _get(data, "val_order") or _get(data, "order", "sequences")}
        raise DataError(f"data.val_path {val_path}: neither a prepared data folder (no meta.json) nor an indexed "
                        f"dataset prefix (no {strip_suffix(val_path)}.idx)")
    if _get(data, "format", "packed") == "indexed":
        raise DataError("data.format indexed has no validation split of its own: set data.val_path (an indexed "
                        "PREFIX or a prepared folder), or turn validation off (eval.every: 0, eval.at_end: false)")
    return {"kind": "packed", "path": data.path, "split": "val"}


def validation_batches(data: Any, *, seq_len: int, micro_batch: int, rank: int, world_size: int, tokenizer,
                       vocab_size: int | None, max_batches: int | None) -> Iterator[torch.Tensor]:
    """One deterministic pass over this rank's part of the validation data (at most ``max_batches``)."""
    src = validation_source(data)
    if src["kind"] == "indexed":
        from .indexed import iter_indexed_eval_batches

        return iter_indexed_eval_batches(src["path"], src["order"], seq_len, micro_batch, rank, world_size,
                                         vocab_size=vocab_size, eod_id=tokenizer.eod_id,
                                         append_eod=_get(data, "append_eod"), max_batches=max_batches)
    from .loader import iter_eval_batches

    return iter_eval_batches(src["path"], seq_len, micro_batch, split=src["split"], rank=rank,
                             world_size=world_size, tokenizer_fingerprint=tokenizer.fingerprint,
                             vocab_size=vocab_size, max_batches=max_batches)


__all__ = ["train_loader", "tokenizer_path", "validation_source", "validation_batches"]
