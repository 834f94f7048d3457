"""What a resume compares with its checkpoint beyond the model shape: the data, the optimizer's own
hyper-parameters, and every other setting — so a resume either refuses a change it cannot honour (naming the old
and the new value) or honours it and says so.

* The data: a checkpoint records the fingerprint of its training (and validation) data
  (:mod:`adaponder.data.fingerprint`). Other data is refused unless ``train.allow_data_change``; checkpoints from
  before the record resume with a notice.
* The optimizer: DeepSpeed restores the optimizer's parameter groups with the checkpoint, hyper-parameters
  included, so a new ``optim.weight_decay``, ``optim.betas`` or ``optim.eps`` would be written into
  ``config.yaml`` while the old one kept running. Such a change is refused unless ``train.allow_optim_change``;
  allowed, the new values are put into the parameter groups after the load (:func:`apply_optimizer_values`).
  (``optim.lr`` and the schedule keys: :func:`check_schedule`.) Fine-tuning's ``train.lr``,
  ``train.lambda_lr`` and ``train.weight_decay`` are checked the same way (:class:`OptimizerValues`).
* Everything else a run reads from its configuration at every step (logging, evaluation, checkpoint interval,
  gradient clipping...) simply takes the new value; :func:`setting_changes` lists them for the log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaponder.data.fingerprint import describe

from .checkpoint import CheckpointError

OPTIM_KEYS = ("optim.weight_decay", "optim.betas", "optim.eps")
# One-resume permissions: not settings of the run, never reported as changes.
_PERMISSIONS = {"train.allow_schedule_change", "train.allow_data_change", "train.allow_optim_change"}


def _fmt(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


# -- the data ---------------------------------------------------------------------------------------------
def data_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """One line per data source (train, val) whose fingerprint differs from the checkpoint's. A source that
    one side does not record (validation turned on or off) is no change of the data trained on."""
    out = []
    for role in ("train", "val"):
        old, new = (saved or {}).get(role), now.get(role)
        if old and new and old.get("fingerprint") != new.get("fingerprint"):
            out.append(f"{role} data: {describe(old)} in the checkpoint, {describe(new)} now")
    return out


def check_data(resume_dir: Path, saved: dict[str, Any] | None, now: dict[str, Any], allow: bool
               ) -> tuple[list[str], str | None]:
    """``(changes allowed by train.allow_data_change, notice)``; raises :class:`CheckpointError` for other data.
    ``notice``: one line for a checkpoint that records no data fingerprint."""
    if saved is None:
        return [], (f"{resume_dir} records no data fingerprint (written before they were recorded): resuming on "
                    f"{describe(now.get('train'))} without checking that it is the data the run trained on")
    changes = data_changes(saved, now)
    if changes and not allow:
        raise CheckpointError(
            f"cannot resume from {resume_dir}: the data differs from the checkpoint's ({'; '.join(changes)}). "
            "Resume on the data the run was trained on, or pass --set train.allow_data_change=true to continue "
            "on the new data from this step")
    return changes, None


# -- the optimizer's hyper-parameters ---------------------------------------------------------------------
def _held(param_groups: list[dict[str, Any]]) -> dict[str, Any]:
    """What the parameter groups hold, by config key (the weight decay of the decayed groups: the largest)."""
    return {"optim.weight_decay": max(float(g.get("weight_decay", 0.0)) for g in param_groups),
            "optim.betas": [float(b) for b in param_groups[0]["betas"]], "optim.eps": float(param_groups[0]["eps"])}


def apply_optimizer_values(param_groups: list[dict[str, Any]], optim: Any) -> None:
    """Put ``optim``'s weight decay (not on the ``*_no_decay`` groups), betas and eps into the parameter groups,
    over what the checkpoint's optimizer state restored: the values a fresh optimizer would start with."""
    for group in param_groups:
        decayed = not str(group.get("name", "")).endswith("_no_decay")
        group["weight_decay"] = float(optim.weight_decay) if decayed else 0.0
        group["betas"] = tuple(float(b) for b in optim.betas)
        group["eps"] = float(optim.eps)


@dataclass(frozen=True)
class OptimizerValues:
    """A run's optimizer hyper-parameters by config key: ``held(groups)`` reads what parameter groups hold (by
    key; a key a run does not use may be left out), ``apply(groups)`` puts the configured values into them."""

    keys: tuple[str, ...]
    held: Callable[[list[dict[str, Any]]], dict[str, Any]]
    apply: Callable[[list[dict[str, Any]]], None]


def pretraining_values(optim: Any) -> OptimizerValues:
    """The pretraining optimizer's values (``optim``: the ``optim`` section; the learning rate follows the
    schedule, which has its own check)."""
    return OptimizerValues(OPTIM_KEYS, _held, lambda groups: apply_optimizer_values(groups, optim))


_GROUP_FIELDS = ("lr", "weight_decay", "betas", "eps")


def reconcile_optimizer(resume_dir: Path, param_groups: list[dict[str, Any]], values: OptimizerValues,
                        allow: bool) -> list[str]:
    """After the checkpoint's optimizer state is loaded (DeepSpeed restores the parameter groups' hyper-parameters
    with it): the changes ``key old → new`` from what the groups hold to the configured ``values``, which the groups
    then hold. A change is refused (:class:`CheckpointError` naming old and new values) unless ``allow``. Comparing
    the restored groups covers checkpoints from before any record too."""
    before = values.held(param_groups)
    restored = [{k: g[k] for k in _GROUP_FIELDS if k in g} for g in param_groups]
    values.apply(param_groups)
    after = values.held(param_groups)
    changes = [f"{key} {_fmt(before[key])} → {_fmt(after[key])}" for key in values.keys
               if key in before and before[key] != after.get(key)]
    if changes and not allow:
        for group, held in zip(param_groups, restored):
            group.update(held)
        raise CheckpointError(
            f"cannot resume from {resume_dir}: the optimizer's hyper-parameters would change ({'; '.join(changes)}). "
            "The checkpoint's optimizer state carries the old values; resume with them, or pass --set "
            "train.allow_optim_change=true to apply the new ones from this step")
    return changes


# -- the schedules ----------------------------------------------------------------------------------------
_STEP_KEYS = ("train.steps", "optim.warmup", "schedule.s0", "schedule.s1", "init.gates_only_tokens")


def check_schedule(resume_dir: Path, state: dict[str, Any], now: dict[str, Any], allow: bool) -> list[str]:
    """A resume that would silently rebuild the schedules (another ``train.steps``, warm-up, decay...; ``now``: the
    schedule record of this run by config key) is an error unless ``allow`` (``train.allow_schedule_change``);
    returns the changes it allows, one line each."""
    saved = state.get("lr_schedule")
    if saved is None:  # checkpoints before the record: what their plan and schedule hold
        plan, sch = state.get("plan", {}), state.get("schedule", {})
        saved = {"train.steps": plan.get("total_steps"), "optim.warmup": plan.get("warmup_steps"),
                 "schedule.s0": plan.get("s0"), "schedule.s1": plan.get("s1"), "schedule.k_max": sch.get("k_max"),
                 "schedule.ponder_weight": sch.get("ponder_weight"),
                 "init.gates_only_tokens": sch.get("gates_only_steps")}
    changes = [f"{key}{' (steps)' if key in _STEP_KEYS else ''}: {saved[key]} in the checkpoint, {value} now"
               for key, value in now.items() if saved.get(key) is not None and saved[key] != value]
    if changes and not allow:
        raise CheckpointError(
            f"cannot resume from {resume_dir}: the schedule would change ({'; '.join(changes)}). The "
            "learning-rate and ponder-loss schedules follow from these keys, so resuming would silently rebuild "
            "them mid-run. Resume with the checkpoint's values, or pass --set train.allow_schedule_change=true "
            "to continue on the new schedule from this step")
    return changes


# -- every other setting ----------------------------------------------------------------------------------
def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and prefix.count(".") < 1:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def setting_changes(saved: dict[str, Any] | None, now: dict[str, Any], reported: set[str]) -> list[str]:
    """``key old → new`` for every configuration key that differs from the checkpoint's configuration, except
    the permissions and the keys in ``reported`` (listed by their own check)."""
    if not saved:
        return []
    old, new = _flatten(saved), _flatten(now)
    skip = _PERMISSIONS | reported
    return [f"{key} {_fmt(old.get(key))} → {_fmt(new.get(key))}" for key in sorted(set(old) | set(new))
            if key not in skip and old.get(key) != new.get(key)]


# -- the whole review --------------------------------------------------------------------------------------
@dataclass
class ResumeReview:
    """What a resume allowed to differ from its checkpoint, one line per change, for the log."""

    data: list[str] = field(default_factory=list)
    data_notice: str | None = None
    optimizer: list[str] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)


def review_resume(cfg: Any, resume_dir: Path | None, state: dict[str, Any] | None, data_now: dict[str, Any],
                  reported: set[str]) -> ResumeReview:
    """Before loading: the data check and the list of other changed settings (``reported``: keys another check
    lists). The optimizer is compared after the load (:func:`reconcile_optimizer`)."""
    if resume_dir is None or state is None:
        return ResumeReview()
    data, notice = check_data(resume_dir, state.get("data"), data_now, cfg.train.allow_data_change)
    settings = setting_changes(state.get("config"), cfg.to_dict(), reported | set(OPTIM_KEYS))
    return ResumeReview(data=data, data_notice=notice, settings=settings)


def log_review(log: Any, step: int, review: ResumeReview) -> None:
    """Each allowed change as one console line and one event of ``metrics.jsonl`` (``log`` is a sink's ``log``)."""
    if review.data_notice:
        log({"kind": "event", "step": step, "event": "data_unchecked", "message": review.data_notice},
            review.data_notice)
    if review.data:
        line = "; ".join(review.data)
        log({"kind": "event", "step": step, "event": "data_changed", "changes": line},
            f"data changed on resume (train.allow_data_change): {line}; training continues on the new data from "
            f"step {step}")
    if review.optimizer:
        line = "; ".join(review.optimizer)
        log({"kind": "event", "step": step, "event": "optimizer_changed", "changes": line},
            f"resumed with {line} (train.allow_optim_change): applied to the optimizer from step {step}")
    if review.settings:
        line = "; ".join(review.settings)
        log({"kind": "event", "step": step, "event": "settings_changed", "changes": line},
            f"resumed with changed settings: {line}")


__all__ = ["OPTIM_KEYS", "OptimizerValues", "ResumeReview", "apply_optimizer_values", "check_data", "check_schedule",
           "data_changes", "log_review", "pretraining_values", "reconcile_optimizer", "review_resume",
           "setting_changes"]
