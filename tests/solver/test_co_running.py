"""The co-running term (phi, ``PlannerConfig.co_running``): a slot's critical trajectory is slowed by the decode
tokens and prefill chunks of the trajectories sharing its slot (continuous batching runs them in the same
forward passes).

Invariants checked:
- a slot's finish is st + max(decode body, max_j (CP_j + phi sum_{k != j} (c D_k + P_k / mu))), hand-computed
  on one MIXED slot;
- phi = 0 gives the batch-1 critical path of earlier versions; a larger phi never lowers an objective;
- the estimated phi is the decode share of the longest critical paths, in [0, 1];
- milp, cpsat and exhaustive agree on the optimum with phi > 0 (the c6 rows price the term exactly);
- the planner spreads short trajectories off the slot of a long tool-bound one when phi > 0 (and need not
  when phi = 0): the term is what balances load that the makespan alone ignores;
- an out-of-range co_running is a one-line user error.
"""

from __future__ import annotations

import dataclasses

import pytest
from factories import make_slot, make_snapshot, make_traj, planner_config

from rollplan.models.errors import UserInputError
from rollplan.models.types import Role
from rollplan.solver import build_instance, plan
from rollplan.solver.core.evaluate import evaluate, evaluate_reference
from rollplan.solver.core.instance import co_running_share


def _one_slot(phi: float | None):
    snap = make_snapshot(
        slots=[make_slot("s0")],
        trajectories=[
            make_traj("long", decode=2000, tool=600.0),
            make_traj("a", decode=3000, prefill=4000.0),
            make_traj("b", decode=1000),
        ],
    )
    return build_instance(snap, planner_config(co_running=phi))


@pytest.mark.parametrize("phi", [0.0, 0.3, 1.0])
def test_slot_finish_is_the_critical_path_plus_the_co_running_term(phi: float) -> None:
    inst = _one_slot(phi)
    assert inst.phi == phi
    sl = inst.slots[0]
    ev = evaluate(inst, [Role.MIXED], [0, 0, 0])
    assert ev == evaluate_reference(inst, [Role.MIXED], [0, 0, 0])
    d = [t.decode for t in inst.trajs]
    e = [t.prefill / sl.mu for t in inst.trajs]
    cps = [inst.critical_path(j, 0) + phi * (sl.c * (sum(d) - d[j]) + sum(e) - e[j]) for j in range(3)]
    body = sl.c * sum(d) + sl.a * max(max(d), sum(inst.occupancy(j, 0) * inst.share(j, 0) for j in range(3))) + sum(e)
    assert cps[0] > body  # the tool-bound trajectory sets the slot's finish in this instance
    assert ev.slot_finish[0] == pytest.approx(sl.start_seconds(Role.MIXED, 0.05) + max(body, *cps), rel=1e-12)


def test_a_larger_phi_never_lowers_the_objective() -> None:
    objs = [evaluate(_one_slot(phi), [Role.MIXED], [0, 0, 0]).objective for phi in (0.0, 0.25, 0.5, 1.0)]
    assert objs == sorted(objs)
    assert objs[0] < objs[-1]


def test_estimated_phi_is_the_decode_share_of_the_longest_paths() -> None:
    inst = _one_slot(None)
    x = inst.arrays
    dec = x.D * (x.a[0] + x.c[0])
    cp = dec + x.W + x.P / x.mu[0]
    assert inst.phi == pytest.approx(float(dec.sum() / cp.sum()))
    assert 0.0 < inst.phi < 1.0
    assert co_running_share(build_instance(make_snapshot(trajectories=[]), planner_config()).arrays) == 0.0


def test_exact_backends_agree_with_phi() -> None:
    snap = make_snapshot(
        slots=[make_slot("s0"), make_slot("s1"), make_slot("s2", role=Role.OFF)],
        trajectories=[
            make_traj("long", decode=3000, tool=300.0),
            *(make_traj(f"t{k}", slot="s0" if k % 2 else "s1", decode=600.0 + 150 * k) for k in range(5)),
        ],
    )
    objs = {}
    for backend in ("exhaustive", "milp", "cpsat"):
        p = plan(snap, config=planner_config(backend=backend, time_limit=20.0, co_running=0.8, relative_gap=0.0))
        objs[backend] = p.objective
    assert objs["milp"] == pytest.approx(objs["exhaustive"], rel=1e-6, abs=1e-6)
    assert objs["cpsat"] == pytest.approx(objs["exhaustive"], rel=1e-3, abs=1e-3)


@pytest.mark.parametrize("backend", ["milp", "greedy"])
def test_phi_moves_short_trajectories_off_the_slot_of_a_long_one(backend: str) -> None:
    # Two warm slots; six short trajectories share the slot of a long tool-bound one, which alone sets the
    # makespan. With phi = 0 staying put is optimal (moving only costs switching); with phi > 0 the short
    # ones' tokens lengthen the long one's path, so they move to the idle slot.
    snap = make_snapshot(
        slots=[make_slot("s0"), make_slot("s1")],
        trajectories=[make_traj("long", decode=2000, tool=900.0),
                      *(make_traj(f"t{k}", slot="s0", decode=1500.0) for k in range(6))],
    )
    cfg = planner_config(backend=backend, time_limit=20.0, relative_gap=0.0)
    shared = {}
    for phi in (0.0, 1.0):
        p = plan(snap, config=dataclasses.replace(cfg, co_running=phi))
        shared[phi] = sum(1 for tid, sid in p.placement.items() if tid != "long" and sid == p.placement["long"])
    assert shared == {0.0: 6, 1.0: 0}


def test_co_running_out_of_range_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match="co_running"):
        planner_config(co_running=1.5)
