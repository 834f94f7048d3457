"""Fine-tune the recurrent core on a GLUE task in PALBERT mode (docs/method.md (b)) and evaluate every exit rule.

One process (a 1-rank DeepSpeed group, like pretraining)::

    adaponder finetune --config sst2 --init runs/demo/hf --output runs/glue/sst2
    adaponder finetune --config sst2 --init EleutherAI/pythia-160m --init-revision step143000
    adaponder finetune --config base --task rte --init CKPT          # the one recipe, the task as a setting

Data parallel over N ranks (ZeRO stage from the config's ``deepspeed`` section, e.g. ``--set deepspeed.zero_stage=3``)::

    deepspeed --num_gpus 2 launch/finetune_glue.py --config rte --init CKPT --deepspeed

``--init`` is a local Hugging Face checkpoint folder (AdaPonder or GPT-NeoX/Pythia), a hub id (with
``--init-revision``, resolved through the Hugging Face cache; offline only the cache is read) or ``tiny-random``
(the ``tiny`` preset, randomly initialised; for smoke runs). GLUE comes from the TSV folder (``--data-dir``, else
``$ADAPONDER_GLUE_DIR``) or through Hugging Face ``datasets`` (``--hf-dataset nyu-mll/glue`` or a ``save_to_disk``
folder); the examples are the same. ``--config`` is a file, or a shipped preset's name: a task (``sst2``: the
recipe ``configs/glue/base.yaml`` with ``task: sst2``) or ``base`` with ``--task NAME``.
``--set section.key=value`` overrides any config value (e.g. ``--set train.max_examples=64``).

Checkpoints (``<output>/checkpoints``) are written after every dev evaluation and on SIGTERM/SIGINT;
``--resume auto`` continues an interrupted run (mid-training, or straight to the evaluation phases).
``results.json`` / ``results.md`` (metric per exit rule, mean exit pass, speed-up, time per example at
batch 1 and 32) are rewritten as each phase ends; ``metrics.jsonl`` logs steps, evaluations and events.

Exit codes: 0 done (or stopped at ``train.stop_at``), 2 configuration/data/checkpoint/model-name error (one
``error:`` line naming the file, and the line of a bad TSV row; ``--debug`` shows the traceback instead,
:mod:`adaponder.cli.errors`), 3 non-finite loss, 128 + N stopped by signal N (a checkpoint was saved; continue
with ``--resume auto``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from adaponder.cli.doc import DefaultsHelpFormatter
from adaponder.cli.errors import UsageError, add_debug_help, cli_main
from adaponder.resources import find_config, repo_root


def recipe_defaults() -> str:
    """The ``--help`` epilog: every value of the shipped recipe (``configs/glue/base.yaml``, which every task preset
    extends) as ``key=value``, the defaults ``--set`` changes; read as YAML only, so ``--help`` stays quick."""
    import textwrap

    import yaml

    path = find_config("base", "glue")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        return f"the recipe's defaults: {path} (cannot be read here: {err})"

    def flat(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}={json.dumps(value)}"

    body = textwrap.fill(", ".join(flat(raw)), width=110, break_on_hyphens=False)
    return (f"config values and their defaults in the recipe every task preset extends ({path}); --set KEY=VALUE "
            f"changes one:\n{body}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=recipe_defaults(),
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--config", required=True,
                    help="a file, or a shipped preset's name: a task (rte, sst2, ...) or base (the recipe; with --task)")
    ap.add_argument("--task", default=None, metavar="NAME",
                    help="the GLUE task (sets 'task', e.g. --config base --task sst2; a task preset names its own)")
    ap.add_argument("--init", default=None,
                    help="checkpoint folder (AdaPonder or GPT-NeoX HF format), hub id (org/name) or 'tiny-random'; "
                         "default: the config's 'init'")
    ap.add_argument("--init-revision", default=None, metavar="REV",
                    help="revision (branch, tag or commit) of a hub id --init, e.g. Pythia's step143000")
    ap.add_argument("--data-dir", default=None,
                    help="GLUE TSV root with <Task>/{train,dev}.tsv (default: $ADAPONDER_GLUE_DIR)")
    ap.add_argument("--hf-dataset", default=None, metavar="ID_OR_PATH",
                    help="instead of TSVs, read GLUE through Hugging Face datasets: a dataset id (nyu-mll/glue) or a "
                         "save_to_disk folder (sets data.hf_dataset; a revision: --set data.hf_revision=REV)")
    ap.add_argument("--output", default=None, help="output directory (default: runs/glue/<task>-<method>-s<seed>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. train.lr=1e-4 (repeatable)")
    ap.add_argument("--resume", default=None, metavar="auto|PATH",
                    help="continue from the newest intact checkpoint of the run ('auto'; a fresh start when there is "
                         "none) or from a checkpoint folder; without it a run refuses a folder holding checkpoints")
    ap.add_argument("--timing-budget", type=float, default=None, metavar="SECONDS",
                    help="time budget of the timing phase (sets timing.budget_seconds; default 60 s, 'null' via --set "
                         "for none): fewer rounds and examples are timed as it runs out, and timing stops when it is "
                         "spent (what was measured is reported)")
    add_debug_help(ap)
    ap.add_argument("--deepspeed", action="store_true",
                    help="accepted for the deepspeed launcher's convention; training always runs on a DeepSpeed engine")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def default_output(task: str, method: str, seed: int) -> Path:
    """``runs/glue/<task>-<method>-s<seed>`` under the checkout, or under the current folder when installed."""
    return (repo_root() or Path.cwd()) / "runs" / "glue" / f"{task}-{method}-s{seed}"


@cli_main  # user errors (configuration, GLUE files, model names, checkpoints): one line, exit code 2
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings: nothing tokenises in parallel

    # torch, transformers and DeepSpeed take seconds to import: --help and a bad argument answer before they load
    from adaponder.palbert.config import load_finetune_config
    from adaponder.palbert.finetune import run_finetune
    from adaponder.train.stopping import TrainingStopped

    # A JSON string is a YAML string: any id or path survives --set's YAML parsing unchanged.
    overrides = ([f"task={json.dumps(args.task)}"] if args.task else []) + args.overrides + ([f"data.hf_dataset={json.dumps(args.hf_dataset)}"] if args.hf_dataset else [])
    if args.timing_budget is not None:
        overrides.append(f"timing.budget_seconds={args.timing_budget!r}")
    cfg = load_finetune_config(find_config(args.config, "glue"), overrides)
    if args.init:  # replaces the config's init together with its revision (which names another model)
        init, revision = args.init, args.init_revision
    else:
        init, revision = cfg.init, args.init_revision or cfg.init_revision
    if not init:
        raise UsageError("no --init given and the config has no 'init'")
    output = args.output or default_output(cfg.task, cfg.model.method, cfg.train.seed)
    try:
        run_finetune(cfg, init=init, init_revision=revision, data_dir=args.data_dir, output=output,
                     resume=args.resume)
    except TrainingStopped as stop:
        if int(os.environ.get("RANK", "0")) == 0:
            print(stop, file=sys.stderr, flush=True)
        return stop.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
