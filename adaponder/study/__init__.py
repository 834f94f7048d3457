"""The evidence study: every arm of the AdaPonderLM comparison trained on the same data, budget, seed and
schedule, evaluated on the same held-out split, reported in ``docs/study.md`` (``launch/study.py``).

* :mod:`~adaponder.study.config` — the study YAML (base config, arms, profiles), validated at once;
* :mod:`~adaponder.study.arms` — train an arm (resumable subprocess) and evaluate it; one JSON per arm;
* :mod:`~adaponder.study.report` — tables, the paper's claims checked against the numbers, plots.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .arms import arm_id, load_result, refresh_training, run_arm
from .config import StudyConfig, StudyConfigError, load_study_config


def prepare_data(cfg: StudyConfig, log=print) -> Path:
    """Tokenize the corpus once (BPE trained on the train split) into ``<runs_dir>/data-<hash>``, or generate the
    configured synthetic task there."""
    from adaponder.data import bundled_corpus_dir
    from adaponder.data.prepare import prepare

    key = hashlib.sha256(json.dumps(cfg.data.identity(), sort_keys=True).encode()).hexdigest()[:12]
    out = Path(cfg.study.runs_dir) / f"data-{key}"
    if (out / "meta.json").is_file():
        return out
    if cfg.data.task == "multihop":
        from adaponder.data.reasoning import MultiHopSpec, write_multihop

        log(f"== generating the multihop task into {out}")
        write_multihop(out, MultiHopSpec(**cfg.data.task_options), overwrite=out.exists())
        return out
    inputs = [str(bundled_corpus_dir()) if x == "bundled" else x for x in cfg.data.corpus]
    log(f"== preparing {', '.join(cfg.data.corpus)} into {out} (tokenizer: BPE, {cfg.data.vocab} entries)")
    prepare(inputs, out, train_tokenizer=cfg.data.vocab, val_fraction=cfg.data.val_fraction,
            seed=cfg.data.split_seed, num_workers=1, progress=False)
    return out


def data_summary(data_dir: Path) -> dict:
    meta = json.loads((data_dir / "meta.json").read_text())
    return {"documents": meta["documents"], "val_documents": meta["splits"]["val"]["documents"],
            "train_tokens": meta["splits"]["train"]["tokens"], "val_tokens": meta["splits"]["val"]["tokens"],
            "vocab_size": meta["vocab_size"], "task": meta.get("task")}


def run_study(cfg: StudyConfig, command: str, only_report: bool = False, refresh: bool = False, log=print) -> Path:
    """Run every (arm, seed) not finished yet, then write the report. Returns the report's path. ``refresh``
    first re-reads the training summary of every finished arm whose run folder is still there."""
    from adaponder.run_lock import lock_folder

    # One study per study folder: a second one would re-run an arm's final validation and export, and append
    # to its metrics, while the first is still at work on it.
    with lock_folder(cfg.study.runs_dir, "study folder"):
        return _run_study(cfg, command, only_report, refresh, log)


def _run_study(cfg: StudyConfig, command: str, only_report: bool, refresh: bool, log) -> Path:
    from .report import write_report

    data_dir = prepare_data(cfg, log)
    runs = cfg.arm_runs()
    if refresh:
        for arm, seed in runs:
            refresh_training(cfg, arm, seed, log)
    results = []
    for i, (arm, seed) in enumerate(runs, 1):
        log(f"== [{i}/{len(runs)}] {arm_id(arm, seed)}")
        res = load_result(cfg, arm, seed) if only_report else run_arm(cfg, arm, seed, data_dir, log)
        if res is not None:
            results.append(res)
    pending = [arm_id(a, s) for a, s in runs if load_result(cfg, a, s) is None]
    report = write_report(cfg, results, data_summary(data_dir), command, pending)
    log(f"== report: {report}")
    return report


__all__ = ["StudyConfig", "StudyConfigError", "data_summary", "load_study_config", "prepare_data", "run_study"]
