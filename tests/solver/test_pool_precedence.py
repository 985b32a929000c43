"""A DECODE slot decodes only once the prefill pool has started (issue 13): pricing.decode_start everywhere.

Invariants:
- ``evaluate``: a DECODE slot hosting a member that needs the pool (``pricing.waits_for_pool``: all but one
  at home with nothing to prefill) finishes at max(st_s, o) + its body, o = min_p st_p over PREFILL slots;
  a DECODE slot whose members all decode at home does not wait; the reference loop gives the same floats;
- ``SlotState`` (bulk, single adds, a PREFILL slot switched on after the adds, finish_with / finish_without /
  exchanges) prices every random role / placement choice with cold PREFILL candidates as ``evaluate`` [100];
- on a tiny P/D instance with a cold prefill slot, the MILP reaches the exhaustive optimum, and with the roles
  fixed to the cold-pool P/D plan its objective is the best ``evaluate`` price over its placements;
- on snapshot-like data (warm MIXED slots, cold spares, long prefills; /tmp/s10 replay) the planner picks
  MIXED, which prices lower than the cold-pool P/D plan the old rule (DECODE from st_s) preferred.
"""

from __future__ import annotations

import itertools

import pytest
from factories import FAST, make_slot, make_snapshot, make_traj, planner_config, slot_lists, traj_lists
from hypothesis import given
from hypothesis import strategies as st

from rollplan.models.types import EngineState, Phase, Role, Trajectory
from rollplan.solver import plan
from rollplan.solver.backends import milp
from rollplan.solver.backends.exhaustive import optimum
from rollplan.solver.backends.pipeline import decision_objective
from rollplan.solver.core import pricing
from rollplan.solver.core.evaluate import evaluate, evaluate_reference
from rollplan.solver.core.instance import Instance, build_instance
from rollplan.solver.model.formulation import ExactFormulation, Sense, SolveLimits
from rollplan.solver.search.placement import Prep
from rollplan.solver.search.state import SlotState, state_of


def _pending(n: int, prefill: float, decode: float, context: int = 0, tool: float = 0.0,
             turns: float = 1.0) -> list[Trajectory]:
    return [make_traj(f"t{i}", slot=None, phase=Phase.PREFILL_PENDING, prefill=prefill, decode=decode,
                      context=context, tool=tool, turns=turns) for i in range(n)]


def _alone(inst: Instance, j: int, s: int) -> float:
    """The body of j alone on DECODE slot s (``slot_time`` from 0)."""
    sl = inst.slots[s]
    d = inst.trajs[j].decode
    own = inst.stall_seconds(j, s, Role.DECODE)
    return pricing.slot_time(0.0, sl.a, sl.c, inst.phi * sl.c, inst.phi, d, d, inst.occupancy(j, s) * inst.share(j, s),
                             own + inst.move_seconds(j, s), inst.own_path(j, s, Role.DECODE), own)


def test_decode_slot_waits_for_a_cold_prefill_slot() -> None:
    slots = [make_slot("s0", role=Role.DECODE), make_slot("c0", engine=EngineState.NONE, role=Role.OFF)]
    home = make_traj("h0", slot="s0", decode=500.0)  # at home, nothing to prefill: does not wait
    trajs = [*_pending(1, 2000.0, 300.0), home]
    inst = build_instance(make_snapshot(slots, trajs), planner_config())
    rsw = inst.config.role_switch_seconds
    roles = [Role.DECODE, Role.PREFILL]
    st_d = inst.slots[0].start_seconds(Role.DECODE, rsw)
    o = inst.slots[1].start_seconds(Role.PREFILL, rsw)
    assert o > st_d + 10.0  # the pool cold-starts
    ev = evaluate(inst, roles, [0, 0])
    only_new = evaluate(inst.restricted([0]), roles, [0])
    assert only_new.slot_finish[0] == o + _alone(inst.restricted([0]), 0, 0)
    only_home = evaluate(inst.restricted([1]), roles, [0])
    assert only_home.slot_finish[0] == st_d + _alone(inst.restricted([1]), 0, 0)
    assert ev.slot_finish[0] > o  # one waiting member makes the whole slot wait
    for sub, pl in ((inst, [0, 0]), (inst.restricted([0]), [0]), (inst.restricted([1]), [0])):
        assert evaluate_reference(sub, roles, pl) == evaluate(sub, roles, pl)
    # No PREFILL slot: the existing handling (a problem, DECODE from st_s).
    ev_none = evaluate(inst.restricted([0]), [Role.DECODE, Role.OFF], [0])
    assert ev_none.problems and ev_none.slot_finish[0] == st_d + _alone(inst.restricted([0]), 0, 0)


@st.composite
def _decisions(draw: st.DrawFn) -> tuple[Instance, list[Role], list[int], list[int]]:
    slots = draw(slot_lists(1, 4))
    n_cold = draw(st.integers(1, 2))
    slots += [make_slot(f"c{i}", engine=EngineState.NONE, role=Role.OFF) for i in range(n_cold)]
    trajs = draw(traj_lists([s.id for s in slots], 7))
    inst = build_instance(make_snapshot(slots, trajs), planner_config())
    n_s, n_j = len(inst.slots), len(inst.trajs)
    roles = [draw(st.sampled_from([Role.MIXED, Role.DECODE, Role.DECODE, Role.DECODE, Role.PREFILL, Role.OFF]))
             for _ in range(n_s - n_cold)]
    roles += [draw(st.sampled_from([Role.PREFILL, Role.PREFILL, Role.PREFILL, Role.MIXED])) for _ in range(n_cold)]
    hosts = [s for s in range(n_s) if roles[s].decodes]
    if not hosts:
        roles[0] = Role.DECODE
        hosts = [0]
    placement = [draw(st.sampled_from(hosts)) for _ in range(n_j)]
    order = draw(st.permutations(list(range(n_j))))
    return inst, roles, placement, order


@FAST
@given(_decisions())
def test_state_prices_cold_pools_like_evaluate(case: tuple[Instance, list[Role], list[int], list[int]]) -> None:
    inst, roles, placement, order = case
    prep = Prep(inst)
    ev = evaluate(inst, roles, placement)
    assert evaluate_reference(inst, roles, placement) == ev
    bulk = state_of(prep, roles, placement)
    single = SlotState(prep, roles)
    late = SlotState(prep, [Role.OFF if r is Role.PREFILL else r for r in roles])  # PREFILL switched on last
    for j in order:
        s = placement[j]
        want = single.finish_with(j, s)
        single.add(j, s)
        assert single.finish[s] == want
        late.add(j, s)
    for s, r in enumerate(roles):
        if r is Role.PREFILL:
            late.set_role(s, r)
    if ev.problems or not order:
        return
    for state in (bulk, single, late):
        assert state.finish == [pytest.approx(f, rel=1e-12, abs=1e-9) if roles[s].decodes else state.finish[s]
                                for s, f in enumerate(ev.slot_finish)]
        assert state.price().objective == pytest.approx(ev.objective, rel=1e-9, abs=1e-9)
    j = order[0]
    s = placement[j]
    without = bulk.finishes_without(s)(j)
    assert bulk.finish_without(j) == pytest.approx(without, rel=1e-12, abs=1e-12)
    others = [i for i in range(len(placement)) if placement[i] != s]
    if others:
        swap = bulk.exchanges(s)(j, others[0])
        moved = list(placement)
        moved[j], moved[others[0]] = placement[others[0]], s
        assert swap == pytest.approx(evaluate(inst, roles, moved).slot_finish[s], rel=1e-9, abs=1e-9)
    bulk.remove(j)
    assert bulk.finish[s] == pytest.approx(without, rel=1e-12, abs=1e-12)


def _tiny_pd() -> Instance:
    """Two warm slots and a cold one; six long prefills: the old rule put a cold pool under DECODE slots."""
    slots = [make_slot("s0"), make_slot("s1"), make_slot("c0", engine=EngineState.NONE, role=Role.OFF)]
    return build_instance(make_snapshot(slots, _pending(6, 16000.0, 8000.0, context=0)),
                          planner_config(relative_gap=0.0, time_limit=30.0))


def test_milp_prices_the_pool_start_like_the_exhaustive_optimum() -> None:
    inst = _tiny_pd()
    opt = optimum(inst)
    assert opt is not None
    m = milp.BACKEND.solve(inst, budget=30.0, hint=None)
    assert m is not None and m.status.value == "optimal"
    assert decision_objective(inst, m.roles, m.placement) == pytest.approx(opt.objective, rel=1e-6, abs=1e-6)
    # The cold-pool P/D plan itself, roles fixed: the model's price is the best evaluate over its placements.
    pd = [Role.DECODE, Role.DECODE, Role.PREFILL]
    best = min(evaluate(inst, pd, list(p)).objective for p in itertools.product([0, 1], repeat=len(inst.trajs)))
    form = ExactFormulation(inst)
    builder = milp.PulpBuilder(inst)
    form.build(builder)
    for s, r in enumerate(pd):
        builder.add_constraint(f"fix_s{s}", [(1.0, form.y[s, r])], Sense.EQ, 1.0)
    res = builder.solve(SolveLimits(time_limit=30.0))
    assert res.objective is not None
    assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-5)
    assert best > opt.objective


def test_planner_prefers_mixed_over_a_cold_pool() -> None:
    slots = [make_slot(f"w{i}") for i in range(4)]
    slots += [make_slot(f"c{i}", engine=EngineState.NONE, role=Role.OFF) for i in range(2)]
    trajs = _pending(24, 16000.0, 4000.0, context=15000, tool=80.0, turns=20.0)
    snap = make_snapshot(slots, trajs)
    cfg = planner_config(backend="milp", time_limit=2.0)
    inst = build_instance(snap, cfg)
    rsw = cfg.role_switch_seconds
    n = len(inst.trajs)
    mixed = [Role.MIXED] * 4 + [Role.OFF] * 2
    pd = [Role.DECODE] * 4 + [Role.PREFILL] * 2
    spread = [j % 4 for j in range(n)]
    ev_pd, ev_mixed = evaluate(inst, pd, spread), evaluate(inst, mixed, spread)
    o = min(inst.slots[s].start_seconds(Role.PREFILL, rsw) for s in (4, 5))
    # The old rule: the warm DECODE slots (st 0) decode from 0, o earlier than now.
    fin = ev_pd.slot_finish
    old_pd = ev_pd.objective - ev_pd.makespan + max(*(fin[s] - o for s in range(4)), fin[4], fin[5])
    assert old_pd < ev_mixed.objective < ev_pd.objective  # the old rule preferred the cold pool
    p = plan(snap, config=cfg)
    roles = [p.roles[sl.id] for sl in inst.slots]
    assert Role.DECODE not in roles, roles
    assert p.objective <= ev_mixed.objective + 1e-9
