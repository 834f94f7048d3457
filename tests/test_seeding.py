"""adaponder.seeding.seed_everything: one seed for Python's random, numpy's global generator and torch."""

import random

import numpy as np
import torch

from adaponder.seeding import seed_everything


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_seeds_every_generator():
    seed_everything(123)
    first = _draws()
    seed_everything(123)
    assert _draws() == first
    seed_everything(124)
    assert all(a != b for a, b in zip(_draws(), first))
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    assert _draws() == first  # the same streams as seeding each generator directly


def test_seeds_beyond_numpys_range_wrap():
    seed_everything(2**32 + 5)
    wrapped = float(np.random.rand())
    np.random.seed(5)
    assert float(np.random.rand()) == wrapped
