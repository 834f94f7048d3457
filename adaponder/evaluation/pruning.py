"""Fixed pruning, the iso-FLOPs control of docs/method.md (a) "Baselines": the trained model, but instead of
the gates' rule (A6) a random subset of the still-active tokens halts after each pass, with per-pass rates
chosen so that the exit-pass histogram is *uniform* or *geometric* with the learned policy's mean D.

Target histograms over exit passes 1..K with mean D (1 ≤ D ≤ K):

* **geometric** (truncated at K): a constant halting rate p after every pass,
  ``P(i) = p (1−p)^(i−1)`` for i < K and ``P(K) = (1−p)^(K−1)``; mean ``Σ_{i<K} (1−p)^i``, which falls
  monotonically from K (p = 0) to 1 (p = 1), so p is solved by bisection.
* **uniform** **[choice]**: every pass a token can stop at *early* gets the same mass q; the rest goes to the
  end. For D ≥ (K+1)/2: ``P(1) = … = P(K−1) = q``, ``P(K) = 1 − (K−1) q`` with ``q = 2(K−D)/(K(K−1))``
  (equivalently: the same number of tokens halts after each pass). For D < (K+1)/2 the mirror image:
  ``P(2) = … = P(K) = q``, ``P(1) = 1 − (K−1) q``, ``q = 2(D−1)/(K(K−1))``. At D = (K+1)/2 both are the
  uniform distribution over 1..K.

A histogram becomes per-pass halting rates ``h_i = P(i) / P(D ≥ i)`` (the fraction of tokens still active at
pass i that halt after it). :class:`FixedPruningPolicy` applies them as the call's exit rule (``RunSettings``):
after pass i it halts ``round(h_i · n)`` of the n active, non-padding tokens of the batch, chosen uniformly at
random with a seeded generator (stochastic rounding keeps the expected count exact), so the realised
histogram matches the target up to sampling noise.
"""

from __future__ import annotations

from collections.abc import Sequence

from adaponder.modeling.exit_rules import FixedPruning

FIXED_RULES = ("uniform", "geometric")


def _check(K: int, mean: float) -> None:
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if not 1.0 - 1e-9 <= mean <= K + 1e-9:
        raise ValueError(f"target mean exit pass must lie in [1, K={K}], got {mean}")


def uniform_histogram(K: int, mean: float) -> list[float]:
    """Exit-pass probabilities ``P(1..K)``: equal mass on the early exits, the remainder at the end (see module doc)."""
    _check(K, mean)
    if K == 1:
        return [1.0]
    mean = min(max(mean, 1.0), float(K))
    if mean >= (K + 1) / 2:
        q = 2.0 * (K - mean) / (K * (K - 1))
        return [q] * (K - 1) + [1.0 - (K - 1) * q]
    q = 2.0 * (mean - 1.0) / (K * (K - 1))
    return [1.0 - (K - 1) * q] + [q] * (K - 1)


def geometric_mean_exit(p: float, K: int) -> float:
    """Mean exit pass of the geometric histogram truncated at K with halting rate p."""
    return sum((1.0 - p) ** i for i in range(K))


def geometric_histogram(K: int, mean: float) -> tuple[list[float], float]:
    """``(P(1..K), p)``: the geometric histogram truncated at K whose mean is ``mean`` (p by bisection)."""
    _check(K, mean)
    if K == 1:
        return [1.0], 0.0
    lo, hi = 0.0, 1.0  # mean(lo) = K >= target >= 1 = mean(hi)
    for _ in range(200):
        mid = (lo + hi) / 2
        if geometric_mean_exit(mid, K) > mean:
            lo = mid
        else:
            hi = mid
    p = (lo + hi) / 2
    hist = [p * (1.0 - p) ** (i - 1) for i in range(1, K)] + [(1.0 - p) ** (K - 1)]
    return hist, p


def target_histogram(rule: str, K: int, mean: float) -> list[float]:
    """The target exit-pass histogram of a fixed-pruning rule (``uniform`` or ``geometric``)."""
    if rule == "uniform":
        return uniform_histogram(K, mean)
    if rule == "geometric":
        return geometric_histogram(K, mean)[0]
    raise ValueError(f"fixed-pruning rule must be one of {', '.join(FIXED_RULES)}; got {rule!r}")


def histogram_mean(hist: Sequence[float]) -> float:
    return sum((i + 1) * float(p) for i, p in enumerate(hist))


def halting_rates(hist: Sequence[float]) -> list[float]:
    """Per-pass halting rates ``h_1..h_{K−1}``: ``h_i = P(i) / P(D ≥ i)`` (1 where nothing is left)."""
    rates, left = [], 1.0
    for p in hist[:-1]:
        rates.append(1.0 if left <= 1e-12 else min(max(p / left, 0.0), 1.0))
        left -= p
    return rates


class FixedPruningPolicy(FixedPruning):
    """:class:`~adaponder.modeling.exit_rules.FixedPruning` (the exit rule, honoured by every consumer of the pass
    driver) built from a target histogram: :meth:`from_rule`."""

    @classmethod
    def from_rule(cls, rule: str, K: int, mean: float, seed: int = 0) -> "FixedPruningPolicy":
        hist = target_histogram(rule, K, mean)
        return cls(halting_rates(hist), seed=seed, rule=rule, histogram=hist)


def make_policy(exit_rule: str, K: int, target_mean_exit: float | None = None, seed: int = 0):
    """``None`` for the learned rule (the gates, A6), else a :class:`FixedPruningPolicy` exit rule with mean
    ``target_mean_exit``."""
    if exit_rule == "learned":
        return None
    if target_mean_exit is None:
        raise ValueError(f"exit rule {exit_rule!r} needs target_mean_exit (the learned policy's mean exit pass)")
    return FixedPruningPolicy.from_rule(exit_rule, K, float(target_mean_exit), seed=seed)


__all__ = ["FIXED_RULES", "FixedPruningPolicy", "geometric_histogram", "geometric_mean_exit", "halting_rates",
           "histogram_mean", "make_policy", "target_histogram", "uniform_histogram"]
