"""``adaponder bench NAME [ARGS ...]``: run the benchmark ``eval/bench_NAME.py`` of a source checkout.

    adaponder bench                         # the benchmarks there are
    adaponder bench inference --help        # that benchmark's own arguments
    adaponder bench train --shapes 70m

The benchmarks measure this machine and import one another from ``eval/``, so they are developer tools of the
checkout, not part of the wheel; from an installed wheel this command says so. Timings mean little on a machine
that other work shares (each benchmark's docstring says what it needs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.errors import UsageError, cli_main
from adaponder.resources import repo_root


def benchmarks(root: Path) -> dict[str, Path]:
    """name -> script, for every ``eval/bench_NAME.py`` of the checkout at ``root``."""
    return {p.stem.removeprefix("bench_"): p for p in sorted((root / "eval").glob("bench_*.py"))}


def _first_line(script: Path) -> str:
    text = script.read_text(encoding="utf-8")
    doc = text.split('"""', 2)[1] if text.count('"""') >= 2 else ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = repo_root()
    if root is None or not (root / "eval").is_dir():
        raise UsageError("adaponder bench: the benchmarks (eval/bench_*.py) ship with a source checkout, not with "
                         "the wheel; run it from a clone of the repository")
    found = benchmarks(root)
    if not args or args[0] in ("-h", "--help"):
        print("usage: adaponder bench NAME [ARGS ...]   (adaponder bench NAME --help: its arguments)\n\nbenchmarks:")
        width = max(map(len, found), default=0)
        for name, script in found.items():
            print(f"  {name:<{width}}  {_first_line(script)}")
        return 0
    name, rest = args[0], args[1:]
    if name not in found:
        raise UsageError(f"adaponder bench: no benchmark {name!r} (available: {', '.join(found)})")
    # a child process: a benchmark owns its interpreter (threads, torch.compile caches, exit status)
    return subprocess.run([sys.executable, str(found[name]), *rest], cwd=str(root)).returncode


if __name__ == "__main__":
    sys.exit(main())
