"""``adaponder-finetune-glue``: PALBERT-mode GLUE fine-tuning, the same command line as ``launch/finetune_glue.py``
(see its ``--help``).

A thin wrapper: it runs ``main`` of ``launch/finetune_glue.py`` — the checkout's, or the copy a wheel carries in
``adaponder/_resources/launch/`` — with its default output folder (``runs/glue/...``) under the current folder
rather than next to the script. ``deepspeed $(which adaponder-finetune-glue) ... --deepspeed`` runs it under the
DeepSpeed launcher.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_launch_module(name: str):
    """``launch/<name>.py`` as a module (checkout first, then the wheel's copy)."""
    from adaponder.resources import launch_script

    path = launch_script(name)
    if path is None:
        raise SystemExit(f"error: launch/{name}.py is not available (neither in a checkout nor in the installed "
                         "package's resources)")
    spec = importlib.util.spec_from_file_location(f"adaponder_launch_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_config_found(argv: list[str]) -> list[str]:
    """``--config configs/glue/sst2.yaml`` names the shipped preset when no such file exists here."""
    from adaponder.resources import find_config

    out = list(argv)
    for i, a in enumerate(out):
        if a == "--config" and i + 1 < len(out):
            out[i + 1] = str(find_config(out[i + 1]))
        elif a.startswith("--config="):
            out[i] = "--config=" + str(find_config(a.split("=", 1)[1]))
    return out


def main(argv=None) -> int:
    from adaponder.resources import repo_root

    module = load_launch_module("finetune_glue")
    if repo_root() is None and hasattr(module, "REPO"):
        module.REPO = Path.cwd()  # installed: default outputs under ./runs, not inside site-packages
    return module.main(_with_config_found(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
