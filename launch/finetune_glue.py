#!/usr/bin/env python
"""PALBERT-mode GLUE fine-tuning: a shim over :mod:`adaponder.cli.finetune_glue` (console script
``adaponder-finetune-glue``; see there, or ``--help``), kept so that ``python launch/finetune_glue.py ...`` and
``deepspeed launch/finetune_glue.py ... --deepspeed`` work from a checkout without installing.

    python launch/finetune_glue.py --config configs/glue/sst2.yaml --init runs/demo/hf --output runs/glue/sst2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adaponder.cli.finetune_glue import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
