#!/usr/bin/env python
"""Thin wrapper over ``adaponder.cli.report``: ``python eval/report.py --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaponder.cli.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
