"""Whether a pass over a ``[B, T]`` token grid should compact the still-active tokens (A16: gather them, compute
only them, scatter the results) or compute the whole grid with the halted tokens masked — decided per pass from
measured seconds, so that halting may save less than its FLOPs but never costs time.

Compaction skips the halted tokens' work but pays for gathering, packing the attention rows and scattering back;
where a pass is cheap per token (a GPU's wide kernels, a short prompt) that overhead can exceed the work it
skips. A dense pass of the grid costs about the same whatever the halted share, so one measurement per grid size
(seconds per dense pass) and a linear model of compacted passes (seconds = overhead + per-token cost × tokens,
fitted to the compacted passes measured at that size) predict both ways; the cheaper one runs. Until a compacted
pass has been measured at a size, compaction runs (it is the way that can save); while dense wins, compaction is
tried again after ``probe_every`` decisions, the interval doubling after each probe it loses.

Passes are timed only while a way is being measured (on a GPU a timed pass synchronises with the device).

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import time
from collections import deque

import torch

#: Compacted passes remembered per grid size for the linear fit (older ones are forgotten: load and halting drift).
HISTORY = 8


class _Size:
    """What has been measured at one grid size."""

    def __init__(self, probe_every: int):
        self.dense: float | None = None  # seconds of the last measured dense pass
        self.compacted: deque = deque(maxlen=HISTORY)  # (tokens computed, seconds)
        self.interval = probe_every
        self.since_probe = 0
        self.dense_runs = 0  # dense passes since the last timed one

    def predicted_compacted(self, n: int) -> float:
        """Seconds of a compacted pass over ``n`` tokens: the least-squares line through the measured ones
        (one measurement, or all at one size: proportional to the tokens)."""
        pts = list(self.compacted)
        ns = [p[0] for p in pts]
        if len(set(ns)) < 2:
            per = sum(t for _, t in pts) / max(sum(ns), 1)
            return per * n
        mean_n, mean_t = sum(ns) / len(ns), sum(t for _, t in pts) / len(pts)
        slope = sum((a - mean_n) * (t - mean_t) for a, t in pts) / sum((a - mean_n) ** 2 for a in ns)
        slope = max(slope, 0.0)
        return max(mean_t + slope * (n - mean_n), 0.0)


class CompactionChoice:
    """``choose(total, active)`` before a pass: compact (True) or dense (False); ``timing(...)`` says whether that
    pass is to be timed, ``record(...)`` stores its seconds. One per model (``core``), shared by its calls."""

    def __init__(self, probe_every: int = 16):
        self.probe_every = probe_every
        self.sizes: dict[tuple[str, int], _Size] = {}
        self.probing = False

    def _size(self, device: torch.device, total: int) -> _Size:
        key = (device.type, max(int(total), 1).bit_length())  # grids within a factor of two share measurements
        size = self.sizes.get(key)
        if size is None:
            size = self.sizes[key] = _Size(self.probe_every)
        return size

    def choose(self, device: torch.device, total: int, active: int) -> bool:
        size = self._size(device, total)
        self.probing = False
        if size.dense is None or not size.compacted:
            self.probing = size.dense is not None  # the first compacted pass at this size is a measurement
            return True
        compact = size.predicted_compacted(active) < size.dense
        if compact:
            size.interval = self.probe_every
            return True
        size.since_probe += 1
        if size.since_probe >= size.interval:  # dense has won for a while: measure compaction again
            size.since_probe, size.interval, self.probing = 0, size.interval * 2, True
            return True
        return False

    def wants_timing(self, device: torch.device, total: int, compact: bool) -> bool:
        """Whether the coming pass is a measurement: a dense pass at a size with none measured, or a compacted one
        at a size with none measured or on a probe."""
        size = self._size(device, total)
        if not compact:  # re-timed every probe_every dense passes: the machine's load moves
            size.dense_runs += 1
            return size.dense is None or size.dense_runs >= self.probe_every
        return self.probing or not size.compacted

    def record(self, device: torch.device, total: int, compact: bool, computed: int, seconds: float) -> None:
        size = self._size(device, total)
        if compact:
            size.compacted.append((computed, seconds))
        else:
            size.dense, size.dense_runs = seconds, 0


def start_timer(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def stop_timer(device: torch.device, started: float) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


__all__ = ["CompactionChoice", "start_timer", "stop_timer"]
