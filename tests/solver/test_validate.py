"""``validate_plan`` catches every kind of corruption (each mutation of a valid plan is reported)."""

from __future__ import annotations

import dataclasses

import pytest
from factories import T0, make_slot, make_snapshot, make_traj, planner_config

from rollplan.models.errors import PlanValidationError
from rollplan.models.types import Action, ActionKind, Role, SlotSource, SolveStatus
from rollplan.solver import plan, validate_plan

CONFIG = planner_config(backend="greedy")


@pytest.fixture(scope="module")
def case():
    slots = [
        make_slot("a"),
        make_slot("b", role=Role.OFF),
        make_slot("lent", source=SlotSource.LENT_BY_TRAINING, return_by=T0 + 60.0),
    ]
    trajs = [make_traj(f"t{i}", slot="a" if i < 4 else "lent", decode=3000.0 + 400 * i, prefill=200.0) for i in range(6)]
    snap = make_snapshot(slots, trajs)
    p = plan(snap, config=CONFIG)
    validate_plan(snap, p, CONFIG)
    return snap, p


def _bad(snap, p, match: str) -> None:
    with pytest.raises(PlanValidationError, match=match):
        validate_plan(snap, p, CONFIG)


def test_valid_plan_passes(case) -> None:
    snap, p = case
    validate_plan(snap, p)  # default config == the planner's defaults but greedy: numbers do not depend on it


def test_missing_and_unknown_placements(case) -> None:
    snap, p = case
    place = dict(p.placement)
    tid = next(iter(place))
    del place[tid]
    _bad(snap, dataclasses.replace(p, placement=place), "is not placed")
    _bad(snap, dataclasses.replace(p, placement={**p.placement, "ghost": "a"}), "not an unfinished trajectory")
    _bad(snap, dataclasses.replace(p, placement={**p.placement, tid: "nowhere"}), "unknown slot")


def test_placement_on_a_slot_that_does_not_decode(case) -> None:
    snap, p = case
    off = next(s for s, r in p.roles.items() if r is Role.OFF)
    tid = next(iter(p.placement))
    _bad(snap, dataclasses.replace(p, placement={**p.placement, tid: off}), "does not decode")


def test_numbers_must_match(case) -> None:
    snap, p = case
    _bad(snap, dataclasses.replace(p, makespan=p.makespan * 0.9), "makespan")
    _bad(snap, dataclasses.replace(p, objective=p.objective + 1.0), "objective")
    _bad(snap, dataclasses.replace(p, switching_cost=p.switching_cost + 1.0), "switching cost")
    _bad(snap, dataclasses.replace(p, lower_bound=p.makespan * 2, bounds={"x": p.makespan * 2}), "exceeds the makespan")
    _bad(snap, dataclasses.replace(p, lower_bound=0.0), "largest of the bounds")


def test_actions_must_match_the_state_diff(case) -> None:
    snap, p = case
    extra = Action(ActionKind.START_ENGINE, "b", duration=1.0)
    _bad(snap, dataclasses.replace(p, actions=(extra, *p.actions)), "unexpected")
    if p.actions:
        _bad(snap, dataclasses.replace(p, actions=p.actions[1:]), "missing")


def test_actions_must_be_in_order() -> None:
    slots = [
        make_slot("a", weights_version=0),
        make_slot("idle", source=SlotSource.LENT_BY_TRAINING, return_by=T0 + 60.0),
    ]
    snap = make_snapshot(slots, [make_traj("t0", slot="a", decode=10000.0)])  # too long for the lent slot
    p = plan(snap, config=CONFIG)
    assert [a.kind for a in p.actions] == [ActionKind.SYNC_WEIGHTS, ActionKind.STOP_ENGINE, ActionKind.RETURN_SLOT]
    _bad(snap, dataclasses.replace(p, actions=tuple(reversed(p.actions))), "ACTION_ORDER")
    wrong = dataclasses.replace(p.actions[0], duration=p.actions[0].duration + 1.0)
    _bad(snap, dataclasses.replace(p, actions=(wrong, *p.actions[1:])), "lasts")


def test_roles_must_name_every_slot(case) -> None:
    snap, p = case
    roles = dict(p.roles)
    roles.pop("b")
    _bad(snap, dataclasses.replace(p, roles=roles), "exactly the snapshot's slots")


def test_work_past_a_deadline_needs_relaxed_status(case) -> None:
    snap = make_snapshot(
        [make_slot("lent", source=SlotSource.LENT_BY_TRAINING, return_by=T0 + 5.0)],
        [make_traj("t0", slot="lent", decode=20000.0)],
    )
    p = plan(snap, config=CONFIG)
    assert p.status is SolveStatus.DEADLINE_RELAXED
    _bad(snap, dataclasses.replace(p, status=SolveStatus.HEURISTIC), "past its return deadline")
    _bad(snap, dataclasses.replace(p, violations=()), "past its return deadline")


def test_every_violation_is_listed(case) -> None:
    snap, p = case
    broken = dataclasses.replace(p, makespan=p.makespan + 5, objective=p.objective + 3, actions=())
    with pytest.raises(PlanValidationError) as err:
        validate_plan(snap, broken, CONFIG)
    assert len(err.value.violations) >= 3 if p.actions else 2
