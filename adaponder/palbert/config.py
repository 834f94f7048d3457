"""Typed configuration of a GLUE fine-tuning run (``configs/glue/<task>.yaml``, docs/method.md (b), B8).

A YAML file has the sections below; every key is optional except ``task``. The ``deepspeed`` section is the
pretraining config's (:class:`adaponder.train.config.DeepSpeedConfig`: ``zero_stage``, ``precision``,
offload, ``overrides``) with fine-tuning defaults (no ZeRO, fp32); ``checkpoint`` and ``logging`` configure
the same checkpoint manager and metrics sink as pretraining. :func:`load_finetune_config`
applies ``--set section.key=value`` overrides (values parsed as YAML), then validates everything at once:
unknown keys, wrong types and inconsistent values are all listed in one :class:`FinetuneConfigError`
naming the file. Each key's type and limits are in its section's annotations (validated by pydantic through
:mod:`adaponder.typed_config`, which also reads YAML 1.1's number strings such as ``1e-5``); checks across keys
are :func:`_cross_problems`. Defaults follow B8 (Adam, constant LR, batch 32, max length 128, early stopping on the
dev metric) and B6/B7 (λ_p = 0.1, β = 0.5, KL(p_G ‖ p)).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import Field

from adaponder import typed_config
from adaponder.core_modes import ATTN_IMPLEMENTATIONS, CORE_MODE_CHOICES
from adaponder.palbert.glue import GLUE_TASKS
from adaponder.palbert.metrics import METRIC_NAMES, canonical_task
from adaponder.palbert.pondernet import EXIT_RULES, ExitRule, KLDirection, Method, rules_for_method
from adaponder.train.config import CheckpointSettings, DeepSpeedConfig, LoggingSettings, deepspeed_problems
from adaponder.typed_config import (Count, Float, Int, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                                    UnitFloat)

#: A dropout probability.
Dropout = Annotated[Float, Field(ge=0, lt=1)]

__all__ = [
    "FinetuneConfigError",
    "ModelSection",
    "LossSection",
    "DataSection",
    "TrainSection",
    "EvalSection",
    "TimingSection",
    "CheckpointSection",
    "LoggingSection",
    "DeepSpeedSection",
    "FinetuneConfig",
    "SECTIONS",
    "load_finetune_config",
    "parse_overrides",
]


class FinetuneConfigError(typed_config.ConfigError):
    """Raised once, listing every problem of a fine-tuning configuration."""

    what = "the fine-tuning configuration"


@dataclass
class ModelSection:
    """The classifier (B1–B3) and its core. ``core_mode: null`` keeps the checkpoint's mode (GPT-NeoX →
    ``vanilla``; ``adaponder`` → ``ponderlm``); ``tiny-random`` inits default to ``ponderlm``.
    ``random_shape`` overrides the ``tiny`` preset's shape for ``--init tiny-random``."""

    method: Method = "palbert"
    #: N, the exit points.
    passes: Count = 4
    core_mode: Literal[CORE_MODE_CHOICES] | None = None
    pooler: bool = False
    classifier_dropout: Dropout = 0.1
    lambda_layers: NonNegativeInt = 3
    lambda_dropout: Dropout = 0.1
    lambda_init_bias: Float | None = None
    attn_implementation: Literal[ATTN_IMPLEMENTATIONS] = "sdpa"
    random_shape: dict = field(default_factory=dict)


@dataclass
class LossSection:
    """B6/B7: ``L = L_rec + β·KL``, geometric prior with λ_p; ``kl_direction`` ``prior_to_p`` = KL(p_G ‖ p)."""

    beta: NonNegativeFloat = 0.5
    lambda_p: Annotated[Float, Field(gt=0, lt=1)] = 0.1
    kl_direction: KLDirection = "prior_to_p"


@dataclass
class DataSection:
    """Tokenisation: ``text_a + sep + text_b + suffix``, truncated to ``max_length`` (B8: 128).
    ``sep``/``suffix`` are token strings (special tokens by name; empty = none). ``tokenizer: null`` is the
    bundled Pythia tokenizer. ``hf_dataset``: read GLUE through Hugging Face ``datasets`` (a dataset name such as
    ``nyu-mll/glue`` at ``hf_revision``, or a ``save_to_disk`` folder; :mod:`adaponder.palbert.glue_datasets`)
    instead of the TSV folder (``--data-dir`` / ``$ADAPONDER_GLUE_DIR``); the examples are the same."""

    max_length: Annotated[Int, Field(ge=4)] = 128
    sep: str = "<|endoftext|>"
    suffix: str = "<|endoftext|>"
    tokenizer: str | None = None
    hf_dataset: str | None = None
    hf_revision: str | None = None


@dataclass
class TrainSection:
    """B8. ``epochs`` may be fractional; ``max_steps > 0`` caps the steps. ``eval_every: 0`` evaluates once
    per epoch. Early stopping: stop after ``early_stopping_patience`` evaluations without improvement of
    the dev main metric under ``select_rule`` (null = Q-exit, or PABEE for the PABEE baseline); the best
    weights are restored (from the best checkpoint). ``max_examples: 0`` uses the whole train split (else a
    seeded random subset). ``batch_size`` is global: each of the W ranks takes ``batch_size / W`` examples.
    ``stop_at``: stop after this step with a checkpoint (exit 0; continue with ``--resume auto``).
    ``threads`` (0 = leave torch's setting) sets torch's intra-op threads for the run; on a CPU shared
    with other jobs 1 is often faster than 2 (no OpenMP thread waits on a descheduled sibling). The device
    is DeepSpeed's accelerator (a GPU when there is one; ``DS_ACCELERATOR=cpu`` forces the CPU)."""

    seed: NonNegativeInt = 0
    lr: PositiveFloat = 2e-5
    lambda_lr: PositiveFloat = 1e-4
    weight_decay: NonNegativeFloat = 0.0
    batch_size: Count = 32
    epochs: PositiveFloat = 3.0
    max_steps: NonNegativeInt = 0
    eval_every: NonNegativeInt = 0
    early_stopping_patience: Count = 3
    select_rule: ExitRule | None = None
    #: 0 = no clipping.
    grad_clip: NonNegativeFloat = 1.0
    max_examples: NonNegativeInt = 0
    log_every: NonNegativeInt = 50
    save_model: bool = False
    stop_at: Count | None = None
    threads: NonNegativeInt = 0
    #: A resume may continue on other GLUE data (another fingerprint of the train or dev examples) only when true.
    allow_data_change: bool = False
    #: A resume may change ``train.lr``, ``train.lambda_lr`` or ``train.weight_decay`` only when true (then applied
    #: to the optimizer; the checkpoint's optimizer state carries the old values).
    allow_optim_change: bool = False


@dataclass
class EvalSection:
    """Dev evaluation of every exit rule. ``q``: B9's threshold; ``patience``: PABEE's t; ``sample_draws``:
    the sampling rule's metric is averaged over this many seeded draws. ``max_examples: 0`` = whole dev."""

    q: UnitFloat = 0.5
    patience: Count = 2
    sample_draws: Count = 5
    batch_size: Count = 64
    max_examples: NonNegativeInt = 0
    rules: list[ExitRule] = field(default_factory=lambda: list(EXIT_RULES))


@dataclass
class TimingSection:
    """Measured time per example with early exit (each rule) against always-last, at each batch size,
    over the first ``max_examples`` dev examples; the speed-up is the median over up to ``repeats`` rounds of
    interleaved runs, with its spread (:mod:`adaponder.palbert.timing`)."""

    enabled: bool = True
    batch_sizes: Annotated[list[Count], Field(min_length=1)] = field(default_factory=lambda: [1, 32])
    max_examples: Count = 256
    repeats: Count = 5
    #: Seconds for the whole phase, shared equally by the batch sizes; fewer rounds and examples are timed when
    #: it runs out (each batch size stops at the first batch past its share). ``null``: no budget.
    budget_seconds: PositiveFloat | None = 60.0
    rules: list[ExitRule] = field(default_factory=lambda: list(EXIT_RULES))
    #: 0 = leave torch's setting.
    threads: NonNegativeInt = 0


@dataclass
class CheckpointSection(CheckpointSettings):
    """Checkpoints of the pretraining trainer's manager (:class:`adaponder.train.config.CheckpointSettings`):
    written after every dev evaluation, every ``every`` steps (0 = no extra ones), on SIGTERM/SIGINT and at
    ``stop_at``. The newest ``keep`` are kept, and always the best one (its weights are restored for the final
    evaluation). ``dir: null`` = ``<output>/checkpoints``."""

    keep: Count = 2


@dataclass
class LoggingSection(LoggingSettings):
    """The pretraining trainer's metrics sink (:class:`adaponder.train.config.LoggingSettings`): progress bars for
    every phase (training, dev evaluation, exit rules, timing)."""

    wandb_project: str = "adaponder-glue"


@dataclass
class DeepSpeedSection(DeepSpeedConfig):
    """:class:`adaponder.train.config.DeepSpeedConfig` with fine-tuning defaults: ZeRO off, fp32."""

    zero_stage: Annotated[Int, Field(ge=0, le=3)] = 0
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"


@dataclass
class FinetuneConfig:
    """``init``: the checkpoint to start from (a local folder, a Hugging Face hub id at ``init_revision``, or
    ``tiny-random``); ``--init`` / ``--init-revision`` override both."""

    task: str = ""
    init: str | None = None
    init_revision: str | None = None
    model: ModelSection = field(default_factory=ModelSection)
    loss: LossSection = field(default_factory=LossSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    timing: TimingSection = field(default_factory=TimingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @property
    def select_rule(self) -> str:
        return self.train.select_rule or ("pabee" if self.model.method == "pabee" else "q")


# The dataclass-typed fields (model, loss, ..., deepspeed); the other fields (task, init, init_revision) are
# top-level values.
_HINTS = typing.get_type_hints(FinetuneConfig)
SECTIONS: dict[str, type] = {name: tp for name, tp in _HINTS.items() if dataclasses.is_dataclass(tp)}
_VALUES = tuple(name for name in _HINTS if name not in SECTIONS)


# ------------------------------------------------------------------------------------------- validation


def _cross_problems(cfg: FinetuneConfig, bad: set[str]) -> list[str]:
    """Checks beyond one key's type and limits: the task's data, and keys that constrain each other. A check
    is skipped when a key it reads was already reported (``bad``: dotted keys and whole sections)."""
    problems: list[str] = []

    def check(keys: tuple[str, ...], ok: bool, message: str):
        if not ok and not any(k in bad or k.split(".")[0] in bad for k in keys):
            problems.append(f"{keys[0]}: {message}")

    if "task" not in bad:
        try:
            name = canonical_task(cfg.task)
            check(("task",), name in GLUE_TASKS,
                  f"has no GLUE data here: {cfg.task!r} (available: {', '.join(GLUE_TASKS)})")
        except ValueError:
            problems.append(f"task: must be a GLUE task ({', '.join(METRIC_NAMES)}); got {cfg.task!r}")
    d, t, ds = cfg.data, cfg.train, cfg.deepspeed
    check(("data.hf_revision", "data.hf_dataset"), d.hf_revision is None or bool(d.hf_dataset),
          "applies to data.hf_dataset, which is null")
    allowed = rules_for_method(cfg.model.method)
    check(("train.select_rule", "model.method"), t.select_rule is None or t.select_rule in allowed,
          f"must be null or one of {', '.join(allowed)} for method {cfg.model.method!r}; got {t.select_rule!r}")
    for keys, problem in deepspeed_problems(ds):
        check(keys, False, problem)
    return problems


def build_finetune_config(values: Mapping[str, Any], source: str | None = None) -> FinetuneConfig:
    """Validate a mapping (a parsed YAML file, overrides applied) into a :class:`FinetuneConfig`."""
    problems: list[str] = []
    bad: set[str] = set()
    if not isinstance(values, Mapping):
        raise FinetuneConfigError([f"the top level must be a mapping, got {type(values).__name__}"], source)
    kwargs: dict[str, Any] = typed_config.validate_sections(values, SECTIONS, problems, bad, others=_VALUES)
    raw_ds = values.get("deepspeed")
    if isinstance(raw_ds, Mapping) and any(k in raw_ds for k in ("zero_optimization", "bf16", "fp16")):
        problems.append("deepspeed: takes typed keys (zero_stage, precision, offload_optimizer, ...); raw DeepSpeed "
                        "settings go under deepspeed.overrides (deep-merged into the generated DeepSpeed config)")
    for key in (k for k in _VALUES if k in values):
        try:
            kwargs[key] = typed_config.coerce(values[key], _HINTS[key])
        except ValueError as err:
            problems.append(f"{key}: {err}")
            bad.add(key)
    if "task" not in values:
        problems.append(f"task: required ({', '.join(GLUE_TASKS)})")
        bad.add("task")
    cfg = FinetuneConfig(**kwargs)
    problems += _cross_problems(cfg, bad)
    if problems:
        raise FinetuneConfigError(problems, source)
    return cfg


def parse_overrides(pairs: list[str] | None) -> list[tuple[list[str], Any]]:
    """``["train.lr=1e-3", "model.passes=6"]`` → ``[(["train", "lr"], 0.001), ...]`` (values parsed as YAML)."""
    return [typed_config.parse_override(pair, FinetuneConfigError) for pair in pairs or []]


def _merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: sections (mappings) merged key by key, any other value replaced."""
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merged(out[key], value) if both else value
    return out


def read_preset(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The values of a fine-tuning YAML file; ``extends: FILE`` (a file beside it) reads FILE first and lays this
    file's keys over it, so that a task preset is its ``task:`` over the one recipe (``configs/glue/base.yaml``)."""
    path = Path(path)
    values = typed_config.read_yaml(path, FinetuneConfigError)
    if "extends" not in values:
        return values
    parent = values.pop("extends")
    if not isinstance(parent, str) or not parent:
        raise FinetuneConfigError([f"extends: {parent!r}, expected the file name of a config beside {path}"],
                                  str(path))
    parent_path = (path.parent / parent).resolve()
    if parent_path in _seen or parent_path == path.resolve():
        raise FinetuneConfigError([f"extends: {parent!r} leads back to a file that extends it"], str(path))
    return _merged(read_preset(parent_path, (*_seen, path.resolve())), values)


def load_finetune_config(path: str | Path | None = None, overrides: list[str] | None = None,
                         base: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """Read a YAML config (with the file it ``extends``; or start from ``base``), apply ``--set`` overrides,
    validate."""
    values: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        values = read_preset(path)
    if base is not None:
        values = {**base, **values}
    values = typed_config.apply_overrides(values, overrides, FinetuneConfigError)
    if overrides:
        source = f"{source or 'config'} (with --set {' '.join(overrides)})"
    return build_finetune_config(values, source)
