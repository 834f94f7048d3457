"""Per-step statistics (one all-reduce per step), throughput/MFU, and the sinks: console, JSONL, wandb, tqdm.

Only rank 0 writes. ``metrics.jsonl`` holds one JSON object per logged step (``"kind": "train"``), per
validation (``"kind": "eval"``) and per notable event (``"kind": "event"``: skipped steps, checkpoints, stops).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from adaponder.errors import writing
from adaponder.modeling.exits import exit_counts

# Layout of the per-step statistics vector (summed over micro-batches and ranks by one all-reduce).
# STOP: ranks stopping (a signal, or a launcher gone); GONE: ranks whose launcher process is gone.
NONFINITE, STOP, GONE, LOSS, LM, PONDER, MICRO, TOKENS, EXIT_SUM = range(9)
HIST = 9  # followed by K exit-pass counts (D = 1..K)


def stats_vector(k_passes: int, device) -> torch.Tensor:
    return torch.zeros(HIST + k_passes, dtype=torch.float64, device=device)


def add_micro_batch(vec: torch.Tensor, loss: torch.Tensor, lm: torch.Tensor, ponder: torch.Tensor | None,
                    exit_pass: torch.Tensor | None, k_passes: int) -> bool:
    """Accumulate one micro-batch; returns whether its loss was finite. Non-finite losses are counted,
    not summed (the step will be skipped)."""
    loss_v = loss.detach().double()
    finite = bool(torch.isfinite(loss_v))
    if not finite:
        vec[NONFINITE] += 1
        return False
    vec[LOSS] += loss_v
    vec[LM] += lm.detach().double()
    if ponder is not None:
        vec[PONDER] += ponder.detach().double()
    vec[MICRO] += 1
    if exit_pass is not None:
        d = exit_pass.reshape(-1)
        vec[TOKENS] += d.numel()
        vec[EXIT_SUM] += d.sum().double()
        vec[HIST:HIST + k_passes] += exit_counts(d, k_passes).double()
    return True


def summarize(vec: torch.Tensor, k_passes: int) -> dict[str, Any]:
    """Means over the (all-reduced) vector: losses, mean exit pass, histogram, active fraction per pass."""
    v = vec.double().cpu()
    micro = max(float(v[MICRO]), 1.0)
    tokens = max(float(v[TOKENS]), 1.0)
    hist = v[HIST:HIST + k_passes]
    # A token with exit pass D was active in passes 1..D.
    active = [float(hist[i:].sum()) / tokens for i in range(k_passes)]
    return {
        "loss": float(v[LOSS]) / micro,
        "lm_loss": float(v[LM]) / micro,
        "ponder_loss": float(v[PONDER]) / micro,
        "mean_exit_pass": float(v[EXIT_SUM]) / tokens,
        "exit_hist": [int(x) for x in hist.tolist()],
        "active_fraction": active,
        "tokens": int(v[TOKENS]),
    }


class Throughput:
    """Tokens/s, achieved FLOP/s and MFU (``mfu_pct``, a percentage) over the time spent in training steps (eval
    and saves excluded). ``peak_flops_per_device`` None: no MFU (unknown device; see :mod:`.peak`). An MFU above
    100 % means the peak is wrong: it is not reported, and ``warn`` (once) names the numbers."""

    def __init__(self, train_flops_per_token: float, peak_flops_per_device: float | None, world_size: int,
                 warn=None):
        self.flops_per_token = train_flops_per_token
        self.peak = peak_flops_per_device * world_size if peak_flops_per_device else None
        self.warn = warn
        self._warned = False
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.tokens = 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def summary(self) -> dict[str, float]:
        if self.seconds <= 0:
            return {}
        tps = self.tokens / self.seconds
        flops = tps * self.flops_per_token
        out = {"tokens_per_s": tps, "flops_per_s": flops}
        if self.peak:
            pct = 100.0 * flops / self.peak
            if pct <= 100.0:
                out["mfu_pct"] = pct
            elif not self._warned:
                self._warned = True
                if self.warn is not None:
                    self.warn(f"achieved {flops:.3e} FLOP/s exceeds the peak of {self.peak:.3e} FLOP/s: the peak is "
                              "wrong for this machine (set logging.peak_flops); MFU is not reported")
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


class MetricsSink:
    """Console + JSONL + wandb, rank 0 only (other ranks get a sink that does nothing)."""

    def __init__(self, out_dir: Path, cfg, rank: int, resume_step: int | None, run_config: dict[str, Any]):
        self.rank = rank
        self.cfg = cfg
        self.enabled = rank == 0
        self.jsonl = None
        self.wandb = None
        if not self.enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        if cfg.jsonl:
            self.path = path = out_dir / "metrics.jsonl"
            with writing(path, "the metrics log"):
                if resume_step is not None and path.is_file():
                    _truncate_after(path, resume_step)
                elif resume_step is None and path.is_file():
                    path.unlink()
                self.jsonl = open(path, "a", encoding="utf-8")
        if cfg.wandb:
            self.wandb = _init_wandb(out_dir, cfg, run_config, resume_step is not None)

    def log(self, record: dict[str, Any], console: str | None = None) -> None:
        if not self.enabled:
            return
        if self.jsonl is not None:
            with writing(self.path, "the metrics log"):
                self.jsonl.write(json.dumps(record, default=float) + "\n")
                self.jsonl.flush()
        if self.wandb is not None:
            kind = record.get("kind", "train")
            flat = {}
            for k, v in record.items():
                if k in ("kind", "step") or isinstance(v, str):
                    continue
                if isinstance(v, list):
                    for i, x in enumerate(v):
                        flat[f"{kind}/{k}_{i + 1}"] = x
                else:
                    flat[f"{kind}/{k}"] = v
            self.wandb.log(flat, step=int(record.get("step", 0)))
        if console and self.cfg.console:
            write_console(console)

    def close(self) -> None:
        if self.jsonl is not None:
            jsonl, self.jsonl = self.jsonl, None
            try:
                jsonl.close()
            except OSError:  # (the unflushed rest of a failed write: its error was raised already)
                pass
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


_BAR = None


def write_console(line: str) -> None:
    """Print above the progress bar when there is one."""
    if _BAR is not None:
        _BAR.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def progress_bar(enabled: bool, total: int, initial: int, desc: str = "train", unit: str = "step"):
    """The run's main progress bar (``write_console`` prints above it), or None when not ``enabled``."""
    global _BAR
    if not enabled:
        return None

    _BAR = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr,
                mininterval=1.0)
    return _BAR


def close_progress_bar() -> None:
    global _BAR
    if _BAR is not None:
        _BAR.close()
        _BAR = None


def train_line(step: int, total: int, r: dict[str, Any]) -> str:
    keys = ["loss", "lm_loss", "ponder_loss", "k", "lambda", "mean_exit_pass", "lr", "grad_norm", "tokens_per_s"]
    parts = [f"step {step}/{total}"] + [f"{k} {_fmt(r[k])}" for k in keys if k in r and r[k] is not None]
    if r.get("mfu_pct") is not None:
        parts.append(f"MFU {r['mfu_pct']:.1f} %")
    if "active_fraction" in r:
        parts.append("active " + "/".join(f"{a:.2f}" for a in r["active_fraction"]))
    if r.get("gate_median"):
        parts.append("gate medians " + "/".join(f"{m:.2g}" for m in r["gate_median"]))
    if r.get("gate_warmup"):
        parts.append(f"gates {r['gate_warmup']}")
    if r.get("skipped"):
        parts.append(f"skipped {r['skipped']}")
    return " | ".join(parts)


def _truncate_after(path: Path, step: int) -> None:
    """Drop records of steps after ``step`` (written by the interrupted run after its last checkpoint)."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the crash
        if int(rec.get("step", 0)) <= step:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    os.replace(tmp, path)


def _init_wandb(out_dir: Path, cfg, run_config: dict[str, Any], resuming: bool):
    """wandb run in ``out_dir``; offline when no API key is configured (sync later with ``wandb sync``)."""
    try:
        import wandb  # takes a second or more to import: only runs that log to wandb need it
    except ImportError:
        write_console("logging.wandb is on but wandb is not installed; skipping wandb")
        return None
    id_file = out_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    mode = os.environ.get("WANDB_MODE")
    if mode is None:
        has_key = bool(os.environ.get("WANDB_API_KEY")) or Path.home().joinpath(".netrc").is_file()
        mode = "online" if has_key else "offline"
    run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_name, dir=str(out_dir), config=run_config,
                     id=run_id, resume="allow" if run_id else None, mode=mode)
    if run is not None and getattr(run, "id", None):
        id_file.write_text(run.id)
    return run


__all__ = ["stats_vector", "add_micro_batch", "summarize", "Throughput", "MetricsSink", "train_line",
           "progress_bar", "close_progress_bar", "write_console"]
