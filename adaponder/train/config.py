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
    debug:       tracing for tests (a digest of every sample each rank reads)

``load_config(path, overrides)`` returns a :class:`TrainConfig` or raises one :class:`TrainConfigError` that
names the file and every offending key path (``optim.lr``), so a user fixes everything in one go.

Each key's type and limits are in its section's annotations (validated by pydantic through
:mod:`adaponder.typed_config`); checks across keys are :func:`_cross_problems`. Numbers: YAML 1.1 reads ``1e-3``
as a string; number fields accept such strings. Integer fields accept integral floats (``tokens: 3.0e11``).
Fields that are "steps or fractions" (``schedule.s0``, ``optim.warmup``) read an integer as a step count and a
float in [0, 1] as a fraction of all steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import Field

from adaponder import typed_config
from adaponder.hub import is_hub_id
from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError, pythia_config, pythia_shape
from adaponder.modeling.run_settings import LEGACY_CONFIG_KEYS, RunSettings
from adaponder.data.config import DataConfig, resolve_data_format
from adaponder.typed_config import (Count, Float, Int, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                                    StepsOrFraction, UnitFloat)


class TrainConfigError(typed_config.ConfigError):
    """Every problem of a training configuration, listed at once, naming the file and key paths."""

    what = "the training configuration"


# -- sections ---------------------------------------------------------------------------------------------
@dataclass
class OptimConfig:
    lr: PositiveFloat = 3e-4
    #: Final learning rate as a fraction of ``lr`` (Pythia: 0.1).
    min_lr_ratio: UnitFloat = 0.1
    #: Linear warm-up: an integer is steps, a float in [0, 1] a fraction of all steps (Pythia: 1%).
    warmup: StepsOrFraction = 0.01
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    betas: Annotated[list[Annotated[Float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = field(
        default_factory=lambda: [0.9, 0.95])
    eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.01
    #: Max global gradient norm; 0 disables clipping.
    grad_clip: NonNegativeFloat = 1.0


@dataclass
class ScheduleConfig:
    """A13: CE alone before ``s0``; then ``CE + ponder_weight · L_ponder`` with bottom-k fraction
    ``k = k_max · min(1, (step − s0) / (s1 − s0))``. Only ``adaponder`` mode has gates to train."""

    s0: StepsOrFraction = 0.2
    s1: StepsOrFraction = 0.4
    #: λ of A13.
    ponder_weight: NonNegativeFloat = 0.1
    k_max: UnitFloat = 0.1
    #: What the gates do before ``s0`` (A13 **[choice]**): ``live`` (the paper: they scale updates and halt from the
    #: first step), ``bypassed`` (the PonderLM regime until ``s0``: s ≡ 1, no halting, gates frozen) or ``floored``
    #: (no halting and gate logits floored at ``gate_floor`` until ``s0``; the floor relaxes until ``s1``).
    gate_warmup: Literal["live", "bypassed", "floored"] = "live"
    #: The gate-logit floor of ``floored`` before ``s0`` (0: s ≥ 0.5).
    gate_floor: Float = 0.0
    #: How the passes are scored (docs/method.md A21–A22 **[choice]**): ``none`` (the final pass's CE),
    #: ``pondernet`` (the expected CE under each token's exit distribution plus β·KL to a geometric prior; needs
    #: ``model.halting_heads``), ``pondernet-anchored`` (the same plus the final pass's own CE) or
    #: ``pondernet-detached`` (the final pass's CE for the backbone; the expected loss trains only the halting heads,
    #: on detached states).
    per_pass: Literal["none", "pondernet", "pondernet-anchored", "pondernet-detached"] = "none"
    #: λ_p of the geometric prior over exit passes (A21).
    halting_prior: Annotated[Float, Field(gt=0, lt=1)] = 0.2
    #: β of the KL term (A21).
    halting_beta: NonNegativeFloat = 0.01
    #: Whether the halting heads' exits are applied in the training forward (A25 **[choice]**): ``none`` (every token
    #: runs every pass) or ``sampled`` (each token's exit pass drawn from its exit distribution and applied, its
    #: K/V reused in later passes as in decoding; applied to a share of tokens rising from 0 at ``s0`` to 1 at ``s1``).
    train_exits: Literal["none", "sampled"] = "none"


@dataclass
class DeepSpeedConfig:
    zero_stage: Annotated[Int, Field(ge=0, le=3)] = 1
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
class CheckpointSettings:
    """What pretraining and fine-tuning checkpoints share (one checkpoint manager: sha256 manifest, atomic
    ``latest``, the newest ``keep`` kept)."""

    #: Default: ``<output folder>/checkpoints``. Must be on a filesystem every node sees.
    dir: str | None = None
    #: A checkpoint every N optimizer steps (0: none beyond the ones the run writes anyway).
    every: NonNegativeInt = 0
    keep: Count = 3


@dataclass
class CheckpointConfig(CheckpointSettings):
    every: Count = 1000
    #: Export a Hugging Face checkpoint to ``<train.out_dir>/hf`` at the end of training.
    export_hf: bool = True


@dataclass
class LoggingSettings:
    """What pretraining and fine-tuning logging share (one metrics sink): ``metrics.jsonl`` in the output folder,
    console lines, tqdm progress bars, optional wandb."""

    jsonl: bool = True
    console: bool = True
    progress_bar: bool = True
    wandb: bool = False
    wandb_project: str = "adaponder"
    wandb_name: str | None = None


@dataclass
class LoggingConfig(LoggingSettings):
    #: Metrics every N optimizer steps.
    every: Count = 10
    #: Peak FLOP/s of one device for MFU (logged as ``mfu_pct``). ``null``: CUDA devices from a table of known
    #: data-sheet peaks (:mod:`adaponder.train.peak`; unknown device: no MFU), CPUs measured at start-up.
    peak_flops: PositiveFloat | None = None


@dataclass
class EvalConfig:
    #: Validation every N steps (0: only at the end).
    every: NonNegativeInt = 1000
    #: Cap on validation micro-batches, all ranks together (``None``: the whole val split); the same tokens on any
    #: number of ranks.
    max_batches: Count | None = 50
    micro_batch: Count | None = None
    at_end: bool = True
    #: Write ``report.md`` + the exit-pass histogram at the end.
    report: bool = True


@dataclass
class RunConfig:
    """The ``train:`` section: output folder, length, batch, seed and stopping of the run."""

    out_dir: str = "runs/default"
    #: Optimizer steps; or give ``tokens`` (a budget: steps = ceil(tokens / tokens per step)).
    steps: Count | None = None
    tokens: Count | None = None
    micro_batch: Count = 4
    #: Give one of these two; the other follows from micro_batch × ranks.
    grad_accum: Count | None = None
    #: Sequences per optimizer step across all ranks (Pythia: 1024).
    global_batch: Count | None = None
    seed: NonNegativeInt = 1234
    #: Stop after this many consecutive skipped (non-finite) steps.
    max_consecutive_skips: Count = 5
    #: Stop at this step with a checkpoint, as if preempted (the schedule still spans all steps); continue
    #: with ``--resume auto``. For jobs shorter than the run.
    stop_at: Count | None = None
    #: ``torch.use_deterministic_algorithms(True)`` (bit-exact resume on CPU; slower on GPU).
    deterministic: bool = False
    #: torch intra-op threads per rank (CPU); ``None`` leaves torch's default.
    threads: Count | None = None
    #: Resume may change the schedule-defining keys only when true.
    allow_schedule_change: bool = False
    #: Resume may continue on other data (another training or validation data fingerprint) only when true.
    allow_data_change: bool = False
    #: Resume may change ``optim.weight_decay``, ``optim.betas`` or ``optim.eps`` only when true (then applied to
    #: the optimizer restored from the checkpoint).
    allow_optim_change: bool = False


@dataclass
class InitConfig:
    """A14: continued pretraining from a GPT-NeoX/Pythia or AdaPonder Hugging Face checkpoint: a local folder, or
    a hub id (``EleutherAI/pythia-410m-deduped``) with ``revision`` (``step143000``) resolved through the Hugging
    Face cache (:func:`adaponder.hub.resolve_pretrained`)."""

    backbone: str | None = None
    #: Hub ids only: branch, tag or commit (Pythia's checkpoints: ``step0`` … ``step143000``; null = main).
    revision: str | None = None
    #: Tokens of the first stage, in which only the gates train (backbone frozen); 0 = no such stage.
    gates_only_tokens: NonNegativeInt = 0
    #: The gates train alone for the whole run (backbone frozen throughout): A13's ponder loss learned on a
    #: trained backbone, which separates what halting learns from what the backbone learns.
    gates_alone: bool = False


@dataclass
class HardwareConfig:
    """The ``hardware:`` section: what a preset is sized for, checked before anything starts, so that a preset
    for GPUs says so at once on a machine without one rather than after minutes of start-up."""

    #: ``gpu``: refuse to start where torch sees no CUDA GPU (``--set hardware.requires=any`` runs it anyway);
    #: ``any``: a CPU will do.
    requires: Literal["any", "gpu"] = "any"
    #: What the preset's sizes assume, named in that refusal (e.g. ``8 x H100-80GB, bf16``).
    sized_for: str | None = None


@dataclass
class DebugConfig:
    """Tracing for the tests; leave empty for real runs."""

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
    "hardware": HardwareConfig,
    "debug": DebugConfig,
}


@dataclass(frozen=True)
class ModelSection:
    """The ``model:`` section: a Pythia shape preset (``size``) that the other keys override, or a full
    :class:`~adaponder.modeling.AdaPonderConfig` mapping; with ``init.backbone`` the shape comes from the checkpoint
    and only recurrence keys may be set. Every key is an ``AdaPonderConfig`` field (or ``size``), validated by that
    typed configuration when the file is read (:func:`_model_problems`)."""

    #: A preset of :data:`adaponder.modeling.PYTHIA_SHAPES` (``70m`` … ``12b``, ``tiny``); ``None``: none.
    size: str | None = None
    #: The recurrence (``AdaPonderConfig.mode``); ``None``: not set, i.e. ``adaponder``.
    mode: str | None = None
    #: The other ``AdaPonderConfig`` fields as written.
    fields: Mapping[str, Any] = field(default_factory=dict)
    #: The keys in the order they were written (``size``/``mode`` included when given, even as null), so the
    #: section is written back and fingerprinted exactly as the user wrote it.
    written: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ModelSection":
        rest = {k: v for k, v in values.items() if k not in ("size", "mode")}
        return cls(size=values.get("size"), mode=values.get("mode"), fields=rest, written=tuple(values))

    def to_mapping(self) -> dict[str, Any]:
        given = {"size": self.size, "mode": self.mode, **self.fields}
        return {k: given[k] for k in self.written}

    @property
    def recurrence(self) -> str:
        return self.mode or "adaponder"

    @property
    def model_fields(self) -> dict[str, Any]:
        """The fields that define the model (the run-time settings this section may also name left out)."""
        return {k: v for k, v in self.fields.items() if k not in LEGACY_CONFIG_KEYS}

    def run_settings(self) -> RunSettings:
        """How training runs the model: ``halting_threshold`` (τ), ``compact_inference``, ``ponder_chunk_size`` and
        ``ponder_recompute`` as this section names them (each a :class:`RunSettings` field; never model config)."""
        return RunSettings.from_legacy(self.fields)

    def model_config(self, source: str | None = None):
        """The :class:`AdaPonderConfig` of a fresh model: the ``size`` preset with the other keys, or the keys as a
        full configuration."""
        if self.size is not None:
            return pythia_config(str(self.size), self.recurrence, **self.model_fields)
        values = {k: v for k, v in self.to_mapping().items() if k != "size" and k not in LEGACY_CONFIG_KEYS}
        return AdaPonderConfig.from_mapping(values, source=source)

    def backbone_overrides(self) -> tuple[str, dict[str, Any]]:
        """(mode, overrides) for :meth:`AdaPonderForCausalLM.from_backbone` (continued pretraining): shape keys
        set to null (``--set model.size=null``) are left out."""
        shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        return self.recurrence, {k: v for k, v in self.model_fields.items() if not (k in shape and v is None)}


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: RunConfig = field(default_factory=RunConfig)
    init: InitConfig = field(default_factory=InitConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
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
        d["model"] = self.model.to_mapping()
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def model_config(self):
        """The :class:`AdaPonderConfig` of a fresh model (not used with ``init.backbone``)."""
        return self.model.model_config(self.source)

    def model_overrides(self) -> tuple[str, dict[str, Any]]:
        """(mode, overrides) for :meth:`AdaPonderForCausalLM.from_backbone` (continued pretraining)."""
        return self.model.backbone_overrides()

    def run_settings(self) -> RunSettings:
        """The :class:`RunSettings` the training forward and validation run with (from the ``model:`` section)."""
        return self.model.run_settings()

    def fingerprint(self) -> str:
        what = self.to_dict()
        # A permission for one resume, not part of what the run is (and fingerprints on disk predate it).
        for permission in ("allow_schedule_change", "allow_data_change", "allow_optim_change"):
            del what["train"][permission]
        del what["hardware"]  # where the run may start, not what it computes
        # Keys added later enter only when set, so the fingerprints of runs that predate them stay the same.
        for key, default in (("gate_warmup", "live"), ("gate_floor", 0.0), ("per_pass", "none"), ("halting_prior", 0.2),
                             ("halting_beta", 0.01), ("train_exits", "none")):
            if what["schedule"].get(key) == default:
                del what["schedule"][key]
        if not what["init"].get("gates_alone"):
            del what["init"]["gates_alone"]
        # Fault-injection keys the debug section once held (empty in every real run): hashed as they were, so
        # the fingerprints of earlier runs stay the same.
        what["debug"] = {"nonfinite_steps": [], "nonfinite_rank": None, "crash_in_save_at": None, **what["debug"]}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- the model section ------------------------------------------------------------------------------------
def _model_problems(values: Any, has_backbone: bool) -> list[str]:
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
    problem = _run_settings_problem(values)
    if problem:
        return [f"model: {problem}"]
    try:
        ModelSection.from_mapping(values).model_config()
    except AdaPonderConfigError as err:
        return [f"model: {p}" for p in err.problems]
    except (TypeError, ValueError) as err:
        return [f"model: {err}"]
    return []


# -- checks across keys (each key's own type and limits are in its annotation) ----------------------------
def deepspeed_problems(ds: DeepSpeedConfig) -> list[tuple[tuple[str, ...], str]]:
    """``(keys, problem)`` of each setting of a ``deepspeed:`` section that cannot work with another one; the
    message is ``f"{keys[0]}: {problem}"``. Pretraining and fine-tuning configurations both check these."""
    found = []
    if ds.offload_optimizer != "none" and ds.zero_stage == 0:
        found.append((("deepspeed.offload_optimizer", "deepspeed.zero_stage"), "needs zero_stage >= 1"))
    if ds.offload_param != "none" and ds.zero_stage != 3:
        found.append((("deepspeed.offload_param", "deepspeed.zero_stage"), "needs zero_stage 3"))
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        found.append((("deepspeed.nvme_path", "deepspeed.offload_optimizer", "deepspeed.offload_param"),
                      "required for nvme offload"))
    return found


def _cross_problems(cfg: TrainConfig, bad: set[str]) -> list[str]:
    p: list[str] = []

    def check(keys: str, broken: bool, message: str) -> None:
        # A key that failed its own check holds its default now: judging it again would only add noise.
        if broken and not any(k in bad or k.split(".")[0] in bad for k in keys.split()):
            p.append(message)

    d, s, ds, ev, t, ini = cfg.data, cfg.schedule, cfg.deepspeed, cfg.eval, cfg.train, cfg.init
    check("data.path", d.path is None,
          "data.path: required (the prepared data folder, or where to prepare data.prepare)")
    check("data.train_tokenizer data.tokenizer", d.train_tokenizer is not None and d.tokenizer is not None,
          "data.train_tokenizer: cannot be combined with data.tokenizer (train one, or name one)")
    check("data.format data.prepare", d.format == "indexed" and d.prepare is not None,
          "data.prepare: prepares packed shards, not an indexed dataset; leave it out with data.format indexed")
    check("data.format data.val_path eval.every eval.at_end",
          d.format == "indexed" and d.val_path is None and bool(ev.every or ev.at_end),
          "data.val_path: required with data.format indexed while validation is on (an indexed PREFIX such as the "
          "Pile's validation set, or a prepared folder); or set eval.every: 0 and eval.at_end: false")
    check("schedule.s0 schedule.s1", type(s.s0) is type(s.s1) and s.s1 < s.s0,
          f"schedule.s1 ({s.s1}) must not come before schedule.s0 ({s.s0})")
    for keys, problem in deepspeed_problems(ds):
        check(" ".join(keys), True, f"{keys[0]}: {problem}")
    check("train.steps train.tokens", (t.steps is None) == (t.tokens is None),
          "train.steps / train.tokens: give exactly one (optimizer steps, or a token budget)")
    check("train.grad_accum train.global_batch", t.grad_accum is None and t.global_batch is None,
          "train.grad_accum / train.global_batch: give one (the other follows from micro_batch × ranks)")
    check("init.gates_only_tokens init.backbone", ini.gates_only_tokens > 0 and ini.backbone is None,
          "init.gates_only_tokens: a gates-only stage needs init.backbone (continued pretraining)")

    check("init.backbone", ini.backbone is not None and not is_hub_id(ini.backbone)
          and not (Path(ini.backbone) / "config.json").is_file(),
          f"init.backbone: {ini.backbone} is not a Hugging Face checkpoint folder (no config.json) nor a hub id "
          "(org/name, e.g. EleutherAI/pythia-410m-deduped)")
    check("init.revision init.backbone", ini.revision is not None and ini.backbone is None,
          "init.revision: applies to a hub id in init.backbone (org/name); there is no init.backbone")
    check("init.gates_only_tokens", ini.gates_only_tokens > 0 and cfg.model.recurrence != "adaponder",
          "init.gates_only_tokens: only mode 'adaponder' has gates to train")
    check("init.gates_alone init.backbone", ini.gates_alone and ini.backbone is None,
          "init.gates_alone: training the gates alone needs a trained backbone (init.backbone)")
    check("init.gates_alone", ini.gates_alone and cfg.model.recurrence != "adaponder",
          "init.gates_alone: only mode 'adaponder' has gates to train")
    check("schedule.per_pass model.halting_heads", cfg.schedule.per_pass != "none"
          and cfg.model.fields.get("halting_heads") is not True,
          f"schedule.per_pass: {cfg.schedule.per_pass!r} scores the passes by each token's exit distribution, which "
          "needs model.halting_heads: true (A21)")
    check("schedule.train_exits schedule.per_pass", cfg.schedule.train_exits != "none"
          and cfg.schedule.per_pass == "none",
          "schedule.train_exits: sampled exits are drawn from the exit distribution of schedule.per_pass (A21, A25); "
          "set schedule.per_pass")
    check("init.gates_alone init.gates_only_tokens", ini.gates_alone and ini.gates_only_tokens > 0,
          "init.gates_alone: the whole run trains the gates alone; leave init.gates_only_tokens at 0")
    return p


def _position_problems(cfg: TrainConfig) -> list[str]:
    """The model must have positions for every backbone position of a training sample (A19: a token and
    its P pauses take P+1 positions). With ``init.backbone`` the positions are the checkpoint's (local folders
    only: a hub id's shape is known once it is downloaded)."""
    if cfg.init.backbone is None:
        mc, whose = cfg.model_config(), "model.max_position_embeddings"
    else:
        shape = backbone_shape(cfg.init.backbone)
        if shape is None:
            return []
        mode, overrides = cfg.model_overrides()
        try:
            mc = AdaPonderConfig(**shape, mode=mode, **overrides)
        except (AdaPonderConfigError, TypeError, ValueError):
            return []  # (the trainer names what is wrong with the model section when it builds the model)
        whose = ("model.max_position_embeddings" if "max_position_embeddings" in overrides
                 else f"the max_position_embeddings of init.backbone {cfg.init.backbone}")
    stride = mc.num_pauses + 1
    positions = cfg.data.seq_len * stride
    if positions <= mc.max_position_embeddings:
        return []
    what = f"{cfg.data.seq_len} tokens × (1 + {mc.num_pauses} pauses) = {positions} positions" if stride > 1 \
        else f"{positions} tokens"
    return [f"data.seq_len: {what} exceed {whose} ({mc.max_position_embeddings}); "
            "lower data.seq_len or raise model.max_position_embeddings"]


#: The shape keys of a GPT-NeoX ``config.json`` that an AdaPonder model continuing from it takes over.
BACKBONE_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                       "max_position_embeddings", "use_parallel_residual", "tie_word_embeddings", "rotary_pct")


def backbone_shape(backbone: str) -> dict[str, Any] | None:
    """The shape fields of a local checkpoint folder's ``config.json``; ``None`` for a hub id or an unreadable file."""
    local = Path(backbone) / "config.json"
    try:
        src = json.loads(local.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {k: src[k] for k in BACKBONE_SHAPE_KEYS if k in src} if isinstance(src, dict) else None


# -- loading ----------------------------------------------------------------------------------------------
def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """``["optim.lr=3e-4", "train.steps=100"]`` applied to a raw (YAML) mapping."""
    return typed_config.apply_overrides(raw, overrides, TrainConfigError)


def config_from_dict(raw: Mapping[str, Any] | None, source: str | None = None) -> TrainConfig:
    """Validate a raw mapping (the parsed YAML) into a :class:`TrainConfig`."""
    raw = dict(raw or {})
    problems: list[str] = []
    bad: set[str] = set()
    sections = typed_config.validate_sections(raw, SECTIONS, problems, bad, others=("model",))
    model = raw.get("model") or {}
    cfg = TrainConfig(model=ModelSection.from_mapping(model if isinstance(model, Mapping) else {}), source=source,
                      **sections)
    resolve_data_format(cfg.data)
    model_problems = _model_problems(model, cfg.init.backbone is not None)
    problems += model_problems + _cross_problems(cfg, bad)
    if not model_problems and "data.seq_len" not in bad and "init.backbone" not in bad:
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


# DeepSpeed's batch keys and the run's values they must equal.
_BATCH_KEYS = (("train_batch_size", "global_batch", "global batch"),
               ("train_micro_batch_size_per_gpu", "micro_batch", "micro-batch per rank"),
               ("gradient_accumulation_steps", "grad_accum", "gradient accumulation steps"))


def batch_override_problems(overrides: Mapping[str, Any], plan: Any) -> list[str]:
    """Batch sizes in ``deepspeed.overrides`` that differ from the run's (``plan``): the data loader and the
    schedules follow the run's, and DeepSpeed would stop with its own assertion about the three numbers."""
    return [f"deepspeed.overrides.{key}: {overrides[key]!r} disagrees with the run's {what} "
            f"({getattr(plan, attr)}, from the train section); set the batch there and leave {key} out"
            for key, attr, what in _BATCH_KEYS if key in overrides and overrides[key] != getattr(plan, attr)]


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
    global_batch = accum * per_accum
    problems += batch_override_problems(cfg.deepspeed.overrides, SimpleNamespace(
        global_batch=global_batch, micro_batch=t.micro_batch, grad_accum=accum))
    if problems:
        raise TrainConfigError(problems, cfg.source)
    tokens_per_step = global_batch * cfg.data.seq_len
    total = t.steps if t.steps is not None else max(1, math.ceil(t.tokens / tokens_per_step))
    gates_only = math.ceil(cfg.init.gates_only_tokens / tokens_per_step) if cfg.init.gates_only_tokens else 0
    if cfg.init.gates_alone:
        gates_only = total
    elif gates_only >= total:
        raise TrainConfigError([f"init.gates_only_tokens ({cfg.init.gates_only_tokens}) covers all {total} steps; "
                                "leave steps for the joint stage"], cfg.source)
    s0, s1 = _to_steps(cfg.schedule.s0, total), _to_steps(cfg.schedule.s1, total)
    if s1 < s0:
        raise TrainConfigError([f"schedule.s1 resolves to step {s1}, before schedule.s0 (step {s0})"], cfg.source)
    plan = RunPlan(world_size=world_size, micro_batch=t.micro_batch, grad_accum=accum, global_batch=global_batch,
                   seq_len=cfg.data.seq_len, total_steps=total, warmup_steps=_to_steps(cfg.optim.warmup, total),
                   s0=s0, s1=s1, gates_only_steps=gates_only)
    problems, _ = schedule_findings(cfg, plan)
    if problems:
        raise TrainConfigError(problems, cfg.source)
    return plan


def schedule_findings(cfg: TrainConfig, plan: RunPlan) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of what the schedules can do in the run's ``plan.total_steps`` steps (0-based:
    the last is ``total - 1``). A problem is a schedule the run cannot carry out as written (a warm-up longer
    than the run, a ponder loss or a gate warm-up that would start or end after the last step, a stop past the
    end); a warning is one it carries out in an odd way. Step counts given as fractions always fit: only counts
    given as steps (or a token budget that shrank the run) can reach these."""
    total, s, t = plan.total_steps, cfg.schedule, cfg.train
    last = f"the run's last step ({total - 1}; {total} steps)"
    problems, warnings = [], []
    if plan.warmup_steps > total:
        problems.append(f"optim.warmup: {plan.warmup_steps} warm-up steps exceed the run's {total} steps: the "
                        f"learning rate would never reach optim.lr ({cfg.optim.lr}); lower optim.warmup or give "
                        "a fraction of the run (e.g. 0.01)")
    elif plan.warmup_steps == total and total > 1:
        warnings.append(f"optim.warmup: the warm-up spans all {total} steps: the learning rate reaches optim.lr "
                        "only at the last step and never decays")
    if cfg.model.recurrence == "adaponder":  # only gated runs have a ponder loss and gates to warm up
        if s.ponder_weight > 0 and plan.s0 >= total:
            problems.append(f"schedule.s0: the ponder loss starts at step {plan.s0}, after {last}: it would never "
                            "be applied; lower schedule.s0 (a fraction such as 0.2 follows the run's length) or "
                            "set schedule.ponder_weight: 0")
        elif s.gate_warmup != "live" and plan.s0 >= total:
            problems.append(f"schedule.gate_warmup: {s.gate_warmup!r} lasts until schedule.s0 (step {plan.s0}), "
                            f"after {last}: the gates would never act; lower schedule.s0 or use gate_warmup: live")
        elif (s.ponder_weight > 0 or s.gate_warmup == "floored") and plan.s1 > total:
            what = "the ponder-loss ramp (k up to schedule.k_max)" if s.ponder_weight > 0 else "the gate floor's relaxing"
            warnings.append(f"schedule.s1: {what} ends at step {plan.s1}, after {last}: the run stops part-way")
    if t.stop_at is not None and t.stop_at > total:
        problems.append(f"train.stop_at: step {t.stop_at} is beyond the run's {total} steps: the run would "
                        f"finish at step {total} without stopping there; lower train.stop_at or leave it out")
    return problems, warnings


def _run_settings_problem(fields: Mapping[str, Any]) -> str | None:
    """What is wrong with the run-time settings a ``model:`` section names (τ outside (0, 1), …), or None."""
    try:
        RunSettings.from_legacy(fields)
    except (TypeError, ValueError) as err:
        return str(err)
    return None


__all__ = ["TrainConfig", "TrainConfigError", "RunPlan", "load_config", "config_from_dict", "apply_overrides",
           "plan_run", "schedule_findings", "ModelSection", "batch_override_problems", "SECTIONS", "backbone_shape",
           "BACKBONE_SHAPE_KEYS"]
