"""One seed for every random number generator a run draws from (pretraining and fine-tuning alike)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator (``seed mod 2**32``, its range) and torch (CPU and
    every accelerator)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


__all__ = ["seed_everything"]
