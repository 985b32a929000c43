"""The large-instance pipeline: incremental pricing, the aggregate model, its LP bound, and the time limit.

Invariants:
- ``repair.SlotState`` prices a decision exactly as ``evaluate`` does, built in bulk or by single adds and
  removes (hypothesis over example snapshots and random decisions);
- the large path (aggregate MILP + disaggregation + repair) of both backends returns a decision without
  problems whose objective is never worse than the hint's;
- ``lp_bound`` through the aggregate relaxation (forced with ``exact_max_trajectories=0``) is <= the
  exhaustive least makespan on tiny instances, and <= every plan's makespan on larger ones;
- the time limit is honoured (budget + a small constant), with the hint as the answer when time is short.
"""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest
from factories import planner_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_milp_exact import tiny_snapshots

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.backends import cpsat, milp
from rollplan.solver.backends.base import Decision
from rollplan.solver.backends.exhaustive import optimum
from rollplan.solver.backends.pipeline import decision_objective
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.core.instance import Instance, build_instance
from rollplan.solver.core.tables import Tables as Prep
from rollplan.solver.examples import example_snapshot
from rollplan.solver.model import aggregate
from rollplan.solver.model.formulation import is_small
from rollplan.solver.search.disaggregate import roles_from_counts
from rollplan.solver.search.placement import solve_greedy
from rollplan.solver.search.state import SlotState, state_of

FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _random_decision(inst: Instance, rng: random.Random) -> tuple[list[Role], list[int]]:
    roles = [rng.choice([Role.OFF, Role.MIXED, Role.MIXED, Role.PREFILL, Role.DECODE]) for _ in inst.slots]
    if not any(r.decodes for r in roles):
        roles[0] = Role.MIXED
    if Role.DECODE in roles and Role.PREFILL not in roles:
        off = [s for s, r in enumerate(roles) if not r.decodes]
        if off:
            roles[off[0]] = Role.PREFILL
        else:
            roles = [Role.MIXED if r is Role.DECODE else r for r in roles]
    hosts = [s for s, r in enumerate(roles) if r.decodes]
    placement = [rng.choice([s for s in hosts if inst.fits(j, s)] or hosts) for j in range(len(inst.trajs))]
    return release_idle(inst, roles, placement), placement


@FAST
@given(
    n_s=st.integers(2, 24),
    n_j=st.integers(1, 200),
    seed=st.integers(0, 10_000),
    lam=st.sampled_from([0.0, 0.01, 1.0]),
)
def test_slot_state_prices_like_evaluate(n_s: int, n_j: int, seed: int, lam: float) -> None:
    inst = build_instance(example_snapshot(n_s, n_j, seed), planner_config(switch_weight=lam))
    rng = random.Random(seed)
    roles, placement = _random_decision(inst, rng)
    prep = Prep(inst)
    bulk = state_of(prep, roles, placement)
    single = SlotState(prep, roles)
    for j, s in enumerate(placement):
        single.add(j, s)
    ev = evaluate(inst, roles, placement)
    for state in (bulk, single):
        assert state.price().objective == pytest.approx(ev.objective, rel=1e-9, abs=1e-9)
    hosts = [s for s, r in enumerate(roles) if r.decodes]
    for _ in range(30):  # moves keep the incremental sums exact
        j, s = rng.randrange(len(placement)), rng.choice(hosts)
        bulk.remove(j)
        bulk.add(j, s)
        placement[j] = s
    assert bulk.price().objective == pytest.approx(
        evaluate(inst, roles, placement).objective, rel=1e-9, abs=1e-9
    )


def test_roles_from_counts_respects_counts_and_prefers_the_hint() -> None:
    inst = build_instance(example_snapshot(12, 50, 3), planner_config())
    prep = Prep(inst)
    members = list(range(len(inst.slots)))
    prefer = [Role.DECODE if s < 4 else Role.MIXED for s in members]
    want = {Role.MIXED: 5, Role.DECODE: 3, Role.PREFILL: 2}
    roles = roles_from_counts(prep, [members], [want], prefer, [0] * len(members))
    for r, n in want.items():
        assert sum(1 for x in roles if x is r) == n
    assert all(roles[s] is Role.DECODE for s in range(3))  # kept from the hint


def _greedy_hint(inst: Instance) -> Decision:
    roles, placement, _ = solve_greedy(inst)
    return Decision(tuple(roles), tuple(placement), SolveStatus.HEURISTIC)


@pytest.mark.parametrize("backend", [milp, cpsat])
@pytest.mark.parametrize(("n_s", "n_j", "seed"), [(16, 400, 0), (8, 600, 1), (40, 500, 2)])
def test_large_path_is_never_worse_than_the_hint(backend: object, n_s: int, n_j: int, seed: int) -> None:
    inst = build_instance(example_snapshot(n_s, n_j, seed), planner_config(time_limit=2.0))
    assert not is_small(inst)
    hint = _greedy_hint(inst)
    d = backend.BACKEND.solve(inst, budget=2.0, hint=hint)  # type: ignore[attr-defined]
    assert d is not None
    mine = decision_objective(inst, d.roles, d.placement)
    assert math.isfinite(mine)
    assert mine <= decision_objective(inst, hint.roles, hint.placement) + 1e-9


def test_large_path_without_a_hint_finds_a_valid_decision() -> None:
    inst = build_instance(example_snapshot(16, 300, 4), planner_config())
    d = milp.BACKEND.solve(inst, budget=2.0, hint=None)
    assert d is not None
    assert not evaluate(inst, release_idle(inst, d.roles, d.placement), d.placement).problems


@FAST
@given(snap=tiny_snapshots(), lam=st.sampled_from([0.0, 0.5]))
def test_aggregate_lp_bound_is_valid_on_tiny_instances(snap: object, lam: float) -> None:
    inst = build_instance(snap, planner_config(exact_max_trajectories=0, switch_weight=lam))  # type: ignore[arg-type]
    assert not is_small(inst)
    opt = optimum(inst)
    assert opt is not None
    bound = milp.lp_bound(inst, 10.0)
    assert bound is not None
    assert bound <= opt.min_makespan * (1 + 1e-9) + 1e-9
    with_upper = milp.lp_bound(inst, 10.0, upper=opt.min_makespan)
    assert with_upper is not None and bound - 1e-9 <= with_upper <= opt.min_makespan * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize(("n_s", "n_j", "seed"), [(32, 512, 0), (16, 2048, 1)])
def test_aggregate_lp_bound_is_below_the_plans(n_s: int, n_j: int, seed: int) -> None:
    inst = build_instance(example_snapshot(n_s, n_j, seed), planner_config())
    hint = _greedy_hint(inst)
    d = milp.BACKEND.solve(inst, budget=2.0, hint=hint)
    assert d is not None
    ms = evaluate(inst, release_idle(inst, d.roles, d.placement), d.placement).makespan
    g_ms = evaluate(inst, release_idle(inst, hint.roles, hint.placement), hint.placement).makespan
    bound = milp.lp_bound(inst, 5.0, upper=g_ms)
    assert bound is not None
    assert bound <= min(ms, g_ms) * (1 + 1e-9)


@pytest.mark.parametrize("backend", [milp, cpsat])
def test_time_limit_is_honoured_on_a_large_instance(backend: object) -> None:
    inst = build_instance(example_snapshot(64, 2000, 5), planner_config())
    hint = _greedy_hint(inst)
    for budget in (0.0, 0.05, 0.3):
        t0 = time.perf_counter()
        d = backend.BACKEND.solve(inst, budget=budget, hint=hint)  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - t0
        # The fixed part (numpy preparation, one model build) is bounded; everything after it is clocked.
        assert elapsed <= budget + 0.25, (budget, elapsed)
        assert d is not None
        assert (
            decision_objective(inst, d.roles, d.placement)
            <= decision_objective(inst, hint.roles, hint.placement) + 1e-9
        )


def test_aggregate_grid() -> None:
    assert aggregate.makespan_grid(10.0, 10.0) == [10.0]
    grid = aggregate.makespan_grid(100.0, 150.0)
    assert grid[0] == pytest.approx(100.0) and grid[-1] == pytest.approx(150.0)
    assert len(grid) <= aggregate.GRID_POINTS and all(b > a for a, b in itertools.pairwise(grid))
    # No critical path (no trajectory left): a positive grid up to hi, and no division by zero.
    grid = aggregate.makespan_grid(0.0, 2.0)
    assert grid[-1] == pytest.approx(2.0) and grid[0] > 0 and all(b > a for a, b in itertools.pairwise(grid))
    assert aggregate.makespan_grid(0.0, 0.0) == [0.0]


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_no_trajectory_left_is_planned_by_the_exact_backend(backend: str, caplog) -> None:
    # Found by the family sweep: 6 slots and no trajectory sent the aggregate pipeline's grid to log(hi / 0),
    # and plan() fell back to greedy with a warning.
    from rollplan.solver import plan
    from rollplan.solver.families import family_snapshot

    p = plan(family_snapshot("example", 6, 0, seed=307508), config=planner_config(backend=backend, time_limit=0.05))
    assert p.backend == backend and not p.placement
    assert "failed" not in caplog.text
