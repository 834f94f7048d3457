"""Transparent huge pages for PyTorch's CPU allocator, for the entry points that decode or score on the CPU.

A decode step streams every weight once (hundreds of MB at the 70M shape) and reads a K/V cache of similar size;
with 4 KiB pages that is tens of thousands of TLB misses per step. PyTorch (≥ 2.2) backs allocations of 2 MiB
and more with huge pages when ``THP_MEM_ALLOC_ENABLE=1`` (an ``madvise``; the kernel's
``/sys/kernel/mm/transparent_hugepage/enabled`` must be ``madvise`` or ``always``). Measured on the 2-core
benchmark machine (70M shape, fp32, batch 8, 512 context, median of 10 alternating runs): a depth-batched decode
tick 48.2 → 37.1 ms with halting off, 56.5 → 43.5 ms at 25 % skipped (docs/benchmarks.md). The variable is read at
the first large allocation, so the entry points set it first thing; a value the user set is kept (``0`` turns it
off)."""

from __future__ import annotations

import os

ENV = "THP_MEM_ALLOC_ENABLE"


def enable_huge_pages() -> bool:
    """Ask PyTorch's CPU allocator for huge pages unless the user said otherwise; returns whether they are asked
    for. Call before the model is built (the allocator reads the variable once)."""
    os.environ.setdefault(ENV, "1")
    return os.environ[ENV] not in ("", "0")


__all__ = ["enable_huge_pages", "ENV"]
