#!/usr/bin/env python
"""Pretrain AdaPonderLM (or a baseline) with DeepSpeed.

    adaponder pretrain --config tiny --set train.steps=50                  # one process, any folder
    deepspeed launch/pretrain.py --config pythia410m                       # all local GPUs (a checkout)
    deepspeed --hostfile hosts launch/pretrain.py --config pythia1b        # multi-node
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 launch/pretrain.py --config tiny
    deepspeed --module adaponder.cli.pretrain --config pythia410m          # installed, with the launcher

    --set key.path=value   override any config value (repeatable), e.g. --set optim.lr=3e-4
    --resume auto|PATH     auto: continue from the newest checkpoint of the run (fresh start if none);
                           PATH: a checkpoint folder or one stepNNNNNNNN folder in it

``--config`` is a file, or the name of a preset shipped with adaponder (``configs/tiny.yaml``, ``tiny``) when no
such file exists here.

Checked before DeepSpeed starts (one ``error:`` line within seconds): the whole configuration, the hardware it
declares (``hardware.requires: gpu``: the Pythia presets, sized for 8 GPUs), the data and every path. A
``data.path`` given with ``--set`` must hold prepared data: the config's ``data.prepare`` prepares only the
config's own ``data.path`` (add ``--set data.prepare=...`` to prepare another).

Exit codes: 0 done; 2 configuration/data/checkpoint error (one ``error:`` line, nothing written; ``--debug`` for
the traceback); 3 stopped after too many non-finite steps; 128+signal after SIGTERM/SIGINT (a checkpoint was
written first).
"""

import argparse
import os
import sys

from adaponder.cli.errors import add_debug_help, cli_main
from adaponder.resources import find_config


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="training YAML (configs/*.yaml, or a shipped preset's name)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. optim.lr=3e-4 (repeatable)")
    p.add_argument("--resume", default=None, metavar="auto|PATH", help="continue a run from a checkpoint")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    add_debug_help(p)
    args = p.parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))

    # torch, transformers and DeepSpeed take seconds to import: --help and a bad argument answer before they load
    from adaponder.train.config import load_config
    from adaponder.train.preflight import preflight

    cfg = load_config(find_config(args.config), args.overrides)  # a TrainConfigError is one line, exit 2 (cli_main)
    # hardware, data and paths, before DeepSpeed loads or a process group starts: a run that cannot succeed stops
    # in seconds (a data path given on the command line is never prepared unless data.prepare is given too)
    preflight(cfg, args.overrides, args.resume)
    from adaponder.train.trainer import run  # (lazy, as above)

    return run(cfg, args.resume)


if __name__ == "__main__":
    sys.exit(main())
