"""The peak FLOP/s that MFU divides by: configured, looked up for known CUDA devices, or measured on a CPU.

* ``logging.peak_flops`` set: that number (per device) — the override for any device.
* CUDA: the device's dense peak for the run's precision from :data:`CUDA_PEAKS` (vendor data sheets; bf16/fp16
  tensor-core peak for ``bf16``/``fp16`` runs, plain FP32 (no TF32) for ``fp32`` runs). A device not in the table
  has no MFU (a note says to set ``logging.peak_flops``).
* CPU: measured at start-up — the best of several timed square float32 matrix products with the threads the
  run uses, on every rank at once (so ranks sharing a machine measure the share they get). MFU against a
  measured peak says how close the model's arithmetic comes to what this machine's BLAS actually reaches.

MFU is logged as a percentage (``mfu_pct``); a value above 100 % would mean the peak is wrong, so it is not
logged and a note names the peak (see :class:`adaponder.train.metrics.Throughput`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import metrics as M

#: Dense peak FLOP/s per device: (bf16 / fp16 tensor cores, fp32 without TF32). The first matching substring of
#: ``torch.cuda.get_device_name()`` wins, so more specific names come first.
CUDA_PEAKS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H200", 989e12, 67e12),  # also GH200
    ("H100", 989e12, 67e12),  # SXM
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
    ("V100", 125e12, 15.7e12),  # fp16 tensor cores (no bf16)
]


def cuda_peak(device_name: str, precision: str) -> float | None:
    """The table's dense peak of ``device_name`` at ``precision`` (``bf16``/``fp16``/``fp32``), or None."""
    for key, half, single in CUDA_PEAKS:
        if key.lower() in device_name.lower():
            return single if precision == "fp32" else half
    return None


def measure_cpu_peak(seconds: float = 0.6, n: int = 1024, dtype: torch.dtype = torch.float32) -> float:
    """Best achieved FLOP/s of ``n×n @ n×n`` products over about ``seconds`` (after one warm-up product)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up (thread pool, caches)
    flops = 2.0 * n ** 3
    best = 0.0
    end = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        dt = time.perf_counter() - t0
        best = max(best, flops / dt if dt > 0 else 0.0)
        runs += 1
        if runs >= 200:
            break
    return best


def resolve_peak(configured: float | None, device: torch.device, precision: str) -> tuple[float | None, str]:
    """``(peak FLOP/s per device or None, where it came from)`` for this rank (see the module doc)."""
    if configured is not None:
        return float(configured), "logging.peak_flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = cuda_peak(name, precision)
        if peak is None:
            return None, f"{name} is not in the table of known devices: set logging.peak_flops for MFU"
        return peak, f"{name}, dense {precision} (data sheet)"
    if device.type == "cpu":
        return measure_cpu_peak(), f"measured on this CPU ({torch.get_num_threads()} threads, fp32 matmul)"
    return None, f"no known peak for device type {device.type}: set logging.peak_flops for MFU"


def agreed_peak(configured: float | None, device: torch.device, precision: str, rank: int,
                world_size: int) -> float | None:
    """Collective: :func:`resolve_peak` on every rank; a CPU peak is measured by every rank at once (as they will
    train together) and averaged. Rank 0 says which peak MFU uses."""
    together = configured is None and device.type == "cpu" and dist.is_initialized() and world_size > 1
    if together:
        dist.barrier()
    peak, how = resolve_peak(configured, device, precision)
    if together:
        t = torch.tensor([peak], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        peak = float(t) / world_size
    if rank == 0:
        M.write_console(f"MFU peak: {f'{peak:.3e} FLOP/s per device' if peak else 'none'} ({how})")
    return peak


__all__ = ["CUDA_PEAKS", "agreed_peak", "cuda_peak", "measure_cpu_peak", "resolve_peak"]
