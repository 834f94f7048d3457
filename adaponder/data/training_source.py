"""The training and validation data of a run, from its typed ``data:`` section (:class:`~.config.DataConfig`).

``data.format: packed`` (default) reads a folder prepared by ``adaponder-prepare`` with
:class:`~adaponder.data.loader.PackedLoader`; ``data.format: indexed`` reads a Megatron/GPT-NeoX indexed
dataset (``PREFIX.bin``/``PREFIX.idx``) with :class:`~adaponder.data.indexed.IndexedLoader` in ``data.order``.
Both are :class:`~.cursor.TokenLoader`\\ s.

The tokenizer: :func:`tokenizer_path`.

Validation: ``data.val_path`` names a separate source — a prepared folder (its ``data.val_split``) or an
indexed PREFIX (all of it, in ``data.val_order`` or else ``data.order``), told apart by what is on disk —;
without it, the ``val`` split of the packed ``data.path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from .config import DataConfig
from .cursor import TokenLoader, first_batches
from .errors import DataError
from .indexed import IndexedLoader, is_indexed_prefix, strip_suffix
from .loader import PackedLoader
from .prepare import TOKENIZER_FILE


@dataclass(frozen=True)
class DataSource:
    """One source of token samples: a prepared folder's ``split``, or an indexed ``path`` (PREFIX) in ``order``."""

    kind: Literal["packed", "indexed"]
    path: str
    split: str | None = None
    order: str | None = None


def _loader(src: DataSource, data: DataConfig, *, seq_len: int, micro_batch: int, rank: int, world_size: int,
            seed: int, tokenizer, vocab_size: int | None, training: bool) -> TokenLoader:
    """The loader of ``src``: shuffled and infinite for training, one unshuffled pass otherwise."""
    order = {} if training else {"shuffle": False, "infinite": False}
    if src.kind == "indexed":
        return IndexedLoader(src.path, src.order, seq_len, micro_batch, rank, world_size, seed, vocab_size,
                             eod_id=tokenizer.eod_id, append_eod=data.append_eod, **order)
    return PackedLoader(src.path, split=src.split, seq_len=seq_len, micro_batch_size=micro_batch, rank=rank,
                        world_size=world_size, seed=seed, tokenizer_fingerprint=tokenizer.fingerprint,
                        vocab_size=vocab_size, **order)


def training_source(data: DataConfig) -> DataSource:
    """What the run trains on: ``data.path`` as a packed folder's ``train`` split or an indexed PREFIX."""
    if data.path is None:
        raise DataError("data.path: required (the prepared data folder, or an indexed dataset PREFIX)")
    if data.format == "indexed":
        return DataSource("indexed", data.path, order=data.order)
    return DataSource("packed", data.path, split="train")


def train_loader(data: DataConfig, *, seq_len: int, micro_batch: int, rank: int, world_size: int, seed: int,
                 tokenizer, vocab_size: int | None) -> TokenLoader:
    """The infinite, shuffled (packed / documents) or stored-order (sequences), rank-sharded training loader."""
    return _loader(training_source(data), data, seq_len=seq_len, micro_batch=micro_batch, rank=rank,
                   world_size=world_size, seed=seed, tokenizer=tokenizer, vocab_size=vocab_size, training=True)


def tokenizer_path(data: DataConfig, backbone: str | None = None) -> str | None:
    """The run's tokenizer file: ``data.tokenizer``; else the one saved next to the prepared shards (trained by
    ``adaponder-prepare --train-tokenizer``); else a local ``backbone`` checkpoint folder's ``tokenizer.json``
    (the vocabulary its embeddings were trained on); else ``None``, the bundled Pythia tokenizer."""
    if data.tokenizer is not None:
        return data.tokenizer
    for folder in (data.path, backbone):
        if folder is not None and (Path(folder) / TOKENIZER_FILE).is_file():
            return str(Path(folder) / TOKENIZER_FILE)
    return None


def validation_source(data: DataConfig) -> DataSource:
    """The validation data: ``data.val_path`` (a prepared folder or an indexed PREFIX), else ``data.path``'s
    ``val`` split."""
    if data.val_path:
        if (Path(data.val_path) / "meta.json").is_file():
            return DataSource("packed", data.val_path, split=data.val_split)
        if is_indexed_prefix(data.val_path):
            return DataSource("indexed", strip_suffix(data.val_path), order=data.val_order or data.order)
        raise DataError(f"data.val_path {data.val_path}: neither a prepared data folder (no meta.json) nor an "
                        f"indexed dataset prefix (no {strip_suffix(data.val_path)}.idx)")
    if data.format == "indexed":
        raise DataError("data.format indexed has no validation split of its own: set data.val_path (an indexed "
                        "PREFIX or a prepared folder), or turn validation off (eval.every: 0, eval.at_end: false)")
    return DataSource("packed", data.path, split="val")


def validation_batches(data: DataConfig, *, seq_len: int, micro_batch: int, rank: int, world_size: int, tokenizer,
                       vocab_size: int | None, max_batches: int | None) -> Iterator[torch.Tensor]:
    """One deterministic pass over this rank's part of the validation data (at most ``max_batches``)."""
    loader = _loader(validation_source(data), data, seq_len=seq_len, micro_batch=micro_batch, rank=rank,
                     world_size=world_size, seed=0, tokenizer=tokenizer, vocab_size=vocab_size, training=False)
    return first_batches(loader, max_batches)


__all__ = ["DataSource", "train_loader", "training_source", "tokenizer_path", "validation_source",
           "validation_batches"]
