"""Home exchanges (``search.exchange``): a trajectory away from home trades places with a guest of its home.

Invariants (hypothesis over random placements of bench-family instances, and every family):
- ``_exchanged`` (vectorised) prices a trade exactly as ``SlotState.exchanges`` (the scalar price) does;
- ``home_exchanges`` never makes a slot end later (so neither the makespan nor the sum of the finishes
  rises), never adds a move
  (each trade sends one trajectory home), keeps every trajectory on a hosting slot of a type it fits, and
  leaves a state that prices as ``state_of`` of its placement;
- on packed work-bound snapshots (every trajectory mid-flight, the packing moving nearly all of them) it
  takes trades (6-13 of 256 at seeds 0-3: the packing leaves most slots at their cap, where few trades
  lower both slots): fewer moves and a lower objective at no higher makespan (a measured regression check).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from factories import planner_config
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.types import Role
from rollplan.solver import build_instance
from rollplan.solver.core.bounds import compute_bounds
from rollplan.solver.core.tables import Tables
from rollplan.solver.families import FAMILIES, family_snapshot
from rollplan.solver.search import disaggregate, exchange
from rollplan.solver.search.state import SlotState, state_of


def _moves(state: SlotState) -> int:
    p = state.prep
    return sum(1 for j, h in enumerate(p.home) if h >= 0 and h != state.where[j])


def _random_state(family: str, seed: int, slots: int = 8, trajectories: int = 96) -> SlotState:
    inst = build_instance(family_snapshot(family, slots, trajectories, seed=seed), planner_config())
    prep = Tables(inst)
    roles = [Role.MIXED if sl.current_role is not Role.OFF else Role.OFF for sl in inst.slots]
    hosting = [s for s, r in enumerate(roles) if r.decodes]
    rng = np.random.default_rng(seed)
    where = []
    for j in range(len(prep.D)):
        ok = [s for s in hosting if prep.fits[prep.ptype[s]][j]]
        where.append(int(rng.choice(ok)))
    return state_of(prep, roles, where)


HARD_FAMILIES = st.sampled_from([f for f in FAMILIES if f != "example"])
SEEDS = st.integers(0, 10_000)


@settings(max_examples=25, deadline=None)
@given(family=HARD_FAMILIES, seed=SEEDS)
def test_vectorised_price_is_the_scalar_price(family: str, seed: int) -> None:
    state = _random_state(family, seed)
    p = state.prep
    n = len(p.D)
    rng = np.random.default_rng(seed + 1)
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, n, size=(40, 2)) if state.where[a] != state.where[b]]
    if not pairs:
        return
    out = np.array([a for a, _ in pairs])
    into = np.array([b for _, b in pairs])
    slot = np.array([state.where[a] for a in out])
    lead = exchange._leaders(state, np.unique(slot))
    got = exchange._exchanged(
        state, slot, out, into, np.asarray(p.a), np.asarray(p.c), np.asarray(p.phic), np.asarray(state.mixed), lead
    )
    for g, s, a, b in zip(got.tolist(), slot.tolist(), out.tolist(), into.tolist(), strict=True):
        assert g == pytest.approx(state.exchanges(s)(a, b), rel=1e-12, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(family=HARD_FAMILIES, seed=SEEDS)
def test_exchanges_never_raise_the_makespan_nor_add_moves(family: str, seed: int) -> None:
    state = _random_state(family, seed)
    before = list(state.finish)
    ms, total, moves = max(before), sum(before), _moves(state)
    trades = exchange.home_exchanges(state)
    for s, f in enumerate(state.finish):
        assert f <= before[s] + 1e-9 * (1 + before[s])
    assert max(state.finish) <= ms + 1e-9 * (1 + ms)
    assert sum(state.finish) <= total + 1e-9 * (1 + total)
    assert _moves(state) <= moves
    assert moves - _moves(state) >= trades  # every trade sends j home; its partner may go home too
    p = state.prep
    for j, s in enumerate(state.where):
        assert state.hosts[s] and p.fits[p.ptype[s]][j]
    fresh = state_of(p, state.roles, state.where)
    assert fresh.finish == pytest.approx(state.finish, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exchanges_save_moves_on_packed_work_bound(seed: int) -> None:
    inst = build_instance(family_snapshot("work-bound", 16, 256, seed=seed), planner_config())
    roles = [Role.MIXED] * len(inst.slots)
    lo = max(compute_bounds(inst).values())
    state = disaggregate.pack_decreasing(Tables(inst), roles, lo=lo, hi=3.0 * lo, until=math.inf, clock=lambda: 0.0)
    assert state is not None
    before = state.price()
    moves = _moves(state)
    assert moves > 0.8 * len(inst.trajs)  # the packing moves nearly every trajectory
    trades = exchange.home_exchanges(state)
    after = state.price()
    assert trades >= 5
    assert _moves(state) <= moves - trades
    assert after.makespan <= before.makespan + 1e-9
    assert after.objective < before.objective - 1e-3
