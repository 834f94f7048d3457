"""AdamW whose step can be vetoed, and the parameter groups of a run.

DeepSpeed calls our optimizer's ``step()`` on whatever it manages (full parameters without ZeRO, flat fp32
partitions with ZeRO 1–3). The guard makes that call a no-op — no parameter and no optimizer-state change,
not even Adam's step count — when

* the trainer vetoed the step (a non-finite loss on any rank), or
* any gradient it sees is non-finite on any rank (one reduction on the device, one all-reduce, one host
  sync per step), or
* a parameter group is frozen (the gates-only stage of continued pretraining, A14): that group is left out.

ZeRO 1–3 already skip a step whose global gradient norm is non-finite before reaching us; the guard
covers the paths where DeepSpeed does not (no ZeRO in fp32) and makes the behaviour the same everywhere.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _Guard:
    def _guard_init(self) -> None:
        self.veto = False  # set by the trainer before the boundary step
        self.last_skipped = False
        self.check_grads = True

    def _nonfinite_grads(self, groups) -> bool:
        """Whether any gradient of ``groups`` (frozen ones included) holds a NaN/Inf here or on any rank.
        The per-tensor checks stay on the device; the host waits once, for the combined flag."""
        grads = [p.grad for g in groups for p in g["params"] if p.grad is not None]
        device = grads[0].device if grads else torch.device("cpu")
        flags = [torch.isfinite(g).all().to(device) for g in grads]
        bad = torch.logical_not(torch.stack(flags).all()) if flags else torch.zeros((), dtype=torch.bool, device=device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = bad.to(torch.float32).reshape(1)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            bad = flag[0] > 0
        return bool(bad)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        if self.veto:
            self.last_skipped = True
            return None
        groups = self.param_groups
        live = [g for g in groups if not g.get("frozen", False)]
        if self.check_grads and self._nonfinite_grads(groups):
            self.last_skipped = True
            return None
        if len(live) == len(groups):
            return super().step(closure, **kwargs)
        self.param_groups = live
        try:
            return super().step(closure, **kwargs) if live else None
        finally:
            self.param_groups = groups


class GuardedAdamW(_Guard, torch.optim.AdamW):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._guard_init()


def guarded_cpu_adam(param_groups, **kwargs):
    """DeepSpeed's CPU Adam (ZeRO-Offload) with the same guard (compiled on first use)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # DeepSpeed takes seconds to import: only CPU offload needs it

    class GuardedCPUAdam(_Guard, DeepSpeedCPUAdam):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._guard_init()

    return GuardedCPUAdam(param_groups, adamw_mode=True, **kwargs)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Four groups: (backbone | gates) × (decay | no decay). Biases and norm weights (1-D, by their full shape) are not decayed.
    The ``part`` key lets the trainer freeze the backbone (A14)."""
    groups = {(part, decay): [] for part in ("backbone", "gates") for decay in (True, False)}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = "gates" if name.startswith("gates.") else "backbone"
        # Under ZeRO-3 a parameter built inside zero.Init holds an empty 1-D partition; its real shape is
        # ds_shape. Reading p.ndim there would put every matrix in the no-decay group.
        shape = getattr(p, "ds_shape", p.shape)
        groups[(part, len(shape) >= 2)].append(p)
    out = []
    for (part, decay), params in groups.items():
        if params:
            out.append({"params": params, "weight_decay": weight_decay if decay else 0.0, "part": part,
                        "frozen": False, "name": f"{part}{'' if decay else '_no_decay'}"})
    return out


__all__ = ["GuardedAdamW", "guarded_cpu_adam", "param_groups"]
