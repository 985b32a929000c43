"""The decision core is pure: its modules import no ray/vllm/torch, no clock and no I/O (checked on the source).

Invariant: no module of ``rollplan.policy`` imports a heavy runtime, a clock or an I/O module, or calls
``open``/``print``/``input``; importing it loads none of ray, vllm, torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollplan.policy

FORBIDDEN = {"ray", "vllm", "torch", "time", "datetime", "os", "io", "socket", "pathlib", "random", "threading",
             "asyncio", "subprocess", "shutil", "tempfile", "urllib", "http", "requests"}
FORBIDDEN_CALLS = {"open", "print", "input"}


def _modules() -> list[Path]:
    (root,) = rollplan.policy.__path__
    return sorted(Path(root).rglob("*.py"))


def test_policy_modules_import_no_clock_io_or_runtime() -> None:
    mods = _modules()
    assert mods
    for path in mods:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{path.name}:{node.lineno} imports {n}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {node.func.id}"


def test_importing_the_core_loads_no_heavy_runtime() -> None:
    code = ("import sys, rollplan.policy\n"
            "print(','.join(sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""
