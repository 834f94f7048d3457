"""Megatron / GPT-NeoX indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) as a training source.

This is the format Pythia's pre-tokenized, pre-shuffled deduplicated Pile is distributed in (and what
Megatron-LM's and GPT-NeoX's ``preprocess_data.py`` write). Layout of ``PREFIX.idx`` (all little-endian)::

    9 bytes   b"MMIDIDX\\x00\\x00"
    8 bytes   version, always 1
    1 byte    dtype code of the tokens in .bin: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
              7 float32, 8 uint16
    8 bytes   N, the number of sequences (items)
    8 bytes   D, the number of document indices (documents + 1)
    N int32   the length of each sequence, in tokens
    N int64   the byte offset of each sequence in .bin
    D int64   document boundaries as sequence indices: document k is sequences [doc[k], doc[k+1])
   (N int8    a mode per sequence; only in multimodal datasets, ignored here)

``PREFIX.bin`` is the sequences' tokens, back to back. :class:`IndexedDataset` reads both with NumPy memory
maps (no megatron-core needed) and checks them when opened: header, version, dtype, that the index's size
fits its counts, that the byte offsets follow from the lengths, that the document boundaries are sane, and
that ``.bin`` has exactly the size the index describes — a truncated ``.bin`` or an ``.idx`` of another
``.bin`` is a :class:`~adaponder.data.errors.ShardError` naming both files.

:class:`IndexedLoader` turns a dataset into training batches, with :class:`~adaponder.data.loader.PackedLoader`'s
interface (iteration, ``state_dict``/``load_state_dict`` exact resume, rank sharding, ``num_samples``), in one
of two orders:

``sequences``
    Every item is one ready training sample of ``seq_len + 1`` tokens, read in stored order and never
    shuffled (Pythia's pre-shuffled Pile: 2049 tokens, seq_len 2048). Items are dealt in groups of
    ``micro_batch_size × world_size``: micro-step ``j`` gives rank ``r`` the items
    ``j·m·W + r·m … j·m·W + r·m + m − 1`` (Megatron's pretraining sampler), so with ``A`` accumulation steps
    the global batch ``b`` is exactly the items ``b·G … b·G + G − 1`` with ``G = m·A·W`` — bit for bit
    Pythia's training order. An epoch's last group, if incomplete, is split into ``W`` equal contiguous
    parts (the ``< W`` items after it are skipped); later epochs repeat the stored order.
``documents``
    Items are documents (each made of its sequences); they are concatenated, each followed by the EOD token
    (unless the documents already end with it: ``append_eod=None`` checks), cut into windows of
    ``seq_len + 1`` tokens every ``seq_len`` tokens and shuffled by ``(seed, epoch)`` — exactly what
    :class:`~adaponder.data.loader.PackedLoader` does with the project's own shards. Empty documents are
    skipped.

Token ids are checked against ``vocab_size``: the first 16M tokens when the loader is built, and every
batch before it is returned (a :class:`~adaponder.data.errors.VocabRangeError` naming the item).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cursor import EpochCursor, first_batches
from .errors import DataError, InputNotFoundError, ShardError, StateError, VocabRangeError

INDEX_HEADER = b"MMIDIDX\x00\x00"
_HEADER_BYTES = 9 + 8 + 1 + 8 + 8
#: dtype codes of megatron.core.datasets.indexed_dataset.DType
DTYPES: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16),
                               4: np.dtype(np.int32), 5: np.dtype(np.int64), 6: np.dtype(np.float64),
                               7: np.dtype(np.float32), 8: np.dtype(np.uint16)}
ORDERS = ("sequences", "documents")
STATE_FORMAT = "adaponder.IndexedLoader/v1"
_STATE_KEYS = ("order", "seed", "seq_len", "world_size", "micro_batch_size", "shuffle", "num_samples",
               "append_eod", "dataset")
_CHUNK = 1 << 24  # elements per chunk of the O(N) checks (bounded memory for the Pile's 146M items)
_VOCAB_SCAN = 1 << 24  # tokens scanned for the vocabulary check at start-up


def idx_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def bin_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def strip_suffix(path: str | os.PathLike[str]) -> str:
    """``data/pile.bin`` / ``data/pile.idx`` / ``data/pile`` → ``data/pile`` (the prefix)."""
    s = os.fspath(path)
    return s[:-4] if s.endswith((".bin", ".idx")) else s


def is_indexed_prefix(path: str | os.PathLike[str]) -> bool:
    """Whether ``PATH.idx`` exists (``PATH`` may also name the .bin or .idx file)."""
    return idx_path(strip_suffix(path)).is_file()


class IndexedDataset:
    """A memory-mapped, validated reader of ``PREFIX.bin``/``PREFIX.idx``.

    ``ds[i]`` is sequence ``i`` as a read-only NumPy view (the dtype of the file); ``ds.get(i, offset, length)``
    a part of it; ``ds.document_indices``, ``ds.sequence_lengths`` and ``ds.sequence_pointers`` are the index
    arrays (as in megatron-core's ``IndexedDataset``).
    """

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = strip_suffix(prefix)
        self.idx_file, self.bin_file = idx_path(self.prefix), bin_path(self.prefix)
        for f in (self.idx_file, self.bin_file):
            if not f.is_file():
                raise InputNotFoundError(
                    f"indexed dataset {self.prefix}: {f} not found (expected {self.idx_file.name} and "
                    f"{self.bin_file.name}, as written by Megatron/GPT-NeoX preprocess_data.py; data.path is the "
                    "prefix without .bin/.idx)")
        self._read_index()
        self._check_index()
        self._open_bin()

    # -- reading and checking ---------------------------------------------------------------------------
    def _fail(self, what: str) -> ShardError:
        return ShardError(f"indexed dataset {self.prefix}: {what}")

    def _read_index(self) -> None:
        size = self.idx_file.stat().st_size
        with open(self.idx_file, "rb") as f:
            head = f.read(_HEADER_BYTES)
        if len(head) < _HEADER_BYTES or head[:9] != INDEX_HEADER:
            raise self._fail(f"{self.idx_file} is not a Megatron index (expected the header {INDEX_HEADER!r}, "
                             f"{size} bytes found)")
        version, = struct.unpack("<Q", head[9:17])
        if version != 1:
            raise self._fail(f"{self.idx_file}: index version {version}, only version 1 is known")
        code = head[17]
        if code not in DTYPES:
            raise self._fail(f"{self.idx_file}: unknown dtype code {code} (known: {sorted(DTYPES)})")
        self.dtype = DTYPES[code]
        if self.dtype.kind == "f":
            raise self._fail(f"{self.idx_file}: tokens are stored as {self.dtype.name}; token ids must be integers")
        n, d = struct.unpack("<QQ", head[18:34])
        self.sequence_count, self.document_count = int(n), int(d)
        expected = _HEADER_BYTES + n * 4 + n * 8 + d * 8
        self.multimodal = size == expected + n and n > 0
        if size != expected and not self.multimodal:
            raise self._fail(
                f"{self.idx_file} has {size} bytes, but its header announces {n} sequences and {d} document "
                f"indices ({expected} bytes): the index is truncated or damaged")
        mm = np.memmap(self.idx_file, dtype=np.uint8, mode="r")
        off = _HEADER_BYTES
        self.sequence_lengths = np.frombuffer(mm, dtype="<i4", count=n, offset=off)
        self.sequence_pointers = np.frombuffer(mm, dtype="<i8", count=n, offset=off + 4 * n)
        self.document_indices = np.frombuffer(mm, dtype="<i8", count=d, offset=off + 12 * n)
        self._idx_map = mm

    def _check_index(self) -> None:
        n, item = self.sequence_count, self.dtype.itemsize
        lengths, pointers, docs = self.sequence_lengths, self.sequence_pointers, self.document_indices
        expected_next = 0  # byte offset the next sequence must start at
        for start in range(0, n, _CHUNK):
            ln = lengths[start:start + _CHUNK].astype(np.int64)
            if (ln < 0).any():
                i = start + int(np.argmax(ln < 0))
                raise self._fail(f"{self.idx_file}: sequence {i} has a negative length {int(lengths[i])}")
            ends = expected_next + np.cumsum(ln * item)
            starts = np.concatenate(([expected_next], ends[:-1]))
            bad = pointers[start:start + _CHUNK] != starts
            if bad.any():
                i = start + int(np.argmax(bad))
                raise self._fail(
                    f"{self.idx_file}: sequence {i} starts at byte {int(pointers[i])}, but the lengths before it "
                    f"put it at byte {int(starts[i - start])}; the .idx does not describe a contiguous .bin")
            expected_next = int(ends[-1])
        self.total_tokens = expected_next // item
        if self.document_count < 1 or docs[0] != 0 or docs[-1] != n:
            raise self._fail(
                f"{self.idx_file}: document indices must run from 0 to the number of sequences {n}, got "
                f"{self.document_count} indices" + (f" from {int(docs[0])} to {int(docs[-1])}"
                                                   if self.document_count else ""))
        if self.document_count > 1 and (np.diff(docs) < 0).any():
            raise self._fail(f"{self.idx_file}: document indices are not non-decreasing")

    def _open_bin(self) -> None:
        expected = self.total_tokens * self.dtype.itemsize
        actual = self.bin_file.stat().st_size
        if actual != expected:
            what = ("is truncated" if actual < expected else
                    "is longer than its index describes (a .idx from another .bin?)")
            raise self._fail(
                f"{self.bin_file} {what}: {actual} bytes, but {self.idx_file.name} describes {self.sequence_count} "
                f"sequences of {self.total_tokens} {self.dtype.name} tokens = {expected} bytes")
        self.tokens = (np.memmap(self.bin_file, dtype=self.dtype.newbyteorder("<"), mode="r") if expected
                       else np.zeros(0, dtype=self.dtype))

    # -- access -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.sequence_count

    def __getitem__(self, i: int) -> np.ndarray:
        i = int(i)
        if not 0 <= i < self.sequence_count:
            raise IndexError(f"sequence {i} out of range [0, {self.sequence_count})")
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return self.tokens[start:start + int(self.sequence_lengths[i])]

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        seq = self[i]
        return seq[offset:] if length is None else seq[offset:offset + length]

    @property
    def num_documents(self) -> int:
        return self.document_count - 1

    def fingerprint(self) -> dict[str, Any]:
        """What a loader state records about the data (cheap; the counts and sizes, not a hash)."""
        return {"sequences": self.sequence_count, "documents": self.num_documents, "tokens": self.total_tokens,
                "dtype": self.dtype.name}

    def max_token(self, limit: int | None = _VOCAB_SCAN) -> int:
        """Largest token id among the first ``limit`` tokens (all of them with ``None``)."""
        stop = self.total_tokens if limit is None else min(self.total_tokens, limit)
        best = -1
        for s in range(0, stop, _CHUNK):
            part = self.tokens[s:min(stop, s + _CHUNK)]
            if len(part):
                best = max(best, int(part.max()))
        return best

    def __repr__(self) -> str:
        return (f"IndexedDataset({self.prefix!r}, sequences={self.sequence_count}, documents={self.num_documents}, "
                f"tokens={self.total_tokens}, dtype={self.dtype.name})")


class IndexedLoader(EpochCursor):
    """Batches ``torch.LongTensor [micro_batch_size, seq_len + 1]`` from an indexed dataset (see module doc).

    Args:
        prefix: ``PREFIX`` of ``PREFIX.bin``/``PREFIX.idx``.
        order: ``"sequences"`` (items are ready samples, stored order) or ``"documents"`` (packed + shuffled).
        seq_len, micro_batch_size, rank, world_size, seed, vocab_size, shuffle, infinite, drop_last: as in
            :class:`~adaponder.data.loader.PackedLoader` (``seed`` and ``shuffle`` only matter for ``documents``).
        eod_id: the end-of-document token (``documents`` order).
        append_eod: ``documents`` order: ``True`` puts ``eod_id`` after every document, ``False`` reads the
            documents as stored; ``None`` appends unless every checked document already ends with ``eod_id``.

    ``position`` counts this rank's samples of the current epoch (a state resumes on the same world size).
    """

    def __init__(
        self,
        prefix: str | os.PathLike[str],
        order: str = "sequences",
        seq_len: int = 2048,
        micro_batch_size: int = 8,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        vocab_size: int | None = None,
        eod_id: int = 0,
        *,
        append_eod: bool | None = None,
        shuffle: bool = True,
        infinite: bool = True,
        drop_last: bool = False,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        # only the documents order is shuffled
        self._take_settings(seq_len, micro_batch_size, rank, world_size, seed, shuffle and order == "documents",
                            infinite, drop_last)
        self.ds = IndexedDataset(prefix)
        self.prefix, self.order = self.ds.prefix, order
        self.vocab_size, self.eod_id = vocab_size, int(eod_id)
        self._check_vocab()
        if order == "sequences":
            self.append_eod = False
            self._check_lengths()
            self.num_samples = len(self.ds)
        else:
            self._build_stream(append_eod)
            self.num_samples = (self.stream_tokens - 1) // seq_len if self.stream_tokens > seq_len else 0
        what = "items" if order == "sequences" else f"windows of {seq_len + 1} tokens"
        self._check_sample_count(self.num_samples, world_size, f"indexed dataset {self.prefix} ({order} order)", what)
        self.samples_per_rank = self.num_samples // world_size
        self.samples_per_epoch = self.samples_per_rank * world_size
        self._epoch, self._position = 0, 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    # -- checks ---------------------------------------------------------------------------------------
    def _check_vocab(self) -> None:
        if self.ds.total_tokens and self.ds.dtype.kind == "i":
            low = min(int(self.ds.tokens[s:s + _CHUNK].min())
                      for s in range(0, min(self.ds.total_tokens, _VOCAB_SCAN), _CHUNK))
            if low < 0:
                raise VocabRangeError(f"indexed dataset {self.prefix}: negative token id {low} in {self.ds.bin_file} "
                                      f"({self.ds.dtype.name}); the file is not token ids")
        if self.vocab_size is None:
            return
        if self.ds.dtype.kind == "u" and np.iinfo(self.ds.dtype).max < self.vocab_size:
            return  # every storable id fits
        top = self.ds.max_token()
        if top >= self.vocab_size:
            raise VocabRangeError(
                f"indexed dataset {self.prefix}: token ids go up to {top}, beyond the model's vocabulary of "
                f"{self.vocab_size} ids (0..{self.vocab_size - 1}); use a model with vocab_size >= {top + 1} or "
                "the tokenizer the data was made with (Pythia / GPT-NeoX-20B: vocab_size 50304)")

    def _check_lengths(self) -> None:
        want = self.seq_len + 1
        lengths = self.ds.sequence_lengths
        for s in range(0, len(lengths), _CHUNK):
            bad = lengths[s:s + _CHUNK] != want
            if bad.any():
                i = s + int(np.argmax(bad))
                raise DataError(
                    f"indexed dataset {self.prefix}: item {i} has {int(lengths[i])} tokens, but data.order "
                    f"'sequences' reads every item as one training sample of data.seq_len + 1 = {want} tokens "
                    "(Pythia's pre-shuffled Pile: 2049 tokens, seq_len 2048); set data.seq_len to the items' length "
                    "minus one, or use data.order: documents to pack documents into windows")

    def _build_stream(self, append_eod: bool | None) -> None:
        ds = self.ds
        docs = np.asarray(ds.document_indices, dtype=np.int64)
        starts = np.empty(len(docs), dtype=np.int64)
        for s in range(0, len(docs), _CHUNK):  # token offset of each boundary
            part = docs[s:s + _CHUNK]
            inside = part < ds.sequence_count
            starts[s:s + _CHUNK][inside] = ds.sequence_pointers[part[inside]] // ds.dtype.itemsize
            starts[s:s + _CHUNK][~inside] = ds.total_tokens
        lengths = np.diff(starts)
        keep = lengths > 0  # empty documents are skipped
        self._doc_start = starts[:-1][keep]  # token offset of each (non-empty) document in .bin
        self._doc_len = lengths[keep]
        n_docs = len(self._doc_start)
        if append_eod is None:
            # Documents made with --append-eod end with EOD already; check up to 4096 of them, spread evenly.
            probe = np.unique(np.linspace(0, n_docs - 1, num=min(n_docs, 4096)).astype(np.int64)) if n_docs else []
            last = [int(ds.tokens[self._doc_start[k] + self._doc_len[k] - 1]) for k in probe]
            append_eod = not (last and all(t == self.eod_id for t in last))
        self.append_eod = bool(append_eod)
        extra = 1 if self.append_eod else 0
        lens = self._doc_len + extra
        self._stream_start = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(lens, out=self._stream_start[1:])
        self.stream_tokens = int(self._stream_start[-1])
        self.documents = n_docs

    # -- order and reading ----------------------------------------------------------------------------
    def _sequence_indices(self, epoch: int) -> np.ndarray:
        """``sequences`` order: this rank's items in one epoch (Megatron's grouping; module doc)."""
        m, w, r = self.micro_batch_size, self.world_size, self.rank
        group = m * w
        full = self.samples_per_epoch // group
        head = (np.arange(full, dtype=np.int64)[:, None] * group + r * m + np.arange(m, dtype=np.int64)).ravel()
        tail_each = (self.samples_per_epoch - full * group) // w
        tail = full * group + r * tail_each + np.arange(tail_each, dtype=np.int64)
        return np.concatenate([head, tail])

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for ``epoch``, in the order they are read."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.order == "sequences":
            mine = self._sequence_indices(epoch)
        else:
            mine = self._epoch_order(epoch)[: self.samples_per_epoch][self.rank :: self.world_size].copy()
        self._order_cache = (epoch, mine)
        return mine

    def _window(self, start: int, length: int) -> np.ndarray:
        """``length`` tokens of the document stream (documents + EOD) from stream position ``start``."""
        out = np.empty(length, dtype=np.int64)
        k = int(np.searchsorted(self._stream_start, start, side="right")) - 1
        pos, filled = start, 0
        while filled < length:
            doc_pos = pos - int(self._stream_start[k])
            dlen = int(self._doc_len[k])
            if doc_pos < dlen:
                take = min(length - filled, dlen - doc_pos)
                a = int(self._doc_start[k]) + doc_pos
                out[filled:filled + take] = self.ds.tokens[a:a + take]
            else:  # the appended EOD
                take = 1
                out[filled] = self.eod_id
            filled += take
            pos += take
            if pos >= int(self._stream_start[k + 1]):
                k += 1
        return out

    def sample(self, index: int) -> torch.Tensor:
        """Sample ``index`` (``seq_len + 1`` tokens) as a LongTensor."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range [0, {self.num_samples})")
        return torch.from_numpy(self._sample_np(int(index)))

    def _sample_np(self, index: int) -> np.ndarray:
        if self.order == "sequences":
            return self.ds[index].astype(np.int64)
        return self._window(index * self.seq_len, self.seq_len + 1)

    def _gather(self, indices: np.ndarray) -> torch.Tensor:
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self._sample_np(int(i))
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            row = int(np.argmax(out.max(axis=1) >= self.vocab_size))  # the first offending sample
            raise VocabRangeError(
                f"indexed dataset {self.prefix}: sample {int(indices[row])} ({self.order} order) holds token id "
                f"{int(out[row].max())}, beyond the model's vocabulary of {self.vocab_size} ids")
        return torch.from_numpy(out)

    def _take(self, n: int) -> np.ndarray:
        parts, got = [], 0
        while got < n and self._position < self.samples_per_rank:
            order = self.epoch_indices(self._epoch)
            k = min(n - got, self.samples_per_rank - self._position)
            parts.append(order[self._position : self._position + k])
            self._position += k
            got += k
            if self.infinite and self._position == self.samples_per_rank:
                self._epoch, self._position = self._epoch + 1, 0
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            indices = self._take(self.micro_batch_size)
            if len(indices) == 0 or (self.drop_last and len(indices) < self.micro_batch_size):
                self._epoch, self._position = self._epoch + 1, 0
                return
            yield self._gather(indices)

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.samples_per_rank, self.micro_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self._cursor_state(STATE_FORMAT), "order": self.order,
                # the sequences order deals items in groups of micro_batch_size × world_size
                "micro_batch_size": self.micro_batch_size if self.order == "sequences" else None,
                "append_eod": self.append_eod, "dataset": self.ds.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise StateError(f"loader state has format {state.get('format')!r}, expected {STATE_FORMAT!r} "
                             "(a state of another data source?)")
        self._restore(state, _STATE_KEYS, str(self.prefix), self.samples_per_rank)

    def __repr__(self) -> str:
        return (f"IndexedLoader({self.prefix!r}, order={self.order!r}, seq_len={self.seq_len}, "
                f"micro_batch_size={self.micro_batch_size}, rank={self.rank}/{self.world_size}, seed={self.seed}, "
                f"samples_per_epoch={self.samples_per_epoch}, epoch={self._epoch}, position={self._position})")


def iter_indexed_eval_batches(prefix, order: str, seq_len: int, micro_batch_size: int, rank: int = 0,
                              world_size: int = 1, vocab_size: int | None = None, eod_id: int = 0,
                              append_eod: bool | None = None, max_batches: int | None = None) -> Iterator[torch.Tensor]:
    """One deterministic, unshuffled pass (this rank's part), optionally capped at ``max_batches``."""
    loader = IndexedLoader(prefix, order, seq_len, micro_batch_size, rank, world_size, vocab_size=vocab_size,
                           eod_id=eod_id, append_eod=append_eod, shuffle=False, infinite=False)
    return first_batches(loader, max_batches)

def write_indexed(prefix: str | os.PathLike[str], documents, dtype=np.uint16) -> Path:
    """Write ``documents`` (each a sequence of token ids, or a list of such sequences = one document of several
    items) as ``PREFIX.bin``/``PREFIX.idx`` in the Megatron format, with NumPy only. For small data and tests;
    megatron-core's ``IndexedDatasetBuilder`` writes the same bytes."""
    dtype = np.dtype(dtype)
    code = {v: k for k, v in DTYPES.items()}[dtype]
    lengths: list[int] = []
    doc_idx = [0]
    with open(bin_path(prefix), "wb") as f:
        for doc in documents:
            items = doc if doc and isinstance(doc[0], (list, tuple, np.ndarray)) else [doc]
            for item in items:
                arr = np.asarray(item, dtype=dtype)
                f.write(arr.astype(dtype.newbyteorder("<")).tobytes())
                lengths.append(len(arr))
            doc_idx.append(len(lengths))
    ln = np.asarray(lengths, dtype="<i4")
    ptr = np.zeros(len(ln), dtype="<i8")
    if len(ln) > 1:
        np.cumsum(ln[:-1].astype(np.int64) * dtype.itemsize, out=ptr[1:])
    with open(idx_path(prefix), "wb") as f:
        f.write(INDEX_HEADER + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<QQ", len(ln), len(doc_idx)))
        f.write(ln.tobytes() + ptr.tobytes() + np.asarray(doc_idx, dtype="<i8").tobytes())
    return Path(os.fspath(prefix))


__all__ = ["IndexedDataset", "IndexedLoader", "iter_indexed_eval_batches", "write_indexed", "is_indexed_prefix",
           "strip_suffix", "idx_path", "bin_path", "ORDERS", "DTYPES", "STATE_FORMAT"]
