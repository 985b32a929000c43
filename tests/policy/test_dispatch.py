"""The decision core's dispatch order and admission (``rollplan.policy.dispatch``).

Invariants (hypothesis, brute force over the candidates):
- ``choose_slot`` returns a slot that admits the trajectory under the headroom its regime and the slot's
  role give; no admitting slot has fewer residents, or as many and more free KV; None only when no slot
  admits; the preferred slot is returned whenever it admits and the trajectory's prediction is informed (an
  uninformed one goes to the best admitting slot, the plan's slot only as one of the candidates);
- an empty slot with room for the trajectory and the watermark always admits it, whatever the headroom;
- ``DispatchQueue`` yields the longest path first, first-queued first among equals, re-keys on a second push
  and forgets discarded keys; whatever the pushes (the same path again included) and discards, ``order()``
  yields every live key exactly once;
- ``bulk_regime_pays`` is monotone in the work bound (more bulk work never turns a bulk-bound batch back into a
  critical-path-bound one), picks the regime whose ``regime_makespan`` is the smaller, and says "critical
  path" with no bulk work left and "bulk" with far more work than the path; ``occupancy_step``'s decode rate
  grows with the occupancy (what makes a headroom cost the bulk decode rate).
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.perf import perf_model
from rollplan.policy.dispatch import (
    DispatchQueue,
    Headrooms,
    SlotLoad,
    admits,
    bulk_regime_pays,
    choose_slot,
    critical_set,
    occupancy_step,
    pessimistic_parts,
    pessimistic_path,
    regime_makespan,
    required_room,
)

PERFS = {"roofline": perf_model("h800", "qwen3-8b"), "calibrated": perf_model("h800", "qwen3-8b", calibrated=True)}


@st.composite
def slot_loads(draw, key: int) -> SlotLoad:
    cap = draw(st.integers(1_000, 100_000))
    free = draw(st.integers(0, cap))
    return SlotLoad(key, cap, free, draw(st.integers(0, cap // 50)), draw(st.integers(0, 40)),
                    draw(st.integers(0, 2_000)), draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(*(slot_loads(i) for i in range(n)))),
       st.integers(1, 60_000), st.booleans(), st.booleans(), st.one_of(st.none(), st.integers(0, 7)),
       st.sampled_from([Headrooms(), Headrooms(0.0), Headrooms(0.5, 0.2, 0.95)]), st.booleans())
def test_choose_slot_is_the_best_admitting_slot(cands, need, critical, bulk, pref_i, hr, informed) -> None:
    pref = cands[pref_i] if pref_i is not None and pref_i < len(cands) else None
    got = choose_slot(need, cands, preferred=pref, critical=critical, bulk_bound=bulk, headrooms=hr,
                      informed=informed)
    hi, lo = hr.levels(bulk)

    def h(s: SlotLoad) -> float:
        return hi if (critical or s.hosts_critical) else lo

    ok = [s for s in cands if admits(s, need, h(s))]
    if informed and pref is not None and admits(pref, need, h(pref)):
        assert got == pref.key
        return
    if not ok:
        assert got is None
        return
    best = min(ok, key=lambda s: (s.residents, -s.kv_free, s.key))
    chosen = next(s for s in cands if s.key == got)
    assert chosen in ok and (chosen.residents, chosen.kv_free) == (best.residents, best.kv_free)


@given(st.integers(1, 100_000), st.floats(0, 1), st.data())
def test_an_empty_slot_that_fits_always_admits(cap, headroom, data) -> None:
    wm = data.draw(st.integers(0, cap))
    need = data.draw(st.integers(0, cap - wm))
    empty = SlotLoad("s", cap, cap, wm, 0)
    assert admits(empty, need, headroom)
    assert required_room(headroom, cap, wm, need) <= max(0, cap - wm - need)


def test_queue_orders_longest_first_then_fifo_rekeys_and_discards() -> None:
    q: DispatchQueue[str] = DispatchQueue()
    for k, v in (("a", 5.0), ("b", 9.0), ("c", 5.0), ("d", 1.0)):
        q.push(k, v)
    assert list(q.order()) == ["b", "a", "c", "d"]
    q.push("d", 10.0)  # re-keyed: keeps its place among equals, moves by its new path
    q.discard("b")
    assert list(q.order()) == ["d", "a", "c"] and len(q) == 3 and "b" not in q


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([1.0, 2.0, 3.0]), st.booleans()), max_size=30))
def test_queue_yields_every_live_key_once(ops: list[tuple[str, float, bool]]) -> None:
    q: DispatchQueue[str] = DispatchQueue()
    live: dict[str, float] = {}
    for key, path, drop in ops:
        if drop:
            q.discard(key)
            live.pop(key, None)
        else:
            q.push(key, path)
            live[key] = path
    got = list(q.order())
    assert sorted(got) == sorted(live) and len(q) == len(live)
    assert [live[k] for k in got] == sorted(live.values(), reverse=True)
    assert list(q.order()) == got  # order() does not consume


def test_paths_and_critical_set() -> None:
    assert pessimistic_path(100, 10, 5, 1, 0.02, z=2.0) == 100 * 0.02 + 5 + 2.0 * (10 * 0.02 + 1)
    assert critical_set({"a": 10.0, "b": 8.4, "c": 8.6}, 0.85) == {"a", "c"}
    assert critical_set({}) == set()


def test_pessimistic_parts_sum_to_the_path() -> None:
    dec_s, tool_s = pessimistic_parts(100, 10, 5, 1, 0.02, z=2.0)
    assert dec_s == pytest.approx((100 + 2.0 * 10) * 0.02) and tool_s == pytest.approx(5 + 2.0 * 1)
    assert dec_s + tool_s == pytest.approx(pessimistic_path(100, 10, 5, 1, 0.02, z=2.0))


@pytest.mark.parametrize("kind", sorted(PERFS))
def test_decode_rate_grows_with_occupancy(kind: str) -> None:
    perf = PERFS[kind]
    steps = [occupancy_step(perf, u) for u in (0.1, 0.3, 0.5, 0.7, 1.0)]
    assert all(a[1] < b[1] for a, b in pairwise(steps))  # tokens/s
    assert all(a[0] <= b[0] for a, b in pairwise(steps))  # step seconds
    # A headroom costs less than its share of the rate: a step reads the weights once for every sequence.
    assert steps[3][1] / steps[-1][1] > 0.7


@pytest.mark.parametrize("kind", sorted(PERFS))
def test_regime_extremes(kind: str) -> None:
    perf = PERFS[kind]
    kw = dict(perf=perf, slots=16, critical=4, headrooms=Headrooms())
    # No bulk left: only the longest path counts, and the critical headroom makes its steps faster.
    assert not bulk_regime_pays(0.0, 600.0, 60.0, **kw)
    assert regime_makespan(False, 0.0, 600.0, 60.0, **kw) < regime_makespan(True, 0.0, 600.0, 60.0, **kw)
    # Far more bulk work than the path: the bulk's decode rate decides.
    assert bulk_regime_pays(10_000.0, 600.0, 60.0, **kw)
    # As many critical trajectories as slots: the critical regime would hold every slot at its headroom.
    assert bulk_regime_pays(500.0, 600.0, 60.0, perf=perf, slots=16, critical=16, headrooms=Headrooms())
    # No headroom rule: the regime changes nothing.
    assert not bulk_regime_pays(10_000.0, 600.0, 60.0, perf=perf, slots=16, critical=4, headrooms=Headrooms(0.0))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(PERFS)), st.floats(0, 5_000), st.floats(0, 5_000), st.floats(0, 2_000),
       st.floats(0, 500), st.integers(1, 64), st.integers(0, 80))
def test_regime_is_the_shorter_makespan_and_monotone_in_work(kind, w1, w2, dec_s, tool_s, slots, critical) -> None:
    perf = PERFS[kind]
    kw = dict(perf=perf, slots=slots, critical=critical, headrooms=Headrooms())
    lo, hi = sorted((w1, w2))
    got = bulk_regime_pays(lo, dec_s, tool_s, **kw)
    assert got == (regime_makespan(True, lo, dec_s, tool_s, **kw) <= regime_makespan(False, lo, dec_s, tool_s, **kw))
    if got:
        assert bulk_regime_pays(hi, dec_s, tool_s, **kw)
