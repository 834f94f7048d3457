"""The DeepSpeed configuration, generated from the training YAML (never written by hand).

The optimizer and the learning-rate schedule stay on our side (a client AdamW whose step can be vetoed, a
learning rate computed from the step), so a resumed run depends on nothing but the saved states. DeepSpeed
owns ZeRO partitioning, offload, mixed precision, gradient accumulation and gradient clipping.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .config import DeepSpeedConfig, TrainConfigError, batch_override_problems


@dataclass(frozen=True)
class BatchSizes:
    """The batch of one optimizer step as DeepSpeed counts it: per rank, accumulated, and over all ranks."""

    micro_batch: int
    grad_accum: int
    global_batch: int

    @classmethod
    def of(cls, plan: Any) -> BatchSizes:
        """The sizes of anything that holds them by these names (a pretraining :class:`~.config.RunPlan`)."""
        return cls(int(plan.micro_batch), int(plan.grad_accum), int(plan.global_batch))


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def clips_in_deepspeed(ds: DeepSpeedConfig) -> bool:
    """Whether DeepSpeed clips gradients. Without ZeRO in fp32, DeepSpeed clips but never reports the
    norm, so the trainer clips (and measures) itself there."""
    return not (ds.zero_stage == 0 and ds.precision == "fp32")


def build_ds_config(ds: DeepSpeedConfig, batch: BatchSizes, grad_clip: float, n_params: int | None = None,
                    source: str | None = None) -> dict[str, Any]:
    """The DeepSpeed config dict of a run with the ``deepspeed`` section ``ds``, the batch sizes ``batch`` and the
    gradient-clipping norm ``grad_clip`` (0: none). ``n_params`` sizes the communication buckets: DeepSpeed's
    default (5e8 elements, 2 GB in fp32) is allocated again at every micro-batch, which dominates the step time
    of small models. ``source``: the config file, for the message of a batch override that disagrees."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    bucket = min(500_000_000, -(-int(n_params or 5e8) // 2**20) * 2**20)  # whole MiB-elements (alignment)
    if ds.zero_stage >= 1:
        zero.update(contiguous_gradients=True, overlap_comm=ds.zero_stage >= 2, reduce_scatter=True,
                    reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    if ds.offload_optimizer != "none":
        off = {"device": ds.offload_optimizer, "pin_memory": True}
        if ds.offload_optimizer == "nvme":
            off["nvme_path"] = ds.nvme_path
        zero["offload_optimizer"] = off
    if ds.offload_param != "none":
        off = {"device": ds.offload_param, "pin_memory": True}
        if ds.offload_param == "nvme":
            off["nvme_path"] = ds.nvme_path
        zero["offload_param"] = off
    if ds.zero_stage == 3:
        zero.update(stage3_gather_16bit_weights_on_model_save=True, stage3_prefetch_bucket_size=bucket // 10,
                    stage3_param_persistence_threshold=min(int(1e5), bucket // 100))
        zero.pop("allgather_bucket_size")

    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch.micro_batch,
        "gradient_accumulation_steps": batch.grad_accum,
        "train_batch_size": batch.global_batch,
        "gradient_clipping": grad_clip if clips_in_deepspeed(ds) else 0.0,
        "zero_optimization": zero,
        # Our AdamW subclass (vetoable step) is not on ZeRO's list of tested optimizers.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": ds.precision == "bf16"},
        "fp16": {"enabled": ds.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
    }
    if ds.precision == "bf16":
        out["bf16"]["check_grad_overflow"] = True
        if ds.zero_stage >= 1:
            # Accumulate gradients in fp32 (ZeRO-1 then uses DeepSpeed's BF16 optimizer); without ZeRO
            # DeepSpeed only supports accumulating in the model's dtype.
            out["data_types"] = {"grad_accum_dtype": "fp32"}
    # Activation checkpointing is the model's own per-pass checkpointing (the trainer switches it on);
    # DeepSpeed's activation_checkpointing section only configures its Megatron-style API, which we don't use.
    if problems := batch_override_problems(ds.overrides or {}, batch):
        raise TrainConfigError(problems, source)
    return _deep_merge(out, ds.overrides or {})


__all__ = ["BatchSizes", "build_ds_config", "clips_in_deepspeed"]
