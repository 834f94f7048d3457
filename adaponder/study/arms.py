"""Train one arm of the study (a ``python -m adaponder.cli.pretrain`` subprocess, resumable) and evaluate it on the held-out
split; the result is one small JSON file per (arm, seed), written atomically, which is what makes the study
resumable arm by arm: an arm whose file exists with the same configuration fingerprint is never retrained.

A rerun says what it does with every arm: ``done earlier`` (its result stands), ``resumed from step N`` (an
interrupted training continued from its newest checkpoint), ``started`` (trained from the first step), or why its
stored result no longer stands. A result records its training fingerprint and the evaluation section it was made
with, so an edited ``eval:`` section re-evaluates the trained checkpoint of each arm it touches, naming the changed
keys, and keeps the others' results; a changed training section retrains (the old run folder is moved aside).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from adaponder.data.reasoning import has_token_labels
from adaponder.evaluation.dial import sweep_tau
from adaponder.evaluation.difficulty import difficulty_by_tau, evaluate_difficulty
from adaponder.evaluation.halting import greedy_changed_share, nll_by_exit_pass
from adaponder.evaluation.perplexity import load_documents, score_documents, summarize
from adaponder.evaluation.pruning import FIXED_RULES, make_policy
from adaponder.evaluation.settings import load_for_eval
from adaponder.jsonio import json_safe, write_json_atomic
from adaponder.evaluation.exit_calibration import calibrate, windows_of
from adaponder.modeling.exit_rules import ConsistencyExit, NoHalting, QExit
from adaponder.modeling.run_settings import RunSettings
from adaponder.resources import module_command, package_env
from adaponder.run_lock import lock_folder

from .config import StudyConfig

#: In an arm's run folder: the training fingerprint it was trained under (an arm started from another carries that
#: arm's, which its ``arm.yaml``, naming only the folder, does not show).
ARM_IDENTITY_FILE = "study_arm.json"
RESULT_VERSION = 2  # 2: per-symbol outcomes, the development split, FLOPs by class (labelled tasks only)
#: Versions whose results still stand: a text study's evaluation is the same in both (what version 2 added is
#: for labelled tasks, whose fingerprints changed with it).
READABLE_VERSIONS = (1, 2)


def arm_id(arm: str, seed: int, data_seed: int | None = None) -> str:
    return f"{arm}-s{seed}" if data_seed is None else f"{arm}-s{seed}-d{data_seed}"


def result_id(res: dict) -> str:
    return arm_id(res["arm"], res["seed"], res.get("data_seed"))


def result_path(cfg: StudyConfig, arm: str, seed: int, data_seed: int | None = None) -> Path:
    return Path(cfg.study.results_dir) / f"{arm_id(arm, seed, data_seed)}.json"


def run_dir_of(cfg: StudyConfig, arm: str, seed: int, data_seed: int | None = None) -> Path:
    return Path(cfg.study.runs_dir) / arm_id(arm, seed, data_seed)


def stored_result(cfg: StudyConfig, arm: str, seed: int, data_seed: int | None = None) -> dict | None:
    """The stored result of (arm, seed, data seed), whatever configuration produced it (None: none stored)."""
    path = result_path(cfg, arm, seed, data_seed)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def load_result(cfg: StudyConfig, arm: str, seed: int, data_seed: int | None = None) -> dict | None:
    """The stored result of (arm, seed, data seed) if it was produced by the current configuration."""
    res = stored_result(cfg, arm, seed, data_seed)
    if res is None or res.get("fingerprint") != cfg.fingerprint(arm, seed, data_seed) \
            or res.get("version") not in READABLE_VERSIONS:
        return None
    return res


# -- what changed since a stored result ---------------------------------------------------------------------
#: ``eval:`` keys read only for some arms (evaluate_arm): the τ dial and fixed pruning for gated arms, the
#: consistency calibration for arms with consistency heads. Every other key touches every arm.
_EVAL_KEY_SCOPE = {"taus": "gated", "pruning_seeds": "gated", "perplexity_controls": "gated",
                   "consistency_delta": "consistency", "consistency_confidence": "consistency"}


def config_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old → new`` for every dotted key whose value differs between two nested mappings."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            missing = "(unset)"
            out += config_changes(old.get(key, missing), new.get(key, missing), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old} → {new}"]


def _arm_kinds(cfg: StudyConfig, arm: str, seed: int, stored: dict) -> set[str]:
    """Which scoped ``eval:`` keys (:data:`_EVAL_KEY_SCOPE`) an arm's evaluation reads."""
    model = cfg.train_raw(arm, seed, "<data>", "<out>").get("model", {})
    kinds = set()
    if stored.get("mode") == "adaponder" and int(stored.get("passes", 1)) > 1:
        kinds.add("gated")
    if model.get("consistency_heads") or "consistency_exit" in stored:
        kinds.add("consistency")
    return kinds


def stale_result(cfg: StudyConfig, arm: str, seed: int, stored: dict,
                 data_seed: int | None = None) -> tuple[str, list[str] | None]:
    """Why a stored result that :func:`load_result` refuses no longer stands, and, when only the evaluation
    section changed since, the changed keys that touch this arm (an empty list: none does, the result stands as
    it is; None: training may have changed, :func:`train_arm` decides)."""
    if stored.get("version") not in READABLE_VERSIONS:
        return (f"its result has format version {stored.get('version')} (this study reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}): evaluated again"), None
    trained = stored.get("training_fingerprint")
    if trained is not None and trained != cfg.training_fingerprint(arm, seed, data_seed):
        return "the training section changed since its result was made", None
    if trained is None or "evaluation" not in stored:  # a result stored before these were recorded
        return (f"its configuration changed since (fingerprint {stored.get('fingerprint')}, now "
                f"{cfg.fingerprint(arm, seed, data_seed)})"), None
    changes = config_changes(stored["evaluation"], json_safe(dict(vars(cfg.eval))), "eval.")
    if not changes:
        return (f"its fingerprint changed ({stored.get('fingerprint')}, now {cfg.fingerprint(arm, seed, data_seed)}) "
                "with the same training and evaluation sections"), None
    kinds = _arm_kinds(cfg, arm, seed, stored)
    touching = [c for c in changes if _EVAL_KEY_SCOPE.get(c.split(":")[0].split(".")[1], "all") in kinds | {"all"}]
    return f"the evaluation section changed ({'; '.join(changes)})", touching


def _result_identity(cfg: StudyConfig, arm: str, seed: int, data_seed: int | None) -> dict[str, Any]:
    """What a result records of the configuration it was made under (see :func:`stale_result`)."""
    return {"fingerprint": cfg.fingerprint(arm, seed, data_seed),
            "training_fingerprint": cfg.training_fingerprint(arm, seed, data_seed),
            "evaluation": json_safe(dict(vars(cfg.eval)))}


# -- training -----------------------------------------------------------------------------------------------
def train_arm(cfg: StudyConfig, arm: str, seed: int, data_dir: Path, log=print,
              data_seed: int | None = None) -> Path:
    """Train (or continue training) one arm in a ``python -m adaponder.cli.pretrain`` subprocess; returns its run folder.
    Wall time is accumulated in ``<run>/study_wall.json`` across interrupted sessions. An arm started from
    another (``from_arm``) trains that one first when its checkpoint is not there."""
    run_dir = run_dir_of(cfg, arm, seed, data_seed)
    name = arm_id(arm, seed, data_seed)
    # Another job on this arm's folder (a pretraining started by hand): refused here, naming it, rather than by
    # the training subprocess, whose failure would advise a rerun that cannot succeed while that job runs.
    lock_folder(run_dir, "arm run folder").release()
    arm_dirs = {}
    source = cfg.arms[arm].get("from_arm")
    if source is not None:
        arm_dirs[source] = str(train_arm(cfg, source, seed, data_dir, log, data_seed) / "hf")
    config_file = run_dir / "arm.yaml"
    identity_file = run_dir / ARM_IDENTITY_FILE
    wanted = cfg.train_raw(arm, seed, str(data_dir), str(run_dir), arm_dirs)
    fingerprint = cfg.training_fingerprint(arm, seed, data_seed)
    changed = None
    if config_file.is_file():
        changed = config_changes(yaml.safe_load(config_file.read_text(encoding="utf-8")), wanted)
        recorded = json.loads(identity_file.read_text())["training_fingerprint"] if identity_file.is_file() else None
        if not changed and recorded not in (None, fingerprint):
            # arm.yaml names the source arm's folder, not what it holds: the source was trained again differently
            changed = [f"the arm it starts from ({source}) was trained under another configuration"
                       if source is not None else f"training fingerprint {recorded} → {fingerprint}"]
    if changed:
        # Trained (or begun) under another configuration: neither reuse nor resume it; keep it aside.
        stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(stale)
        shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
        log(f"== {name}: the run folder was trained under another configuration; moved to {stale} "
            f"(changed: {shown}); training it from the first step")
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(wanted, sort_keys=False), encoding="utf-8")
    write_json_atomic(identity_file, {"training_fingerprint": fingerprint})
    wall_file = run_dir / "study_wall.json"
    wall = json.loads(wall_file.read_text())["seconds"] if wall_file.is_file() else 0.0
    if (run_dir / "hf" / "config.json").is_file() and _finished(run_dir):
        log(f"== {name}: trained earlier ({run_dir}); not trained again")
        return run_dir
    cmd = module_command("adaponder.cli.pretrain", ["--config", str(config_file), "--resume", "auto"])
    log(f"== training {name}: {_training_start(wanted, run_dir)}; {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    env = package_env({**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")})
    proc = subprocess.run(cmd, cwd=os.getcwd(), env=env)
    wall += time.perf_counter() - t0
    write_json_atomic(wall_file, {"seconds": wall})
    if proc.returncode != 0:
        raise RuntimeError(f"training {arm_id(arm, seed, data_seed)} failed with exit code {proc.returncode} "
                           f"(log above; config {config_file}); rerun the study to resume it")
    return run_dir


def _training_start(raw: dict, run_dir: Path) -> str:
    """``resumed from step N of M`` when an earlier attempt left a checkpoint (``--resume auto`` continues from the
    newest intact one and names any it skips), else ``started``."""
    from adaponder.train.checkpoint import TAG_RE, list_tags
    from adaponder.train.config import config_from_dict, plan_run

    try:
        train_cfg = config_from_dict(raw, str(run_dir / "arm.yaml"))
        ckpt_dir, total = Path(train_cfg.checkpoint_dir), f" of {plan_run(train_cfg, 1).total_steps}"
    except (ValueError, OSError):  # the training child names the problem
        ckpt_dir, total = run_dir / "checkpoints", ""
    tags = list_tags(ckpt_dir)
    if tags:
        return f"resumed from step {int(TAG_RE.match(tags[-1]).group(1))}{total} ({ckpt_dir / tags[-1]})"
    earlier = " (an earlier attempt left no checkpoint)" if (run_dir / "metrics.jsonl").is_file() else ""
    return f"started from step 0{total}{earlier}"


def _finished(run_dir: Path) -> bool:
    records = _metrics(run_dir)
    return any(r.get("kind") == "eval" and r.get("final") for r in records)


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


_GATE_KEYS = ("gate_median", "gate_halt_share", "active_fraction", "tau", "gate_warmup")


def _gated_record(r: dict) -> bool:
    return r.get("gate_median") is not None or r.get("gate_warmup") is not None


def training_summary(run_dir: Path) -> dict[str, Any]:
    """Training curve (per logged step), throughput and wall time from the run's ``metrics.jsonl``."""
    records = _metrics(run_dir)
    train = [r for r in records if r.get("kind") == "train"]
    # A resumed run may log a step twice; keep the last record of each step.
    by_step = {r["step"]: r for r in train}
    curve = [{"step": s, "tokens": r.get("tokens"), "lm_loss": r.get("lm_loss"), "loss": r.get("loss"),
              "mean_exit_pass": r.get("mean_exit_pass"), "lr": r.get("lr"),
              # gated runs: per-gate median and halt share, per-pass active share (the collapse watch's inputs)
              **({k: r[k] for k in _GATE_KEYS if r.get(k) is not None} if _gated_record(r) else {})}
             for s, r in sorted(by_step.items())]
    tps = [r["tokens_per_s"] for r in by_step.values() if r.get("tokens_per_s")]
    wall_file = run_dir / "study_wall.json"
    return {
        "curve": curve,
        "tokens": curve[-1]["tokens"] if curve else 0,
        "steps": curve[-1]["step"] if curve else 0,
        "tokens_per_s": statistics.median(tps) if tps else float("nan"),
        "wall_s": json.loads(wall_file.read_text())["seconds"] if wall_file.is_file() else float("nan"),
        "final_train_lm_loss": curve[-1]["lm_loss"] if curve else float("nan"),
    }


def refresh_training(cfg: StudyConfig, arm: str, seed: int, log=print, data_seed: int | None = None) -> bool:
    """Re-read a finished arm's training summary from its run folder into its stored result (no training, no
    evaluation): for results stored before the summary carried something it carries now. False when the result
    or the run folder's metrics are missing."""
    res = load_result(cfg, arm, seed, data_seed)
    run_dir = run_dir_of(cfg, arm, seed, data_seed)
    if res is None or not (run_dir / "metrics.jsonl").is_file():
        return False
    fresh = json_safe(training_summary(run_dir))
    if not math.isfinite(fresh.get("wall_s") or float("nan")):
        fresh["wall_s"] = res["train"].get("wall_s")
    write_json_atomic(result_path(cfg, arm, seed, data_seed), {**res, "train": fresh})
    log(f"== {arm_id(arm, seed, data_seed)}: training summary re-read from {run_dir / 'metrics.jsonl'}")
    return True


# -- evaluation ---------------------------------------------------------------------------------------------
def evaluate_arm(cfg: StudyConfig, run_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Held-out perplexity, mean exit pass and inference FLOPs/token of the exported checkpoint; for gated
    arms also NLL by exit pass, fixed pruning (uniform, geometric) at the learned mean exit pass, and the τ
    dial. Windows: the training length, not overlapping (every token scored once)."""
    t0 = time.perf_counter()
    torch.manual_seed(0)
    train_cfg = yaml.safe_load((run_dir / "arm.yaml").read_text())
    window = int(train_cfg["data"]["seq_len"])
    model, tok = load_for_eval(run_dir / "hf")
    docs = load_documents(data_dir, tok, max_tokens_per_doc=cfg.eval.max_tokens_per_doc, split="val")
    score_kw = dict(window=window, stride=window, batch_size=cfg.eval.batch_size, eod_id=tok.eos_token_id)
    scores = score_documents(model, docs, **score_kw)
    out: dict[str, Any] = {"heldout": json_safe(summarize(scores, docs, model)),
                           "parameters": model.parameter_counts(), "passes": int(model.config.num_passes),
                           "mode": model.config.mode, "window": window}
    if model.config.ponders and model.config.num_passes > 1:
        out["greedy_changed_by_later_passes"] = greedy_changed_share(model, docs, window, cfg.eval.batch_size,
                                                                     tok.eos_token_id)
    if model.config.gated:
        K = model.config.num_passes
        out["nll_by_exit_pass"] = json_safe(nll_by_exit_pass(scores))
        mean_exit = out["heldout"]["mean_exit"]
        pruning = {}
        for rule in FIXED_RULES if cfg.eval.perplexity_controls else ():
            if 1.0 < mean_exit < K:
                runs = [summarize(score_documents(model, docs, settings=RunSettings(
                    exit_rule=make_policy(rule, K, mean_exit, seed=s)), **score_kw), docs, model)
                    for s in cfg.eval.pruning_seeds]
                # the first seed's full summary, plus every seed's perplexity (the control's own noise)
                pruning[rule] = json_safe({**runs[0], "ppl_seeds": [r["ppl"] for r in runs],
                                        "mean_exit_seeds": [r["mean_exit"] for r in runs]})
        out["fixed_pruning"] = pruning
        if cfg.eval.perplexity_controls:
            out["tau_dial"] = json_safe(sweep_tau(model, docs, cfg.eval.taus, **score_kw))
        # Reference points on the same trained model: no halting (every token runs K passes).
        out["no_halting"] = json_safe(summarize(score_documents(model, docs, settings=_NEVER_HALT, **score_kw),
                                             docs, model))
    looped = model.config.mode in ("ponderlm", "loop", "adaponder") and model.config.num_passes > 1
    if model.halting_heads is not None:  # token-level Q-exit (A21, B9): perplexity and passes at its exits
        out["q_exit"] = json_safe(summarize(score_documents(model, docs, settings=RunSettings(
            exit_rule=QExit(0.5, head=model.halting_heads)), **score_kw), docs, model))
    if model.consistency_heads is not None and not has_token_labels(data_dir):
        # A23 on a text corpus: calibrated on every other held-out window, read on the others
        wins = windows_of(docs, window, tok.eos_token_id)
        out["consistency_exit"] = json_safe(asdict(calibrate(
            model, wins[0::2], cfg.eval.consistency_delta, cfg.eval.consistency_confidence, window,
            batch_size=cfg.eval.batch_size, split="val (even windows)", test_windows=wins[1::2])))
    if has_token_labels(data_dir):  # a corpus with per-token difficulty (adaponder.data.reasoning)
        out["difficulty"] = json_safe(evaluate_difficulty(model, data_dir, tok, batch_size=cfg.eval.batch_size,
                                                          pruning_seeds=cfg.eval.pruning_seeds))
        if model.config.gated:
            out["difficulty_no_halting"] = json_safe(evaluate_difficulty(
                model, data_dir, tok, batch_size=cfg.eval.batch_size, settings=_NEVER_HALT))
            out["difficulty_tau"] = json_safe(difficulty_by_tau(model, data_dir, tok, cfg.eval.taus,
                                                                batch_size=cfg.eval.batch_size))
        if looped:  # the per-pass probe: pass i's greedy answers (passes 1..i run, nothing halts), by difficulty
            out["pass_probe"] = [json_safe(_probe_row(evaluate_difficulty(
                model, data_dir, tok, batch_size=cfg.eval.batch_size, pruning_seeds=(),
                settings=RunSettings(passes=i, exit_rule=NoHalting())))) for i in range(1, model.config.num_passes + 1)]
        if model.halting_heads is not None:  # token-level Q-exit on the halting heads (A21, B9)
            out["difficulty_q_exit"] = json_safe(evaluate_difficulty(
                model, data_dir, tok, batch_size=cfg.eval.batch_size, pruning_seeds=(),
                settings=RunSettings(exit_rule=QExit(0.5, head=model.halting_heads))))
        if model.consistency_heads is not None and has_token_labels(data_dir, "dev"):  # A23, calibrated on dev
            dev = load_documents(data_dir, tok, split="dev")
            cal = calibrate(model, windows_of(dev, max(len(d) for d in dev), tok.eos_token_id),
                            cfg.eval.consistency_delta, cfg.eval.consistency_confidence, window,
                            batch_size=cfg.eval.batch_size, split="dev")
            out["consistency_exit"] = json_safe(asdict(cal))
            out["difficulty_consistency"] = json_safe(evaluate_difficulty(
                model, data_dir, tok, batch_size=cfg.eval.batch_size, pruning_seeds=(),
                settings=RunSettings(exit_rule=ConsistencyExit(cal.threshold, model.consistency_heads))))
        if model.halting_heads is not None and has_token_labels(data_dir, "dev"):
            # Q-exit at each q of the grid, on the development split (where q is chosen: .q_choice) and on the test
            # split (the report reads it only at the q chosen on the development split)
            for key, split in (("difficulty_q_grid_dev", "dev"), ("difficulty_q_grid", "val")):
                out[key] = {f"{q:g}": json_safe(evaluate_difficulty(
                    model, data_dir, tok, split=split, batch_size=cfg.eval.batch_size, pruning_seeds=(),
                    settings=RunSettings(exit_rule=QExit(q, head=model.halting_heads)))) for q in Q_GRID}
        if has_token_labels(data_dir, "dev"):
            # The development split: where settings (τ, an arm) are chosen; the test split above is then read once.
            out["difficulty_dev"] = json_safe(evaluate_difficulty(model, data_dir, tok, split="dev",
                                                                  batch_size=cfg.eval.batch_size, pruning_seeds=()))
            if model.config.gated:
                out["difficulty_tau_dev"] = json_safe(difficulty_by_tau(model, data_dir, tok, cfg.eval.taus, split="dev",
                                                                        batch_size=cfg.eval.batch_size))
    out["eval_wall_s"] = time.perf_counter() - t0
    return out


#: The Q-exit thresholds evaluated on arms with halting heads (A21, B9), q chosen among them on the development split.
Q_GRID = (0.3, 0.5, 0.7, 0.9)

#: Every token runs K passes (the gates still weigh the feedback).
_NEVER_HALT = RunSettings(exit_rule=NoHalting())


def _probe_row(res: dict) -> dict:
    """What the per-pass probe keeps of a difficulty evaluation: accuracy by difficulty and the answer accuracy."""
    return {"levels": [{k: lv[k] for k in ("difficulty", "accuracy", "mean_nll")} for lv in res["levels"]],
            "answer_accuracy": res["answer_accuracy"], "ppl": res["ppl"]}


def run_arm(cfg: StudyConfig, arm: str, seed: int, data_dir: Path, log=print, data_seed: int | None = None,
            train_only: bool = False) -> dict | None:
    """Train and evaluate (arm, seed, data seed) unless its result is already stored; returns the result
    (None with ``train_only``, which trains and stops there)."""
    name = arm_id(arm, seed, data_seed)
    done = load_result(cfg, arm, seed, data_seed)
    if done is not None:
        log(f"== {name}: done earlier ({result_path(cfg, arm, seed, data_seed)})")
        return done
    stored = stored_result(cfg, arm, seed, data_seed)
    if stored is not None:
        why, touching = stale_result(cfg, arm, seed, stored, data_seed)
        if touching == [] and not train_only:
            # e.g. a τ added to the dial: an arm without gates has no dial, its figures would come out the same
            write_json_atomic(result_path(cfg, arm, seed, data_seed),
                              {**stored, **_result_identity(cfg, arm, seed, data_seed)})
            log(f"== {name}: {why}; none of it touches this arm: its result is kept")
            return load_result(cfg, arm, seed, data_seed)
        log(f"== {name}: its stored result no longer stands: {why}")
    run_dir = train_arm(cfg, arm, seed, data_dir, log, data_seed)
    if train_only:
        return None
    held = lock_folder(run_dir, "arm run folder")  # no other job re-trains or re-exports it while it is evaluated
    try:
        log(f"== {'re-evaluating' if stored is not None else 'evaluating'} {name} on the held-out split")
        result = {"version": RESULT_VERSION, "arm": arm, "seed": seed,
                  **({} if data_seed is None else {"data_seed": data_seed}),
                  **_result_identity(cfg, arm, seed, data_seed),
                  "profile": cfg.profile, "checkpoint": str(run_dir / "hf"), "overrides": cfg.arms[arm],
                  "train": json_safe(training_summary(run_dir)), **evaluate_arm(cfg, run_dir, data_dir)}
        write_json_atomic(result_path(cfg, arm, seed, data_seed), result)
    finally:
        held.release()
    h = result["heldout"]
    log(f"== {arm_id(arm, seed, data_seed)}: held-out ppl {h['ppl']:.2f}, mean exit pass {h['mean_exit']:.3f}, "
        f"{h['flops']['total'] / 1e6:.2f} MFLOP/token; train {result['train']['tokens_per_s']:.0f} tok/s")
    return result


__all__ = ["arm_id", "config_changes", "evaluate_arm", "load_result", "result_id", "run_dir_of", "refresh_training",
           "result_path", "run_arm", "stale_result", "stored_result", "train_arm", "training_summary"]
