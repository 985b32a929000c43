"""The nested host counts of the head bounds (``core.bounds.nested_hosts``) and the packing by own time.

Invariants:
- with the nested hosts, every bound ``compute_bounds`` reports is at most the exhaustive optimum (the
  deadline-aware ones at most the least on-time makespan), on family instances where the nested count is
  what raises the bound (found by a scan of 2-4 slots x 5-12 trajectories: 0 violations on 353 instances);
- the nested count on a coarse grid is at most the count on every k (it only under-counts layers);
- the packing (``search.disaggregate.pack_decreasing``) returns a decision whose slots all meet the target.
"""

from __future__ import annotations

import numpy as np
import pytest
from factories import planner_config

from rollplan.models.types import Role
from rollplan.solver import build_instance
from rollplan.solver.backends import exhaustive
from rollplan.solver.core import bounds
from rollplan.solver.core.tables import Tables
from rollplan.solver.families import family_snapshot
from rollplan.solver.search.disaggregate import pack_decreasing

TOL = 1e-7


def _heads_without_nesting(inst, on_time: bool) -> float:
    saved = bounds.nested_hosts
    try:
        bounds.nested_hosts = lambda pieces, need, level, scale, grid: np.zeros(level.size)  # type: ignore[assignment]
        x = inst.arrays
        return max(bounds._work_head_bound(x, on_time, 0.0), bounds._path_head_bound(x, inst.phi, on_time, 0.0))
    finally:
        bounds.nested_hosts = saved


@pytest.mark.parametrize(
    ("family", "slots", "trajs", "seed", "on_time"),
    [
        ("work-bound", 2, 5, 6, False),
        ("heterogeneous", 3, 6, 7, False),
        ("deadlines", 2, 5, 22, True),
        ("deadlines", 3, 6, 6, True),
        ("long-tail", 2, 5, 4, False),
        ("work-bound", 2, 8, 24, True),
    ],
)
def test_nested_hosts_raise_the_head_bounds_below_the_exhaustive_optimum(
    monkeypatch: pytest.MonkeyPatch, family: str, slots: int, trajs: int, seed: int, on_time: bool
) -> None:
    monkeypatch.setattr(exhaustive, "MAX_TRAJECTORIES", 8)  # 2 slots x 8: 4,096 decisions, a fraction of a second
    inst = build_instance(family_snapshot(family, slots, trajs, seed=seed), planner_config(switch_weight=0.0))
    x = inst.arrays
    nested = max(bounds._work_head_bound(x, on_time, 0.0), bounds._path_head_bound(x, inst.phi, on_time, 0.0))
    assert nested > _heads_without_nesting(inst, on_time) * (1 + 1e-4)  # the nested count sets the bound here
    opt = exhaustive.optimum(inst)
    assert opt is not None and opt.complete
    ref = opt.min_makespan_on_time if on_time else opt.min_makespan
    assert nested <= ref * (1 + TOL) + TOL
    for name, value in bounds.compute_bounds(inst, on_time=on_time).items():
        assert value <= ref * (1 + TOL) + TOL, name


def test_a_coarse_grid_only_under_counts() -> None:
    rng = np.random.default_rng(0)
    level = np.sort(rng.uniform(1.0, 50.0, 500))[::-1]
    need = {alpha: np.cumsum(rng.uniform(0.5, 3.0, 500)) for alpha in bounds.HEAD_ALPHAS}
    pieces = bounds.window_pieces(np.array([200.0] * 30 + [120.0] * 20))
    fine = bounds.nested_hosts(pieces, need, level, 0.5, np.arange(level.size))
    coarse = bounds.nested_hosts(pieces, need, level, 0.5, bounds._nested_grid(level.size))
    assert fine is not None and coarse is not None
    assert (coarse <= fine + 1e-12).all() and (np.diff(coarse) >= 0).all()
    assert bounds.nested_hosts(bounds.window_pieces(np.array([10.0])), need, level, 0.5, np.arange(500)) is None


def test_packing_by_own_time_meets_its_target() -> None:
    inst = build_instance(family_snapshot("deadlines", 8, 128, seed=2), planner_config())
    prep = Tables(inst)
    roles = [Role.MIXED] * len(inst.slots)
    lo = bounds.critical_path_bound(inst)
    state = pack_decreasing(prep, roles, lo=lo, hi=3.0 * lo, until=float("inf"), clock=lambda: 0.0)
    assert state is not None and all(s >= 0 for s in state.where)
    assert all(f <= min(3.0 * lo, prep.deadline[s]) + 1e-9 for s, f in enumerate(state.finish))
