"""The collapse alarm: per-gate statistics of a training step, and a watch that warns once, by name, when a gate
has shut its passes off.

A gate whose value sits far below τ has almost no gradient to reopen (σ'(z) ≈ s), so the passes after it stop
learning for good. Two signs, each required over ``window`` consecutive logged steps:

* **closed in the warm-up**: before the ponder loss starts (step ≤ S₀) a gate's median value is below τ — only
  cross-entropy can have pushed it there, switching off the passes that would learn what pass 1 cannot;
* **dead pass**: a pass after the first runs for under ``min_active`` of the tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

REMEDY = ("try schedule.gate_warmup=bypassed (the PonderLM regime until S0: gates bypassed, no halting) or "
          "schedule.gate_warmup=floored (gate logits floored, no halting until S0)")


def gate_stats(gate_values: torch.Tensor, gate_mask: torch.Tensor, tau: float) -> tuple[list[float], list[float]]:
    """Per gate (after passes 1..K−1): the median value over its pool and the share of the pool it halts (s < τ).
    NaN for a gate whose pool is empty. Reads values on the host: call it on logged steps only."""
    medians, halts = [], []
    for i in range(gate_values.shape[-1]):
        vals = gate_values[..., i][gate_mask[..., i]].detach().float()
        medians.append(float(vals.median()) if vals.numel() else float("nan"))
        halts.append(float((vals < tau).float().mean()) if vals.numel() else float("nan"))
    return medians, halts


class GateWatch:
    """Feed it every logged train record; :meth:`observe` returns the alarms raised at that step (each at most once)."""

    def __init__(self, tau: float, s0: int, window: int = 3, min_active: float = 0.01) -> None:
        self.tau, self.s0, self.window, self.min_active = tau, s0, window, min_active
        self.streaks: dict[str, int] = {}
        self.raised: set[str] = set()

    def _count(self, key: str, bad: bool) -> bool:
        self.streaks[key] = self.streaks.get(key, 0) + 1 if bad else 0
        return self.streaks[key] >= self.window and key not in self.raised

    def observe(self, step: int, medians: Sequence[float] | None, active_fraction: Sequence[float]) -> list[dict[str, Any]]:
        alarms = []
        for i, m in enumerate(medians or [], start=1):
            key = f"gate{i}"
            if self._count(key, step <= self.s0 and math.isfinite(m) and m < self.tau):
                self.raised.add(key)
                alarms.append({"event": "gate_collapse", "gate": i, "step": step, "median": m, "message": (
                    f"gate {i} (after pass {i}) closed at step {step}, before the ponder loss starts (step {self.s0}): "
                    f"its median value {m:.2e} has stayed below τ = {self.tau:g} for {self.window} logged steps. "
                    f"Cross-entropy alone is switching off passes {i + 1}.., and a gate this far below τ gets almost "
                    f"no gradient to reopen; {REMEDY}.")})
        for p, a in enumerate(active_fraction[1:], start=2):
            key = f"pass{p}"
            if self._count(key, a < self.min_active):
                self.raised.add(key)
                alarms.append({"event": "dead_pass", "pass": p, "step": step, "active": a, "message": (
                    f"pass {p} ran for {a:.2%} of the tokens at step {step}, under {self.min_active:.0%} for "
                    f"{self.window} logged steps: the gates before it have shut it off and it no longer learns; "
                    f"{REMEDY}, or a weaker ponder loss (schedule.ponder_weight, schedule.k_max).")})
        return alarms

    def state_dict(self) -> dict[str, Any]:
        return {"streaks": dict(self.streaks), "raised": sorted(self.raised)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streaks = dict(state.get("streaks", {}))
        self.raised = set(state.get("raised", []))


def draw_gate_curves(records: Sequence[dict], title: str):
    """Per-gate median value and per-pass active share over training, from the run's train records; None when no
    record carries gate statistics."""
    rows = [r for r in records if r.get("kind") == "train" and r.get("gate_median")]
    if not rows:
        return None
    # adaponder.plotting imports matplotlib (a second): only drawing the curves needs it
    from adaponder.plotting import LINE_MARKERS, figure, legend_outside, readable_log_ticks

    steps = [r["step"] for r in rows]
    fig = figure(8.4, 6.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for i in range(len(rows[-1]["gate_median"])):
        vals = [r["gate_median"][i] if i < len(r["gate_median"]) else float("nan") for r in rows]
        # Gates often share a value (all near 1, or all at the floor): staggered hollow markers keep each visible.
        every = max(1, len(steps) // 6)
        top.plot(steps, [max(v, 1e-40) if v is not None else float("nan") for v in vals], label=f"gate {i + 1}",
                 marker=LINE_MARKERS[i % len(LINE_MARKERS)], ms=4, mfc="none", markevery=(i * every // 3 % every, every))
    top.set_yscale("log")
    tau = rows[-1].get("tau")
    if tau:
        top.axhline(tau, color="gray", ls=":", label=f"τ = {tau:g}")
    readable_log_ticks(top, "y")
    top.set_ylabel("median gate value s")
    top.grid(alpha=0.3)
    act = [r for r in records if r.get("kind") == "train" and r.get("active_fraction")]
    for p in range(1, len(act[-1]["active_fraction"]) if act else 0):
        bottom.plot([r["step"] for r in act], [r["active_fraction"][p] for r in act], ls="--", label=f"pass {p + 1}")
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel("share of tokens active")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    h1, l1 = top.get_legend_handles_labels()
    h2, l2 = bottom.get_legend_handles_labels()
    legend_outside(top, h1 + h2, l1 + l2, title="top: gates · bottom: passes (dashed)", title_fontsize=7)
    fig.suptitle(title, fontsize=11)
    return fig


def gate_curves_png(records: Sequence[dict], path, title: str):
    fig = draw_gate_curves(records, title)
    if fig is None:
        return None
    from adaponder.plotting import save  # matplotlib, as above

    return save(fig, path)


__all__ = ["GateWatch", "REMEDY", "draw_gate_curves", "gate_curves_png", "gate_stats"]
