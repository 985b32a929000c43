"""The length packing's pruning and record (``search.disaggregate``), the greedy's packing candidate
(``search.placement``) and the wide polish's head-room targets and partner pruning (``search.local``).

Invariants:
- ``_pack_at`` with its cheap pre-test packs exactly what the plain next fit with head fills (every
  candidate slot priced with ``finish_with``) packs, at targets below, near and above what packs;
- the head fill (``PACK_FILL``) lowers the bisected packing's makespan on work-bound snapshots whose long
  slots have unfilled heads (a measured regression check over seeds, not an invariant);
- ``pack_decreasing`` on roles packed before starts from the record: never worse than the first packing,
  the same answer twice, and a state that prices as ``state_of`` of its placement;
- ``_swap_reach`` never prunes a partner length that could fit (brute force over a grid);
- the wide polish prunes only: with ``_swap_reach`` disabled it makes the same moves (same placement);
- ``_head_room`` returns, per role, the slots finishing before ``cur`` with the most unfilled head
  (brute force).
"""

from __future__ import annotations

import math
import random

import pytest
from factories import greedy_state, planner_config

from rollplan.models.types import Role
from rollplan.solver import build_instance, plan
from rollplan.solver.core.bounds import compute_bounds
from rollplan.solver.core.tables import Tables
from rollplan.solver.families import family_snapshot
from rollplan.solver.search import disaggregate, local
from rollplan.solver.search.state import SlotState, state_of


def _plain_next_fit(prep: Tables, roles, order, slots, target: float) -> SlotState | None:
    """``_pack_at`` before its pre-test: every candidate slot priced (the specification)."""
    state = SlotState(prep, roles)
    cap = [min(target, prep.deadline[s]) for s in slots]
    cur = 0
    for n, j in enumerate(order):
        if state.where[j] >= 0:
            continue  # placed early by a head fill
        placed = False
        i = max(0, cur - disaggregate.PACK_LOOKBACK)
        while i < len(slots):
            s = slots[i]
            if prep.fits[prep.ptype[s]][j] and state.finish_with(j, s) <= cap[i]:
                state.add(j, s)
                placed = True
                break
            if i == cur and state.members[s]:
                # closing s: the shortest left join it while it has unfilled head and they fit
                for f in reversed(order[n + 1:]):
                    if state.where[f] >= 0:
                        continue
                    if state.max_d[s] <= state.occ[s] or not prep.fits[prep.ptype[s]][f]:
                        break
                    if state.finish_with(f, s) > cap[i]:
                        break
                    state.add(f, s)
                cur += 1
            i += 1
        if not placed:
            return None
    return state


@pytest.mark.parametrize("family", ["work-bound", "heterogeneous", "deadlines", "long-tail"])
def test_pack_pretest_packs_what_plain_next_fit_packs(family: str) -> None:
    inst = build_instance(family_snapshot(family, 8, 128, seed=4), planner_config())
    prep = Tables(inst)
    roles = [Role.MIXED] * len(inst.slots)
    k = max(set(prep.ptype), key=prep.ptype.count)
    order = sorted(range(len(prep.D)), key=lambda j: (-prep.cp[k][j], -prep.D[j]))
    slots = sorted(range(len(roles)), key=lambda s: (prep.start(s, roles[s]), s))
    ref = _plain_next_fit(prep, roles, order, slots, math.inf)
    assert ref is not None
    top = max(ref.finish)
    packed = 0
    for frac in (0.6, 0.8, 0.9, 0.95, 1.0, 1.05, 1.2):
        want = _plain_next_fit(prep, roles, order, slots, frac * top)
        got, done = disaggregate._pack_at(prep, roles, order, slots, frac * top, math.inf, lambda: 0.0)
        assert done
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            packed += 1
            assert got.where == want.where
            assert got.finish == want.finish
    assert packed >= 2  # the targets reach both sides


def test_head_fill_lowers_the_packing_on_work_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    gains = []
    for seed in range(4):
        inst = build_instance(family_snapshot("work-bound", 16, 256, seed=seed), planner_config())
        roles = [Role.MIXED] * len(inst.slots)
        lo = max(compute_bounds(inst).values())
        made = {}
        for fill in (False, True):
            monkeypatch.setattr(disaggregate, "PACK_FILL", fill)
            st = disaggregate.pack_decreasing(Tables(inst), roles, lo=lo, hi=3.0 * lo, until=math.inf,
                                              clock=lambda: 0.0)
            assert st is not None
            made[fill] = max(st.finish)
            inst = build_instance(family_snapshot("work-bound", 16, 256, seed=seed), planner_config())  # no record
        gains.append(made[False] / made[True] - 1.0)
    assert min(gains) >= -1e-3  # never measurably worse
    assert max(gains) > 2e-3  # and it pays where long slots have head room


def test_pack_record_reuses_earlier_rounds() -> None:
    inst = build_instance(family_snapshot("heterogeneous", 8, 128, seed=2), planner_config())
    roles = [Role.MIXED] * len(inst.slots)
    lo, hi = max(compute_bounds(inst).values()), 1e4
    first = disaggregate.pack_decreasing(Tables(inst), roles, lo=lo, hi=hi, until=math.inf, clock=lambda: 0.0,
                                         rounds=4, grow=0.01)
    assert first is not None
    record = disaggregate._pack_record(Tables(inst), roles)
    assert len(record) == 4
    again: list[SlotState] = []
    for n in (0, 3):
        st = disaggregate.pack_decreasing(Tables(inst), roles, lo=lo, hi=hi, until=math.inf, clock=lambda: 0.0,
                                          rounds=n)
        assert st is not None
        again.append(st)
    assert max(again[0].finish) == pytest.approx(max(first.finish), rel=1e-12)  # no round: the one recorded
    assert max(again[1].finish) <= max(first.finish) * (1 + 1e-12)
    assert len(record) == 7
    prep = Tables(inst)
    for st in again:
        ref = state_of(prep, roles, st.where)
        assert st.finish == pytest.approx(ref.finish, rel=1e-12, abs=1e-9)


def test_swap_reach_never_prunes_a_fitting_length() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        a, c, rest = rng.uniform(0.0, 0.02), rng.choice([0.0, rng.uniform(1e-4, 3e-3)]), rng.uniform(0.0, 5000.0)
        room = rng.uniform(-5.0, 120.0)
        reach = local._swap_reach(room, a, c, rest)
        for d in (rng.uniform(0.0, 8000.0) for _ in range(20)):
            if c * d + a * max(d, rest) < room:
                assert d <= reach


@pytest.mark.parametrize(("family", "seed"), [("work-bound", 1), ("heterogeneous", 3)])
def test_wide_polish_prunes_only(family: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = family_snapshot(family, 8, 128, seed=seed)
    inst = build_instance(snap, planner_config())
    p = plan(snap, config=planner_config(backend="greedy"))
    ids = {s.id: i for i, s in enumerate(inst.slots)}
    roles = [p.roles[s.id] for s in inst.slots]
    where = [ids[p.placement[t.id]] for t in inst.trajs]
    out = []
    for prune in (True, False):
        if not prune:
            monkeypatch.setattr(local, "_swap_reach", lambda *args: math.inf)
        state = state_of(Tables(inst), roles, where)
        moves = local.repair(state, until=None, clock=lambda: 0.0, max_moves=256, wide=True)
        out.append((moves, list(state.where)))
    assert out[0] == out[1]
    assert out[0][0] > 0


def test_head_room_picks_the_largest_unfilled_heads() -> None:
    _, state = greedy_state("work-bound", 12, 192, seed=5)
    hosts = [s for s, r in enumerate(state.roles) if r.decodes]
    by_role: dict[Role, list[int]] = {}
    for s in hosts:
        by_role.setdefault(state.roles[s], []).append(s)
    cur = sorted(state.finish[s] for s in hosts)[len(hosts) // 2]
    taken = hosts[:2]
    got = local._head_room(state, by_role, cur, 3, taken)
    a = state.prep.a
    for lst in by_role.values():
        cands = [t for t in lst if state.finish[t] < cur and t not in taken and state.max_d[t] > state.occ[t]]
        heads = sorted((a[t] * (state.max_d[t] - state.occ[t]) for t in cands), reverse=True)[:3]
        mine = sorted((a[t] * (state.max_d[t] - state.occ[t]) for t in got if t in lst), reverse=True)
        assert mine == heads
