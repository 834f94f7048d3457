"""Packed, deterministically shuffled, rank-sharded, exactly resumable batches over prepared token shards.

Packing (Megatron / GPT-NeoX / Pythia style): a split's token stream — documents each followed by EOD — is
cut into windows of ``seq_len + 1`` tokens starting every ``seq_len`` tokens, so *consecutive windows share
their boundary token*: sample ``i`` is ``tokens[i*seq_len : (i+1)*seq_len + 1]``. Every token after the first
is a label exactly once per epoch and nothing is padded; windows cross document boundaries (the EOD token
marks them). ``num_samples = (n_tokens - 1) // seq_len``; the few tokens after the last full window are unused.
Windows are fixed; epochs differ only in their order.

Sharding across data-parallel ranks: the ranks read one *global* sample stream — epoch 0's order, then
epoch 1's, ... — where epoch ``e`` is a permutation of all ``num_samples`` windows by a generator seeded by
``(seed, e)`` (nothing is dropped). The stream is cut into micro-batches of ``micro_batch_size`` consecutive
samples, dealt out in rounds: in each round of ``world_size`` micro-batches rank ``r`` takes the ``r``-th. The
ranks' parts are disjoint, and an optimizer step of ``grad_accum`` rounds reads the same micro-batches (same
samples, same grouping) whatever ``world_size`` is, as long as the global batch and ``micro_batch_size`` are
unchanged: 1 rank × 2 accumulation steps and 2 ranks × 1 read the same two micro-batches.

With ``infinite=True`` (training) the stream runs over epoch after epoch and a micro-batch may straddle two
epochs. The state is the position in the global stream (epoch, samples of it read by all ranks together):
identical on every rank and independent of ``world_size`` and ``micro_batch_size``, so ``state_dict()`` after
``N`` rounds, loaded into a fresh loader of any world size, continues with exactly the next global samples.
With ``infinite=False`` (evaluation) each ``iter()`` is one pass over the rest of the current epoch: the rounds
stop at the epoch's end, so the last micro-batches may be short, and some ranks may get one fewer.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cursor import EpochCursor, first_batches
from .errors import ShardError, StateError, TokenizerMismatchError, VocabRangeError
from .layout import open_shards, read_meta, split_info

STATE_FORMAT = "adaponder.PackedLoader/v2"
_STATE_V1 = "adaponder.PackedLoader/v1"  # position per rank, read with the same world_size only
# Keys that must match for a state to be resumable exactly (world_size and micro_batch_size may change).
_STATE_KEYS = ("seed", "seq_len", "split", "shuffle", "num_samples", "tokenizer_fingerprint")


class PackedLoader(EpochCursor):
    """Iterate ``torch.LongTensor`` batches of shape ``[micro_batch_size, seq_len + 1]``.

    Use ``x[:, :-1]`` as inputs and ``x[:, 1:]`` as labels.

    Args:
        data_dir: a folder written by ``adaponder-prepare``.
        split: ``"train"`` or ``"val"``.
        seq_len: tokens the model sees per sample (each sample holds ``seq_len + 1``).
        micro_batch_size: samples per batch on this rank.
        rank, world_size: data-parallel position; every rank must use the same seed and sizes.
        seed: shuffling seed; the order of epoch ``e`` depends only on ``(seed, e)``.
        tokenizer_fingerprint: if given (a string, or anything with ``.fingerprint``), must equal the
            fingerprint recorded at preparation, else :class:`TokenizerMismatchError` naming both.
        vocab_size: if given, :class:`VocabRangeError` when the data holds an id ``>= vocab_size``.
        shuffle: ``False`` reads windows in stream order (evaluation).
        infinite: ``True`` runs over epochs without end; ``False`` makes each ``iter()`` one pass over the
            rest of the current epoch (then the loader moves on to the next epoch).
        drop_last: with ``infinite=False``, drop a last batch smaller than ``micro_batch_size``.
        verify_checksums: re-hash every shard against meta.json and scan the real maximum token id (slow).

    ``position`` counts the samples of the current epoch read by all ranks together (a state resumes on any world
    size and micro-batch size).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        seq_len: int = 2048,
        micro_batch_size: int = 8,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        tokenizer_fingerprint: str | Any | None = None,
        vocab_size: int | None = None,
        *,
        shuffle: bool = True,
        infinite: bool = True,
        drop_last: bool = False,
        verify_checksums: bool = False,
    ) -> None:
        self._take_settings(seq_len, micro_batch_size, rank, world_size, seed, shuffle, infinite, drop_last)
        self.data_dir = Path(data_dir)
        self.split = split

        self.meta = read_meta(self.data_dir)
        self._check_tokenizer(tokenizer_fingerprint)
        info = split_info(self.meta, split, self.data_dir)
        self._shards = open_shards(self.data_dir, self.meta, split, verify_checksums)
        self._bounds = [0]
        for m in self._shards:
            self._bounds.append(self._bounds[-1] + len(m))
        self.tokens = self._bounds[-1]
        self._check_vocab(vocab_size, verify_checksums)

        self.num_samples = (self.tokens - 1) // seq_len if self.tokens > seq_len else 0
        self._check_sample_count(self.num_samples, world_size, f"{self.data_dir} split {split!r}",
                                 f"samples of seq_len + 1 = {seq_len + 1} tokens",
                                 f" (it has {self.tokens} tokens in {info['documents']} documents)")
        #: Samples read per epoch by all ranks together (every window; nothing is dropped).
        self.samples_per_epoch = self.num_samples
        self._epoch = 0
        self._position = 0  # samples of the current epoch already read by all ranks together
        self._orders: dict[int, np.ndarray] = {}  # the epoch orders in use (at most two: a batch may straddle)

    # -- checks ---------------------------------------------------------------------------------------
    def _check_tokenizer(self, expected: str | Any | None) -> None:
        if expected is None:
            return
        expected = getattr(expected, "fingerprint", expected)
        recorded = self.meta["tokenizer_fingerprint"]
        if expected != recorded:
            raise TokenizerMismatchError(
                f"{self.data_dir} was prepared with tokenizer {self.meta['tokenizer']['name']!r} "
                f"(fingerprint {recorded}), but the tokenizer in use has fingerprint {expected}; "
                "re-run adaponder-prepare with this tokenizer, or use the one the data was prepared with"
            )

    def _check_vocab(self, vocab_size: int | None, scan: bool) -> None:
        if vocab_size is None:
            return
        max_id = int(self.meta["max_token_id"])
        if scan:
            max_id = max([max_id, *(int(m.max()) for m in self._shards if len(m))])
        if max_id >= vocab_size:
            raise VocabRangeError(
                f"{self.data_dir}: token ids go up to {max_id}, beyond the model's vocabulary of {vocab_size} ids "
                f"(0..{vocab_size - 1}); the data was tokenized with {self.meta['tokenizer']['name']!r} "
                f"(vocab_size {self.meta['vocab_size']}): use a model with vocab_size >= {max_id + 1}"
            )

    # -- order and reading ----------------------------------------------------------------------------
    def epoch_indices(self, epoch: int) -> np.ndarray:
        """All window indices of ``epoch`` in global stream order (the same on every rank)."""
        if epoch not in self._orders:
            order = self._epoch_order(epoch)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]

    def _read(self, start: int, length: int) -> np.ndarray:
        s = bisect.bisect_right(self._bounds, start) - 1
        local = start - self._bounds[s]
        if start + length <= self._bounds[s + 1]:
            return self._shards[s][local : local + length]
        parts, need = [], length
        while need:  # the window spans a shard boundary
            piece = self._shards[s][local : local + need]
            parts.append(piece)
            need -= len(piece)
            s, local = s + 1, 0
        return np.concatenate(parts)

    def sample(self, index: int) -> torch.Tensor:
        """Window ``index`` (``seq_len + 1`` tokens) as a LongTensor."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range [0, {self.num_samples})")
        window = self._read(index * self.seq_len, self.seq_len + 1).astype(np.int64)
        self._check_ids(window[None], np.array([index]))
        return torch.from_numpy(window)

    def _gather(self, indices: np.ndarray) -> torch.Tensor:
        width = self.seq_len + 1
        out = np.empty((len(indices), width), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self._read(int(i) * self.seq_len, width)
        self._check_ids(out, indices)
        return torch.from_numpy(out)

    def _check_ids(self, batch: np.ndarray, indices: np.ndarray) -> None:
        """:class:`ShardError` naming the shard file and offset when a served window holds an id above the largest
        one recorded at preparation: the shard's bytes changed after it was written. Opening checks each shard's
        size, ``verify_checksums`` its hash; this per-batch maximum catches damaged content that would otherwise
        reach the model as ids outside its vocabulary (every id up to the recorded maximum fits the model)."""
        limit = int(self.meta["max_token_id"])
        if not batch.size or int(batch.max()) <= limit:
            return
        row, col = (int(v) for v in np.argwhere(batch > limit)[0])
        start = int(indices[row]) * self.seq_len + col
        s = bisect.bisect_right(self._bounds, start) - 1
        shard = self.data_dir / split_info(self.meta, self.split, self.data_dir)["shards"][s]["file"]
        offset = start - self._bounds[s]
        raise ShardError(
            f"shard {shard} is damaged: token {offset} (byte {offset * self._shards[s].dtype.itemsize}) is "
            f"{int(batch[row, col])}, above the largest id recorded at preparation ({limit}); its size is right but "
            "its content changed: re-run adaponder-prepare or restore the shard"
        )

    def _stream(self, start: int, stop: int) -> np.ndarray:
        """Global stream samples ``start .. stop-1``, counted from the start of the current epoch."""
        n, parts = self.num_samples, []
        while start < stop:
            epoch, offset = self._epoch + start // n, start % n
            k = min(stop - start, n - offset)
            parts.append(self.epoch_indices(epoch)[offset : offset + k])
            start += k
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def __iter__(self) -> Iterator[torch.Tensor]:
        m, n, w = self.micro_batch_size, self.num_samples, self.world_size
        while self.infinite:  # one round: this rank's micro-batch; every rank advances the same
            start = self._position + self.rank * m
            indices = self._stream(start, start + m)
            self._epoch, self._position = divmod(self._epoch * n + self._position + w * m, n)
            self._orders = {e: o for e, o in self._orders.items() if e >= self._epoch}
            yield self._gather(indices)
        # finite: rounds up to the end of the current epoch, then the next iter() reads the next epoch
        while self._position < n:
            start = min(self._position + self.rank * m, n)
            indices = self._stream(start, min(start + m, n))
            self._position = min(self._position + w * m, n)
            if len(indices) == 0 or (self.drop_last and len(indices) < m):
                break
            yield self._gather(indices)
        self._epoch, self._position = self._epoch + 1, 0

    @property
    def batches_per_epoch(self) -> int:
        """This rank's batches in one whole epoch, finite (a last partial batch counts unless drop_last)."""
        full, rest = divmod(self.num_samples, self.micro_batch_size)
        return len(range(self.rank, full + (1 if rest and not self.drop_last else 0), self.world_size))

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (plain ints/strings; safe for torch.save and JSON)."""
        return {**self._cursor_state(STATE_FORMAT), "split": self.split,
                "tokenizer_fingerprint": self.meta["tokenizer_fingerprint"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the exact next sample of ``state`` (written with any world size and micro-batch size);
        :class:`StateError` if it belongs to another setup."""
        fmt = state.get("format")
        if fmt not in (STATE_FORMAT, _STATE_V1):
            raise StateError(f"loader state has format {fmt!r}, expected {STATE_FORMAT!r}")
        keys = _STATE_KEYS + (("world_size",) if fmt == _STATE_V1 else ())
        end, position = self.num_samples, None  # the samples of an epoch that are read
        if fmt == _STATE_V1:  # v1 counted per rank; its ranks read num_samples // world_size each per epoch
            end = self.num_samples // self.world_size * self.world_size
            position = int(state["position"]) * self.world_size
        self._restore(state, keys, str(self.data_dir), end, position)

    def __repr__(self) -> str:
        return (
            f"PackedLoader({str(self.data_dir)!r}, split={self.split!r}, seq_len={self.seq_len}, "
            f"micro_batch_size={self.micro_batch_size}, rank={self.rank}/{self.world_size}, seed={self.seed}, "
            f"samples_per_epoch={self.samples_per_epoch}, epoch={self._epoch}, position={self._position})"
        )


def iter_eval_batches(
    data_dir: str | os.PathLike[str],
    seq_len: int,
    micro_batch_size: int,
    split: str = "val",
    rank: int = 0,
    world_size: int = 1,
    tokenizer_fingerprint: str | Any | None = None,
    vocab_size: int | None = None,
    max_batches: int | None = None,
) -> Iterator[torch.Tensor]:
    """One deterministic, unshuffled pass over ``split`` (this rank's part: every ``world_size``-th
    micro-batch), optionally capped at ``max_batches`` of this rank; the last batch may be smaller than
    ``micro_batch_size``."""
    loader = PackedLoader(data_dir, split=split, seq_len=seq_len, micro_batch_size=micro_batch_size, rank=rank,
                          world_size=world_size, tokenizer_fingerprint=tokenizer_fingerprint, vocab_size=vocab_size,
                          shuffle=False, infinite=False)
    return first_batches(loader, max_batches)

__all__ = ["PackedLoader", "iter_eval_batches", "STATE_FORMAT"]
