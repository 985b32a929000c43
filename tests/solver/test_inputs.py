"""Input checks (``rollplan.solver.inputs.check_inputs``): raised by ``plan()`` before any solve and by
``rollplan plan`` (one line, exit 2), each naming the field path and ending with a "To fix:" hint.

Cases: a context beyond the model's window, a trajectory on an unknown slot, duplicate trajectory / slot
ids, a return deadline before the snapshot time; and what stays accepted (a deadline at the snapshot
time, a finished trajectory on a vanished slot, a context exactly at the window).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from factories import T0, make_slot, make_snapshot, make_traj

from rollplan.models.errors import SchemaError, UserInputError
from rollplan.models.io import to_json
from rollplan.models.specs import model_spec
from rollplan.models.types import Phase, SlotSource
from rollplan.solver import PlannerConfig, plan
from rollplan.solver.cli import main
from rollplan.solver.inputs import check_inputs

GREEDY = PlannerConfig(backend="greedy", time_limit=0.5)
WINDOW = model_spec("qwen3-8b").max_context


def _snap(**over):
    slots = over.pop("slots", [make_slot("s0"), make_slot("s1")])
    trajs = over.pop("trajectories", [make_traj(f"t{i}", slot="s0") for i in range(4)])
    return make_snapshot(slots, trajs, **over)


def _bad_trajs(i: int, **change):
    trajs = [make_traj(f"t{k}", slot="s0") for k in range(5)]
    trajs[i] = dataclasses.replace(trajs[i], **change)
    return trajs


CASES = {
    "context beyond the window": (
        _snap(trajectories=_bad_trajs(3, context_tokens=10**9)),
        "trajectories[3].context_tokens",
        str(WINDOW),
    ),
    "unknown slot": (_snap(trajectories=_bad_trajs(2, slot="nowhere")), "trajectories[2].slot", "'nowhere'"),
    "duplicate trajectory id": (_snap(trajectories=_bad_trajs(4, id="t1")), "trajectories[4].id", "'t1'"),
    "duplicate slot id": (
        _snap(slots=[make_slot("s0"), make_slot("s1"), make_slot("s0")]),
        "slots[2].id",
        "'s0'",
    ),
    "deadline in the past": (
        _snap(slots=[make_slot("s0"), make_slot("s1", source=SlotSource.PREEMPTIBLE, return_by=T0 - 1.0)]),
        "slots[1].return_by",
        "before the snapshot time",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_raises_one_line_with_the_field(case: str) -> None:
    snap, path, detail = CASES[case]
    with pytest.raises(SchemaError) as info:
        plan(snap, config=GREEDY)
    text = str(info.value)
    assert "\n" not in text and text.startswith(path + ":") and detail in text and "To fix:" in text
    assert isinstance(info.value, UserInputError)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_prints_one_line_and_exits_2(case: str, tmp_path, capsys) -> None:
    snap, path, _ = CASES[case]
    f = tmp_path / "snap.json"
    f.write_text(to_json(snap))
    assert main(["plan", str(f), "--backend", "greedy", "--time-limit", "0.2"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and f"{f}: {path}" in err and "To fix" in err
    assert captured.out == ""


def test_the_checks_run_before_any_solve() -> None:
    """An exact backend with a generous limit: the error comes back without a solve (fake clock: 0 time)."""
    snap = CASES["context beyond the window"][0]
    calls = []

    def clock() -> float:
        calls.append(1)
        return 0.0

    with pytest.raises(SchemaError):
        plan(snap, config=PlannerConfig(backend="milp", time_limit=30.0, clock=clock))
    assert len(calls) <= 1  # t0 only: nothing was timed, built or solved


def test_edge_cases_stay_accepted() -> None:
    snap = _snap(
        slots=[make_slot("s0"), make_slot("s1", source=SlotSource.LENT_BY_TRAINING, return_by=T0)],
        trajectories=[
            make_traj("t0", slot="s0", context=WINDOW, decode=0.0),
            dataclasses.replace(make_traj("t1", slot="gone", context=10**9), phase=Phase.DONE),
        ],
    )
    assert check_inputs(snap) is snap
    p = plan(snap, config=GREEDY)
    assert set(p.placement) == {"t0"}


def test_malformed_json_still_names_the_pydantic_path(tmp_path, capsys) -> None:
    doc = {"time": 0, "model": "qwen3-8b", "slots": [], "trajectories": [{"id": "a", "group": "g", "phase": "x"}]}
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    assert main(["plan", str(f)]) == 2
    assert "trajectories.0.phase" in capsys.readouterr().err
