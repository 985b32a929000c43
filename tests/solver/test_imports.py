"""Importing rollplan.models, rollplan.solver and rollplan.sim must not import ray, vllm or torch."""

from __future__ import annotations

import subprocess
import sys


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
