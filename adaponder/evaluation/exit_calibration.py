"""Calibrating the consistency exit (A23) to a user's tolerance, with a stated confidence (Learn-then-Test).

The risk of a threshold ``t`` is the share of positions whose greedy token under the exit rule
(:class:`~adaponder.modeling.exit_rules.ConsistencyExit` at ``t``) differs from the full model's (every token
runs all K passes). It is measured on held-out windows by running the model with the rule — a token that stops
early changes what later tokens attend to (A15), so the rule's own outputs are compared, not per-pass guesses.

The threshold is chosen by fixed-sequence testing (Angelopoulos et al., "Learn then Test", 2021; the procedure of
CALM, Schuster et al., 2022): thresholds are tried from the most conservative down; for each, the null hypothesis
"risk > δ" is rejected when the Hoeffding–Bentkus p-value of the windows' mean risk is at most ε; the last rejected
threshold is kept, and testing stops at the first that is not rejected. Windows are the independent units (their
risks lie in [0, 1]); the guarantee is ``P(risk(t̂) > δ) ≤ ε`` over the draw of the calibration windows, for
windows drawn as they were. No threshold rejected: ``t̂ = 1`` (the rule never stops a token early).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from adaponder.jsonio import write_json_atomic
from adaponder.modeling.exit_rules import ConsistencyExit, NoHalting
from adaponder.modeling.run_settings import RunSettings

#: Where ``adaponder calibrate`` writes its result, inside the checkpoint folder.
CALIBRATION_FILE = "exit_calibration.json"
#: Thresholds tried, most conservative first.
DEFAULT_THRESHOLDS = (0.999, 0.995, 0.99, 0.98, 0.97, 0.96, 0.95, 0.93, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5, 0.4,
                      0.3, 0.2, 0.1, 0.0)


def _kl_bernoulli(a: float, b: float) -> float:
    a = min(max(a, 0.0), 1.0)
    out = 0.0
    if a > 0:
        out += a * math.log(a / b)
    if a < 1:
        out += (1 - a) * math.log((1 - a) / (1 - b))
    return out


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) ≤ k), summed in log space."""
    if k >= n:
        return 1.0
    if k < 0:
        return 0.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def hoeffding_bentkus_p_value(mean_risk: float, n: int, delta: float) -> float:
    """p-value of "the expected risk exceeds δ" from the mean of ``n`` independent risks in [0, 1] (Bates et al.,
    2021): ``min(exp(−n·KL(r̂ ‖ δ)), e·P(Bin(n, δ) ≤ ⌈n r̂⌉))``, and 1 where ``r̂ ≥ δ``."""
    if n <= 0 or mean_risk >= delta:
        return 1.0
    hoeffding = math.exp(-n * _kl_bernoulli(mean_risk, delta))
    bentkus = math.e * _binom_cdf(math.ceil(n * mean_risk), n, delta)
    return min(1.0, hoeffding, bentkus)


def choose_threshold(risks: np.ndarray, thresholds: Sequence[float], delta: float,
                     epsilon: float) -> tuple[float, int | None]:
    """Fixed-sequence testing (module doc): ``risks`` ``[windows, thresholds]``, ``thresholds`` most conservative
    first. Returns ``(t̂, index)``; ``(1.0, None)`` when the first threshold is not rejected."""
    if not 0 < delta < 1 or not 0 < epsilon < 1:
        raise ValueError(f"δ and ε must lie in (0, 1); got δ={delta}, ε={epsilon}")
    risks = np.asarray(risks, dtype=np.float64)
    n = risks.shape[0]
    chosen, index = 1.0, None
    for j, t in enumerate(thresholds):
        if hoeffding_bentkus_p_value(float(risks[:, j].mean()), n, delta) > epsilon:
            break
        chosen, index = float(t), j
    return chosen, index


@dataclass
class Curves:
    """Per window and threshold: the share of positions whose greedy token differs from the full model's
    (``risks``), and the mean exit pass per threshold."""

    thresholds: list[float]
    risks: np.ndarray  # [windows, thresholds]
    mean_exit: list[float]
    tokens: int


def windows_of(docs, window: int, eod_id: int) -> list[torch.Tensor]:
    """Non-overlapping input windows ``[EOD] + tokens`` of every document (the last one of a document shorter)."""
    out = []
    for doc in docs:
        inputs = torch.tensor([eod_id, *doc.ids.tolist()[:-1]], dtype=torch.long)
        out += [inputs[b:b + window] for b in range(0, len(inputs), window)]
    return out


@torch.no_grad()
def disagreement_curves(model, windows: Sequence[torch.Tensor], thresholds: Sequence[float],
                        batch_size: int = 16, progress: str | None = None) -> Curves:
    """Run every window with every threshold's consistency exit and with all K passes (see the module doc).
    ``progress``: a label for a progress bar (on stderr) counting the windows done; None shows none."""
    heads = model.consistency_heads
    if heads is None:
        raise ValueError("calibrating the consistency exit needs a model with consistency heads "
                         "(consistency_heads: true, docs/method.md A23)")
    by_length: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_length.setdefault(len(w), []).append(i)
    risks = np.zeros((len(windows), len(thresholds)))
    exit_sum = np.zeros(len(thresholds))
    tokens = 0
    # each batch costs 1 + len(thresholds) forwards: the bar moves by windows, which its total counts
    with tqdm(total=len(windows), desc=progress, unit="window", disable=progress is None, leave=False,
              dynamic_ncols=True) as bar:
        for idx in by_length.values():
            for s in range(0, len(idx), batch_size):
                rows = idx[s:s + batch_size]
                ids = torch.stack([windows[i] for i in rows]).to(model.device)
                full = model(input_ids=ids, use_cache=False,
                             settings=RunSettings(exit_rule=NoHalting())).logits.argmax(-1)
                tokens += ids.numel()
                for j, t in enumerate(thresholds):
                    out = model(input_ids=ids, use_cache=False,
                                settings=RunSettings(exit_rule=ConsistencyExit(t, heads)))
                    risks[rows, j] = (out.logits.argmax(-1) != full).double().mean(1).cpu().numpy()
                    exit_sum[j] += float(out.exit_pass.double().sum())
                bar.update(len(rows))
    return Curves(list(map(float, thresholds)), risks, (exit_sum / max(tokens, 1)).tolist(), tokens)


@dataclass
class Calibration:
    """What ``adaponder calibrate`` writes next to the checkpoint (:data:`CALIBRATION_FILE`)."""

    threshold: float
    delta: float
    confidence: float
    windows: int
    tokens: int
    window: int
    split: str
    calibration_disagreement: float
    calibration_mean_exit: float
    passes: int
    curve: list[dict] = field(default_factory=list)
    test: dict | None = None
    rule: str = "consistency"
    method: str = "Learn-then-Test, fixed sequence, Hoeffding-Bentkus p-values; windows are the units"

    def save(self, checkpoint: str | os.PathLike) -> Path:
        path = Path(checkpoint) / CALIBRATION_FILE
        write_json_atomic(path, asdict(self))
        return path


def calibrate(model, wins: Sequence[torch.Tensor], delta: float, confidence: float = 0.95, window: int = 64,
              thresholds: Sequence[float] = DEFAULT_THRESHOLDS, batch_size: int = 16, split: str = "dev",
              test_windows: Sequence[torch.Tensor] | None = None, progress: bool = False) -> Calibration:
    """The consistency exit's threshold for tolerance ``delta`` at ``confidence`` (= 1 − ε) on the input windows
    ``wins`` (:func:`windows_of`); with ``test_windows``, the chosen threshold's disagreement and mean exit pass
    measured on them too. ``progress`` shows a progress bar per stage on stderr."""
    curves = disagreement_curves(model, wins, thresholds, batch_size,
                                 progress=f"calibrating ({len(thresholds)} thresholds)" if progress else None)
    t, j = choose_threshold(curves.risks, thresholds, delta, 1.0 - confidence)
    K = int(model.config.num_passes)
    curve = [{"threshold": th, "disagreement": float(curves.risks[:, i].mean()), "mean_exit": curves.mean_exit[i],
              "p_value": hoeffding_bentkus_p_value(float(curves.risks[:, i].mean()), len(wins), delta)}
             for i, th in enumerate(curves.thresholds)]
    cal = Calibration(threshold=t, delta=delta, confidence=confidence, windows=len(wins), tokens=curves.tokens,
                      window=window, split=split,
                      calibration_disagreement=0.0 if j is None else curve[j]["disagreement"],
                      calibration_mean_exit=float(K) if j is None else curve[j]["mean_exit"], passes=K, curve=curve)
    if test_windows is not None:
        test = disagreement_curves(model, test_windows, [t], batch_size, progress="testing" if progress else None)
        cal.test = {"windows": int(test.risks.shape[0]), "tokens": test.tokens,
                    "disagreement": float(test.risks[:, 0].mean()), "mean_exit": test.mean_exit[0],
                    "passes_saved": 1.0 - test.mean_exit[0] / K}
    return cal


def load_calibration(checkpoint: str | os.PathLike) -> dict:
    """The calibration written next to ``checkpoint``, or a ``FileNotFoundError`` that says how to make one."""
    path = Path(checkpoint) / CALIBRATION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no calibration of the consistency exit; run `adaponder calibrate "
                                f"--checkpoint {checkpoint} --data DATA --delta 0.05` first (or give the threshold)")
    return json.loads(path.read_text(encoding="utf-8"))


__all__ = ["CALIBRATION_FILE", "Calibration", "Curves", "DEFAULT_THRESHOLDS", "calibrate", "choose_threshold",
           "disagreement_curves", "hoeffding_bentkus_p_value", "load_calibration", "windows_of"]
