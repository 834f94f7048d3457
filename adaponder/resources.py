"""Files that ship with adaponder besides its Python modules: the lm-eval task folder, the configuration presets
and the launch scripts.

In a source checkout (or an editable install) they are the repository's ``eval/tasks``, ``configs`` and
``launch``; a wheel (``pip install .``) carries copies under ``adaponder/_resources/`` (added by ``setup.py``'s
``build_py``), so the console scripts work from any folder without the repository.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_BUNDLED = _PACKAGE / "_resources"
#: name in the wheel -> folder in the repository
RESOURCES = {"eval_tasks": "eval/tasks", "configs": "configs", "launch": "launch"}


def repo_root() -> Path | None:
    """The source checkout adaponder is imported from (it holds pyproject.toml), or None for an installed wheel."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "adaponder").is_dir() else None


def resource_dir(name: str) -> Path | None:
    """The folder of resource ``name`` (a key of :data:`RESOURCES`): the checkout's, else the wheel's."""
    root = repo_root()
    if root is not None and (root / RESOURCES[name]).is_dir():
        return root / RESOURCES[name]
    bundled = _BUNDLED / name
    return bundled if bundled.is_dir() else None


def task_dir() -> Path | None:
    """The ``adaponder_*`` lm-eval task definitions (``eval/tasks``)."""
    return resource_dir("eval_tasks")


def configs_dir() -> Path | None:
    """The configuration presets (``configs``)."""
    return resource_dir("configs")


def find_config(path: str | os.PathLike[str], family: str | None = None) -> Path:
    """``path`` if it exists; else the preset of that name shipped with adaponder (``configs/tiny.yaml``,
    ``tiny.yaml`` and ``tiny`` all name ``<configs>/tiny.yaml``; with ``family`` ``"glue"``, ``rte`` names
    ``<configs>/glue/rte.yaml``). Returns ``path`` unchanged when neither exists (the caller reports the missing
    file)."""
    p = Path(path)
    if p.exists():
        return p
    base = configs_dir()
    if base is None:
        return p
    rel = Path(*p.parts[1:]) if p.parts and p.parts[0] == "configs" else p
    folders = (base / family, base) if family else (base,)
    for candidate in (c for b in folders for c in (b / rel, b / rel.with_suffix(".yaml"))):
        if candidate.is_file():
            return candidate
    return p


def module_command(module: str, argv: list[str]) -> list[str]:
    """``python -m <module> ARGV`` with this interpreter: how one command starts another (the study its training
    runs) through the package, never through a path into a checkout, so it works from a wheel as from a clone."""
    return [sys.executable, "-m", module, *argv]


def package_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the folder holding this ``adaponder`` first on ``PYTHONPATH``, so a
    child started by :func:`module_command` imports the same copy of the package as its parent, whatever its
    working folder and whichever other copy (an editable install elsewhere) the interpreter would find."""
    env = dict(os.environ if env is None else env)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_PACKAGE.parent) + (os.pathsep + rest if rest else "")
    return env


__all__ = ["RESOURCES", "repo_root", "resource_dir", "task_dir", "configs_dir", "find_config", "module_command",
           "package_env"]
