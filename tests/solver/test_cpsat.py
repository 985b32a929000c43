"""The ``cpsat`` backend: the one scaling function, safe rounding of rows, time limit, warm start.

Invariants:
- ``to_ms`` keeps exact millisecond values exact in every rounding mode and rounds to the requested side;
- a CP-SAT solution of the exact model never under-estimates ``evaluate``: its model objective is at least
  the decision's price minus the objective's own rounding (rows round to the safe side), and a deadline it
  meets is met (hypothesis over tiny snapshots);
- the time limit is honoured on an exact instance too big to prove in time, and the hint comes back no worse.
"""

from __future__ import annotations

import time

import pytest
from factories import planner_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_milp_exact import tiny_snapshots

from rollplan.models.types import ClusterSnapshot, SolveStatus
from rollplan.solver.backends import cpsat
from rollplan.solver.backends.base import Decision
from rollplan.solver.backends.pipeline import decision_objective
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.core.instance import build_instance
from rollplan.solver.examples import example_snapshot
from rollplan.solver.model.formulation import ExactFormulation, Sense, SolveLimits, is_small
from rollplan.solver.search.placement import solve_greedy


def test_to_ms_modes() -> None:
    assert cpsat.to_ms(2.0) == cpsat.to_ms(2.0, "down") == cpsat.to_ms(2.0, "up") == 2000
    assert cpsat.to_ms(0.0012) == 1
    assert cpsat.to_ms(0.0012, "up") == 2
    assert cpsat.to_ms(0.0018, "down") == 1
    assert cpsat.to_ms(-0.0012, "down") == -2
    assert cpsat.to_ms(0.1 + 0.2) == 300  # float noise does not move an exact value


def test_rows_round_to_the_safe_side() -> None:
    inst = build_instance(example_snapshot(2, 4, 0), planner_config())
    b = cpsat.CpSatBuilder(inst)
    x = b.add_var("x", 0.0, 10.0, integer=False)
    y = b.add_var("y", 0.0, 1.0, integer=True)
    b.add_constraint("ge", [(1.0, x), (-1.0003, y)], Sense.GE, 0.0)  # x >= 1.0003 y
    b.add_constraint("on", [(1.0, y)], Sense.EQ, 1.0)
    b.set_objective([])
    res = b.solve(SolveLimits(time_limit=5.0))
    assert res.status is SolveStatus.OPTIMAL
    assert res.value(x) >= 1.0003  # 1.001: rounded up, never down


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(snap=tiny_snapshots(), lam=st.sampled_from([0.0, 0.01, 0.5]))
def test_cpsat_never_underestimates(snap: ClusterSnapshot, lam: float) -> None:
    inst = build_instance(snap, planner_config(switch_weight=lam, relative_gap=0.0))
    form = ExactFormulation(inst)
    b = cpsat.CpSatBuilder(inst)
    form.build(b)
    res = b.solve(SolveLimits(time_limit=20.0))
    assert res.status is SolveStatus.OPTIMAL and res.objective is not None
    roles, placement = form.decision(res)
    ev = evaluate(inst, roles, placement)
    assert not ev.problems
    n_terms = 2 * len(inst.trajs) * len(inst.slots) + 4 * len(inst.slots) + 3
    assert res.objective >= ev.objective - 5e-4 * n_terms
    for s, sl in enumerate(inst.slots):
        if sl.deadline is not None and res.value(form.ov[s]) == 0.0:
            assert ev.overrun[s] == 0.0


@pytest.mark.parametrize("budget", [0.05, 0.3])
def test_time_limit_on_an_exact_instance(budget: float) -> None:
    inst = build_instance(example_snapshot(16, 64, 7), planner_config(relative_gap=0.0))
    assert is_small(inst)
    roles, placement, _ = solve_greedy(inst)
    hint = Decision(tuple(roles), tuple(placement), SolveStatus.HEURISTIC)
    t0 = time.perf_counter()
    d = cpsat.BACKEND.solve(inst, budget=budget, hint=hint)
    assert (
        time.perf_counter() - t0 <= budget + 0.5
    )  # model build is measured and subtracted; CP-SAT stops on time
    assert d is not None
    assert decision_objective(inst, d.roles, d.placement) <= decision_objective(inst, roles, placement) + 1e-9
