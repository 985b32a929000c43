"""The exhaustive oracle against greedy and the lower bounds, on tiny instances.

Invariants (hypothesis, examples per test in brackets):
- greedy's objective >= the exhaustive optimum (exhaustive is optimal over the same ``evaluate``) [150];
- every lower bound (work/capacity, critical path) <= the least makespan of any feasible decision, and the
  deadline-aware (``on_time``) ones <= the least makespan of any decision meeting every deadline [150];
- adding an idle warm slot never makes the optimal predicted makespan worse (lambda = 0, exhaustive) [100];
- plan(backend="exhaustive") returns the exhaustive optimum with status OPTIMAL and validates [60].
"""

from __future__ import annotations

import dataclasses

import pytest
from factories import FAST, make_slot, make_snapshot, make_traj, planner_config, tiny_snapshots
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollplan.models.errors import InfeasiblePlanError, SolverError
from rollplan.models.types import ClusterSnapshot, Role, SolveStatus
from rollplan.solver import PlannerConfig, build_instance, plan, validate_plan
from rollplan.solver.backends.exhaustive import optimum
from rollplan.solver.core.bounds import compute_bounds, critical_path_bound, work_bound
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.search.placement import solve_greedy

TOL = 1e-7


def _instance(snap: ClusterSnapshot, config: PlannerConfig):
    try:
        return build_instance(snap, config)
    except InfeasiblePlanError:
        assume(False)


@settings(FAST, max_examples=150)
@given(tiny_snapshots(max_slots=3, max_trajectories=3), st.sampled_from([0.0, 0.01, 0.5]))
def test_greedy_never_beats_the_exhaustive_optimum_and_bounds_hold(snap: ClusterSnapshot, lam: float) -> None:
    config = planner_config(backend="greedy", switch_weight=lam)
    inst = _instance(snap, config)
    opt = optimum(inst)
    assert opt is not None
    roles, placement, _ = solve_greedy(inst)
    ev = evaluate(inst, roles, placement)
    assert not ev.problems
    assert ev.objective >= opt.objective * (1 - TOL) - TOL
    for name, bound in compute_bounds(inst).items():
        assert bound <= opt.min_makespan * (1 + TOL) + TOL, name
    for name, bound in compute_bounds(inst, on_time=True).items():
        assert bound <= opt.min_makespan_on_time * (1 + TOL) + TOL, name


@settings(FAST, max_examples=100)
@given(tiny_snapshots(max_slots=2, max_trajectories=3), st.sampled_from(["h800", "a100"]))
def test_adding_an_idle_warm_slot_never_worsens_the_optimal_makespan(snap: ClusterSnapshot, gpu: str) -> None:
    config = planner_config(backend="exhaustive", switch_weight=0.0)
    inst = _instance(snap, config)
    before = optimum(inst)
    extra = make_slot("idle", gpu=gpu, node="n9")
    bigger = dataclasses.replace(snap, slots=(*snap.slots, extra))
    after = optimum(build_instance(bigger, config))
    assert before is not None and after is not None
    assert after.objective <= before.objective * (1 + TOL) + TOL
    assert after.min_makespan <= before.min_makespan * (1 + TOL) + TOL


@settings(FAST, max_examples=60)
@given(tiny_snapshots(max_slots=2, max_trajectories=3))
def test_exhaustive_backend_through_plan(snap: ClusterSnapshot) -> None:
    # start_idle off: the optimum is the decision's; the idle starts plan() adds after it are priced on top
    # (tests/solver/test_start_idle.py checks that part).
    config = planner_config(backend="exhaustive", time_limit=30.0, relative_gap=0.0, start_idle=False)
    inst = _instance(snap, config)
    opt = optimum(inst)
    assert opt is not None
    p = plan(snap, config=config)
    validate_plan(snap, p, config)
    assert p.objective == pytest.approx(opt.objective, rel=1e-9, abs=1e-9)
    assert p.status in (SolveStatus.OPTIMAL, SolveStatus.DEADLINE_RELAXED)
    if "exhaustive_bound" in p.bounds:  # absent when greedy met a lower bound: the backend did not run
        assert p.bounds["exhaustive_bound"] == pytest.approx(opt.min_makespan)


def test_bounds_are_tight_on_a_single_long_trajectory() -> None:
    snap = make_snapshot([make_slot("s0"), make_slot("s1")], [make_traj("t0", decode=10000.0)])
    inst = build_instance(snap, planner_config())
    opt = optimum(inst)
    assert opt is not None
    assert critical_path_bound(inst) == pytest.approx(opt.min_makespan, rel=1e-9)
    assert work_bound(inst) <= opt.min_makespan


def test_work_bound_dominates_when_many_trajectories_share_few_slots() -> None:
    trajs = [make_traj(f"t{i}", decode=500.0, context=20000) for i in range(200)]
    snap = make_snapshot([make_slot("s0")], trajs)
    inst = build_instance(snap, planner_config())
    roles, placement, _ = solve_greedy(inst)
    ms = evaluate(inst, roles, placement).makespan
    assert critical_path_bound(inst) < work_bound(inst) <= ms * (1 + TOL)


def test_exhaustive_refuses_big_instances() -> None:
    snap = make_snapshot([make_slot(f"s{i}") for i in range(5)], [make_traj("t0")])
    with pytest.raises(SolverError, match="To fix"):
        optimum(build_instance(snap, planner_config()))


def test_exhaustive_prefers_fewer_changes_on_ties() -> None:
    # Two identical warm slots, one trajectory at home on s0: staying home ties with nothing better.
    snap = make_snapshot([make_slot("s0"), make_slot("s1")], [make_traj("t0", slot="s0", context=0)])
    opt = optimum(build_instance(snap, planner_config(switch_weight=0.0)))
    assert opt is not None
    assert opt.placement == (0,)
    assert opt.roles[0] is Role.MIXED
