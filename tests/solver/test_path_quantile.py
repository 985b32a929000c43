"""Critical paths at a quantile of the predictions (``PlannerConfig.path_z``).

Invariants (hypothesis, tiny snapshots whose estimates carry spreads):
- the vectorised ``evaluate`` prices every decision as ``evaluate_reference`` does, at any ``path_z``
  (exact float equality);
- every core lower bound stays below the exhaustive optimum of the instance it is computed on;
- for one decision, raising ``path_z`` never lowers the makespan and leaves the work bound as it is
  (the paths take the spreads, the work the means).
"""

from __future__ import annotations

import pytest
from factories import FAST, make_slot, make_snapshot, make_traj, planner_config, tiny_snapshots
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollplan.models.errors import InfeasiblePlanError, UserInputError
from rollplan.models.types import ClusterSnapshot, Role
from rollplan.solver import build_instance, plan
from rollplan.solver.backends.exhaustive import optimum
from rollplan.solver.config import PlannerConfig
from rollplan.solver.core.bounds import compute_bounds, critical_path_bound, work_bound
from rollplan.solver.core.evaluate import evaluate, evaluate_reference

TOL = 1e-7
Z = st.sampled_from([0.5, 1.77, 3.0])


def _instance(snap: ClusterSnapshot, z: float):
    try:
        return build_instance(snap, planner_config(backend="exhaustive", path_z=z))
    except InfeasiblePlanError:
        assume(False)


@settings(FAST, max_examples=80)
@given(tiny_snapshots(max_slots=3, max_trajectories=4), Z, st.randoms(use_true_random=False))
def test_vectorised_evaluate_matches_the_reference(snap: ClusterSnapshot, z: float, rnd) -> None:
    inst = _instance(snap, z)
    roles = [rnd.choice([Role.MIXED, Role.DECODE, Role.PREFILL, Role.OFF]) for _ in inst.slots]
    placement = [rnd.randrange(len(inst.slots)) for _ in inst.trajs]
    assert evaluate(inst, roles, placement) == evaluate_reference(inst, roles, placement)

@settings(FAST, max_examples=80)
@given(tiny_snapshots(max_slots=3, max_trajectories=3), Z)
def test_bounds_hold_against_the_exhaustive_optimum(snap: ClusterSnapshot, z: float) -> None:
    inst = _instance(snap, z)
    opt = optimum(inst)
    assert opt is not None
    for name, bound in compute_bounds(inst).items():
        assert bound <= opt.min_makespan * (1 + TOL) + TOL, name
    for name, bound in compute_bounds(inst, on_time=True).items():
        assert bound <= opt.min_makespan_on_time * (1 + TOL) + TOL, name


@settings(FAST, max_examples=60)
@given(tiny_snapshots(max_slots=3, max_trajectories=4), Z)
def test_a_higher_quantile_never_shortens_a_decision_and_keeps_the_work(snap: ClusterSnapshot, z: float) -> None:
    lo, hi = _instance(snap, 0.0), _instance(snap, z)
    roles = [Role.MIXED] * len(lo.slots)
    placement = [0] * len(lo.trajs)
    assert evaluate(hi, roles, placement).makespan >= evaluate(lo, roles, placement).makespan - TOL
    assert critical_path_bound(hi) >= critical_path_bound(lo) - TOL
    assert work_bound(hi) == pytest.approx(work_bound(lo))


def test_the_spread_moves_the_critical_path_by_z_spreads() -> None:
    """One trajectory alone on one slot, all decode: its path grows by z spreads of decode steps."""
    snap = make_snapshot([make_slot("s0")], [make_traj("t0", decode=2000.0)])  # spread 400 tokens
    lo = build_instance(snap, planner_config(path_z=0.0))
    hi = build_instance(snap, planner_config(path_z=2.0))
    sl = lo.slots[0]
    assert hi.critical_path(0, 0) - lo.critical_path(0, 0) == pytest.approx(2.0 * 400.0 * (sl.a + sl.c))
    assert float(hi.arrays.D[0]) == float(lo.arrays.D[0]) == 2000.0


def test_the_plan_reports_the_quantile_makespan() -> None:
    snap = make_snapshot([make_slot("s0"), make_slot("s1")],
                         [make_traj(f"t{i}", slot="s0", decode=1000.0 + 500 * i) for i in range(4)])
    lo = plan(snap, config=planner_config(backend="greedy", path_z=0.0))
    hi = plan(snap, config=planner_config(backend="greedy", path_z=1.77))
    assert hi.makespan > lo.makespan


@pytest.mark.parametrize("z", [-0.5, float("nan"), float("inf")])
def test_bad_path_z_is_a_user_error(z: float) -> None:
    with pytest.raises(UserInputError, match="path_z"):
        PlannerConfig(path_z=z)
