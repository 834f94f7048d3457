"""The evidence study: train every arm (vanilla, PonderLM, Loop, Pause, AdaPonder at several ponder-loss
settings; key arms with a second seed) on the same data and budget, evaluate each on the same held-out split,
and write the report (docs/study.md + PNGs).

    python launch/study.py --config configs/study/cpu.yaml --corpus ../shared/data/corpus/gutenberg
    python launch/study.py --config configs/study/cpu.yaml --profile quick        # bundled corpus, minutes
    python launch/study.py --config configs/study/cpu.yaml --report-only          # tables/plots from stored results
    python launch/study.py --config configs/study/cpu.yaml --report-only --refresh-training  # curves re-read from runs/

Resumable: every finished arm is stored as one JSON in the results folder and never retrained; an interrupted
arm continues from its last checkpoint (--resume auto). Exit codes: 0 done, 2 configuration error, 1 a run failed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from adaponder.cli.errors import cli_main


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="study YAML (configs/study/*.yaml)")
    p.add_argument("--profile", default=None, help="a profile of the config (e.g. quick)")
    p.add_argument("--corpus", nargs="+", default=None, metavar="PATH",
                   help="raw text inputs (files/folders/globs; 'bundled' = the shipped corpus); default: the config's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a study-file value, e.g. base.train.tokens=8192 (repeatable)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from stored results")
    p.add_argument("--train-only", action="store_true",
                   help="train every run not trained yet and stop (no evaluation, no report): a later run "
                        "evaluates the checkpoints without training them again")
    p.add_argument("--refresh-training", action="store_true",
                   help="re-read the training summaries (curves, gate statistics) of finished arms from their run "
                        "folders into the stored results; nothing is retrained or re-evaluated")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    # after DS_ACCELERATOR is set (DeepSpeed reads it on import); torch and transformers take seconds to import,
    # so --help and a bad argument answer before they load
    from adaponder.study import StudyConfigError, load_study_config, run_study

    try:
        cfg = load_study_config(args.config, args.profile, args.corpus, args.overrides)
    except StudyConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    flags = ("--report-only", "--refresh-training")
    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in flags]
    command = "python launch/study.py " + " ".join(shlex.quote(a) for a in shown)
    try:
        run_study(cfg, command, only_report=args.report_only, refresh=args.refresh_training,
                  train_only=args.train_only)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
