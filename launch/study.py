#!/usr/bin/env python
"""The evidence study: a shim over :mod:`adaponder.cli.study` (console script ``adaponder-study``; see there, or
``--help``), kept so that ``python launch/study.py ...`` works from a checkout without installing.

    python launch/study.py --config configs/study/cpu.yaml --profile quick        # bundled corpus, minutes
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adaponder.cli.study import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
