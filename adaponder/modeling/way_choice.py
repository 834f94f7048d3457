"""Choosing between two ways of doing the same work by measuring them: each way is timed once first, then the
faster one (by its last measured seconds per unit of work) is taken, and the other is tried again after
``probe_every`` units — a machine's load, a model's acceptance rate or its halting change which one wins. A probe
that loses doubles the interval to the next one (a way that never pays costs ever less); a probe that wins resets
it.

Used where two ways give identical results and only their cost differs: self-speculative drafting against
ordinary decoding, a static decode step pass by pass against the whole step as one graph.

This file travels with saved checkpoints (``auto_map``): standard library and torch only.
"""

from __future__ import annotations

import time

import torch


class WayChooser:
    def __init__(self, ways: tuple[str, str], probe_every: int, device: torch.device):
        self.ways, self.probe_every, self.device = ways, probe_every, device
        self.interval = probe_every
        self.per_unit: dict[str, float] = {}
        self.since_probe = 0
        self.probed: str | None = None  # the way the last probe tried, until its timing is judged

    def next_way(self) -> str:
        for way in self.ways:
            if way not in self.per_unit:
                return way
        best = min(self.per_unit, key=self.per_unit.get)
        if self.probed is not None:  # the last probe is in: it lost (double the interval) or won (reset it)
            self.interval = self.probe_every if best == self.probed else self.interval * 2
            self.probed = None
        if self.since_probe >= self.interval:
            self.since_probe = 0
            self.probed = self.ways[1] if best == self.ways[0] else self.ways[0]
            return self.probed
        return best

    def start(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def record(self, way: str, started: float, units: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.per_unit[way] = (time.perf_counter() - started) / max(units, 1)
        self.since_probe += units


__all__ = ["WayChooser"]
