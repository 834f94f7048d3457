"""Choosing between two ways of doing the same work by measuring them, while doing it.

The first way (once the caller runs it) is the way in use; the other is first timed once the way in use has ``FIRST_LOOK``
measurements, and after that is tried again (a probe) every ``probe_every`` units — a machine's load, a model's
acceptance rate or its halting change which one wins. A probe takes over only when its timing beats the way in
use's by ``MARGIN`` (the way in use costs the median seconds per unit of its last ``WINDOW`` measurements): one
step timed on a loaded machine moves by more than the gains at stake, a first call at a new shape is slower than
the ones after it, and a probe that took over on luck would run the slower way until the next probe. A probe that
loses (or that the caller did not run, e.g. drafting where it could not pay) doubles the interval to the next one;
one that wins resets it.

Used where two ways give identical results and only their cost differs: self-speculative drafting against
ordinary decoding, a static decode step pass by pass against the whole step as one graph.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

import torch

#: How much faster a probe must measure to replace the way in use (a fraction of the latter's cost).
MARGIN = 0.1
#: Measurements of the way in use that its cost is the median of.
WINDOW = 5
#: Measurements of the way in use (at any setting) before the other way is first timed.
FIRST_LOOK = 3


class WayChooser:
    def __init__(self, ways: tuple[str, str], probe_every: int, device: torch.device):
        self.ways, self.probe_every, self.device = ways, probe_every, device
        self.interval = probe_every
        self.recent: dict[str, deque] = {}  # way -> its last seconds per unit (at its setting)
        self.setting: dict[str, Any] = {}
        self.runs: dict[str, int] = {}  # way -> measurements, at any setting
        self.current: str | None = None  # the way in use: the first way once run, until a probe takes over
        self.looked = False  # the other way was tried once
        self.since_probe = 0
        self.probed: str | None = None  # the way the last probe tried, until its timing is judged

    def cost(self, way: str) -> float:
        """Median seconds per unit of ``way``'s recent measurements."""
        return statistics.median(self.recent[way])

    def next_way(self) -> str:
        if self.probed is not None:
            self._judge(self.probed)
            self.probed = None
        if self.current is None:
            return self.ways[0]
        first_look = not self.looked and self.runs[self.current] >= FIRST_LOOK
        if first_look or (self.looked and self.since_probe >= self.interval):
            self.looked, self.since_probe = True, 0
            self.probed = self.ways[1] if self.current == self.ways[0] else self.ways[0]
            return self.probed
        return self.current

    def _judge(self, way: str) -> None:
        """The last probe is in: it won (take it, reset the interval) or lost (double it)."""
        times = self.recent.get(way)
        latest = times[-1] if times else None  # (older timings are from earlier probes, maybe stale)
        if latest is not None and way != self.current and latest < (1 - MARGIN) * self.cost(self.current):
            self.current, self.interval = way, self.probe_every
            self.recent[way] = deque([latest], maxlen=WINDOW)  # (setting unchanged)
        else:
            self.interval *= 2

    def start(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def record(self, way: str, started: float, units: int, work: float | None = None, setting: Any = None) -> None:
        """``units`` done ``way`` since ``started``; ``work``: what they amount to in typical units where that
        differs (one token that took every pass is more than a typical token's work); ``setting``: what the way
        ran with (a draft length), see :meth:`measured`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        per_unit = (time.perf_counter() - started) / max(work if work is not None else units, 1e-9)
        self.measured(way, per_unit, units, setting)

    def measured(self, way: str, per_unit: float, units: int, setting: Any = None) -> None:
        """``units`` done ``way`` at ``per_unit`` seconds each. Measurements of a way at another ``setting`` do
        not count toward its cost at this one (the way's window starts again)."""
        if way not in self.recent or self.setting.get(way) != setting:
            self.recent[way], self.setting[way] = deque(maxlen=WINDOW), setting
        self.recent[way].append(per_unit)
        self.runs[way] = self.runs.get(way, 0) + 1
        if self.current is None and way == self.ways[0]:
            self.current = way  # (a caller that ran the other way instead, e.g. no draft yet, leaves it open)
        self.since_probe += units


__all__ = ["FIRST_LOOK", "MARGIN", "WINDOW", "WayChooser"]
