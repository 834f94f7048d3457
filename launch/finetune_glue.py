#!/usr/bin/env python
"""Fine-tune the recurrent core on a GLUE task in PALBERT mode (docs/method.md (b)) and evaluate every exit rule.

One process (a 1-rank DeepSpeed group, like ``launch/pretrain.py``)::

    python launch/finetune_glue.py --config configs/glue/sst2.yaml --init runs/demo/hf --output runs/glue/sst2

Data parallel over N ranks (ZeRO stage from the config's ``deepspeed`` section, e.g. ``--set deepspeed.zero_stage=3``)::

    deepspeed --num_gpus 2 launch/finetune_glue.py --config configs/glue/rte.yaml --init CKPT --deepspeed

``--init`` is a local Hugging Face checkpoint directory (AdaPonder or GPT-NeoX/Pythia) or ``tiny-random``
(the ``tiny`` preset, randomly initialised; for smoke runs). ``--set section.key=value`` overrides any
config value (e.g. ``--set train.max_examples=64 --set train.lr=1e-3``).

Checkpoints (``<output>/checkpoints``) are written after every dev evaluation and on SIGTERM/SIGINT;
``--resume auto`` continues an interrupted run (mid-training, or straight to the evaluation phases).
``results.json`` / ``results.md`` (metric per exit rule, mean exit pass, speed-up, time per example at
batch 1 and 32) are rewritten as each phase ends; ``metrics.jsonl`` logs steps, evaluations and events.

Exit codes: 0 done (or stopped at ``train.stop_at``), 2 configuration/data/checkpoint error,
3 non-finite loss, 128 + N stopped by signal N (a checkpoint was saved; continue with ``--resume auto``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

for _key, _val in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                   ("WANDB_MODE", "disabled"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_key, _val)

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="configs/glue/<task>.yaml")
    ap.add_argument("--init", default=None,
                    help="checkpoint directory (AdaPonder or GPT-NeoX HF format) or 'tiny-random'; "
                         "default: the config's 'init'")
    ap.add_argument("--data-dir", default=None,
                    help="GLUE root with <Task>/{train,dev}.tsv (default: $ADAPONDER_GLUE_DIR; one of the two is required)")
    ap.add_argument("--output", default=None, help="output directory (default: runs/glue/<task>-<method>-s<seed>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. train.lr=1e-4 (repeatable)")
    ap.add_argument("--resume", default=None, metavar="auto|PATH",
                    help="continue from the newest intact checkpoint of the run ('auto'; a fresh start when there is "
                         "none) or from a checkpoint folder; without it a run refuses a folder holding checkpoints")
    ap.add_argument("--deepspeed", action="store_true",
                    help="accepted for the deepspeed launcher's convention; training always runs on a DeepSpeed engine")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from adaponder.palbert.config import FinetuneConfigError, load_finetune_config

    try:
        cfg = load_finetune_config(args.config, args.overrides)
    except FinetuneConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    init = args.init or cfg.init
    if not init:
        print("error: no --init given and the config has no 'init'", file=sys.stderr)
        return 2
    if init != "tiny-random" and not (Path(init) / "config.json").is_file():
        print(f"error: --init {init}: not a checkpoint directory (no config.json) and not 'tiny-random'",
              file=sys.stderr)
        return 2
    output = args.output or str(REPO / "runs" / "glue" / f"{cfg.task}-{cfg.model.method}-s{cfg.train.seed}")

    from adaponder.modeling import AdaPonderConfigError
    from adaponder.palbert.finetune import run_finetune
    from adaponder.palbert.glue import GlueDataError
    from adaponder.train.checkpoint import CheckpointError
    from adaponder.train.trainer import TrainingStopped

    rank = int(os.environ.get("RANK", "0"))
    try:
        run_finetune(cfg, init=init, data_dir=args.data_dir, output=output, resume=args.resume)
    except TrainingStopped as stop:
        if rank == 0:
            print(stop, file=sys.stderr, flush=True)
        return stop.exit_code
    except (FinetuneConfigError, AdaPonderConfigError, GlueDataError, CheckpointError) as err:
        # Every rank sees the same configuration, data and checkpoints: rank 0 speaks for all.
        if rank == 0:
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
