"""Whether model weights are all finite (no NaN or inf).

A run resumed from non-finite weights can only skip steps, and every checkpoint it then writes holds the same
broken weights: so each checkpoint records ``weights_finite`` when it is saved, rotation keeps the newest
checkpoint whose weights were finite, and resume, export and evaluation refuse non-finite weights by name.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from adaponder.errors import UsageError


class NonFiniteWeightsError(UsageError):
    """Weights holding NaN or inf where finite ones are needed (export, evaluation); the message names them."""


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """``"<name> holds NaN"`` (or ``inf``) for the first floating-point tensor that is not all finite, else None."""
    for name, t in named:
        if torch.is_tensor(t) and t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            return f"{name} holds {'NaN' if bool(torch.isnan(t).any()) else 'inf'}"
    return None


def _local_tensors(module: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """This rank's weights: the parameters, or under ZeRO-3 this rank's partition of each (``ds_tensor``)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    for name, p in module.named_parameters():
        if hasattr(p, "ds_tensor"):  # the partition is padded to equal sizes: the padding is never initialised
            part = p.ds_tensor.detach().reshape(-1)
            yield name, part[:max(0, min(part.numel(), int(p.ds_numel) - rank * part.numel()))]
        else:
            yield name, p.detach()


def module_weights_problem(module: torch.nn.Module) -> str | None:
    """Collective when a process group exists: the first non-finite weight on any rank (described on rank 0's
    terms when it has one), or None when every rank's weights are finite."""
    local = first_nonfinite(_local_tensors(module))
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return local
    found: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(found, local)
    return next((f for f in found if f), None)


__all__ = ["NonFiniteWeightsError", "first_nonfinite", "module_weights_problem"]
