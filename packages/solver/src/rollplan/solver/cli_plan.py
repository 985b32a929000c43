"""CLI: ``rollplan snapshot example`` and ``rollplan plan`` (registered through the ``rollplan.cli`` entry points).

    rollplan snapshot example --slots 32 --trajectories 512 --seed 1 > snap.json
    rollplan snapshot example --family work-bound --slots 32 --trajectories 512 > hard.json
    rollplan plan snap.json --backend greedy --time-limit 0.5          # rich table
    rollplan plan snap.json --json > plan.json                         # the Plan as JSON (docs/schema.md)
    rollplan plan snap2.json --previous plan.json                      # re-plan with the last plan as hint

Exit codes: 0 ok; 2 user error (malformed snapshot JSON: ``SchemaError`` naming the field path; unknown
backend/model/GPU name); 1 no feasible plan (``InfeasiblePlanError``: a well-formed snapshot some trajectory of
which fits no slot; the one-line message lists the reasons and how to fix them).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from rollplan.models.errors import SchemaError
from rollplan.models.io import from_json, plan_from_json, to_json
from rollplan.models.types import ClusterSnapshot, Plan, Role
from rollplan.solver.config import BACKENDS, PlannerConfig

MAX_ROWS = 40


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr meanwhile: native solver libraries (HiGHS prints a banner) write
    straight to fd 1 and would corrupt the JSON the command prints."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real fd 1 (embedded interpreter, some test runners): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise SchemaError(str(path), f"cannot read the {what} file ({err.strerror})", fix="check the path") from None


def _table(snap: ClusterSnapshot, p: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    hosted = Counter(p.placement.values())
    table = Table(title=f"plan at t={p.time:g} ({len(snap.slots)} slots, {len(p.placement)} unfinished trajectories)")
    for col in ("slot", "source", "engine", "now", "plan", "trajectories", "finish s", "return by"):
        table.add_column(col, justify="right" if col in ("trajectories", "finish s", "return by") else "left")
    order = sorted(snap.slots, key=lambda s: (-p.slot_finish.get(s.id, 0.0), s.id))
    for s in order[:MAX_ROWS]:
        new = p.roles.get(s.id, Role.OFF)
        style = "bold" if new is not s.role else ""
        table.add_row(
            s.id,
            s.source.value,
            s.engine.value,
            s.role.value,
            f"[{style}]{new.value}[/{style}]" if style else new.value,
            str(hosted.get(s.id, 0)),
            f"{p.slot_finish.get(s.id, 0.0):.2f}",
            "" if s.return_by is None else f"{s.return_by - snap.time:+.1f}",
        )
    if len(order) > MAX_ROWS:
        table.caption = f"... {len(order) - MAX_ROWS} more slots (busiest first); --json for everything"
    console.print(table)
    kinds = Counter(a.kind.value for a in p.actions)
    bounds = ", ".join(f"{k}={v:.2f}" for k, v in sorted(p.bounds.items()))
    console.print(f"P:D            {p.pd_ratio}")
    console.print(f"makespan       {p.makespan:.2f} s   (lower bound {p.lower_bound:.2f} s: {bounds})")
    console.print(f"gap            {p.gap:.2%}")
    console.print(f"switching      {p.switching_cost:.2f} GPU-s   objective {p.objective:.3f}")
    console.print(f"status         {p.status.value} ({p.backend}, {p.solve_seconds * 1000:.0f} ms)")
    console.print(f"actions        {len(p.actions)}" + (f": {dict(sorted(kinds.items()))}" if kinds else ""))
    for v in p.violations:
        console.print(f"[red]violation[/red]      {v}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add ``snapshot example`` and ``plan`` to the root app, and ``bench planner``."""
    from rollplan.solver.bench import register_bench

    register_bench(bench)
    snapshot_app = typer.Typer(help="Cluster snapshots (the planner's input).", no_args_is_help=True)
    app.add_typer(snapshot_app, name="snapshot")

    @snapshot_app.command("example")
    def snapshot_example(
        slots: Annotated[int, typer.Option("--slots", min=0, help="Number of slots (engines).")] = 8,
        trajectories: Annotated[int, typer.Option("--trajectories", min=0, help="Trajectories in the batch.")] = 64,
        seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same snapshot).")] = 0,
        model: Annotated[str, typer.Option("--model", help="Model preset.")] = "qwen3-8b",
        gpu: Annotated[str, typer.Option("--gpu", help="GPU kind preset (family example only).")] = "h800",
        family: Annotated[
            str, typer.Option("--family", help="example | work-bound | heterogeneous | deadlines | long-tail.")
        ] = "example",
    ) -> None:
        """Print a realistic, valid snapshot as JSON: ``example`` (mixed sources, engines and phases) or one of
        the hard bench families (rollplan.solver.families)."""
        from rollplan.solver.examples import example_snapshot
        from rollplan.solver.families import family_snapshot

        if family == "example":
            snap = example_snapshot(slots, trajectories, seed=seed, model=model, gpu=gpu)
        else:
            if slots < 1:
                raise typer.BadParameter("a family snapshot needs --slots >= 1", param_hint="--slots")
            snap = family_snapshot(family, slots, trajectories, seed=seed, model=model)
        print(to_json(snap))

    @app.command("plan")
    def plan_cmd(
        snapshot: Annotated[Path, typer.Argument(help="Snapshot JSON file (see docs/schema.md).")],
        backend: Annotated[str, typer.Option("--backend", help=f"One of {', '.join(BACKENDS)}.")] = "milp",
        time_limit: Annotated[float, typer.Option("--time-limit", min=0.0, help="Seconds for the whole plan.")] = 1.0,
        previous: Annotated[Path | None, typer.Option("--previous", help="The previous plan (JSON): hint.")] = None,
        switch_weight: Annotated[
            float, typer.Option("--switch-weight", min=0.0, help="lambda: weight of one switching GPU-second.")
        ] = 0.01,
        seed: Annotated[int, typer.Option("--seed", help="Solver seed.")] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the Plan as JSON instead of a table.")] = False,
        deterministic: Annotated[
            bool, typer.Option("--deterministic", help="Same plan whatever the load: --time-limit is a work budget.")
        ] = False,
    ) -> None:
        """Plan roles, P:D ratio and placement for a snapshot; print a table or the Plan JSON."""
        from rollplan.models.errors import UnknownNameError
        from rollplan.solver.api import plan

        if backend not in BACKENDS:
            raise UnknownNameError("planner backend", backend, BACKENDS)
        from rollplan.solver.inputs import check_inputs

        # Types by the schema, then the solver's input checks (the one place: field path + fix).
        snap = check_inputs(from_json(ClusterSnapshot, _read(snapshot, "snapshot"), source=str(snapshot)),
                            source=str(snapshot))
        prev = plan_from_json(_read(previous, "plan"), source=str(previous)) if previous is not None else None
        config = PlannerConfig(
            backend=backend, time_limit=time_limit, switch_weight=switch_weight, seed=seed, deterministic=deterministic
        )
        with _stdout_to_stderr():
            result = plan(snap, previous=prev, config=config)
        if as_json:
            print(to_json(result))
        else:
            _table(snap, result)
