#!/usr/bin/env python
"""Export a training checkpoint to a Hugging Face folder: a shim over :mod:`adaponder.cli.export_hf` (console
script ``adaponder-export``), kept so that ``python launch/export_hf.py CKPT OUT`` works from a checkout.

    python launch/export_hf.py runs/demo/checkpoints runs/demo/hf-export          # newest checkpoint
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adaponder.cli.export_hf import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
