"""The Q-exit threshold q of an arm with halting heads (A21, B9), chosen on the development split and then read once
on the test split (docs/method.md A25).

Each run of such an arm is evaluated with Q-exit at every q of a grid on both splits (``difficulty_q_grid_dev``,
``difficulty_q_grid``; :data:`adaponder.study.arms.Q_GRID`). The criterion reads the development split alone — the
arm's runs at each q against ``ponderlm``'s runs (``difficulty_dev``, all passes) — and is the reasoning goal's own:
**the smallest q (the earliest exits) at which the lower bound of the difference in development accuracy to
``ponderlm`` lies above −0.03 at H = 1 and at H = 2** (two-level bootstrap, :mod:`.intervals`). Where no q of the grid
meets it, the q whose worse lower bound (over H = 1, 2) is highest, and the choice says the criterion was not met.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import intervals

REFERENCE = "ponderlm"
#: The goal's margin: the difference's lower bound must lie above −MARGIN at each difficulty of :data:`LEVELS`.
MARGIN = 0.03
LEVELS = (1, 2)
DEV_GRID = "difficulty_q_grid_dev"
TEST_GRID = "difficulty_q_grid"


@dataclass(frozen=True)
class QChoice:
    """The q chosen for ``arm`` (its key in the grids, e.g. ``"0.7"``), whether it meets the criterion, and the
    development-split differences to the reference at each q of the grid (``rows``: (q, [interval per level]))."""

    arm: str
    q: str
    met: bool
    runs: int
    rows: tuple[tuple[str, tuple[intervals.Interval, ...]], ...]

    def test_runs(self, results: Sequence[Mapping]) -> list[Mapping]:
        """The test-split evaluations of the arm's runs at the chosen q: the one read of the test split."""
        return [r[TEST_GRID][self.q] for r in results
                if r["arm"] == self.arm and self.q in (r.get(TEST_GRID) or {})]


def choose_q(results: Sequence[Mapping], arm: str, reference: str = REFERENCE) -> QChoice | None:
    """:class:`QChoice` for ``arm`` from the development-split entries of ``results`` only; None where the arm has no
    development grid or the reference no development evaluation."""
    runs = [r for r in results if r["arm"] == arm and r.get(DEV_GRID)]
    ref = [r["difficulty_dev"]["per_symbol"] for r in results
           if r["arm"] == reference and (r.get("difficulty_dev") or {}).get("per_symbol")]
    if not runs or not ref:
        return None
    grid = sorted(set.intersection(*(set(r[DEV_GRID]) for r in runs)), key=float)
    if not grid:
        return None
    rows = []
    for q in grid:
        own = [r[DEV_GRID][q]["per_symbol"] for r in runs]
        rows.append((q, tuple(intervals.difference(own, ref, intervals.accuracy(h)) for h in LEVELS)))
    meeting = [q for q, diffs in rows if all(d.low > -MARGIN for d in diffs)]
    if meeting:
        return QChoice(arm, meeting[0], True, len(runs), tuple(rows))
    best = max(rows, key=lambda row: min(d.low for d in row[1]))[0]
    return QChoice(arm, best, False, len(runs), tuple(rows))


__all__ = ["DEV_GRID", "LEVELS", "MARGIN", "QChoice", "REFERENCE", "TEST_GRID", "choose_q"]
