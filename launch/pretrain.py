#!/usr/bin/env python
"""Pretrain AdaPonderLM (or a baseline) with DeepSpeed: a shim over :mod:`adaponder.cli.pretrain` (see there, or
``--help``), kept so that ``deepspeed launch/pretrain.py ...`` and ``python launch/pretrain.py ...`` work from a
checkout without installing.

    deepspeed launch/pretrain.py --config configs/pythia410m.yaml                 # all local GPUs
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 launch/pretrain.py --config configs/tiny.yaml
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adaponder.cli.pretrain import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
