"""Official GLUE metrics (docs/method.md B8): scikit-learn and scipy calls.

accuracy; Matthews correlation (CoLA); accuracy + F1 (MRPC, QQP); Pearson + Spearman (STS-B).
Degenerate inputs get the libraries' own values without their warnings: a constant prediction has MCC 0
and F1 0 (no positives), a correlation with a constant (or non-finite) input is NaN.

Metric names are those of the Hugging Face ``glue`` metric (``matthews_correlation``, ``accuracy``,
``f1``, ``pearson``, ``spearmanr``). Tasks with two metrics also report ``combined_score``, their mean,
which is the task's GLUE score and its main metric for early stopping **[choice]** (as HF ``run_glue``).

scikit-learn and scipy are imported on first use, so reading a fine-tuning config does not load them.
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
    """Fraction of exact matches (``sklearn.metrics.accuracy_score``)."""
    from sklearn import metrics as skm  # seconds to import: on first use (see the module doc)

    p, y = _pair(preds, labels)
    return float(skm.accuracy_score(y, p))


def matthews_corrcoef(preds: Any, labels: Any) -> float:
    """Matthews correlation coefficient (``sklearn.metrics.matthews_corrcoef``, multiclass form). 0.0 when
    it is undefined (a constant prediction, or a single class in labels and predictions together) — the
    majority-class score on CoLA."""
    from sklearn import metrics as skm  # seconds to import: on first use (see the module doc)

    p, y = _pair(preds, labels)
    if np.unique(np.concatenate([y, p])).size < 2:
        return 0.0  # sklearn's value too, but it warns about the one-class confusion matrix first
    return float(skm.matthews_corrcoef(y, p))


def f1_binary(preds: Any, labels: Any, pos_label: int = 1) -> float:
    """Binary F1 of the positive class (``sklearn.metrics.f1_score``); 0.0 when there are neither positive
    labels nor positive predictions."""
    from sklearn import metrics as skm  # seconds to import: on first use (see the module doc)

    p, y = _pair(preds, labels)
    return float(skm.f1_score(y, p, pos_label=pos_label, average="binary", zero_division=0.0))


def _correlatable(x: np.ndarray, z: np.ndarray) -> bool:
    """Whether a correlation of ``x`` and ``z`` is defined: two or more values, all finite, neither constant."""
    return (x.size >= 2 and bool(np.all(np.isfinite(x)) and np.all(np.isfinite(z)))
            and not bool(np.all(x == x[0])) and not bool(np.all(z == z[0])))


def _correlation(preds: Any, labels: Any, kind: str) -> float:
    """``scipy.stats.pearsonr`` / ``spearmanr`` (``kind``) of the pair; NaN where it is not defined."""
    from scipy import stats  # seconds to import: on first use (see the module doc)

    p, y = _pair(preds, labels)
    x, z = p.astype(np.float64), y.astype(np.float64)
    if not _correlatable(x, z):
        return float("nan")
    return float(getattr(stats, kind)(x, z).statistic)


def pearson(preds: Any, labels: Any) -> float:
    """Pearson correlation (``scipy.stats.pearsonr``); NaN when either input is constant or not finite."""
    return _correlation(preds, labels, "pearsonr")


def rankdata_average(x: Any) -> np.ndarray:
    """1-based ranks with ties given their average rank (``scipy.stats.rankdata(method="average")``)."""
    from scipy import stats  # seconds to import: on first use (see the module doc)

    return stats.rankdata(_to_numpy(x).reshape(-1), method="average")


def spearman(preds: Any, labels: Any) -> float:
    """Spearman rank correlation (``scipy.stats.spearmanr``); NaN as for :func:`pearson`."""
    return _correlation(preds, labels, "spearmanr")


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
