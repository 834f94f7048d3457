"""Official GLUE metrics in plain numpy (docs/method.md B8).

accuracy; Matthews correlation (CoLA); accuracy + F1 (MRPC, QQP); Pearson + Spearman (STS-B).
The definitions and degenerate-case conventions follow scikit-learn / scipy (which the tests compare
against), but the library does not import either, so evaluation has no dependency beyond numpy.

Metric names are those of the Hugging Face ``glue`` metric (``matthews_correlation``, ``accuracy``,
``f1``, ``pearson``, ``spearmanr``). Tasks with two metrics also report ``combined_score``, their mean,
which is the task's GLUE score and its main metric for early stopping **[choice]** (as HF ``run_glue``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "METRIC_NAMES",
    "MAIN_METRIC",
    "canonical_task",
    "accuracy",
    "matthews_corrcoef",
    "f1_binary",
    "pearson",
    "spearman",
    "rankdata_average",
    "glue_metrics",
    "main_metric",
]

# Canonical lower-case task name -> metric keys returned by glue_metrics (B8).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1", "combined_score"),
    "qqp": ("accuracy", "f1", "combined_score"),
    "stsb": ("pearson", "spearmanr", "combined_score"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

# Metric to maximise for early stopping / model selection (B8).
MAIN_METRIC: dict[str, str] = {
    "cola": "matthews_correlation",
    "sst2": "accuracy",
    "mrpc": "combined_score",
    "qqp": "combined_score",
    "stsb": "combined_score",
    "mnli": "accuracy",
    "qnli": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
}


def canonical_task(task: str) -> str:
    """Normalise a GLUE task name: ``"SST-2"``, ``"sst_2"``, ``"sst2"`` -> ``"sst2"``; ``"STS-B"`` -> ``"stsb"``."""
    name = task.strip().lower().replace("-", "").replace("_", "")
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(METRIC_NAMES)}")
    return name


def main_metric(task: str) -> str:
    """Name of the key of :func:`glue_metrics` to maximise for early stopping on ``task`` (B8)."""
    return MAIN_METRIC[canonical_task(task)]


def _pair(preds: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    p, y = _to_numpy(preds).reshape(-1), _to_numpy(labels).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"preds and labels differ in length: {p.shape[0]} vs {y.shape[0]}")
    if p.size == 0:
        raise ValueError("metrics of an empty set are undefined")
    return p, y


def _to_numpy(x: Any) -> np.ndarray:
    # Accept torch tensors without importing torch here.
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def accuracy(preds: Any, labels: Any) -> float:
    """Fraction of exact matches (sklearn ``accuracy_score``)."""
    p, y = _pair(preds, labels)
    return float(np.mean(p == y))


def matthews_corrcoef(preds: Any, labels: Any) -> float:
    """Matthews correlation coefficient, multiclass form (Gorodkin 2004) as in sklearn.

    ``MCC = (c·s − t·p) / sqrt((s² − t·t)(s² − p·p))`` with ``t``/``p`` the per-class counts of labels /
    predictions, ``c`` the number correct and ``s`` the number of samples. Returns 0.0 when the
    denominator is 0 (e.g. a constant prediction), like sklearn; this is the majority-class score on CoLA.
    """
    p, y = _pair(preds, labels)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    y_idx, p_idx = inv[: y.size], inv[y.size :]
    k = classes.size
    t_sum = np.bincount(y_idx, minlength=k).astype(np.float64)
    p_sum = np.bincount(p_idx, minlength=k).astype(np.float64)
    n_correct = float(np.sum(y_idx == p_idx))
    n = float(y.size)
    cov_ytyp = n_correct * n - float(t_sum @ p_sum)
    cov_ypyp = n * n - float(p_sum @ p_sum)
    cov_ytyt = n * n - float(t_sum @ t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def f1_binary(preds: Any, labels: Any, pos_label: int = 1) -> float:
    """Binary F1 of the positive class, ``2·TP / (2·TP + FP + FN)`` (sklearn ``f1_score``).

    Returns 0.0 when there are no positive labels and no positive predictions (sklearn's
    ``zero_division`` default).
    """
    p, y = _pair(preds, labels)
    pp, yp = p == pos_label, y == pos_label
    tp = float(np.sum(pp & yp))
    denom = 2.0 * tp + float(np.sum(pp & ~yp)) + float(np.sum(~pp & yp))
    return 0.0 if denom == 0 else 2.0 * tp / denom


def pearson(preds: Any, labels: Any) -> float:
    """Pearson correlation coefficient (scipy ``pearsonr(...).statistic``).

    NaN when either input is constant or contains a non-finite value (scipy returns NaN for a
    constant input too).
    """
    p, y = _pair(preds, labels)
    x, z = p.astype(np.float64), y.astype(np.float64)
    if x.size < 2 or not (np.all(np.isfinite(x)) and np.all(np.isfinite(z))):
        return float("nan")
    if np.all(x == x[0]) or np.all(z == z[0]):
        return float("nan")  # test equality, not the centred norm: the mean of equal values can round
    xm, zm = x - x.mean(), z - z.mean()
    nx, nz = np.linalg.norm(xm), np.linalg.norm(zm)
    if nx == 0 or nz == 0:
        return float("nan")
    # Normalise before the dot product so large values cannot overflow; clip rounding past ±1.
    r = float(np.dot(xm / nx, zm / nz))
    return max(-1.0, min(1.0, r))


def rankdata_average(x: Any) -> np.ndarray:
    """1-based ranks with ties given their average rank (scipy ``rankdata(method="average")``)."""
    a = _to_numpy(x).reshape(-1)
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    last = np.cumsum(counts).astype(np.float64)  # 1-based rank of the last member of each tie group
    avg = last - (counts - 1) / 2.0
    return avg[inverse.reshape(-1)]


def spearman(preds: Any, labels: Any) -> float:
    """Spearman rank correlation: Pearson of average-tie ranks (scipy ``spearmanr``). NaN as for :func:`pearson`."""
    p, y = _pair(preds, labels)
    x, z = p.astype(np.float64), y.astype(np.float64)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(z))):
        return float("nan")
    return pearson(rankdata_average(x), rankdata_average(z))


def _class_preds(preds: Any) -> np.ndarray:
    p = _to_numpy(preds)
    if p.ndim == 2:  # logits / probabilities [n, C]
        return p.argmax(axis=-1)
    if p.ndim != 1:
        raise ValueError(f"classification preds must be [n] labels or [n, C] scores, got shape {p.shape}")
    return p


def _regression_preds(preds: Any) -> np.ndarray:
    p = _to_numpy(preds)
    if p.ndim == 2 and p.shape[1] == 1:
        p = p[:, 0]
    if p.ndim != 1:
        raise ValueError(f"regression preds must be [n] or [n, 1], got shape {p.shape}")
    return p


def glue_metrics(task: str, preds: Any, labels: Any) -> dict[str, float]:
    """The official GLUE dev metrics of ``task`` (B8).

    Args:
        task: GLUE task name (any spelling accepted by :func:`canonical_task`).
        preds: classification: predicted labels ``[n]`` or scores ``[n, C]`` (argmax taken);
            STS-B: predicted scores ``[n]`` or ``[n, 1]``. numpy arrays, lists or torch tensors.
        labels: gold labels ``[n]`` (ints; floats for STS-B).

    Returns:
        dict with the keys ``METRIC_NAMES[task]``; values are floats in the metric's natural scale
        (fractions, not percentages). :func:`main_metric` names the key to early-stop on.
    """
    name = canonical_task(task)
    if name == "stsb":
        p = _regression_preds(preds)
        r, rho = pearson(p, labels), spearman(p, labels)
        return {"pearson": r, "spearmanr": rho, "combined_score": (r + rho) / 2.0}
    p = _class_preds(preds)
    if name == "cola":
        return {"matthews_correlation": matthews_corrcoef(p, labels)}
    if name in ("mrpc", "qqp"):
        acc, f1 = accuracy(p, labels), f1_binary(p, labels)
        return {"accuracy": acc, "f1": f1, "combined_score": (acc + f1) / 2.0}
    return {"accuracy": accuracy(p, labels)}
