"""``adaponder build-extensions``: build DeepSpeed's CPU collectives once for this Python environment, in its own
folder (:mod:`adaponder.train.extensions`), so no run start builds them. ``scripts/setup.sh`` runs it; after a
wheel install, run it once (or let the first CPU run build them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from adaponder.cli.errors import cli_main


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(prog="adaponder build-extensions", description=(
        "Build DeepSpeed's CPU collectives once for this Python environment, in a folder of its own (under "
        "~/.cache/adaponder/torch_extensions; TORCH_EXTENSIONS_DIR overrides it), so no run start builds them. "
        "scripts/setup.sh runs this.")).parse_args(argv)
    from adaponder.train.extensions import has_cuda, load_cpu_collectives

    if not has_cuda():  # without CUDA, DeepSpeed's accelerator is the CPU (said, not guessed)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    t0 = time.monotonic()
    root = load_cpu_collectives()
    if root is None:
        print("DeepSpeed runs on a GPU here: no CPU collectives to build")
    else:
        print(f"DeepSpeed's CPU collectives ready in {root} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
