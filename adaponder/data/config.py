"""The ``data:`` section of a training configuration, typed: what the training and validation data of a run are
(read by :mod:`adaponder.data.training_source`). Each key's type and limits are in its annotation; the training
configuration (:mod:`adaponder.train.config`) validates it with its other sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from adaponder.typed_config import Count, Float

from .indexed import is_indexed_prefix


@dataclass
class DataConfig:
    #: ``packed``: ``path`` is a prepared data folder (``adaponder-prepare`` output: ``meta.json`` + shards).
    #: ``indexed``: ``path`` is the PREFIX of a Megatron/GPT-NeoX indexed dataset (``PREFIX.bin`` +
    #: ``PREFIX.idx``, e.g. Pythia's pre-tokenized Pile); see :mod:`adaponder.data.indexed`.
    #: ``auto``: ``indexed`` when ``PATH.idx`` exists, else ``packed``; resolved when the config is loaded.
    format: Literal["auto", "packed", "indexed"] = "packed"
    #: Prepared data folder, or the indexed dataset's PREFIX (``data.format: indexed``).
    path: str | None = None
    #: ``data.format: indexed`` only. ``sequences``: every item is one ready sample of ``seq_len + 1`` tokens,
    #: read in stored order (global batch b = items b·G … b·G+G−1: Pythia's pre-shuffled Pile, bit for bit);
    #: ``documents``: items are documents, packed with EOD and shuffled by seed like prepared shards.
    order: Literal["sequences", "documents"] = "sequences"
    #: ``documents`` order: put the EOD token after every document (``null``: unless they end with it already).
    append_eod: bool | None = None
    #: A separate validation source: a prepared data folder (its ``val_split``) or an indexed PREFIX (all of
    #: it; order ``val_order``, default ``order``). ``null``: the ``val`` split of ``path`` (packed only).
    val_path: str | None = None
    val_split: str = "val"
    val_order: Literal["sequences", "documents"] | None = None
    #: Raw inputs to prepare into ``path`` when it holds no ``meta.json`` yet: files, folders, globs, or
    #: ``"bundled"`` for the public-domain corpus shipped with adaponder. ``None``: ``path`` must exist.
    prepare: Annotated[list[str], Field(min_length=1)] | None = None
    #: Tokenizer file/folder; ``None`` = ``<path>/tokenizer.json`` when the data folder holds one (a tokenizer
    #: trained by ``adaponder-prepare --train-tokenizer``), else the bundled Pythia (GPT-NeoX-20B) tokenizer.
    tokenizer: str | None = None
    #: When preparing on the fly: train a byte-level BPE tokenizer of this many entries on the train split.
    train_tokenizer: Count | None = None
    #: Tokens per training sample (the model sees ``seq_len`` inputs and as many labels).
    seq_len: Count = 2048
    #: Used only when preparing on the fly.
    val_fraction: Annotated[Float, Field(ge=0, lt=1)] = 0.01
    text_field: str = "text"
    prepare_workers: Count = 1


def resolve_data_format(data: DataConfig) -> None:
    """``data.format: auto``: an indexed PREFIX when ``PATH.idx`` exists, else a prepared (packed) folder, which
    ``data.prepare`` may still have to write."""
    if data.format != "auto":
        return
    indexed = data.path is not None and data.prepare is None and is_indexed_prefix(data.path)
    data.format = "indexed" if indexed else "packed"


__all__ = ["DataConfig", "resolve_data_format"]
