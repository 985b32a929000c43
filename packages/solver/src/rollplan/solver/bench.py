"""``rollplan bench planner``: latency, gap and memory of ``plan()`` per family, scale and backend.

An adapter (like the CLI): it reads the wall clock and measures memory; the planner itself does neither.

For each family (``families.FAMILIES``: example, work-bound, heterogeneous, deadlines, long-tail; ``--families
all``), scale (S = 32 slots / 512 trajectories, M = 256 / 4,096, L = 1,024 / 16,384; ``--scales`` picks) and
backend, in a fresh interpreter (``python -m rollplan.solver.bench``, so that memory is
per cell): one warm-up ``plan()`` on a small snapshot of the family (imports, first-call costs: a controller
re-plans in a long-lived process), then ``repeat`` snapshots ``family_snapshot(family, slots, trajectories,
seed + i)``, each planned with the backend (timed: the whole ``plan()`` call, ``time.perf_counter``) and with
``greedy`` (untimed unless greedy is the cell's backend) for the objective ratio. ``--deterministic`` plans
with ``PlannerConfig(deterministic=True)`` (the time limit is then a work budget). Reported per cell:

- ``latency_s``: p50 / p99 / max of the ``plan()`` wall time (p99 by linear interpolation: with fewer than
  100 repeats it is close to the max); ``cpu_s``: the same for the process CPU time of the call (the wall
  time on an idle machine: the planner is single-threaded); ``load_avg_1min``: before and after the cell
  (other processes on the machine inflate the wall time, not the CPU time);
- ``gap``: p50 / max of ``Plan.gap`` (makespan / best lower bound - 1);
- ``objective_ratio_to_greedy``: p50 / max of objective / greedy objective (<= 1 means not worse);
- ``peak_rss_mb``: the child's peak resident set (``resource`` ru_maxrss) after the cell, i.e. interpreter +
  imports + snapshots + planning; ``baseline_rss_mb``: the same right after the warm-up, before the cell;
- ``status``: count per ``SolveStatus``; ``per_seed``: each snapshot's seed, latency, gap and objective over
  greedy (which seed a cell's max comes from); ``meets``: each target checked on the cell's numbers (issue 15:
  p99 latency <= 0.2 / 0.5 / 1.0 s for S / M / L; gap <= 5% (10% for heterogeneous and long-tail, and at L);
  never worse than greedy).

``--time-limit`` sets ``PlannerConfig.time_limit`` for every scale; by default each scale gets its latency
target (0.2 / 0.5 / 1.0 s), which ``plan()`` honours.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import typer

from rollplan.models.errors import UnknownNameError
from rollplan.solver.families import FAMILIES, SIZES

SCALES: dict[str, tuple[int, int]] = dict(SIZES)
LATENCY_TARGET = {"S": 0.2, "M": 0.5, "L": 1.0}
GAP_TARGET = {"S": 0.05, "M": 0.05, "L": 0.10}
LOOSE_GAP_FAMILIES = ("heterogeneous", "long-tail")
"""Families whose gap target is 10% at every scale (issue 15)."""
RSS_TARGET_MB = {"L": 2048.0}
BENCH_BACKENDS = ("milp", "cpsat", "greedy")


def gap_target(family: str, scale: str) -> float:
    return max(GAP_TARGET[scale], 0.10) if family in LOOSE_GAP_FAMILIES else GAP_TARGET[scale]


@dataclass(frozen=True, slots=True)
class Cell:
    scale: str
    backend: str
    repeat: int
    seed: int
    time_limit: float
    family: str = "example"
    deterministic: bool = False


def _rss_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 if sys.platform != "darwin" else peak / 2**20


def _pct(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan


def run_cell(cell: Cell) -> dict[str, Any]:
    """Measure one (scale, backend) cell in this process (see the module docstring)."""
    from rollplan.solver import plan
    from rollplan.solver.config import PlannerConfig
    from rollplan.solver.families import family_snapshot

    slots, trajs = SCALES[cell.scale]
    det = cell.deterministic
    cfg = PlannerConfig(backend=cell.backend, time_limit=cell.time_limit, seed=cell.seed, deterministic=det)
    greedy_cfg = PlannerConfig(backend="greedy", time_limit=cell.time_limit, seed=cell.seed, deterministic=det)
    plan(family_snapshot(cell.family, 8, 128, seed=cell.seed), config=cfg)  # warm-up
    baseline = _rss_mb()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    latency, cpu, gaps, ratios = [], [], [], []
    status: Counter[str] = Counter()
    for i in range(cell.repeat):
        snap = family_snapshot(cell.family, slots, trajs, seed=cell.seed + i)
        c0, t0 = time.process_time(), time.perf_counter()
        result = plan(snap, config=cfg)
        latency.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        status[result.status.value] += 1
        gaps.append(result.gap)
        ref = result if cell.backend == "greedy" else plan(snap, config=greedy_cfg)
        ratios.append(result.objective / ref.objective if ref.objective > 0 else 1.0)
    out: dict[str, Any] = {
        "family": cell.family,
        "scale": cell.scale,
        "slots": slots,
        "trajectories": trajs,
        "backend": cell.backend,
        "time_limit": cell.time_limit,
        "deterministic": det,
        "repeat": cell.repeat,
        "seeds": [cell.seed, cell.seed + cell.repeat - 1],
        "latency_s": {"p50": _pct(latency, 50), "p99": _pct(latency, 99), "max": max(latency)},
        "cpu_s": {"p50": _pct(cpu, 50), "p99": _pct(cpu, 99), "max": max(cpu)},
        "load_avg_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan],
        "gap": {"p50": _pct(gaps, 50), "max": max(gaps)},
        "objective_ratio_to_greedy": {"p50": _pct(ratios, 50), "max": max(ratios)},
        "peak_rss_mb": _rss_mb(),
        "baseline_rss_mb": baseline,
        "status": dict(status),
        # Each snapshot's figures, so a cell's max can be traced to its seed.
        "per_seed": [
            {"seed": cell.seed + i, "latency_s": round(latency[i], 4), "gap": round(gaps[i], 6),
             "objective_ratio_to_greedy": round(ratios[i], 6)}
            for i in range(cell.repeat)
        ],
    }
    meets = {
        "latency_p99": out["latency_s"]["p99"] <= LATENCY_TARGET[cell.scale],
        "gap_max": out["gap"]["max"] <= gap_target(cell.family, cell.scale),
        "not_worse_than_greedy": out["objective_ratio_to_greedy"]["max"] <= 1.0 + 1e-9,
    }
    if cell.scale in RSS_TARGET_MB:
        meets["peak_rss"] = out["peak_rss_mb"] <= RSS_TARGET_MB[cell.scale]
    out["meets"] = meets
    return out


def run_in_child(cell: Cell) -> dict[str, Any]:
    """``run_cell`` in a fresh interpreter (``python -m rollplan.solver.bench CELL``): per-cell peak RSS."""
    arg = json.dumps(dataclasses.asdict(cell))
    proc = subprocess.run(
        [sys.executable, "-m", "rollplan.solver.bench", arg], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(
            f"bench cell {cell.family}/{cell.scale}/{cell.backend} failed (exit {proc.returncode}): {tail[0]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child_main(arg: str) -> None:
    """Child entry: run one cell, print its JSON as the last stdout line.

    HiGHS prints a banner on C stdout once per process: fd 1 points at /dev/null while the cell runs and
    the result goes to the saved original stdout.
    """
    cell = Cell(**json.loads(arg))
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        out = run_cell(cell)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(out), flush=True)


def parse_list(text: str, known: Sequence[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in known:
            raise UnknownNameError(what, x, list(known))
    return items


def bench_planner(
    scales: Sequence[str],
    backends: Sequence[str],
    *,
    repeat: int,
    seed: int,
    time_limit: float | None,
    families: Sequence[str] = ("example",),
    deterministic: bool = False,
    in_child: bool = True,
) -> dict[str, Any]:
    """Run every (family, scale, backend) cell; the report ``rollplan bench planner --json`` prints."""
    results = []
    for family in families:
        for scale in scales:
            for backend in backends:
                limit = time_limit if time_limit is not None else LATENCY_TARGET[scale]
                cell = Cell(scale, backend, repeat, seed, limit, family=family, deterministic=deterministic)
                results.append(run_in_child(cell) if in_child else run_cell(cell))
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    gaps = {f: {sc: gap_target(f, sc) for sc in scales} for f in families}
    return {
        "benchmark": "planner",
        "machine": {"cpus": os.cpu_count(), "load_avg_1_5_15": list(load)},
        "targets": {"latency_p99_s": LATENCY_TARGET, "gap_max": gaps, "peak_rss_mb": RSS_TARGET_MB},
        "results": results,
    }


def _table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="rollplan bench planner")
    cols = ("family", "scale", "backend", "limit s", "p50 s", "p99 s", "cpu p99 s", "gap p50", "gap max",
            "obj/greedy p50", "obj/greedy max", "RSS MB", "status", "meets")
    for col in cols:
        t.add_column(col)
    for r in report["results"]:
        t.add_row(
            r["family"],
            r["scale"],
            r["backend"],
            f"{r['time_limit']:.2f}" + (" det" if r.get("deterministic") else ""),
            f"{r['latency_s']['p50']:.3f}",
            f"{r['latency_s']['p99']:.3f}",
            f"{r['cpu_s']['p99']:.3f}",
            f"{r['gap']['p50']:.2%}",
            f"{r['gap']['max']:.2%}",
            f"{r['objective_ratio_to_greedy']['p50']:.4f}",
            f"{r['objective_ratio_to_greedy']['max']:.4f}",
            f"{r['peak_rss_mb']:.0f}",
            ", ".join(f"{k}={v}" for k, v in sorted(r["status"].items())),
            " ".join(f"{k}:{'ok' if v else 'MISS'}" for k, v in r["meets"].items()),
        )
    Console(width=220).print(t)  # wide: 14 columns; a pipe would get 80


def register_bench(bench: typer.Typer) -> None:
    """Add ``planner`` to the ``bench`` sub-app (called by ``cli_plan.register``)."""

    @bench.command("planner")
    def planner_cmd(
        scales: str = typer.Option(
            "S,M,L",
            "--scales",
            help="Comma-separated scales: S (32/512), M (256/4096), L (1024/16384).",
        ),
        families: str = typer.Option(
            "example", "--families", help=f"Comma-separated snapshot families, or all: {', '.join(FAMILIES)}."
        ),
        deterministic: bool = typer.Option(
            False, "--deterministic", help="PlannerConfig(deterministic=True): the time limit is a work budget."
        ),
        backends: str = typer.Option(
            "milp", "--backends", help="Comma-separated backends: milp, cpsat, greedy."
        ),
        repeat: int = typer.Option(
            5, "--repeat", min=1, help="Snapshots per scale (seeds seed..seed+repeat-1)."
        ),
        seed: int = typer.Option(0, "--seed", help="First family_snapshot seed."),
        time_limit: float | None = typer.Option(
            None,
            "--time-limit",
            min=0.01,
            help="PlannerConfig.time_limit for every scale (default: each scale's latency target).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON report only."),
    ) -> None:
        """p50/p99 latency of plan(), gap to the best lower bound, objective vs greedy, peak RSS."""
        report = bench_planner(
            parse_list(scales, list(SCALES), "scale"),
            parse_list(backends, BENCH_BACKENDS, "backend"),
            repeat=repeat,
            seed=seed,
            time_limit=time_limit,
            families=list(FAMILIES) if families.strip() == "all" else parse_list(families, FAMILIES, "family"),
            deterministic=deterministic,
        )
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            _table(report)


if __name__ == "__main__":
    _child_main(sys.argv[1])
