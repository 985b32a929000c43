"""The decision core's dispatch order and admission (``rollplan.policy.dispatch``).

Invariants (hypothesis, brute force over the candidates):
- ``choose_slot`` returns a slot that admits the trajectory under the headroom its regime and the slot's
  role give; no admitting slot has fewer residents, or as many and more free KV; None only when no slot
  admits; the preferred slot is returned whenever it admits and the trajectory's prediction is informed (an
  uninformed one goes to the best admitting slot, the plan's slot only as one of the candidates);
- an empty slot with room for the trajectory and the watermark always admits it, whatever the headroom;
- ``DispatchQueue`` yields the longest path first, first-queued first among equals, re-keys on a second push
  and forgets discarded keys; whatever the pushes (the same path again included) and discards, ``order()``
  yields every live key exactly once.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.policy.dispatch import (
    DispatchQueue,
    Headrooms,
    SlotLoad,
    admits,
    choose_slot,
    critical_set,
    pessimistic_path,
    required_room,
)


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
