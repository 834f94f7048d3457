#!/usr/bin/env python
"""Plan a training run before launching it: memory per rank (ZeRO stage, micro-batch, K, with and without per-pass
activation checkpointing), FLOPs per token by part, step time and days to the token budget at an assumed MFU, the
largest micro-batch that fits. A shim over :mod:`adaponder.cli.plan` (console script ``adaponder-plan``) and
:mod:`adaponder.train.plan` (see there, or ``--help``).

    python launch/plan.py --config configs/pythia410m.yaml --gpus 8 --gpu h100-80gb
    python launch/plan.py --config configs/pythia1b.yaml --gpus 16 --gpu-mem-gb 94 --gpu-tflops 989 --mfu 0.35
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adaponder.cli.plan import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
