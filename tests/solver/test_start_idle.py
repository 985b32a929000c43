"""``PlannerConfig.start_idle``: OFF slots without a return deadline that the plan leaves empty are started MIXED.

Invariants (hypothesis, tiny snapshots of ``factories.tiny_snapshots``):
- the placement and the makespan are those of the same call with ``start_idle=False``;
- the objective differs exactly by the switching weight times the started slots' start GPU-seconds;
- a started slot carries no deadline and serves before the makespan; a slot with a deadline is never started.
"""

from __future__ import annotations

import math

from factories import FAST, make_slot, make_snapshot, make_traj, planner_config, tiny_snapshots
from hypothesis import assume, given

from rollplan.models.errors import InfeasiblePlanError
from rollplan.models.types import ActionKind, EngineState, Role, Slot, SlotSource
from rollplan.solver import plan
from rollplan.solver.core.instance import build_instance


def _cold(id: str, return_by: float | None = None) -> Slot:
    return make_slot(id, role=Role.OFF, engine=EngineState.NONE, source=SlotSource.PREEMPTIBLE, return_by=return_by)


def test_idle_cold_slot_is_started_without_changing_the_placement() -> None:
    # One long trajectory at home on a warm slot: the critical path binds, so the placement needs no other GPU.
    snap = make_snapshot(
        slots=[make_slot("warm"), _cold("cold"), _cold("lent", return_by=1000.0 + 600.0)],
        trajectories=[make_traj("t0", slot="warm", decode=40000.0)],
    )
    lean = plan(snap, config=planner_config(backend="greedy", start_idle=False))
    full = plan(snap, config=planner_config(backend="greedy"))
    assert lean.roles["cold"] is Role.OFF
    assert full.roles["cold"] is Role.MIXED
    assert any(a.kind is ActionKind.START_ENGINE and a.slot == "cold" for a in full.actions)
    assert full.roles["lent"] is Role.OFF  # a deadline: released, never started
    assert full.placement == lean.placement
    assert full.makespan == lean.makespan


def test_slot_that_cannot_start_before_the_makespan_stays_off() -> None:
    # A short batch: the cold engine would come up after the last trajectory finished.
    snap = make_snapshot(
        slots=[make_slot("warm"), _cold("cold")],
        trajectories=[make_traj("t0", slot="warm", decode=50.0)],
    )
    p = plan(snap, config=planner_config(backend="greedy"))
    inst = build_instance(snap, planner_config(backend="greedy"))
    cold = next(sl for sl in inst.slots if sl.id == "cold")
    assert cold.start_seconds(Role.MIXED, inst.config.role_switch_seconds) >= p.makespan
    assert p.roles["cold"] is Role.OFF


@FAST
@given(tiny_snapshots(max_slots=3, max_trajectories=4))
def test_start_idle_only_adds_priced_starts(snap) -> None:  # type: ignore[no-untyped-def]
    cfg_off = planner_config(backend="greedy", start_idle=False)
    try:
        lean = plan(snap, config=cfg_off)
    except InfeasiblePlanError:
        assume(False)  # some trajectory fits no slot: nothing to compare
        return
    full = plan(snap, config=planner_config(backend="greedy"))
    assert full.placement == lean.placement
    assert math.isclose(full.makespan, lean.makespan, rel_tol=1e-12, abs_tol=1e-12)
    inst = build_instance(snap, cfg_off)
    started = [sl for sl in inst.slots if lean.roles[sl.id] is Role.OFF and full.roles[sl.id] is Role.MIXED]
    changed = [sl for sl in inst.slots if lean.roles[sl.id] is not full.roles[sl.id]]
    assert changed == started  # nothing else moves
    extra = 0.0
    for sl in started:
        st = sl.start_seconds(Role.MIXED, inst.config.role_switch_seconds)
        assert sl.deadline is None
        assert st < full.makespan
        extra += st * sl.tp
    assert math.isclose(full.switching_cost, lean.switching_cost + extra, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(full.objective, lean.objective + inst.config.switch_weight * extra, rel_tol=1e-9, abs_tol=1e-9)
