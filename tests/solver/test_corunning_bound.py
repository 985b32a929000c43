"""The co-running count bound (``core.bounds``, ``co_running``) and the late-start P:D split of the placement.

Invariants:
- the raw co-running bound (no floor) is at most the exhaustive optimum's least makespan, and its on-time
  version at most the least on-time makespan, with phi > 0 [hypothesis, 120 tiny snapshots, and alike
  trajectories on warm + cold slots where it is the best bound];
- ``most_fed`` (the Lagrangian count with the PREFILL feed) is at least the most any role assignment
  hosts, brute-forced over small slot groups [hypothesis, 150];
- ``corunning_need`` equals the least requirement over every n-subset, brute-forced [hypothesis, 100];
- on a replay-like snapshot (warm and cold slots, alike trajectories) the bound is well above the pooled
  ones and below the plan; on a small one below the MILP-proven optimum [slow].
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from factories import FAST, make_slot, make_snapshot, make_traj, planner_config, tiny_snapshots
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollplan.models.errors import InfeasiblePlanError
from rollplan.models.types import ClusterSnapshot, EngineState, Phase, Role
from rollplan.solver import build_instance, plan
from rollplan.solver.backends import exhaustive
from rollplan.solver.core import bounds

TOL = 1e-7


def _alike(n_warm: int, n_cold: int, n_trajs: int, *, decode: float = 3000.0, tool: float = 40.0) -> ClusterSnapshot:
    """Warm MIXED slots, cold ones (a cold start first), alike pending trajectories (each a new prefill)."""
    slots = [make_slot(f"w{i}") for i in range(n_warm)]
    slots += [make_slot(f"c{i}", role=Role.OFF, engine=EngineState.NONE) for i in range(n_cold)]
    trajs = [
        make_traj(f"t{i}", slot=None, phase=Phase.PREFILL_PENDING, context=0, decode=decode + 10.0 * i,
                  prefill=20000.0, tool=tool)
        for i in range(n_trajs)
    ]
    return make_snapshot(slots, trajs)


def _raw(inst, on_time: bool) -> float:
    return bounds._corunning_bound(inst.arrays, inst.phi, on_time, 0.0)


@settings(FAST, max_examples=120)
@given(tiny_snapshots(max_slots=3, max_trajectories=4), st.sampled_from([0.3, 0.9]))
def test_the_raw_bound_is_below_the_exhaustive_optimum(snap: ClusterSnapshot, phi: float) -> None:
    try:
        inst = build_instance(snap, planner_config(switch_weight=0.0, co_running=phi))
    except InfeasiblePlanError:
        assume(False)
    opt = exhaustive.optimum(inst)
    assert opt is not None and opt.complete
    assert _raw(inst, False) <= opt.min_makespan * (1 + TOL) + TOL
    if math.isfinite(opt.min_makespan_on_time):
        assert _raw(inst, True) <= opt.min_makespan_on_time * (1 + TOL) + TOL


@pytest.mark.parametrize(("warm", "cold", "trajs", "phi"), [(2, 1, 5, 0.5), (2, 1, 5, 0.9), (1, 2, 5, 0.9)])
def test_on_alike_trajectories_it_is_the_best_bound_and_valid(
    monkeypatch: pytest.MonkeyPatch, warm: int, cold: int, trajs: int, phi: float
) -> None:
    monkeypatch.setattr(exhaustive, "MAX_TRAJECTORIES", 6)
    inst = build_instance(_alike(warm, cold, trajs), planner_config(switch_weight=0.0, co_running=phi))
    raw = _raw(inst, False)
    others = {k: v for k, v in bounds.compute_bounds(inst).items() if k != bounds.BOUND_CORUNNING}
    assert raw > max(others.values()) * (1 + 1e-3), others  # the count sets the bound here
    opt = exhaustive.optimum(inst)
    assert opt is not None and opt.complete
    assert raw <= opt.min_makespan * (1 + TOL) + TOL


@st.composite
def _groups(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    g = draw(st.integers(1, 3))
    mixed = np.array([draw(st.integers(0, 4)) for _ in range(g)], dtype=float)
    decode = mixed + np.array([draw(st.integers(0, 3)) for _ in range(g)], dtype=float)
    served = np.array([draw(st.sampled_from([0.0, 50.0, 130.0, 400.0])) for _ in range(g)])
    counts = np.array([draw(st.integers(1, 3)) for _ in range(g)], dtype=float)
    prefill = np.sort(np.array([draw(st.sampled_from([0.0, 20.0, 45.0, 100.0])) for _ in range(draw(st.integers(1, 12)))]))
    return mixed, decode, served, counts, np.concatenate([[0.0], np.cumsum(prefill)])


@settings(FAST, max_examples=150)
@given(_groups())
def test_most_fed_is_at_least_every_role_assignment(groups) -> None:
    mixed, decode, served, counts, least_p = groups
    size = least_p.size - 1
    slots = [s for s, c in enumerate(counts.astype(int).tolist()) for _ in range(c)]
    best = 0.0
    for roles in itertools.product("MDPO", repeat=len(slots)):  # one role per slot: at most 4^9
        on_decode = sum(decode[g] for g, r in zip(slots, roles, strict=True) if r == "D")
        capacity = sum(served[g] for g, r in zip(slots, roles, strict=True) if r == "P")
        fed = int(np.searchsorted(least_p, capacity * (1 + 1e-12), side="right")) - 1  # members whose P fits
        hosted = sum(mixed[g] for g, r in zip(slots, roles, strict=True) if r == "M")
        best = max(best, hosted + min(on_decode, fed, size))
    assert bounds.most_fed(mixed, decode, served, counts, least_p) >= best - 1e-9


@settings(FAST, max_examples=100)
@given(st.lists(st.tuples(st.sampled_from([5.0, 9.0, 20.0]), st.sampled_from([0.5, 1.0, 3.0]),
                          st.sampled_from([1.0, 2.0, 4.0])), min_size=1, max_size=6),
       st.sampled_from([0.0, 0.4, 1.0]))
def test_the_need_is_the_least_over_every_subset(items: list[tuple[float, float, float]], phi: float) -> None:
    cp, u, b = (np.array(col) for col in zip(*items, strict=True))
    by_u = np.argsort(u, kind="stable")
    need = bounds.corunning_need(cp[by_u], u[by_u], np.sort(b), phi)
    for n in range(1, len(items) + 1):
        least = min(
            max(max(cp[j] + phi * (u[list(sub)].sum() - u[j]) for j in sub), b[list(sub)].sum())
            for sub in itertools.combinations(range(len(items)), n)
        )
        # The need splits the path and the body minimisation: at most the least over the subsets.
        assert need[n - 1] <= least + 1e-9
        paths = min(min(cp[j] + phi * (u[list(sub)].sum() - u[j]) for j in sub)
                    for sub in itertools.combinations(range(len(items)), n))
        bodies = min(b[list(sub)].sum() for sub in itertools.combinations(range(len(items)), n))
        assert need[n - 1] >= max(paths, bodies) - 1e-9


def _replay_like() -> ClusterSnapshot:
    slots = [make_slot(f"w{i}") for i in range(9)]
    slots += [make_slot(f"c{i}", role=Role.OFF, engine=EngineState.NONE) for i in range(7)]
    trajs = [make_traj(f"t{i}", slot=None, phase=Phase.PREFILL_PENDING, context=0, decode=3800.0, prefill=30000.0,
                       tool=80.0) for i in range(256)]
    return make_snapshot(slots, trajs)


def test_a_replay_like_snapshot_is_bounded_by_the_count() -> None:
    cfg = planner_config(backend="milp", time_limit=1.0)
    p = plan(_replay_like(), config=cfg)
    pooled = max(v for k, v in p.bounds.items() if k not in (bounds.BOUND_CORUNNING, bounds.BOUND_LP))
    assert p.bounds[bounds.BOUND_CORUNNING] > pooled * 1.1, p.bounds  # measured 180.8 against 150.8
    assert p.bounds[bounds.BOUND_CORUNNING] <= p.makespan * (1 + TOL)
    assert p.gap <= 0.06, (p.makespan, p.bounds)  # measured 5.1%


@pytest.mark.slow
def test_the_bound_is_below_the_milp_proven_optimum() -> None:
    snap = _alike(2, 1, 10)
    cfg = planner_config(backend="milp", switch_weight=0.0, relative_gap=0.0, time_limit=30.0, deterministic=False,
                         co_running=0.5)
    inst = build_instance(snap, cfg)
    raw = _raw(inst, False)
    p = plan(snap, config=cfg)
    assert p.status.value == "optimal"
    assert raw <= p.makespan * (1 + TOL) + TOL
