"""The training configuration: typed sections loaded from YAML, ``--set`` overrides, one error for every problem.

A run is described by one YAML file with these sections (all optional except what the run needs)::

    model:       Pythia size preset (``size: 410m``) plus AdaPonderConfig fields, or a full AdaPonderConfig mapping
    data:        prepared data folder (``path``), optionally raw inputs to prepare into it, ``seq_len``, tokenizer
    optim:       AdamW + warm-up/cosine learning-rate schedule + gradient clipping
    schedule:    the A13 ponder-loss schedule: S0, S1 (steps, or fractions of training), lambda, k_max
    deepspeed:   ZeRO stage, offload, precision, activation checkpointing, raw overrides
    checkpoint:  folder, interval, how many to keep, HF export at the end
    logging:     interval, JSONL, wandb, peak FLOP/s for MFU
    eval:        validation interval and size, end-of-run report
    train:       output folder, steps or token budget, micro-batch, accumulation or global batch, seed
    init:        continued pretraining (A14): backbone checkpoint, gates-only token budget
    debug:       fault injection for tests (non-finite losses, a crash in the middle of a save)

``load_config(path, overrides)`` returns a :class:`TrainConfig` or raises one :class:`TrainConfigError` that
names the file and every offending key path (``optim.lr``), so a user fixes everything in one go.

Numbers: YAML 1.1 reads ``1e-3`` as a string; number fields accept such strings. Integer fields accept
integral floats (``tokens: 3.0e11``). Fields that are "steps or fractions" (``schedule.s0``,
``optim.warmup``) read an integer as a step count and a float in [0, 1] as a fraction of all steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from adaponder import typed_config

PRECISIONS = ("fp32", "bf16", "fp16")
OFFLOAD = ("none", "cpu", "nvme")
DECAYS = ("cosine", "linear", "constant")


class TrainConfigError(typed_config.ConfigError):
    """Every problem of a training configuration, listed at once, naming the file and key paths."""

    what = "the training configuration"


StepsOrFraction = Union[int, float]


# -- sections ---------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    #: ``packed``: ``path`` is a prepared data folder (``adaponder-prepare`` output: ``meta.json`` + shards).
    #: ``indexed``: ``path`` is the PREFIX of a Megatron/GPT-NeoX indexed dataset (``PREFIX.bin`` +
    #: ``PREFIX.idx``, e.g. Pythia's pre-tokenized Pile); see :mod:`adaponder.data.indexed`.
    format: Literal["packed", "indexed"] = "packed"
    #: Prepared data folder, or the indexed dataset's PREFIX (``data.format: indexed``).
    path: str | None = None
    #: ``data.format: indexed`` only. ``sequences``: every item is one ready sample of ``seq_len + 1`` tokens,
    #: read in stored order (global batch b = items b·G … b·G+G−1: Pythia's pre-shuffled Pile, bit for bit);
    #: ``documents``: items are documents, packed with EOD and shuffled by seed like prepared shards.
    order: Literal["sequences", "documents"] = "sequences"
    #: ``documents`` order: put the EOD token after every document (``null``: unless they end with it already).
    append_eod: bool | None = None
    #: A separate validation source: a prepared data folder (its ``val_split``) or an indexed PREFIX (all of
    #: it; order ``val_order``, default ``order``). ``null``: the ``val`` split of ``path`` (packed only).
    val_path: str | None = None
    val_split: str = "val"
    val_order: Literal["sequences", "documents"] | None = None
    #: Raw inputs to prepare into ``path`` when it holds no ``meta.json`` yet: files, folders, globs, or
    #: ``"bundled"`` for the public-domain corpus shipped with adaponder. ``None``: ``path`` must exist.
    prepare: list[str] | None = None
    #: Tokenizer file/folder; ``None`` = ``<path>/tokenizer.json`` when the data folder holds one (a tokenizer
    #: trained by ``adaponder-prepare --train-tokenizer``), else the bundled Pythia (GPT-NeoX-20B) tokenizer.
    tokenizer: str | None = None
    #: When preparing on the fly: train a byte-level BPE tokenizer of this many entries on the train split.
    train_tokenizer: int | None = None
    #: Tokens per training sample (the model sees ``seq_len`` inputs and as many labels).
    seq_len: int = 2048
    #: Used only when preparing on the fly.
    val_fraction: float = 0.01
    text_field: str = "text"
    prepare_workers: int = 1


@dataclass
class OptimConfig:
    lr: float = 3e-4
    #: Final learning rate as a fraction of ``lr`` (Pythia: 0.1).
    min_lr_ratio: float = 0.1
    #: Linear warm-up: an integer is steps, a float in [0, 1] a fraction of all steps (Pythia: 1%).
    warmup: StepsOrFraction = 0.01
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.01
    #: Max global gradient norm; 0 disables clipping.
    grad_clip: float = 1.0


@dataclass
class ScheduleConfig:
    """A13: CE alone before ``s0``; then ``CE + ponder_weight · L_ponder`` with bottom-k fraction
    ``k = k_max · min(1, (step − s0) / (s1 − s0))``. Only ``adaponder`` mode has gates to train."""

    s0: StepsOrFraction = 0.2
    s1: StepsOrFraction = 0.4
    #: λ of A13.
    ponder_weight: float = 0.1
    k_max: float = 0.1


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 1
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    #: ZeRO-Offload of optimizer states (stages 1–3): none | cpu | nvme.
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    #: ZeRO-3 parameter offload: none | cpu | nvme.
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    #: Checkpoint each pass's activations (the model's per-pass activation checkpointing).
    activation_checkpointing: bool = False
    #: Deep-merged into the generated DeepSpeed config last (expert escape hatch, e.g. bucket sizes).
    overrides: dict = field(default_factory=dict)


@dataclass
class CheckpointConfig:
    #: Default: ``<train.out_dir>/checkpoints``. Must be on a filesystem every node sees.
    dir: str | None = None
    every: int = 1000
    keep: int = 3
    #: Export a Hugging Face checkpoint to ``<train.out_dir>/hf`` at the end of training.
    export_hf: bool = True


@dataclass
class LoggingConfig:
    every: int = 10
    #: Append metrics to ``<train.out_dir>/metrics.jsonl``.
    jsonl: bool = True
    console: bool = True
    progress_bar: bool = True
    wandb: bool = False
    wandb_project: str = "adaponder"
    wandb_name: str | None = None
    #: Peak FLOP/s of one device for MFU (logged as ``mfu_pct``). ``null``: CUDA devices from a table of known
    #: data-sheet peaks (:mod:`adaponder.train.peak`; unknown device: no MFU), CPUs measured at start-up.
    peak_flops: float | None = None


@dataclass
class EvalConfig:
    #: Validation every N steps (0: only at the end).
    every: int = 1000
    #: Cap on validation batches per rank (``None``: the whole val split).
    max_batches: int | None = 50
    micro_batch: int | None = None
    at_end: bool = True
    #: Write ``report.md`` + the exit-pass histogram at the end.
    report: bool = True


@dataclass
class RunConfig:
    """The ``train:`` section: output folder, length, batch, seed and stopping of the run."""

    out_dir: str = "runs/default"
    #: Optimizer steps; or give ``tokens`` (a budget: steps = ceil(tokens / tokens per step)).
    steps: int | None = None
    tokens: int | None = None
    micro_batch: int = 4
    #: Give one of these two; the other follows from micro_batch × ranks.
    grad_accum: int | None = None
    #: Sequences per optimizer step across all ranks (Pythia: 1024).
    global_batch: int | None = None
    seed: int = 1234
    #: Stop after this many consecutive skipped (non-finite) steps.
    max_consecutive_skips: int = 5
    #: Stop at this step with a checkpoint, as if preempted (the schedule still spans all steps); continue
    #: with ``--resume auto``. For jobs shorter than the run.
    stop_at: int | None = None
    #: ``torch.use_deterministic_algorithms(True)`` (bit-exact resume on CPU; slower on GPU).
    deterministic: bool = False
    #: torch intra-op threads per rank (CPU); ``None`` leaves torch's default.
    threads: int | None = None


@dataclass
class InitConfig:
    """A14: continued pretraining from a GPT-NeoX/Pythia or AdaPonder Hugging Face checkpoint: a local folder, or
    a hub id (``EleutherAI/pythia-410m-deduped``) with ``revision`` (``step143000``) resolved through the Hugging
    Face cache (:func:`adaponder.hub.resolve_pretrained`)."""

    backbone: str | None = None
    #: Hub ids only: branch, tag or commit (Pythia's checkpoints: ``step0`` … ``step143000``; null = main).
    revision: str | None = None
    #: Tokens of the first stage, in which only the gates train (backbone frozen); 0 = no such stage.
    gates_only_tokens: int = 0


@dataclass
class DebugConfig:
    """Fault injection used by the tests; leave empty for real runs."""

    #: Steps whose loss is multiplied by NaN.
    nonfinite_steps: list[int] = field(default_factory=list)
    #: Only on this rank (``None``: every rank).
    nonfinite_rank: int | None = None
    #: Raise in the middle of the checkpoint save at this step (after the files, before the rename).
    crash_in_save_at: int | None = None
    #: Write a digest of every training sample each rank reads to ``<out_dir>/trace/rank<r>.jsonl``.
    trace_batches: bool = False


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "deepspeed": DeepSpeedConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "eval": EvalConfig,
    "train": RunConfig,
    "init": InitConfig,
    "debug": DebugConfig,
}


@dataclass
class TrainConfig:
    model: dict = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: RunConfig = field(default_factory=RunConfig)
    init: InitConfig = field(default_factory=InitConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    #: Where the config came from (for messages); not part of the file.
    source: str | None = None

    # -- derived --------------------------------------------------------------------------------------
    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.out_dir / "checkpoints"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def model_config(self):
        """The :class:`AdaPonderConfig` of a fresh model (not used with ``init.backbone``)."""
        return build_model_config(self.model, self.source)

    def model_overrides(self) -> tuple[str, dict[str, Any]]:
        """(mode, overrides) for :meth:`AdaPonderForCausalLM.from_backbone` (continued pretraining)."""
        shape = ("size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        values = {k: v for k, v in self.model.items() if not (k in shape and v is None)}  # --set model.size=null
        values.pop("size", None)
        mode = values.pop("mode", "adaponder")
        return mode, values

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- the model section ------------------------------------------------------------------------------------
def build_model_config(values: Mapping[str, Any], source: str | None = None):
    """``size:`` preset + overrides, or a full :class:`AdaPonderConfig` mapping."""
    from adaponder.modeling import AdaPonderConfig, pythia_config

    values = dict(values)
    size = values.pop("size", None)
    if size is not None:
        mode = values.pop("mode", "adaponder")
        return pythia_config(str(size), mode, **values)
    return AdaPonderConfig.from_mapping(values, source=source)


def _model_problems(values: Any, has_backbone: bool) -> list[str]:
    from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError, pythia_shape

    if not isinstance(values, Mapping):
        return [f"model: must be a mapping, got {type(values).__name__}"]
    if has_backbone:
        # Continued pretraining: the shape comes from the checkpoint; only recurrence fields may be set.
        shape = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}
        probs = [f"model.{k}: unknown key" for k in values if k not in AdaPonderConfig.known_keys() | {"size"}]
        probs += [f"model.{k}: cannot be set together with init.backbone (the shape comes from the checkpoint)"
                  for k, v in values.items() if (k in shape or k == "size") and v is not None]
        return probs
    size = values.get("size")
    if size is not None:
        try:
            pythia_shape(str(size))
        except KeyError as err:
            return [f"model.size: {err.args[0]}"]
    elif not values:
        return ["model: give a Pythia preset (model.size: 70m, ..., tiny) or a full model configuration"]
    try:
        build_model_config(values)
    except AdaPonderConfigError as err:
        return [f"model: {p}" for p in err.problems]
    except (TypeError, ValueError) as err:
        return [f"model: {err}"]
    return []


# -- semantic checks -------------------------------------------------------------------------------------
def _check_steps_or_fraction(value: int | float, key: str, problems: list[str]) -> None:
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        problems.append(f"{key}: a float is a fraction of training and must lie in [0, 1], got {value} "
                        "(write an integer for a step count)")
    if isinstance(value, int) and value < 0:
        problems.append(f"{key}: must be >= 0, got {value}")


def _semantic_problems(cfg: TrainConfig) -> list[str]:
    p: list[str] = []
    d, o, s, ds, c, lg, ev, t, ini = (cfg.data, cfg.optim, cfg.schedule, cfg.deepspeed, cfg.checkpoint, cfg.logging,
                                      cfg.eval, cfg.train, cfg.init)
    if d.path is None:
        p.append("data.path: required (the prepared data folder, or where to prepare data.prepare)")
    if d.seq_len < 1:
        p.append(f"data.seq_len: must be >= 1, got {d.seq_len}")
    if not 0 <= d.val_fraction < 1:
        p.append(f"data.val_fraction: must lie in [0, 1), got {d.val_fraction}")
    if d.train_tokenizer is not None and d.tokenizer is not None:
        p.append("data.train_tokenizer: cannot be combined with data.tokenizer (train one, or name one)")
    if d.prepare is not None and not d.prepare:
        p.append("data.prepare: an empty list; give inputs (or 'bundled') or leave it out")
    if d.format == "indexed" and d.prepare is not None:
        p.append("data.prepare: prepares packed shards, not an indexed dataset; leave it out with data.format indexed")
    if d.format == "indexed" and d.val_path is None and (ev.every or ev.at_end):
        p.append("data.val_path: required with data.format indexed while validation is on (an indexed PREFIX such "
                 "as the Pile's validation set, or a prepared folder); or set eval.every: 0 and eval.at_end: false")
    if o.lr <= 0:
        p.append(f"optim.lr: must be > 0, got {o.lr}")
    if not 0 <= o.min_lr_ratio <= 1:
        p.append(f"optim.min_lr_ratio: must lie in [0, 1], got {o.min_lr_ratio}")
    _check_steps_or_fraction(o.warmup, "optim.warmup", p)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        p.append(f"optim.betas: must be two numbers in [0, 1), got {o.betas}")
    if o.eps <= 0:
        p.append(f"optim.eps: must be > 0, got {o.eps}")
    if o.weight_decay < 0:
        p.append(f"optim.weight_decay: must be >= 0, got {o.weight_decay}")
    if o.grad_clip < 0:
        p.append(f"optim.grad_clip: must be >= 0 (0 = no clipping), got {o.grad_clip}")
    _check_steps_or_fraction(s.s0, "schedule.s0", p)
    _check_steps_or_fraction(s.s1, "schedule.s1", p)
    if type(s.s0) is type(s.s1) and s.s1 < s.s0:
        p.append(f"schedule.s1 ({s.s1}) must not come before schedule.s0 ({s.s0})")
    if s.ponder_weight < 0:
        p.append(f"schedule.ponder_weight: must be >= 0, got {s.ponder_weight}")
    if not 0 <= s.k_max <= 1:
        p.append(f"schedule.k_max: must lie in [0, 1], got {s.k_max}")
    if ds.zero_stage not in (0, 1, 2, 3):
        p.append(f"deepspeed.zero_stage: must be 0, 1, 2 or 3, got {ds.zero_stage}")
    if ds.offload_optimizer != "none" and ds.zero_stage == 0:
        p.append("deepspeed.offload_optimizer: needs zero_stage >= 1")
    if ds.offload_param != "none" and ds.zero_stage != 3:
        p.append("deepspeed.offload_param: needs zero_stage 3")
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        p.append("deepspeed.nvme_path: required for nvme offload")
    if c.every < 1:
        p.append(f"checkpoint.every: must be >= 1, got {c.every}")
    if c.keep < 1:
        p.append(f"checkpoint.keep: must be >= 1, got {c.keep}")
    if lg.every < 1:
        p.append(f"logging.every: must be >= 1, got {lg.every}")
    if lg.peak_flops is not None and lg.peak_flops <= 0:
        p.append(f"logging.peak_flops: must be > 0, got {lg.peak_flops}")
    if ev.every < 0:
        p.append(f"eval.every: must be >= 0 (0 = only at the end), got {ev.every}")
    if ev.max_batches is not None and ev.max_batches < 1:
        p.append(f"eval.max_batches: must be >= 1 or null, got {ev.max_batches}")
    if ev.micro_batch is not None and ev.micro_batch < 1:
        p.append(f"eval.micro_batch: must be >= 1, got {ev.micro_batch}")
    if (t.steps is None) == (t.tokens is None):
        p.append("train.steps / train.tokens: give exactly one (optimizer steps, or a token budget)")
    if t.steps is not None and t.steps < 1:
        p.append(f"train.steps: must be >= 1, got {t.steps}")
    if t.tokens is not None and t.tokens < 1:
        p.append(f"train.tokens: must be >= 1, got {t.tokens}")
    if t.micro_batch < 1:
        p.append(f"train.micro_batch: must be >= 1, got {t.micro_batch}")
    if t.grad_accum is not None and t.grad_accum < 1:
        p.append(f"train.grad_accum: must be >= 1, got {t.grad_accum}")
    if t.global_batch is not None and t.global_batch < 1:
        p.append(f"train.global_batch: must be >= 1, got {t.global_batch}")
    if t.grad_accum is None and t.global_batch is None:
        p.append("train.grad_accum / train.global_batch: give one (the other follows from micro_batch × ranks)")
    if t.seed < 0:
        p.append(f"train.seed: must be >= 0, got {t.seed}")
    if t.stop_at is not None and t.stop_at < 1:
        p.append(f"train.stop_at: must be >= 1, got {t.stop_at}")
    if t.max_consecutive_skips < 1:
        p.append(f"train.max_consecutive_skips: must be >= 1, got {t.max_consecutive_skips}")
    if t.threads is not None and t.threads < 1:
        p.append(f"train.threads: must be >= 1, got {t.threads}")
    if ini.gates_only_tokens < 0:
        p.append(f"init.gates_only_tokens: must be >= 0, got {ini.gates_only_tokens}")
    if ini.gates_only_tokens > 0 and ini.backbone is None:
        p.append("init.gates_only_tokens: a gates-only stage needs init.backbone (continued pretraining)")
    from adaponder.hub import is_hub_id

    if ini.backbone is not None and not is_hub_id(ini.backbone) and not (Path(ini.backbone) / "config.json").is_file():
        p.append(f"init.backbone: {ini.backbone} is not a Hugging Face checkpoint folder (no config.json) nor a hub "
                 "id (org/name, e.g. EleutherAI/pythia-410m-deduped)")
    if ini.revision is not None and ini.backbone is None:
        p.append("init.revision: applies to a hub id in init.backbone (org/name); there is no init.backbone")
    if ini.gates_only_tokens > 0 and cfg.model.get("mode", "adaponder") != "adaponder":
        p.append("init.gates_only_tokens: only mode 'adaponder' has gates to train")
    return p


def _position_problems(cfg: TrainConfig) -> list[str]:
    """The model must have positions for every backbone position of a training sample (A19: a token and
    its P pauses take P+1 positions)."""
    mc = cfg.model_config()
    stride = mc.num_pauses + 1
    positions = cfg.data.seq_len * stride
    if positions <= mc.max_position_embeddings:
        return []
    what = f"{cfg.data.seq_len} tokens × (1 + {mc.num_pauses} pauses) = {positions} positions" if stride > 1 \
        else f"{positions} tokens"
    return [f"data.seq_len: {what} exceed model.max_position_embeddings ({mc.max_position_embeddings}); "
            "lower data.seq_len or raise model.max_position_embeddings"]


# -- loading ----------------------------------------------------------------------------------------------
def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """``["optim.lr=3e-4", "train.steps=100"]`` applied to a raw (YAML) mapping."""
    return typed_config.apply_overrides(raw, overrides, TrainConfigError)


def config_from_dict(raw: Mapping[str, Any] | None, source: str | None = None) -> TrainConfig:
    """Validate a raw mapping (the parsed YAML) into a :class:`TrainConfig`."""
    raw = dict(raw or {})
    problems: list[str] = []
    known = {"model", *SECTIONS}
    for key in raw:
        if key not in known:
            problems.append(f"{key}: unknown section (known: {', '.join(sorted(known))})")
    sections = {name: typed_config.build_section(cls, raw.get(name), name, problems) for name, cls in SECTIONS.items()}
    model = raw.get("model") or {}
    cfg = TrainConfig(model=dict(model) if isinstance(model, Mapping) else {}, source=source, **sections)
    model_problems = _model_problems(model, cfg.init.backbone is not None)
    problems += model_problems + _semantic_problems(cfg)
    if not model_problems and cfg.init.backbone is None and cfg.data.seq_len >= 1:
        problems += _position_problems(cfg)
    if problems:
        raise TrainConfigError(problems, source)
    return cfg


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file (or nothing: all defaults), apply ``--set`` overrides, validate everything."""
    source = str(path) if path is not None else "<defaults>"
    raw: Any = typed_config.read_yaml(path, TrainConfigError) if path is not None else {}
    if overrides:
        source += " + --set " + " ".join(overrides)
    return config_from_dict(apply_overrides(raw, overrides), source)


# -- values resolved at run time (world size known) -------------------------------------------------------
@dataclass
class RunPlan:
    """Step counts and batch sizes of a run, resolved from the config and the number of ranks."""

    world_size: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    seq_len: int
    total_steps: int
    warmup_steps: int
    s0: int
    s1: int
    gates_only_steps: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def _to_steps(value: int | float, total: int) -> int:
    return int(round(value * total)) if isinstance(value, float) else int(value)


def plan_run(cfg: TrainConfig, world_size: int) -> RunPlan:
    """Resolve accumulation, global batch and step counts for ``world_size`` ranks (errors name the keys)."""
    t = cfg.train
    problems = []
    per_accum = t.micro_batch * world_size
    if t.global_batch is not None:
        if t.global_batch % per_accum:
            problems.append(f"train.global_batch ({t.global_batch}) must be a multiple of micro_batch "
                            f"({t.micro_batch}) × ranks ({world_size}) = {per_accum}")
        accum = max(1, t.global_batch // per_accum)
        if t.grad_accum is not None and t.grad_accum != accum:
            problems.append(f"train.grad_accum ({t.grad_accum}) disagrees with global_batch {t.global_batch} / "
                            f"(micro_batch {t.micro_batch} × {world_size} ranks) = {accum}; give only one")
    else:
        accum = int(t.grad_accum)
    if problems:
        raise TrainConfigError(problems, cfg.source)
    global_batch = accum * per_accum
    tokens_per_step = global_batch * cfg.data.seq_len
    total = t.steps if t.steps is not None else max(1, math.ceil(t.tokens / tokens_per_step))
    gates_only = math.ceil(cfg.init.gates_only_tokens / tokens_per_step) if cfg.init.gates_only_tokens else 0
    if gates_only >= total:
        raise TrainConfigError([f"init.gates_only_tokens ({cfg.init.gates_only_tokens}) covers all {total} steps; "
                                "leave steps for the joint stage"], cfg.source)
    s0, s1 = _to_steps(cfg.schedule.s0, total), _to_steps(cfg.schedule.s1, total)
    if s1 < s0:
        raise TrainConfigError([f"schedule.s1 resolves to step {s1}, before schedule.s0 (step {s0})"], cfg.source)
    return RunPlan(world_size=world_size, micro_batch=t.micro_batch, grad_accum=accum, global_batch=global_batch,
                   seq_len=cfg.data.seq_len, total_steps=total, warmup_steps=_to_steps(cfg.optim.warmup, total),
                   s0=s0, s1=s1, gates_only_steps=gates_only)


__all__ = ["TrainConfig", "TrainConfigError", "RunPlan", "load_config", "config_from_dict", "apply_overrides",
           "plan_run", "build_model_config", "SECTIONS"]
