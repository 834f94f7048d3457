"""Counting exit passes: how many tokens left after each pass 1..K (D_t of A8).

The one exit-pass histogram of the package: training statistics, validation, evaluation and lm-eval accounting
all count with it.
"""

from __future__ import annotations

import numpy as np
import torch


def exit_counts(exit_pass: torch.Tensor, K: int) -> torch.Tensor:
    """Token counts per exit pass 1..K: an int64 tensor ``[K]`` on ``exit_pass``'s device (no host sync).

    ``exit_pass``: an integer tensor of any shape with values in 1..K (unchecked; see :func:`exit_histogram`)."""
    return torch.bincount(exit_pass.reshape(-1).long() - 1, minlength=K)[:K]


def exit_histogram(exit_pass, K: int) -> list[int]:
    """Token counts per exit pass 1..K (``exit_pass``: any array-like of ints in 1..K, checked)."""
    arr = np.asarray(exit_pass, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 1 or arr.max() > K):
        raise ValueError(f"exit passes must lie in 1..{K}; got {arr.min()}..{arr.max()}")
    return exit_counts(torch.from_numpy(arr), K).tolist()


__all__ = ["exit_counts", "exit_histogram"]
