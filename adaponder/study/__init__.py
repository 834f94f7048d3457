"""The evidence study: every arm of the AdaPonderLM comparison trained on the same data, budget, seed and
schedule, evaluated on the same held-out split, reported in ``docs/study.md`` (``adaponder study``).

* :mod:`~adaponder.study.config` — the study YAML (base config, arms, profiles), validated at once;
* :mod:`~adaponder.study.arms` — train an arm (resumable subprocess) and evaluate it; one JSON per arm;
* :mod:`~adaponder.study.report` — tables, the paper's claims checked against the numbers, plots.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from adaponder.data import bundled_corpus_dir
from adaponder.data.prepare import prepare
from adaponder.data.reasoning import MultiHopSpec, write_multihop
from adaponder.run_lock import lock_folder

from .arms import arm_id, load_result, refresh_training, run_arm
from .config import StudyConfig, StudyConfigError, load_study_config


def prepare_data(cfg: StudyConfig, log=print, data_seed: int | None = None) -> Path:
    """Tokenize the corpus once (BPE trained on the train split) into ``<runs_dir>/data-<hash>``, or generate the
    configured synthetic task there (with ``data_seed`` as the task's seed, when given)."""
    key = hashlib.sha256(json.dumps(cfg.data_identity(data_seed), sort_keys=True).encode()).hexdigest()[:12]
    out = Path(cfg.study.runs_dir) / f"data-{key}"
    if (out / "meta.json").is_file():
        return out
    if cfg.data.task == "multihop":
        log(f"== generating the multihop task into {out}" + ("" if data_seed is None else f" (data seed {data_seed})"))
        write_multihop(out, MultiHopSpec(**cfg.task_options(data_seed)), overwrite=out.exists())
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


def run_study(cfg: StudyConfig, command: str, only_report: bool = False, refresh: bool = False, log=print,
              train_only: bool = False) -> Path | None:
    """Run every (arm, seed, data seed) not finished yet, then write the report. Returns the report's path.
    ``refresh`` first re-reads the training summary of every finished arm whose run folder is still there;
    ``train_only`` trains what is missing and writes neither results nor the report (returns None)."""
    # One study per study folder: a second one would re-run an arm's final validation and export, and append
    # to its metrics, while the first is still at work on it.
    with lock_folder(cfg.study.runs_dir, "study folder"):
        return _run_study(cfg, command, only_report, refresh, log, train_only)


def _run_study(cfg: StudyConfig, command: str, only_report: bool, refresh: bool, log, train_only: bool) -> Path | None:
    from .report import write_report  # draws with matplotlib (a second to import): --train-only never loads it

    runs = cfg.arm_runs()
    data_dirs = {ds: prepare_data(cfg, log, ds) for ds in dict.fromkeys(ds for _, _, ds in runs)}
    if refresh:
        for arm, seed, ds in runs:
            refresh_training(cfg, arm, seed, log, ds)
    results = []
    for i, (arm, seed, ds) in enumerate(runs, 1):
        log(f"== [{i}/{len(runs)}] {arm_id(arm, seed, ds)}")
        if only_report:
            res = load_result(cfg, arm, seed, ds)
        else:
            res = run_arm(cfg, arm, seed, data_dirs[ds], log, ds, train_only=train_only)
        if res is not None:
            results.append(res)
    if train_only:
        return None
    pending = [arm_id(a, s, ds) for a, s, ds in runs if load_result(cfg, a, s, ds) is None]
    report = write_report(cfg, results, data_summary(next(iter(data_dirs.values()))), command, pending)
    log(f"== report: {report}")
    return report


__all__ = ["StudyConfig", "StudyConfigError", "data_summary", "load_study_config", "prepare_data", "run_study"]
