"""The package's import layering: every import (module level or inside a function) runs from a layer to a lower
one, packages on one layer do not import each other, and no modules import each other in a circle. Read from the
source with ``ast``; nothing is imported."""

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "adaponder"

#: Lowest first. Top-level modules (``adaponder.errors``, ``adaponder.typed_config``, …) are the foundation.
LAYERS = [
    {"(top)"},
    {"modeling", "data"},
    {"train", "generation"},
    {"evaluation", "palbert"},
    {"study"},
    {"cli"},
]
LEVEL = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}

#: The modules decoding moved out of ``modeling`` keep their import paths as aliases of ``generation``'s.
MOVED = ("static_decoding", "depth_batching", "speculative", "static_speculative", "pass_pipeline", "way_choice")
#: Upward imports the design calls for: the model's ``generate`` hands ``decoding=`` to the generation package inside
#: a guarded import (a checkpoint's copy of the model runs without it), and the aliases above.
UPWARD = {("adaponder.modeling.modeling_adaponder", "adaponder.generation")} | {
    (f"adaponder.modeling.{m}", f"adaponder.generation.{m}") for m in MOVED}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    p = REPO.joinpath(*module.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of this package it imports`` (``from pkg import sub`` counts as ``pkg.sub``)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name.split(".")[0] == "adaponder"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "adaponder":
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    graph[mod].add(sub if _exists(sub) else target)
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "(top)"


def test_every_package_has_a_layer():
    packages = {_package(m) for m in import_graph()}
    assert packages <= set(LEVEL), f"packages without a layer in this test: {sorted(packages - set(LEVEL))}"


def test_imports_run_downward_only():
    wrong = []
    for mod, targets in import_graph().items():
        src = _package(mod)
        for target in targets:
            dst = _package(target)
            if dst != src and LEVEL[dst] >= LEVEL[src] and (mod, target) not in UPWARD:
                wrong.append(f"{mod} -> {target} ({src} on layer {LEVEL[src]}, {dst} on layer {LEVEL[dst]})")
    assert not wrong, "imports that do not run to a lower layer:\n" + "\n".join(sorted(wrong))


def test_the_upward_imports_are_only_the_sanctioned_ones():
    """Every sanctioned upward import exists (an alias removed, or the dispatch changed, shrinks the list here)."""
    graph = import_graph()
    assert all(target in graph[mod] for mod, target in UPWARD), [e for e in UPWARD if e[1] not in graph[e[0]]]


def test_no_import_circle():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"modules importing each other in a circle: {circles}"


def test_the_graph_sees_function_level_and_relative_imports():
    """Guards the reader itself: a lazy import inside a function and a relative import are both edges."""
    graph = import_graph()
    assert "adaponder.evaluation.accounting" in graph["adaponder.evaluation.perplexity"]  # ``from .accounting``
    assert "adaponder.modeling.exits" in graph["adaponder.train.metrics"]
    assert any(t.startswith("adaponder.evaluation") for t in graph["adaponder.study.arms"])  # inside a function


def test_argument_parsers_live_only_in_the_cli_package():
    """Library modules expose functions with typed arguments; only ``adaponder/cli`` parses command lines."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "argparse" for n in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"argument parsing outside adaponder/cli: {found}"
