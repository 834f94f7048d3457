"""Packed, deterministically shuffled, rank-sharded, exactly resumable batches over prepared token shards.

Packing (Megatron / GPT-NeoX / Pythia style): a split's token stream — documents each followed by EOD — is
cut into windows of ``seq_len + 1`` tokens starting every ``seq_len`` tokens, so *consecutive windows share
their boundary token*: sample ``i`` is ``tokens[i*seq_len : (i+1)*seq_len + 1]``. Every token after the first
is a label exactly once per epoch and nothing is padded; windows cross document boundaries (the EOD token
marks them). ``num_samples = (n_tokens - 1) // seq_len``; the few tokens after the last full window are unused.
Windows are fixed; epochs differ only in their order.

Sharding across data-parallel ranks: each epoch ``e`` the ``num_samples`` window indices are permuted with a
generator seeded by ``(seed, e)``; the tail of the permutation is dropped so every rank gets the same number
of samples (at most ``world_size - 1`` samples per epoch are skipped, a different few each epoch), and rank
``r`` takes positions ``r::world_size``. The ranks' parts are disjoint and together cover every kept sample.

Batches are consecutive groups of ``micro_batch_size`` samples of this rank's sample stream; with
``infinite=True`` (training) the stream runs over epoch after epoch and a batch may straddle two epochs, so no
sample is dropped at epoch ends. The position in that stream is the whole state: ``state_dict()`` after ``N``
batches, loaded into a fresh loader, continues with exactly batch ``N + 1``. Ranks advance in lockstep, so the
state is identical on every rank and rank 0's state can be loaded everywhere.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import CorpusTooSmallError, StateError, TokenizerMismatchError, VocabRangeError
from .layout import open_shards, read_meta, split_info

STATE_FORMAT = "adaponder.PackedLoader/v1"
# Keys that must match for a state to be resumable exactly.
_STATE_KEYS = ("seed", "seq_len", "world_size", "split", "shuffle", "num_samples", "tokenizer_fingerprint")


class PackedLoader:
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
        if seq_len < 1 or micro_batch_size < 1:
            raise ValueError(f"seq_len and micro_batch_size must be >= 1, got {seq_len}, {micro_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.data_dir = Path(data_dir)
        self.split, self.seq_len, self.micro_batch_size = split, seq_len, micro_batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.infinite, self.drop_last = shuffle, infinite, drop_last

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
        if self.num_samples < 1:
            raise CorpusTooSmallError(
                f"{self.data_dir} split {split!r} has {self.tokens} tokens ({info['documents']} documents), "
                f"fewer than one sample of seq_len + 1 = {seq_len + 1} tokens; use a smaller seq_len or more data"
            )
        self.samples_per_rank = self.num_samples // world_size
        if self.samples_per_rank < 1:
            raise CorpusTooSmallError(
                f"{self.data_dir} split {split!r} has {self.num_samples} samples of {seq_len + 1} tokens, "
                f"too few to give each of {world_size} ranks one"
            )
        #: Samples read per epoch by all ranks together (``num_samples`` minus the dropped tail).
        self.samples_per_epoch = self.samples_per_rank * world_size
        self._epoch = 0
        self._position = 0  # samples of the current epoch already consumed by this rank
        self._order_cache: tuple[int, np.ndarray] | None = None

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
        """This rank's window indices for ``epoch``, in the order they are read."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            # int32 halves the memory of the permutation for corpora under 2^31 windows.
            dtype = np.int32 if self.num_samples < 2**31 else np.int64
            order = np.arange(self.num_samples, dtype=dtype)
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        else:
            order = np.arange(self.num_samples, dtype=np.int64)
        mine = order[: self.samples_per_epoch][self.rank :: self.world_size].copy()
        self._order_cache = (epoch, mine)
        return mine

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
        return torch.from_numpy(self._read(index * self.seq_len, self.seq_len + 1).astype(np.int64))

    def _gather(self, indices: np.ndarray) -> torch.Tensor:
        width = self.seq_len + 1
        out = np.empty((len(indices), width), dtype=np.int64)
        for row, i in enumerate(indices):
            out[row] = self._read(int(i) * self.seq_len, width)
        return torch.from_numpy(out)

    def _take(self, n: int) -> np.ndarray:
        """Consume up to ``n`` sample indices of this rank's stream, crossing epochs when infinite."""
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
                # Only reachable when finite: the pass is over; the next iter() reads the next epoch.
                self._epoch, self._position = self._epoch + 1, 0
                return
            yield self._gather(indices)

    def __len__(self) -> int:
        """Batches in one pass (finite loaders only)."""
        if self.infinite:
            raise TypeError("an infinite PackedLoader has no length; see samples_per_epoch / batches_per_epoch")
        return self.batches_per_epoch

    @property
    def batches_per_epoch(self) -> int:
        """Batches per epoch on this rank (a last partial batch counts unless drop_last)."""
        full, rest = divmod(self.samples_per_rank, self.micro_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def epoch(self) -> int:
        """Epoch of the next sample to be read."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch this rank has already read."""
        return self._position

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (plain ints/strings; safe for torch.save and JSON)."""
        return {
            "format": STATE_FORMAT,
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "world_size": self.world_size,
            "split": self.split,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
            "tokenizer_fingerprint": self.meta["tokenizer_fingerprint"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the exact next sample of ``state``; :class:`StateError` if it belongs to another setup."""
        if state.get("format") != STATE_FORMAT:
            raise StateError(f"loader state has format {state.get('format')!r}, expected {STATE_FORMAT!r}")
        mine = self.state_dict()
        for key in _STATE_KEYS:
            if state.get(key) != mine[key]:
                raise StateError(
                    f"loader state does not fit the loader over {self.data_dir}: {key} is {state.get(key)!r} in "
                    f"the state but {mine[key]!r} here; exact resumption needs the same data and settings"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.samples_per_rank:
            raise StateError(f"loader state position {position} of epoch {epoch} is out of range "
                             f"(samples per rank: {self.samples_per_rank})")
        if self.infinite and position == self.samples_per_rank:
            epoch, position = epoch + 1, 0
        self._epoch, self._position = epoch, position

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
    """One deterministic, unshuffled pass over ``split`` (this rank's part), optionally capped at
    ``max_batches``; the last batch may be smaller than ``micro_batch_size``."""
    loader = PackedLoader(
        data_dir,
        split=split,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        rank=rank,
        world_size=world_size,
        tokenizer_fingerprint=tokenizer_fingerprint,
        vocab_size=vocab_size,
        shuffle=False,
        infinite=False,
    )
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            return
        yield batch


__all__ = ["PackedLoader", "iter_eval_batches", "STATE_FORMAT"]
