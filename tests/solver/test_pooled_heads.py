"""The pooled heads of ``work_head`` (``core.bounds``) and the wide swaps of ``repair`` (``search.local``).

Invariants:
- ``work_head`` (with its pooled-heads inequality) is at most the optimum the exact MILP proves, on small
  work-bound family instances where the pooled term raises it (3-4 slots x 12 trajectories; the exhaustive
  oracle's 6 trajectories never make the fill pool scarce) [slow: each exact solve takes seconds];
- ``SlotState.exchanges`` prices a swap's side as removing and adding the two trajectories does;
- the wide-swap repair never makes the makespan worse.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from factories import greedy_state, planner_config

from rollplan.solver import build_instance, plan
from rollplan.solver.core import bounds
from rollplan.solver.core.tables import Tables
from rollplan.solver.families import family_snapshot
from rollplan.solver.search.local import repair
from rollplan.solver.search.state import state_of


def _without_pool(inst, *, nesting: bool = True) -> float:
    saved, saved_nested = bounds._PoolFill.most, bounds.nested_hosts
    try:
        bounds._PoolFill.most = lambda self, b: np.full(np.shape(b), np.inf)  # type: ignore[method-assign]
        if not nesting:  # the nested host counts (test_nested_hosts) subsume the pool on many instances
            bounds.nested_hosts = lambda pieces, need, level, scale, grid: np.zeros(level.size)  # type: ignore[assignment]
        return bounds._work_head_bound(inst.arrays, False, bounds._floor(inst, False))
    finally:
        bounds._PoolFill.most = saved  # type: ignore[method-assign]
        bounds.nested_hosts = saved_nested


@pytest.mark.slow
@pytest.mark.parametrize(("slots", "trajs", "seed"), [(3, 12, 25), (4, 12, 23), (4, 12, 29)])
def test_pooled_head_bound_is_below_the_proven_optimum(slots: int, trajs: int, seed: int) -> None:
    snap = family_snapshot("work-bound", slots, trajs, seed=seed)
    cfg = planner_config(backend="milp", switch_weight=0.0, relative_gap=0.0, time_limit=30.0, deterministic=False)
    inst = build_instance(snap, cfg)
    pooled = bounds._work_head_bound(inst.arrays, False, bounds._floor(inst, False))
    assert pooled > _without_pool(inst, nesting=False) + 1e-9  # the pooled term sets the bound without nesting
    p = plan(snap, config=cfg)
    assert p.status.value == "optimal"
    assert pooled <= p.makespan * (1 + 1e-7) + 1e-7


def test_pooled_heads_raise_the_work_head_bound_at_scale() -> None:
    # (The nested host counts subsume the pool on most family instances; here it still adds.)
    inst = build_instance(family_snapshot("work-bound", 4, 64, seed=3), planner_config())
    assert bounds.work_head_bound(inst) > _without_pool(inst) + 1e-3


def test_exchanges_price_a_swap_like_remove_and_add() -> None:
    snap = family_snapshot("heterogeneous", 6, 96, seed=3)
    inst = build_instance(snap, planner_config())
    p = plan(snap, config=planner_config(backend="greedy"))
    ids = {s.id: i for i, s in enumerate(inst.slots)}
    roles = [p.roles[s.id] for s in inst.slots]
    state = state_of(Tables(inst), roles, [ids[p.placement[t.id]] for t in inst.trajs])
    rng = random.Random(0)
    hosts = [s for s in range(len(roles)) if state.members[s]]
    for _ in range(200):
        s, t = rng.sample(hosts, 2)
        j, i = rng.choice(state.members[s]), rng.choice(state.members[t])
        priced = state.exchanges(s)(j, i), state.exchanges(t)(i, j)
        state.remove(j)
        state.remove(i)
        state.add(i, s)
        state.add(j, t)
        assert priced == pytest.approx((state.finish[s], state.finish[t]), rel=1e-12, abs=1e-9)


def test_wide_repair_never_worsens_the_makespan() -> None:
    _, state = greedy_state("work-bound", 8, 128, seed=1)
    before = state.price().makespan
    repair(state, until=None, clock=lambda: 0.0, max_moves=256, wide=True)
    assert state.price().makespan <= before * (1 + 1e-12)
