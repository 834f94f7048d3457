"""The evidence study: train every arm (vanilla, PonderLM, Loop, Pause, AdaPonder at several ponder-loss
settings; key arms with a second seed) on the same data and budget, evaluate each on the same held-out split,
and write the report (docs/study.md + PNGs).

    adaponder study --config cpu --corpus PATH/TO/BOOKS           # a text corpus: files, folders, globs
    adaponder study --config cpu --profile quick                  # bundled corpus, minutes
    adaponder study --config reasoning --profile quick            # the multi-hop task, minutes
    adaponder study --config cpu --report-only                    # tables/plots from stored results
    adaponder study --config cpu --report-only --refresh-training # curves re-read from runs/

``--config`` is a file, or the name of a study shipped with adaponder (``cpu``, ``reasoning``; also
``study/reasoning.yaml``, ``configs/study/reasoning.yaml``), from a checkout or an installed wheel alike. Each arm
trains in a ``python -m adaponder.cli.pretrain`` child process.

Resumable: every finished arm is stored as one JSON in the results folder and never retrained; an interrupted
arm continues from its last checkpoint (--resume auto). A rerun says of each arm whether it was done earlier, resumed
(from which step) or started, and why a stored result no longer stands: an edited eval section re-evaluates the arms
it touches, a changed training section retrains. Exit codes: 0 done, 2 configuration error, 1 a run failed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from adaponder.cli.errors import cli_main, report
from adaponder.resources import find_config


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="study YAML: a file, or a shipped study's name (cpu, reasoning)")
    p.add_argument("--profile", default=None, help="a profile of the config (e.g. quick)")
    p.add_argument("--corpus", nargs="+", default=None, metavar="PATH",
                   help="raw text inputs (files/folders/globs; 'bundled' = the shipped corpus); default: the config's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a study-file value, e.g. base.train.tokens=8192 (repeatable)")
    only = p.add_mutually_exclusive_group()  # (each is the other's opposite: argparse names the conflict)
    only.add_argument("--report-only", action="store_true", help="only rewrite the report from stored results")
    only.add_argument("--train-only", action="store_true",
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
        cfg = load_study_config(find_config(args.config, "study"), args.profile, args.corpus, args.overrides)
    except StudyConfigError as err:
        return report(err)  # one line, exit code 2
    flags = ("--report-only", "--refresh-training")
    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in flags]
    command = "adaponder study " + " ".join(shlex.quote(a) for a in shown)
    try:
        run_study(cfg, command, only_report=args.report_only, refresh=args.refresh_training,
                  train_only=args.train_only)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
