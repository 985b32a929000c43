"""Exactness of the ``milp`` and ``cpsat`` backends and validity of ``milp.lp_bound`` on tiny instances.

Invariants (hypothesis over tiny snapshots: 1-3 slots in every engine state / role / deadline situation,
1-4 trajectories with short or long predicted lengths, lambda in {0, 0.01, 0.5}):

- milp (HiGHS, relative gap 0) reaches the exhaustive optimum of the ``make_plan`` objective
  (``release_idle`` then ``evaluate``) up to the solver's tolerance;
- cpsat reaches it up to the millisecond scaling (about 1 ms per term of a row), and never reports a
  deadline met that ``evaluate`` says is missed;
- the MILP's own objective equals ``evaluate`` of the decision it returns (the model prices like evaluate);
- ``lp_bound`` <= the least makespan of any decision (exhaustive), and >= the critical-path cut;
- on family snapshots small enough for the exact model (3 slots x 12 trajectories, every family), milp and
  cpsat agree within 1% wherever both prove optimality (issue 15), and at least one family has both proving it.
"""

from __future__ import annotations

import math

import pytest
from factories import planner_config
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rollplan.models.types import (
    ClusterSnapshot,
    EngineState,
    Estimate,
    Phase,
    Role,
    Slot,
    SlotSource,
    Trajectory,
)
from rollplan.solver.backends import cpsat, milp
from rollplan.solver.backends.exhaustive import optimum
from rollplan.solver.backends.pipeline import decision_objective
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.core.instance import Instance, build_instance
from rollplan.solver.families import FAMILIES, family_snapshot
from rollplan.solver.model.formulation import ExactFormulation, SolveLimits

T0 = 100.0
VERSION = 3


@st.composite
def tiny_snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    """1-3 slots (h100, qwen3-8b, tp 1), 1-4 trajectories; every slot state and deadline case reachable."""
    n_s = draw(st.integers(1, 3))
    slots = []
    for i in range(n_s):
        engine = draw(st.sampled_from(list(EngineState)))
        role = (
            draw(st.sampled_from([Role.MIXED, Role.MIXED, Role.PREFILL, Role.DECODE]))
            if engine is EngineState.WARM
            else Role.OFF
        )
        deadline = draw(st.one_of(st.none(), st.floats(0.5, 200.0)))
        slots.append(
            Slot(
                id=f"s{i}",
                gpu="h100",
                node=f"n{draw(st.integers(0, 1))}",
                source=SlotSource.DEDICATED if deadline is None else SlotSource.LENT_BY_TRAINING,
                return_by=None if deadline is None else T0 + deadline,
                role=role,
                engine=engine,
                weights_version=draw(st.sampled_from([VERSION, VERSION - 1]))
                if engine is not EngineState.NONE
                else 0,
            )
        )
    # At least one slot that can host anything without a deadline, so every instance is feasible.
    if all(s.return_by is not None for s in slots):
        s0 = slots[0]
        slots[0] = Slot(
            s0.id, s0.gpu, s0.node, s0.tp, SlotSource.DEDICATED, None, s0.role, s0.engine, s0.weights_version
        )
    n_j = draw(st.integers(1, 4))
    trajs = []
    for j in range(n_j):
        home = draw(st.one_of(st.none(), st.integers(0, n_s - 1)))
        ctx = draw(st.integers(0, 30000))
        trajs.append(
            Trajectory(
                id=f"t{j}",
                group=f"g{j // 2}",
                phase=draw(st.sampled_from([Phase.DECODING, Phase.IN_TOOL, Phase.PREFILL_PENDING])),
                context_tokens=ctx,
                slot=None if home is None else slots[home].id,
                remaining_decode_tokens=Estimate(draw(st.floats(1.0, 20000.0))),
                remaining_prefill_tokens=Estimate(
                    draw(st.sampled_from([0.0, 0.0, 500.0, 20000.0, 200000.0]))
                ),
                remaining_tool_seconds=Estimate(draw(st.sampled_from([0.0, 2.0, 30.0]))),
            )
        )
    return ClusterSnapshot(
        time=T0, model="qwen3-8b", slots=tuple(slots), trajectories=tuple(trajs), weights_version=VERSION
    )


def _instance(snap: ClusterSnapshot, lam: float) -> Instance:
    return build_instance(snap, planner_config(relative_gap=0.0, switch_weight=lam, time_limit=30.0))


def _rounding_tolerance(inst: Instance) -> float:
    """Millisecond rounding of CP-SAT: ~1 ms per term of the longest row, times the objective weights."""
    terms = 2 * len(inst.trajs) + 4 * len(inst.slots) + 4
    tp = max(sl.tp for sl in inst.slots)
    return 1e-3 * terms * (1.0 + inst.config.switch_weight * tp * len(inst.slots))


def _near_deadline(inst: Instance, roles: tuple[Role, ...], placement: tuple[int, ...], eps: float) -> bool:
    ev = evaluate(inst, roles, placement)
    return any(
        sl.deadline is not None and roles[s] is not Role.OFF and abs(ev.slot_finish[s] - sl.deadline) <= eps
        for s, sl in enumerate(inst.slots)
    )


LAMBDAS = st.sampled_from([0.0, 0.01, 0.5])
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@SETTINGS
@given(snap=tiny_snapshots(), lam=LAMBDAS)
def test_milp_and_cpsat_reach_the_exhaustive_optimum(snap: ClusterSnapshot, lam: float) -> None:
    inst = _instance(snap, lam)
    opt = optimum(inst)
    assert opt is not None
    m = milp.BACKEND.solve(inst, budget=30.0, hint=None)
    assert m is not None and m.status.value == "optimal"
    m_obj = decision_objective(inst, m.roles, m.placement)
    assert m_obj == pytest.approx(opt.objective, rel=1e-6, abs=1e-6)

    tol = _rounding_tolerance(inst)
    assume(not _near_deadline(inst, opt.roles, opt.placement, 10 * tol))
    c = cpsat.BACKEND.solve(inst, budget=30.0, hint=None)
    assert c is not None and c.status.value == "optimal"
    c_ev = evaluate(inst, c.roles, c.placement)
    assert c_ev.total_overrun <= opt_overrun(inst, opt) + 1e-9
    assert decision_objective(inst, c.roles, c.placement) <= opt.objective + tol


def opt_overrun(inst: Instance, opt: object) -> float:
    return evaluate(inst, opt.roles, opt.placement).total_overrun  # type: ignore[attr-defined]


@SETTINGS
@given(snap=tiny_snapshots(), lam=LAMBDAS)
def test_milp_objective_equals_evaluate(snap: ClusterSnapshot, lam: float) -> None:
    """The model's objective value at its solution is ``evaluate``'s price of the decision it encodes."""
    inst = _instance(snap, lam)
    form = ExactFormulation(inst)
    builder = milp.PulpBuilder(inst)
    form.build(builder)
    res = builder.solve(SolveLimits(time_limit=30.0))
    assert res.status is not None and res.objective is not None
    roles, placement = form.decision(res)
    ev = evaluate(inst, roles, placement)
    assert not ev.problems
    assert res.objective == pytest.approx(ev.objective, rel=1e-6, abs=1e-5)


@SETTINGS
@given(snap=tiny_snapshots(), lam=LAMBDAS)
def test_lp_bound_is_valid(snap: ClusterSnapshot, lam: float) -> None:
    inst = _instance(snap, lam)
    opt = optimum(inst)
    assert opt is not None
    bound = milp.lp_bound(inst, 10.0)
    assert bound is not None
    assert bound <= opt.min_makespan * (1 + 1e-9) + 1e-9
    assert bound >= ExactFormulation(inst).longest_path_cut() * (1 - 1e-6) - 1e-6


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_warm_start_and_solvers_agree(solver: str) -> None:
    """The hint is accepted (HiGHS setSolution / CBC warmStart) and both MILP solvers find the same optimum."""
    from rollplan.solver.backends.greedy import BACKEND as GREEDY
    from rollplan.solver.examples import example_snapshot

    snap = example_snapshot(4, 12, seed=5)
    inst = build_instance(snap, planner_config(relative_gap=0.0, milp_solver=solver, time_limit=30.0))
    hint = GREEDY.solve(inst, budget=1.0)
    assert hint is not None
    d = milp.BACKEND.solve(inst, budget=30.0, hint=hint)
    assert d is not None
    assert d.status.value == "optimal"
    opt = optimum(inst) if len(inst.slots) <= 4 and len(inst.trajs) <= 6 else None
    got = decision_objective(inst, d.roles, d.placement)
    assert got <= decision_objective(inst, hint.roles, hint.placement) + 1e-9
    if opt is not None:
        assert got == pytest.approx(opt.objective, rel=1e-6, abs=1e-6)
    assert math.isfinite(got)


def test_milp_and_cpsat_agree_where_both_prove_optimality() -> None:
    """Issue 15's "within 1% wherever both prove optimality", on every family (deterministic work limits)."""
    both = 0
    for family in FAMILIES:
        config = planner_config(relative_gap=0.0, deterministic=True, time_limit=10.0)
        inst = build_instance(family_snapshot(family, 3, 12, seed=0), config)
        m = milp.BACKEND.solve(inst, budget=10.0, hint=None)
        c = cpsat.BACKEND.solve(inst, budget=10.0, hint=None)
        assert m is not None and c is not None
        if m.status.value == "optimal" and c.status.value == "optimal":
            both += 1
            m_obj = decision_objective(inst, m.roles, m.placement)
            c_obj = decision_objective(inst, c.roles, c.placement)
            assert abs(m_obj - c_obj) <= 0.01 * max(m_obj, c_obj), (family, m_obj, c_obj)
    assert both >= 1
