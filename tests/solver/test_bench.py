"""``rollplan bench planner``: the command runs a cell in a child process and prints the documented JSON."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from rollplan.models.errors import UnknownNameError
from rollplan.solver.bench import BENCH_BACKENDS, SCALES, parse_list, register_bench


def test_bench_planner_json() -> None:
    app = typer.Typer()
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    register_bench(bench)
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "planner",
            "--scales",
            "S",
            "--backends",
            "greedy",
            "--repeat",
            "1",
            "--time-limit",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    (cell,) = report["results"]
    assert (cell["scale"], cell["backend"], cell["slots"], cell["trajectories"]) == ("S", "greedy", 32, 512)
    assert cell["time_limit"] == 1.0
    assert 0 < cell["latency_s"]["p50"] <= cell["latency_s"]["max"]
    assert cell["objective_ratio_to_greedy"]["max"] == pytest.approx(1.0)
    assert cell["gap"]["max"] >= 0 and cell["peak_rss_mb"] > cell["baseline_rss_mb"] * 0.5
    assert sum(cell["status"].values()) == 1
    assert set(cell["meets"]) == {"latency_p99", "gap_max", "not_worse_than_greedy"}
    (one,) = cell["per_seed"]  # the per-snapshot figures the cell's aggregates come from
    assert one["seed"] == 0 and one["gap"] == pytest.approx(cell["gap"]["max"], abs=1e-6)
    assert one["latency_s"] == pytest.approx(cell["latency_s"]["max"], abs=1e-4)


def test_unknown_names_are_user_errors() -> None:
    assert parse_list("S, L", list(SCALES), "scale") == ["S", "L"]
    with pytest.raises(UnknownNameError, match="unknown backend 'gurobi'"):
        parse_list("milp,gurobi", BENCH_BACKENDS, "backend")


def test_bench_families_cells() -> None:
    """``--families`` selects family snapshots; the report names each cell's family and its gap target."""
    from rollplan.solver.bench import gap_target

    app = typer.Typer()
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    register_bench(bench)
    args = ["bench", "planner", "--scales", "S", "--backends", "greedy", "--repeat", "1", "--json"]
    result = CliRunner().invoke(app, [*args, "--families", "work-bound,long-tail", "--deterministic"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [(c["family"], c["deterministic"]) for c in report["results"]] == [
        ("work-bound", True),
        ("long-tail", True),
    ]
    assert report["targets"]["gap_max"] == {"work-bound": {"S": 0.05}, "long-tail": {"S": 0.10}}
    assert gap_target("heterogeneous", "M") == 0.10 and gap_target("deadlines", "M") == 0.05
    bad = CliRunner().invoke(app, [*args, "--families", "easy"])
    assert bad.exit_code != 0 and "unknown family 'easy'" in str(bad.exception)
