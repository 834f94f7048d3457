"""The loader protocol (:class:`TokenLoader`) and what the two loaders that follow it
(:class:`~.loader.PackedLoader`, :class:`~.indexed.IndexedLoader`) share: the settings and sizes they refuse, where
the next sample is (epoch, position), their length, and restoring a saved state after checking it against their
own settings. Each loader says what its position counts (all ranks' samples, or this rank's) and how far an epoch
goes (``end``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .errors import CorpusTooSmallError, StateError


@runtime_checkable
class TokenLoader(Protocol):
    """Rank-sharded batches ``LongTensor [micro_batch_size, seq_len + 1]`` (inputs ``x[:, :-1]``, labels
    ``x[:, 1:]``), exactly resumable: ``state_dict()`` after any number of batches, loaded into a fresh loader over
    the same data and settings, continues with the next sample."""

    seq_len: int
    micro_batch_size: int
    num_samples: int

    def __iter__(self) -> Iterator[torch.Tensor]: ...

    def sample(self, index: int) -> torch.Tensor: ...

    @property
    def batches_per_epoch(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def first_batches(loader: Iterable[torch.Tensor], max_batches: int | None) -> Iterator[torch.Tensor]:
    """``loader``'s batches, at most ``max_batches`` of them (``None``: all)."""
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            return
        yield batch


class EpochCursor:
    """Mixin: the loader keeps its settings with :meth:`_take_settings`; ``self._epoch``, ``self._position``,
    ``num_samples``, ``batches_per_epoch`` and ``state_dict()`` are its own."""

    _epoch: int
    _position: int
    infinite: bool
    seed: int
    seq_len: int
    micro_batch_size: int
    rank: int
    world_size: int
    shuffle: bool
    drop_last: bool
    num_samples: int

    def __len__(self) -> int:
        """Batches in one pass (finite loaders only)."""
        if self.infinite:
            raise TypeError(f"an infinite {type(self).__name__} has no length; see samples_per_epoch / "
                            "batches_per_epoch")
        return self.batches_per_epoch

    @staticmethod
    def _check_settings(seq_len: int, micro_batch_size: int, rank: int, world_size: int, seed: int) -> None:
        """The settings every loader refuses: ``ValueError`` naming the bad value."""
        if seq_len < 1 or micro_batch_size < 1:
            raise ValueError(f"seq_len and micro_batch_size must be >= 1, got {seq_len}, {micro_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")

    def _take_settings(self, seq_len: int, micro_batch_size: int, rank: int, world_size: int, seed: int,
                       shuffle: bool, infinite: bool, drop_last: bool) -> None:
        """Check (:meth:`_check_settings`) and keep the settings every loader takes."""
        self._check_settings(seq_len, micro_batch_size, rank, world_size, seed)
        self.seq_len, self.micro_batch_size = seq_len, micro_batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.infinite, self.drop_last = shuffle, infinite, drop_last

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """``0..num_samples-1`` in the order of ``epoch``: a permutation that depends only on ``(seed, epoch)``
        when shuffling, else the stored order."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        # int32 halves the memory of the permutation for corpora under 2^31 samples.
        dtype = np.int32 if self.num_samples < 2**31 else np.int64
        order = np.arange(self.num_samples, dtype=dtype)
        np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    @staticmethod
    def _check_sample_count(num_samples: int, world_size: int, source: str, what: str, holds: str = "") -> None:
        """:class:`CorpusTooSmallError` naming ``source`` when it holds no sample (``what``: its samples; ``holds``:
        what it has instead, for the message), or too few to give every rank one."""
        if num_samples < 1:
            raise CorpusTooSmallError(f"{source} holds no {what}{holds}; use a smaller seq_len or more data")
        if num_samples < world_size:
            raise CorpusTooSmallError(f"{source} holds {num_samples} {what}, too few to give each of {world_size} "
                                      "ranks one")

    def _cursor_state(self, fmt: str) -> dict[str, Any]:
        """The state keys every loader writes: its format, where it stands and the settings its order depends on."""
        return {"format": fmt, "epoch": self._epoch, "position": self._position, "seed": self.seed,
                "seq_len": self.seq_len, "world_size": self.world_size, "shuffle": self.shuffle,
                "num_samples": self.num_samples}

    @property
    def epoch(self) -> int:
        """Epoch of the next sample to be read."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch already read (what they count: the loader's docstring)."""
        return self._position

    def _restore(self, state: dict[str, Any], keys: tuple[str, ...], source: str, end: int,
                 position: int | None = None) -> None:
        """Check ``state``'s ``keys`` against this loader's own state (:class:`StateError` naming the first that
        differs and ``source``, the data), then stand at its epoch and ``position`` (default: the state's), which
        must lie in ``0..end``; an infinite loader at ``end`` moves on to the next epoch."""
        mine = self.state_dict()
        for key in keys:
            if state.get(key) != mine[key]:
                raise StateError(
                    f"loader state does not fit the loader over {source}: {key} is {state.get(key)!r} in the state "
                    f"but {mine[key]!r} here; exact resumption needs the same data and settings")
        epoch = int(state["epoch"])
        position = int(state["position"]) if position is None else position
        if epoch < 0 or not 0 <= position <= end:
            raise StateError(f"loader state position {position} of epoch {epoch} is out of range (0..{end})")
        if self.infinite and position == end:
            epoch, position = epoch + 1, 0
        self._epoch, self._position = epoch, position


__all__ = ["EpochCursor", "TokenLoader", "first_batches"]
