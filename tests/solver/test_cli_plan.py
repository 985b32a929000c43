"""``rollplan snapshot example`` and ``rollplan plan`` through the real CLI entry point (``main``)."""

from __future__ import annotations

import json

import pytest

from rollplan.models.io import plan_from_json, snapshot_from_json
from rollplan.solver.cli import main


@pytest.fixture()
def snap_file(tmp_path, capsys):
    assert main(["snapshot", "example", "--slots", "6", "--trajectories", "40", "--seed", "2"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "snap.json"
    path.write_text(text)
    return path


def test_snapshot_example_is_valid_json(snap_file) -> None:
    snap = snapshot_from_json(snap_file.read_text())
    assert len(snap.slots) == 6 and len(snap.trajectories) == 40


def test_plan_table(snap_file, capsys) -> None:
    assert main(["plan", str(snap_file), "--backend", "greedy", "--time-limit", "0.5"]) == 0
    out = capsys.readouterr().out
    for word in ("makespan", "lower bound", "gap", "P:D", "actions", "heuristic"):
        assert word in out


def test_plan_json_and_previous(snap_file, tmp_path, capsys) -> None:
    assert main(["plan", str(snap_file), "--backend", "greedy", "--json"]) == 0
    text = capsys.readouterr().out
    p = plan_from_json(text)
    assert p.backend == "greedy" and p.placement
    prev = tmp_path / "plan.json"
    prev.write_text(text)
    assert main(["plan", str(snap_file), "--backend", "greedy", "--json", "--previous", str(prev)]) == 0
    again = plan_from_json(capsys.readouterr().out)
    assert again.actions == p.actions


def test_malformed_snapshot_names_the_field(tmp_path, capsys) -> None:
    doc = {"time": 0, "model": "qwen3-8b", "slots": [{"id": "a", "gpu": "h800", "node": "n", "tp": "x"}], "trajectories": []}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "slots.0.tp" in err and "To fix" in err


def test_not_json(tmp_path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    assert main(["plan", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_infeasible_snapshot_exits_1_with_reasons(tmp_path, capsys) -> None:
    doc = {
        "time": 0,
        "model": "llama-2-70b",
        "slots": [{"id": "a", "gpu": "a100", "node": "n", "tp": 1, "role": "mixed", "engine": "warm"}],
        "trajectories": [{"id": "t0", "group": "g", "phase": "decoding", "context_tokens": 100, "slot": "a"}],
    }
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", str(path), "--backend", "greedy"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no feasible plan" in err and "'t0'" in err and "To fix" in err


def test_unknown_backend_exits_2(snap_file, capsys) -> None:
    assert main(["plan", str(snap_file), "--backend", "magic"]) == 2
    assert "unknown planner backend" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path, capsys) -> None:
    assert main(["plan", str(tmp_path / "none.json")]) == 2


def test_json_stdout_stays_clean_with_native_solvers(tmp_path, capfd) -> None:
    # HiGHS writes a banner straight to file descriptor 1: --json must still print only the plan.
    from rollplan.models.io import to_json
    from rollplan.solver.examples import example_snapshot

    path = tmp_path / "snap.json"
    path.write_text(to_json(example_snapshot(4, 120, seed=2)))
    assert main(["plan", str(path), "--backend", "milp", "--time-limit", "0.5", "--json"]) == 0
    out = capfd.readouterr().out
    assert plan_from_json(out).backend == "milp"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["replay", "--availability", "none", "--workload", "builtin", "--notice-s", "-5"], "--notice-s"),
        (["replay", "--workload", "builtin"], "--availability"),
        (["workload", "build", "--from", "synthetic", "--groups", "abc"], "--groups"),
        (["demo", "--batches", "0"], "--batches"),
        (["nosuchcmd"], "nosuchcmd"),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv: list[str], names: str, capsys) -> None:
    # Typer raises its own (bundled) click exceptions: they must not escape as tracebacks.
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and names in err and "To fix:" in err


def test_plan_deterministic_flag(snap_file, capsys) -> None:
    outs = []
    for _ in range(2):
        assert main(["plan", str(snap_file), "--backend", "cpsat", "--time-limit", "0.2", "--deterministic", "--json"]) == 0
        p = plan_from_json(capsys.readouterr().out)
        outs.append((p.roles, p.placement, p.objective))
    assert outs[0] == outs[1]


def test_repeated_calls_do_not_grow_the_app(capsys) -> None:
    """``main`` adds the entry points' commands once per process: calling it again (as every CLI test does)
    must not register them again (the app grew by all of them on every call, and each call built it whole)."""
    from rollplan.solver import cli

    def size() -> tuple[int, int, int, int]:
        return (len(cli.app.registered_commands), len(cli.app.registered_groups),
                len(cli.bench.registered_commands), len(cli.bench.registered_groups))

    assert main(["nosuchcmd"]) == 2
    before = size()
    assert before[0] > 0 and before[2] > 0
    for _ in range(3):
        assert main(["nosuchcmd"]) == 2
    assert size() == before
    capsys.readouterr()
