"""Intervals that respect how the reasoning study's answers are made: a two-level bootstrap over runs (training
seeds × data draws) and, within a run, over query symbols.

Every answer about one symbol stands or falls together (a symbol whose chain the model has learned is answered
right every time it is asked), so the answers of a run are not independent draws: resampling answers would
give an interval several times too narrow. A resample here draws runs with replacement and, inside each drawn
run, its symbols with replacement (multinomial weights); a statistic is computed per drawn run from its
weighted per-symbol counts and averaged over the drawn runs. The point estimate is the mean over runs of the
statistic on all their symbols; the interval is the percentile interval of the resamples.

The counts come from :func:`adaponder.evaluation.difficulty.per_symbol_outcomes` (``answers[s][H-1]``,
``correct[s][H-1]``, ``exit_counts[s][H-1][D-1]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    runs: int

    def __str__(self) -> str:
        if not np.isfinite(self.mean):
            return "–"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def above(self, value: float) -> bool:
        return self.low > value

    def below(self, value: float) -> bool:
        return self.high < value


def _tables(per_symbol: Mapping) -> dict[str, np.ndarray]:
    return {"answers": np.asarray(per_symbol["answers"], dtype=float),
            "correct": np.asarray(per_symbol["correct"], dtype=float),
            "exit_counts": np.asarray(per_symbol["exit_counts"], dtype=float)}


# -- statistics of weighted per-symbol counts: each takes the tables summed with weights w [B, S] -------------
def accuracy(h: int) -> Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]:
    """Answer accuracy at difficulty ``h``."""
    def stat(t: dict[str, np.ndarray], w: np.ndarray) -> np.ndarray:
        n = w @ t["answers"][:, h - 1]
        return np.divide(w @ t["correct"][:, h - 1], n, out=np.full_like(n, np.nan), where=n > 0)
    return stat


def mean_exit(h: int) -> Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]:
    """Mean exit pass of the answers at difficulty ``h``."""
    def stat(t: dict[str, np.ndarray], w: np.ndarray) -> np.ndarray:
        counts = t["exit_counts"][:, h - 1, :]                       # [S, K]
        passes = np.arange(1, counts.shape[1] + 1, dtype=float)
        n = w @ counts.sum(axis=1)
        return np.divide(w @ (counts @ passes), n, out=np.full_like(n, np.nan), where=n > 0)
    return stat


def spearman_table(table: np.ndarray) -> np.ndarray:
    """Spearman's ρ of (difficulty, exit pass) from count tables ``[..., H, K]`` (midranks for ties): the
    Pearson correlation of the two variables' midranks, weighted by the counts."""
    table = np.asarray(table, dtype=float)
    n = table.sum(axis=(-2, -1))
    rows, cols = table.sum(axis=-1), table.sum(axis=-2)               # [..., H], [..., K]
    rank_r = np.cumsum(rows, axis=-1) - rows + (rows + 1) / 2
    rank_c = np.cumsum(cols, axis=-1) - cols + (cols + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        mr = (rows * rank_r).sum(-1) / n
        mc = (cols * rank_c).sum(-1) / n
        dr, dc = rank_r - mr[..., None], rank_c - mc[..., None]
        cov = (table * dr[..., :, None] * dc[..., None, :]).sum(axis=(-2, -1))
        var_r = (rows * dr ** 2).sum(-1)
        var_c = (cols * dc ** 2).sum(-1)
        return cov / np.sqrt(var_r * var_c)


def spearman(t: dict[str, np.ndarray], w: np.ndarray) -> np.ndarray:
    """Spearman's ρ between difficulty and exit pass over the answers."""
    table = np.einsum("bs,shk->bhk", w, t["exit_counts"])
    return spearman_table(table)


# -- the bootstrap ------------------------------------------------------------------------------------------
def bootstrap(runs: Sequence[Mapping], stat: Callable, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = 0, draws: bool = False):
    """``stat``'s :class:`Interval` over ``runs`` (each a ``per_symbol`` mapping). With ``draws=True`` also
    returns the ``resamples`` draws (for differences between arms)."""
    rng = np.random.default_rng(seed)
    tables = [_tables(r) for r in runs]
    if not tables:
        nan = float("nan")
        return (Interval(nan, nan, nan, 0), np.full(resamples, nan)) if draws else Interval(nan, nan, nan, 0)
    full = np.array([float(stat(t, np.ones((1, len(t["answers"]))))[0]) for t in tables])
    per_run = np.empty((resamples, len(tables)))
    for i, t in enumerate(tables):
        s = len(t["answers"])
        w = rng.multinomial(s, np.full(s, 1.0 / s), size=resamples).astype(float)
        per_run[:, i] = stat(t, w)
    pick = rng.multinomial(len(tables), np.full(len(tables), 1.0 / len(tables)), size=resamples).astype(float)
    valid = ~np.isnan(per_run)
    samples = (np.where(valid, per_run, 0.0) * pick).sum(1) / np.maximum((pick * valid).sum(1), 1e-12)
    with np.errstate(all="ignore"):
        point = float(np.nanmean(full)) if np.isfinite(full).any() else float("nan")
    out = _interval(point, samples, level, len(tables))
    return (out, samples) if draws else out


def _interval(mean: float, samples: np.ndarray, level: float, runs: int) -> Interval:
    lo, hi = np.nanquantile(samples, [(1 - level) / 2, (1 + level) / 2]) if np.isfinite(samples).any() else (np.nan,) * 2
    return Interval(mean, float(lo), float(hi), runs)


def difference(runs_a: Sequence[Mapping], runs_b: Sequence[Mapping], stat: Callable, resamples: int = RESAMPLES,
               level: float = LEVEL, seed: int = 0) -> Interval:
    """The interval of ``stat(a) − stat(b)``, the two arms resampled independently."""
    a, da = bootstrap(runs_a, stat, resamples, level, seed, draws=True)
    b, db = bootstrap(runs_b, stat, resamples, level, seed + 1, draws=True)
    return _interval(a.mean - b.mean, da - db, level, min(a.runs, b.runs))


def run_values(runs: Sequence[Mapping], value: Callable[[Mapping], float], resamples: int = RESAMPLES,
               level: float = LEVEL, seed: int = 0) -> Interval:
    """A bootstrap over runs alone, for a per-run figure with no per-symbol structure (FLOPs, passes)."""
    vals = np.array([value(r) for r in runs], dtype=float)
    if not len(vals):
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(vals), size=(resamples, len(vals)))
    return _interval(float(vals.mean()), vals[pick].mean(1), level, len(vals))


__all__ = ["Interval", "LEVEL", "RESAMPLES", "accuracy", "bootstrap", "difference", "mean_exit", "run_values",
           "spearman", "spearman_table"]
