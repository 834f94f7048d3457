"""Errors raised by the data pipeline.

Every error is a :class:`DataError` (a ``ValueError``) whose message names the culprit — the file, folder,
glob or data directory — and, where it applies, the line number or byte offset and what was expected.
Subclasses let callers and tests tell the cases apart.
"""

from __future__ import annotations


class DataError(ValueError):
    """Base class: bad input data, bad prepared data, or a mismatch between data and model/tokenizer."""


class InputNotFoundError(DataError):
    """A path does not exist, or a folder or glob matched no readable input file."""


class EmptyInputError(DataError):
    """An input file (or dataset) holds no text."""


class DecodingError(DataError):
    """Input bytes are not valid UTF-8 (with ``errors="strict"``)."""


class RecordError(DataError):
    """A JSONL line is not JSON, or a record/column lacks the text field or holds a non-string."""


class CorpusTooSmallError(DataError):
    """A prepared split is shorter than one packed sample (or gives a rank no sample)."""


class TokenizerMismatchError(DataError):
    """Prepared data was tokenized with a different tokenizer than the one in use."""


class VocabRangeError(DataError):
    """Prepared data holds token ids that the model's vocabulary cannot embed."""


class ShardError(DataError):
    """A prepared data directory is incomplete or damaged: missing/truncated shard, missing meta.json."""


class StateError(DataError):
    """A loader state_dict does not fit the loader it is loaded into."""


__all__ = [
    "DataError",
    "InputNotFoundError",
    "EmptyInputError",
    "DecodingError",
    "RecordError",
    "CorpusTooSmallError",
    "TokenizerMismatchError",
    "VocabRangeError",
    "ShardError",
    "StateError",
]
