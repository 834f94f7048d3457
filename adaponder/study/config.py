"""The study configuration (``configs/study/*.yaml``): one base training config, the arms as overrides of it,
what to evaluate, and named profiles that shrink everything for a quick run.

::

    study:    name, seeds, which arms repeat with the second seed, output folders
    data:     corpus (raw text; ``bundled`` = the corpus shipped with adaponder), tokenizer vocabulary, split
    base:     a complete ``launch/pretrain.py`` configuration shared by every arm (model, optim, schedule, train …)
    arms:     arm name → ``--set``-style overrides of ``base`` (``model.mode: ponderlm``)
    eval:     held-out tokens, τ values of the dial
    profiles: profile name → overrides of this file itself (``base.train.tokens: 16384``)

Every problem — unknown keys, bad values, an arm whose training config does not validate — is reported at
once by :class:`StudyConfigError`, naming the file and the key path.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field

from adaponder import typed_config
from adaponder.data.reasoning import MultiHopSpec
from adaponder.train.config import BACKBONE_SHAPE_KEYS, TrainConfigError, apply_overrides, config_from_dict
from adaponder.typed_config import Count, Float, Int, NonNegativeInt


class StudyConfigError(typed_config.ConfigError):
    what = "the study configuration"


@dataclass
class StudySection:
    name: str = "study"
    #: The first seed trains every arm; ``repeat_seed`` retrains the arms in ``repeat_arms``.
    seed: NonNegativeInt = 1234
    repeat_seed: NonNegativeInt | None = 4321
    repeat_arms: list[str] = field(default_factory=list)
    #: Every arm with every one of these training seeds (replaces ``seed`` / ``repeat_seed`` / ``repeat_arms``).
    seeds: list[NonNegativeInt] | None = None
    #: Arms trained with fewer of ``seeds`` (arm → its seeds; it runs on those also in ``seeds``): arms added to a
    #: study whose compute allowed only some replicates; the report says how many runs each arm has.
    arm_seeds: dict[str, list[NonNegativeInt]] = field(default_factory=dict)
    #: Synthetic tasks only: every run once per data seed (the task's ``seed``: its permutation, held-out symbols
    #: and documents), each on its own generated corpus. Null: the task's own seed only.
    data_seeds: list[NonNegativeInt] | None = None
    #: Train and report only these arms, in this order (default: every arm of ``arms``), e.g. in a profile that
    #: reruns a few arms at another token budget.
    only: list[str] | None = None
    #: Results folders of the same study at other token budgets, reported beside this one as a trend.
    compare_results: list[str] = field(default_factory=list)
    #: Checkpoints and training logs (large; not committed).
    runs_dir: str = "runs/study"
    #: One small JSON per finished arm (committed): the study resumes from these.
    results_dir: str = "docs/study"
    #: The Markdown report; its PNGs go to ``results_dir``.
    report: str = "docs/study.md"
    #: A smoke run of the pipeline (the quick profiles): its report is titled as such and gives no verdicts,
    #: since arms trained for a few steps say nothing about the claims.
    pipeline_check: bool = False
    #: Which settings were chosen on which data, printed in the report beside the figures they may flatter.
    settings_chosen_on: str | None = None


@dataclass
class DataSection:
    #: Raw text inputs (files, folders, globs) or ``bundled``; ``--corpus`` overrides.
    corpus: list[str] = field(default_factory=lambda: ["bundled"])
    #: Entries of the byte-level BPE tokenizer trained on the train split (at least its 256 bytes and 2 specials).
    vocab: Annotated[Int, Field(ge=258)] = 4096
    #: Fraction of documents (whole books) held out for validation.
    val_fraction: Annotated[Float, Field(gt=0, lt=1)] = 0.1
    split_seed: Int = 0
    #: A corpus generated from a seed instead of raw text (``corpus``, ``vocab`` and the split keys are then
    #: unused): ``multihop`` is :mod:`adaponder.data.reasoning`'s task, with per-token difficulty labels.
    task: Literal["multihop"] | None = None
    #: The task's sizes: fields of :class:`adaponder.data.reasoning.MultiHopSpec` (symbols, max_hops, ...).
    task_options: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """What decides the prepared data (and enters every arm's fingerprint); the task keys only when set,
        so text studies keep the fingerprints they had before tasks existed."""
        out = dict(vars(self))
        if self.task is None:
            del out["task"], out["task_options"]
        return out


@dataclass
class EvalSection:
    #: Held-out tokens scored per document (``null``: all).
    max_tokens_per_doc: Count | None = 16384
    batch_size: Count = 16
    #: τ values of the compute dial (adaponder arms).
    taus: list[Float] = field(default_factory=lambda: [1e-4, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5])
    #: Seeds of the fixed-pruning controls' random halting (their spread is the control's own noise).
    pruning_seeds: list[Int] = field(default_factory=lambda: [0, 1, 2])
    #: The τ dial and fixed pruning scored on the held-out split's perplexity. A labelled task's difficulty
    #: evaluation scores both again, by difficulty, on the same split: such a study may turn these off.
    perplexity_controls: bool = True
    #: The consistency exit's tolerance δ and confidence (arms with consistency heads, docs/method.md A23): the
    #: threshold is calibrated on the development split (a text corpus: every other held-out window) and read on
    #: the test split.
    consistency_delta: Annotated[Float, Field(gt=0, lt=1)] = 0.05
    consistency_confidence: Annotated[Float, Field(gt=0, lt=1)] = 0.95


SECTIONS = {"study": StudySection, "data": DataSection, "eval": EvalSection}


@dataclass
class StudyConfig:
    study: StudySection
    data: DataSection
    eval: EvalSection
    base: dict
    arms: dict[str, dict[str, Any]]
    source: str
    profile: str

    def chosen_arms(self) -> list[str]:
        return list(self.arms) if self.study.only is None else list(self.study.only)

    def arm_runs(self) -> list[tuple[str, int, int | None]]:
        """(arm, seed, data seed) in training order. With ``seeds``: replicate by replicate (seed, then data
        seed), every arm within one, so an interrupted study holds whole replicates. Otherwise every arm with
        the first seed, then the repeats. The data seed is None unless ``data_seeds`` is set."""
        chosen = self.chosen_arms()
        data_seeds = self.study.data_seeds or [None]
        if self.study.seeds is not None:
            return [(arm, seed, ds) for seed in self.study.seeds for ds in data_seeds for arm in chosen
                    if seed in self.study.arm_seeds.get(arm, self.study.seeds)]
        runs = [(arm, self.study.seed, ds) for ds in data_seeds for arm in chosen]
        if self.study.repeat_seed is not None:
            runs += [(arm, self.study.repeat_seed, ds) for ds in data_seeds
                     for arm in self.study.repeat_arms if arm in chosen]
        return runs

    def data_identity(self, data_seed: int | None = None) -> dict[str, Any]:
        """The data section's identity with the task's seed replaced by ``data_seed`` (when given)."""
        out = self.data.identity()
        if data_seed is not None:
            out["task_options"] = {**out["task_options"], "seed": int(data_seed)}
        return out

    def task_options(self, data_seed: int | None = None) -> dict[str, Any]:
        return self.data_identity(data_seed).get("task_options", {})

    def train_raw(self, arm: str, seed: int, data_dir: str, out_dir: str,
                  arm_dirs: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The ``launch/pretrain.py`` configuration (a raw mapping) of one arm and seed. An arm with ``from_arm:
        NAME`` starts from that arm's trained checkpoint of the same seeds: ``init.backbone`` is its folder,
        ``arm_dirs[NAME]`` (a placeholder when not given, as in the fingerprint)."""
        spec = dict(self.arms[arm])
        source = spec.pop("from_arm", None)
        overrides = [f"{k}={_yaml_scalar(v)}" for k, v in spec.items()]
        overrides += [f"train.seed={seed}", f"data.path={data_dir}", f"train.out_dir={out_dir}"]
        if source is not None:
            overrides.append(f"init.backbone={(arm_dirs or {}).get(source, f'<arm {source}>')}")
        raw = apply_overrides(copy.deepcopy(self.base), overrides)
        if source is not None:  # the shape is the source checkpoint's
            for key in BACKBONE_SHAPE_KEYS:
                raw.get("model", {}).pop(key, None)
        return raw

    def evaluation_identity(self) -> dict[str, Any]:
        """The ``eval:`` section as it enters every fingerprint (stored with each result, so that a rerun can name
        what changed in it)."""
        evaluation = dict(vars(self.eval))
        # defaults of keys added later leave the fingerprint alone: results stored before them keep theirs
        for key, default in (("perplexity_controls", True), ("consistency_delta", 0.05),
                             ("consistency_confidence", 0.95)):
            if evaluation.get(key, default) == default:
                evaluation.pop(key, None)
        return evaluation

    def fingerprint(self, arm: str, seed: int, data_seed: int | None = None) -> str:
        """What decides an arm's result: its training config (minus output paths), data and evaluation (and, for
        an arm started from another, that arm's fingerprint)."""
        raw = self.train_raw(arm, seed, "<data>", "<out>")
        what = {"train": raw, "data": self.data_identity(data_seed), "eval": self.evaluation_identity()}
        source = self.arms[arm].get("from_arm")
        if source is not None:
            what["from_arm"] = self.fingerprint(source, seed, data_seed)
        return _digest(what)

    def training_fingerprint(self, arm: str, seed: int, data_seed: int | None = None) -> str:
        """What decides an arm's trained checkpoint: :meth:`fingerprint` without the evaluation (an arm started
        from another carries that arm's training fingerprint, so retraining the source retrains it too)."""
        what = {"train": self.train_raw(arm, seed, "<data>", "<out>"), "data": self.data_identity(data_seed)}
        source = self.arms[arm].get("from_arm")
        if source is not None:
            what["from_arm"] = self.training_fingerprint(source, seed, data_seed)
        return _digest(what)


def _digest(what: Any) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _yaml_scalar(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)


def _deep_set(raw: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise KeyError(dotted)
    node[keys[-1]] = value


def load_study_config(path: str | Path, profile: str | None = None, corpus: list[str] | None = None,
                      overrides: list[str] | None = None) -> StudyConfig:
    """Read and validate a study YAML; apply ``profile`` (from its ``profiles:``), ``corpus`` and ``--set``
    overrides (on the study file's own keys, e.g. ``base.train.tokens=8192``)."""
    source = str(path)
    raw = typed_config.read_yaml(path, StudyConfigError)
    problems: list[str] = []
    profiles = raw.pop("profiles", None) or {}
    if profile is not None:
        if profile not in profiles:
            raise StudyConfigError([f"profile {profile!r} is not defined (profiles: {', '.join(profiles) or 'none'})"],
                                   source)
        for key, value in (profiles[profile] or {}).items():
            try:
                _deep_set(raw, key, value)
            except KeyError:
                problems.append(f"profiles.{profile}.{key}: does not name a key of the study file")
        source += f" (profile {profile})"
    if corpus:
        raw.setdefault("data", {})["corpus"] = list(corpus)
    if overrides:
        raw = typed_config.apply_overrides(raw, overrides, StudyConfigError)
        source += " + --set " + " ".join(overrides)
    sections = typed_config.validate_sections(raw, SECTIONS, problems, others=("base", "arms"))
    base = raw.get("base")
    arms = raw.get("arms")
    if not isinstance(base, Mapping):
        problems.append("base: required, a launch/pretrain.py configuration shared by every arm")
        base = {}
    if not isinstance(arms, Mapping) or not arms:
        problems.append("arms: required, a mapping of arm name to overrides of base (e.g. model.mode: ponderlm)")
        arms = {}
    arms = {str(k): dict(v or {}) for k, v in arms.items()} if isinstance(arms, Mapping) else {}
    cfg = StudyConfig(study=sections["study"], data=sections["data"], eval=sections["eval"], base=dict(base),
                      arms=arms, source=source, profile=profile or "default")
    for key in ("repeat_arms", "only"):
        for name in getattr(cfg.study, key) or []:
            if name not in arms:
                problems.append(f"study.{key}: {name!r} is not an arm (arms: {', '.join(arms)})")
    if cfg.study.data_seeds is not None and cfg.data.task is None:
        problems.append("study.data_seeds: only a synthetic task (data.task) has a data seed; "
                        "a text corpus has one split (data.split_seed)")
    for arm, values in cfg.study.arm_seeds.items():
        if arm not in arms:
            problems.append(f"study.arm_seeds: {arm!r} is not an arm (arms: {', '.join(arms)})")
        elif cfg.study.seeds is None or not set(values) & set(cfg.study.seeds):
            problems.append(f"study.arm_seeds.{arm}: {values}, expected seeds of study.seeds ({cfg.study.seeds}); "
                            "the arm runs on those in both")
    for key in ("seeds", "data_seeds"):
        values = getattr(cfg.study, key)
        if values is not None and (not values or len(set(values)) != len(values)):
            problems.append(f"study.{key}: {values}, expected a non-empty list of distinct seeds")
    chosen = cfg.chosen_arms() if not problems else []
    for arm, spec in arms.items():
        src = spec.get("from_arm")
        if src is None:
            continue
        if src not in arms or arms[src].get("from_arm") is not None:
            problems.append(f"arms.{arm}.from_arm: {src!r}, expected an arm trained from scratch "
                            f"(arms: {', '.join(a for a in arms if 'from_arm' not in arms[a])})")
        elif arm in chosen and src not in chosen:
            problems.append(f"arms.{arm}.from_arm: {src!r} is not among the arms this study runs (study.only)")
        elif arm in chosen and chosen.index(src) > chosen.index(arm):
            problems.append(f"arms.{arm}.from_arm: {src!r} must come before {arm!r} in the arms' order")
    if cfg.data.task == "multihop":
        known = {f.name for f in fields(MultiHopSpec)}
        unknown = sorted(set(cfg.data.task_options) - known)
        problems += [f"data.task_options.{k}: not an option of the multihop task (options: {', '.join(sorted(known))})"
                     for k in unknown]
        if not unknown:
            try:
                problems += [f"data.task_options.{p}" for p in MultiHopSpec(**cfg.data.task_options).problems()]
            except TypeError as err:
                problems.append(f"data.task_options: {err}")
    if base:  # every arm must be a valid training config (reported with the other problems)
        for arm in arms:
            try:
                config_from_dict(cfg.train_raw(arm, cfg.study.seed, "<data>", "<out>"), f"arm {arm}")
            except TrainConfigError as err:
                # an arm started from another names a checkpoint that exists only once that arm has trained
                problems += [f"arms.{arm}: {p}" for p in err.problems
                             if not ("from_arm" in arms[arm] and p.startswith("init.backbone:"))]
    if problems:
        raise StudyConfigError(problems, source)
    return cfg


__all__ = ["StudyConfig", "StudyConfigError", "load_study_config"]
