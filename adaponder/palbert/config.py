"""Typed configuration of a GLUE fine-tuning run (``configs/glue/<task>.yaml``, docs/method.md (b), B8).

A YAML file has the sections below; every key is optional except ``task``. The ``deepspeed`` section is the
pretraining config's (:class:`adaponder.train.config.DeepSpeedConfig`: ``zero_stage``, ``precision``,
offload, ``overrides``) with fine-tuning defaults (no ZeRO, fp32); ``checkpoint`` and ``logging`` configure
the same checkpoint manager and metrics sink as pretraining. :func:`load_finetune_config`
applies ``--set section.key=value`` overrides (values parsed as YAML), then validates everything at once:
unknown keys, wrong types and inconsistent values are all listed in one :class:`FinetuneConfigError`
naming the file. Defaults follow B8 (Adam, constant LR, batch 32, max length 128, early stopping on the
dev metric) and B6/B7 (λ_p = 0.1, β = 0.5, KL(p_G ‖ p)).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from adaponder import typed_config
from adaponder.core_modes import CORE_MODE_CHOICES
from adaponder.palbert.glue import GLUE_TASKS
from adaponder.palbert.metrics import METRIC_NAMES, canonical_task
from adaponder.palbert.pondernet import EXIT_RULES, KL_DIRECTIONS, METHODS, rules_for_method
from adaponder.train.config import DeepSpeedConfig

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

    method: str = "palbert"
    passes: int = 4
    core_mode: str | None = None
    pooler: bool = False
    classifier_dropout: float = 0.1
    lambda_layers: int = 3
    lambda_dropout: float = 0.1
    lambda_init_bias: float | None = None
    attn_implementation: str = "sdpa"
    random_shape: dict = field(default_factory=dict)


@dataclass
class LossSection:
    """B6/B7: ``L = L_rec + β·KL``, geometric prior with λ_p; ``kl_direction`` ``prior_to_p`` = KL(p_G ‖ p)."""

    beta: float = 0.5
    lambda_p: float = 0.1
    kl_direction: str = "prior_to_p"


@dataclass
class DataSection:
    """Tokenisation: ``text_a + sep + text_b + suffix``, truncated to ``max_length`` (B8: 128).
    ``sep``/``suffix`` are token strings (special tokens by name; empty = none). ``tokenizer: null`` is the
    bundled Pythia tokenizer. ``hf_dataset``: read GLUE through Hugging Face ``datasets`` (a dataset name such as
    ``nyu-mll/glue`` at ``hf_revision``, or a ``save_to_disk`` folder; :mod:`adaponder.data.glue_datasets`)
    instead of the TSV folder (``--data-dir`` / ``$ADAPONDER_GLUE_DIR``); the examples are the same."""

    max_length: int = 128
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

    seed: int = 0
    lr: float = 2e-5
    lambda_lr: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = 32
    epochs: float = 3.0
    max_steps: int = 0
    eval_every: int = 0
    early_stopping_patience: int = 3
    select_rule: str | None = None
    grad_clip: float = 1.0
    max_examples: int = 0
    log_every: int = 50
    save_model: bool = False
    stop_at: int | None = None
    threads: int = 0


@dataclass
class EvalSection:
    """Dev evaluation of every exit rule. ``q``: B9's threshold; ``patience``: PABEE's t; ``sample_draws``:
    the sampling rule's metric is averaged over this many seeded draws. ``max_examples: 0`` = whole dev."""

    q: float = 0.5
    patience: int = 2
    sample_draws: int = 5
    batch_size: int = 64
    max_examples: int = 0
    rules: list = field(default_factory=lambda: list(EXIT_RULES))


@dataclass
class TimingSection:
    """Measured time per example with early exit (each rule) against always-last, at each batch size,
    over the first ``max_examples`` dev examples; the minimum over ``repeats`` interleaved runs."""

    enabled: bool = True
    batch_sizes: list = field(default_factory=lambda: [1, 32])
    max_examples: int = 256
    repeats: int = 3
    rules: list = field(default_factory=lambda: list(EXIT_RULES))
    threads: int = 0


@dataclass
class CheckpointSection:
    """Checkpoints of the pretraining trainer's manager (sha256 manifest, atomic ``latest``): written after
    every dev evaluation, every ``every`` steps (0 = no extra ones), on SIGTERM/SIGINT and at ``stop_at``.
    The newest ``keep`` are kept, and always the best one (its weights are restored for the final
    evaluation). ``dir: null`` = ``<output>/checkpoints``."""

    dir: str | None = None
    every: int = 0
    keep: int = 2


@dataclass
class LoggingSection:
    """``metrics.jsonl`` in the output folder (train / eval / event records), console lines, tqdm progress
    bars for every phase (training, dev evaluation, exit rules, timing), optional wandb."""

    jsonl: bool = True
    console: bool = True
    progress_bar: bool = True
    wandb: bool = False
    wandb_project: str = "adaponder-glue"
    wandb_name: str | None = None


@dataclass
class DeepSpeedSection(DeepSpeedConfig):
    """:class:`adaponder.train.config.DeepSpeedConfig` with fine-tuning defaults: ZeRO off, fp32."""

    zero_stage: int = 0
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

    @property
    def select_rule(self) -> str:
        return self.train.select_rule or ("pabee" if self.model.method == "pabee" else "q")


_SECTIONS = {f.name: f for f in dataclasses.fields(FinetuneConfig)}
# The dataclass-typed fields (model, loss, ..., deepspeed); task/init are plain values.
_SECTION_TYPES = {name: tp for name, tp in typing.get_type_hints(FinetuneConfig).items()
                  if dataclasses.is_dataclass(tp)}


# ------------------------------------------------------------------------------------------- validation


def _semantic_problems(cfg: FinetuneConfig, bad: set[str]) -> list[str]:
    """Value checks for fields whose type was right (``bad`` holds the dotted keys already reported)."""
    problems: list[str] = []

    def check(key: str, ok: bool, message: str):
        if key not in bad and key.split(".")[0] not in bad and not ok:
            problems.append(f"{key}: {message}")

    m, lo, d, t, e, tm = cfg.model, cfg.loss, cfg.data, cfg.train, cfg.eval, cfg.timing
    if "task" not in bad:
        try:
            name = canonical_task(cfg.task)
            check("task", name in GLUE_TASKS,
                  f"has no GLUE data here: {cfg.task!r} (available: {', '.join(GLUE_TASKS)})")
        except ValueError:
            problems.append(f"task: must be a GLUE task ({', '.join(METRIC_NAMES)}); got {cfg.task!r}")
    check("model.method", m.method in METHODS, f"must be one of {', '.join(METHODS)}; got {m.method!r}")
    check("model.passes", m.passes >= 1, f"(N) must be >= 1, got {m.passes}")
    check("model.core_mode", m.core_mode is None or m.core_mode in CORE_MODE_CHOICES,
          f"must be null or one of {', '.join(CORE_MODE_CHOICES)}; got {m.core_mode!r}")
    check("model.classifier_dropout", 0 <= m.classifier_dropout < 1, f"must lie in [0, 1), got {m.classifier_dropout}")
    check("model.lambda_dropout", 0 <= m.lambda_dropout < 1, f"must lie in [0, 1), got {m.lambda_dropout}")
    check("model.lambda_layers", m.lambda_layers >= 0, f"must be >= 0, got {m.lambda_layers}")
    check("model.attn_implementation", m.attn_implementation in ("sdpa", "eager", "flash_attention_2"),
          f"must be sdpa, eager or flash_attention_2; got {m.attn_implementation!r}")
    check("loss.beta", lo.beta >= 0, f"(β) must be >= 0, got {lo.beta}")
    check("loss.lambda_p", 0 < lo.lambda_p < 1, f"(λ_p) must lie in (0, 1), got {lo.lambda_p}")
    check("loss.kl_direction", lo.kl_direction in KL_DIRECTIONS,
          f"must be prior_to_p (KL(p_G‖p)) or p_to_prior (KL(p‖p_G)); got {lo.kl_direction!r}")
    check("data.max_length", d.max_length >= 4, f"must be >= 4, got {d.max_length}")
    check("data.hf_revision", d.hf_revision is None or bool(d.hf_dataset), "applies to data.hf_dataset, which is null")
    check("train.lr", t.lr > 0, f"must be > 0, got {t.lr}")
    check("train.lambda_lr", t.lambda_lr > 0, f"must be > 0, got {t.lambda_lr}")
    check("train.weight_decay", t.weight_decay >= 0, f"must be >= 0, got {t.weight_decay}")
    check("train.batch_size", t.batch_size >= 1, f"must be >= 1, got {t.batch_size}")
    check("train.epochs", t.epochs > 0, f"must be > 0, got {t.epochs}")
    for key in ("max_steps", "eval_every", "max_examples", "log_every"):
        check(f"train.{key}", getattr(t, key) >= 0, f"must be >= 0, got {getattr(t, key)}")
    check("train.early_stopping_patience", t.early_stopping_patience >= 1,
          f"must be >= 1, got {t.early_stopping_patience}")
    check("train.stop_at", t.stop_at is None or t.stop_at >= 1, f"must be null or >= 1, got {t.stop_at}")
    check("train.threads", t.threads >= 0, f"must be >= 0 (0 = leave torch's setting), got {t.threads}")
    check("train.grad_clip", t.grad_clip >= 0, f"must be >= 0 (0 = off), got {t.grad_clip}")
    allowed = rules_for_method(m.method)
    check("train.select_rule", t.select_rule is None or t.select_rule in allowed,
          f"must be null or one of {', '.join(allowed)} for method {m.method!r}; got {t.select_rule!r}")
    check("eval.q", 0 <= e.q <= 1, f"must lie in [0, 1], got {e.q}")
    check("eval.patience", e.patience >= 1, f"(PABEE t) must be >= 1, got {e.patience}")
    check("eval.sample_draws", e.sample_draws >= 1, f"must be >= 1, got {e.sample_draws}")
    check("eval.batch_size", e.batch_size >= 1, f"must be >= 1, got {e.batch_size}")
    check("eval.max_examples", e.max_examples >= 0, f"must be >= 0, got {e.max_examples}")
    for sec, rules in (("eval", e.rules), ("timing", tm.rules)):
        unknown = [r for r in rules if r not in EXIT_RULES]
        check(f"{sec}.rules", not unknown, f"has unknown exit rules {unknown}; known: {', '.join(EXIT_RULES)}")
    check("timing.batch_sizes", bool(tm.batch_sizes) and all(isinstance(b, int) and not isinstance(b, bool)
                                                             and b >= 1 for b in tm.batch_sizes),
          f"must be a non-empty list of integers >= 1, got {tm.batch_sizes!r}")
    check("timing.max_examples", tm.max_examples >= 1, f"must be >= 1, got {tm.max_examples}")
    check("timing.repeats", tm.repeats >= 1, f"must be >= 1, got {tm.repeats}")
    check("timing.threads", tm.threads >= 0, f"must be >= 0 (0 = leave torch's setting), got {tm.threads}")
    c, ds = cfg.checkpoint, cfg.deepspeed
    check("checkpoint.every", c.every >= 0, f"must be >= 0 (0 = only at evaluations and stops), got {c.every}")
    check("checkpoint.keep", c.keep >= 1, f"must be >= 1, got {c.keep}")
    check("deepspeed.zero_stage", ds.zero_stage in (0, 1, 2, 3), f"must be 0, 1, 2 or 3, got {ds.zero_stage}")
    check("deepspeed.offload_optimizer", ds.offload_optimizer == "none" or ds.zero_stage >= 1,
          "needs zero_stage >= 1")
    check("deepspeed.offload_param", ds.offload_param == "none" or ds.zero_stage == 3, "needs zero_stage 3")
    check("deepspeed.nvme_path", "nvme" not in (ds.offload_optimizer, ds.offload_param) or bool(ds.nvme_path),
          "required for nvme offload")
    return problems


def build_finetune_config(values: Mapping[str, Any], source: str | None = None) -> FinetuneConfig:
    """Validate a mapping (a parsed YAML file, overrides applied) into a :class:`FinetuneConfig`."""
    problems: list[str] = []
    bad: set[str] = set()
    if not isinstance(values, Mapping):
        raise FinetuneConfigError([f"the top level must be a mapping, got {type(values).__name__}"], source)
    for key in values:
        if key not in _SECTIONS:
            problems.append(f"{key}: unknown key (known: {', '.join(_SECTIONS)})")
    kwargs: dict[str, Any] = {name: typed_config.build_section(cls, values.get(name), name, problems, bad)
                              for name, cls in _SECTION_TYPES.items()}
    raw_ds = values.get("deepspeed")
    if isinstance(raw_ds, Mapping) and any(k in raw_ds for k in ("zero_optimization", "bf16", "fp16")):
        problems.append("deepspeed: takes typed keys (zero_stage, precision, offload_optimizer, ...); raw DeepSpeed "
                        "settings go under deepspeed.overrides (deep-merged into the generated DeepSpeed config)")
    hints = typing.get_type_hints(FinetuneConfig)
    for key in (k for k in _SECTIONS if k not in _SECTION_TYPES):
        if key in values:
            try:
                kwargs[key] = typed_config.coerce(values[key], hints[key])
            except ValueError as err:
                problems.append(f"{key}: {err}")
                bad.add(key)
    if "task" not in values:
        problems.append(f"task: required ({', '.join(GLUE_TASKS)})")
        bad.add("task")
    cfg = FinetuneConfig(**kwargs)
    problems += _semantic_problems(cfg, bad)
    if problems:
        raise FinetuneConfigError(problems, source)
    return cfg


def parse_overrides(pairs: list[str] | None) -> list[tuple[list[str], Any]]:
    """``["train.lr=1e-3", "model.passes=6"]`` → ``[(["train", "lr"], 0.001), ...]`` (values parsed as YAML)."""
    return [typed_config.parse_override(pair, FinetuneConfigError) for pair in pairs or []]


def load_finetune_config(path: str | Path | None = None, overrides: list[str] | None = None,
                         base: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """Read a YAML config (or start from ``base``), apply ``--set`` overrides, validate."""
    values: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        values = typed_config.read_yaml(path, FinetuneConfigError)
    if base is not None:
        values = {**base, **values}
    values = typed_config.apply_overrides(values, overrides, FinetuneConfigError)
    if overrides:
        source = f"{source or 'config'} (with --set {' '.join(overrides)})"
    return build_finetune_config(values, source)
