"""Import rules of the planner.

Invariants:
- importing rollplan.models, rollplan.solver and rollplan.sim imports no ray, vllm or torch;
- the import graph of ``rollplan.solver`` (every module's imports, function-level ones included) has no
  cycle, and runs downward through the layers: ``core`` imports only ``core`` and ``config``; ``search``
  and ``model`` only ``core``, ``config`` and themselves (not each other); ``backends`` nothing above
  itself (not ``api``, the CLI or the package root).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollplan.solver

ROOT = Path(rollplan.solver.__file__).parent
PKG = "rollplan.solver"

ALLOWED = {
    "core": {"core", "config"},
    "search": {"core", "config", "search"},
    "model": {"core", "config", "model"},
    "backends": {"core", "config", "search", "model", "backends"},
}
"""Layer -> the layers its modules may import (``config`` is a leaf: it imports only rollplan.models)."""


def test_core_packages_import_no_heavy_runtime() -> None:
    code = (
        "import sys, importlib\n"
        "for name in ('rollplan.models', 'rollplan.solver', 'rollplan.sim', 'rollplan.solver.api',\n"
        "             'rollplan.solver.backends.greedy', 'rollplan.solver.cli_plan'):\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join([PKG, *parts])] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``rollplan.solver`` an imported name lives in (the longest known prefix)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every ``rollplan.solver`` module ``path`` imports, at any depth (``if TYPE_CHECKING`` blocks aside)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and _is_type_checking(b) for n in ast.walk(b)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n == PKG or n.startswith(PKG + "."):
                mod = _resolve(n, modules)
                if mod is not None:
                    found.add(mod)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_solver_import_graph_is_acyclic() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = [*stack[stack.index(n) :], n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_solver_layers_import_downward_only() -> None:
    bad = []
    for m, deps in sorted(_graph().items()):
        allowed = ALLOWED.get(_layer(m))
        if allowed is None:
            continue  # the package root, api, the CLI and bench modules may import anything
        for d in sorted(deps):
            if _layer(d) not in allowed:
                bad.append(f"{m} imports {d}")
    assert not bad, "\n".join(bad)


def test_the_core_layout_exists() -> None:
    graph = _graph()
    for name in ("instance", "pricing", "evaluate", "bounds", "actions", "validate"):
        assert f"{PKG}.core.{name}" in graph
    for name in ("state", "placement", "local", "disaggregate"):
        assert f"{PKG}.search.{name}" in graph
    for name in ("formulation", "aggregate"):
        assert f"{PKG}.model.{name}" in graph
