"""The simulator's components on their own (``rollplan.sim.engine.Simulator`` composes them).

Invariants checked:
- Handlers and component methods *return* the events they cause and queue nothing themselves (the event queue
  is untouched until the coordinator's loop pushes them): ``Lifecycle.try_start`` / ``on_seg_done`` /
  ``on_tool_done``, ``Batching.add`` / ``reschedule``.
- ``Batching``: a slot's ``n_run`` and ``kv_sum`` are those of its members in RUN; ``tau`` is ``inf`` exactly
  when nothing runs; the SEG_DONE it returns carries the slot's current ``version`` and fires at ``sched_t``, the
  analytic finish ``t_ref + (V0 + D - V) * tau`` of its first member; a join that slows the batch returns no new
  event (the armed one fires early and re-checks).
- ``KvMemory`` (hypothesis, random reserve / release / tool sequences over shared-prompt groups): ``kv_free ==
  kv_cap - reserved``, ``n_res == len(residents)``, ``reserved`` is the residents' own reservations plus each
  resident group's prompt once, and the incremental ``idle`` equals the scan ``idle_kv``.
- Each component's state is its own: the coordinator's properties (``trajs``, ``slots``, ``live``,
  ``n_pending``, ``batch_left``, ``slot_epoch``) are views of the owning component's attributes.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.perf import default_provider
from rollplan.models.types import EngineState, Role, Slot, SlotSource
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj, Simulator
from rollplan.sim.events import EvKind
from rollplan.sim.policies import make_policy
from rollplan.sim.state import DONE, RUN, TOOL, WAIT

_PERF: dict[tuple[str, int], FastPerf] = {}


def _perf_for(gpu: str, tp: int) -> FastPerf:
    if (gpu, tp) not in _PERF:
        cfg = SimConfig()
        _PERF[gpu, tp] = FastPerf(default_provider("qwen3-8b")(gpu, tp), cfg.prefill_chunk, 40960, cfg.mem_util)
    return _PERF[gpu, tp]


class _OneBatchDriver:
    """A driver of one batch that stops the replay when it is done."""

    def start(self, sim):
        return []

    def on_event(self, sim, ev):
        return []

    def on_batch_done(self, sim):
        sim.stop()
        return []

    def lending_event(self, index):
        raise IndexError(index)


def _sim(specs: list[SimTraj]) -> Simulator:
    """A simulator with one warm dedicated MIXED slot and ``specs`` as its batch, set up without the main loop."""
    sim = Simulator(model="qwen3-8b", perf_for=_perf_for, policy=make_policy("static-colocated"),
                    driver=_OneBatchDriver(),
                    dedicated=(Slot("a/g0", "h800", "a", source=SlotSource.DEDICATED, engine=EngineState.WARM),))
    assert sim.fleet.start() == []
    sim.policy.attach(sim)
    sim.fleet.set_role(0, Role.MIXED)
    sim.lifecycle.start_batch(0, specs, [s.group for s in specs])
    sim.out.clear()
    return sim


def test_a_trajectory_through_its_handlers_returns_each_event_it_causes() -> None:
    # Turn 0 decodes 100 tokens then waits 50 s on a tool (longer than the fold: the segment ends there);
    # turn 1 prefills 10 and decodes 40.
    sim = _sim([SimTraj("t0", "g0", 500, (0, 10), (100, 40), (50.0, 0.0))])
    life, s = sim.lifecycle, sim.slots[0]
    j = life.trajs[0]
    assert sim.trajs is life.trajs and sim.slots is sim.fleet.slots and sim.live is sim.fleet.live
    assert sim.n_pending == sim.queue.n_pending == 1 and sim.batch_left == life.batch_left == 1
    sim.queue.dequeue(j)
    j.state = WAIT
    (ev,) = life.try_start(j, s)
    assert len(sim.q) == 0  # returned, not queued
    assert ev.kind == EvKind.SEG_DONE and (ev.a, ev.b) == (s.idx, s.version) and ev.time == s.sched_t
    assert j.state == RUN and s.n_run == 1 and s.kv_sum == j.seg_kv
    assert math.isclose(ev.time, s.t_ref + (j.seg_V0 + j.seg_run - s.V) * s.tau)
    assert j.seg_D == 100 and j.seg_m == 0

    sim.now = ev.time
    (tool,) = life.on_seg_done(ev)
    assert len(sim.q) == 0
    assert tool.kind == EvKind.TOOL_DONE and tool.a == j.idx and tool.b == j.epoch
    assert math.isclose(tool.time, ev.time + 50.0)
    assert j.state == TOOL and j.turn == 1 and s.n_run == 0 and s.tau == math.inf
    assert s.idle == sim.kv.idle_kv(s) == s.reserved == j.reserved + j.sh > 0  # its KV stays, evictable

    sim.now = tool.time
    (ev2,) = life.on_tool_done(tool)
    assert ev2.kind == EvKind.SEG_DONE and j.state == RUN and s.idle == sim.kv.idle_kv(s) == 0
    sim.now = ev2.time
    assert life.on_seg_done(ev2) == []  # completion: the driver stops, nothing follows
    assert j.state == DONE and life.batch_left == 0 and not life.batch_active and sim.stopped
    assert s.reserved == 0 and s.n_res == 0 and s.kv_free == s.kv_cap


def test_batching_joins_are_lazy_and_the_sums_are_the_members() -> None:
    sim = _sim([SimTraj("a", "ga", 300, (0,), (200,), (0.0,)), SimTraj("b", "gb", 300, (0,), (50,), (0.0,))])
    life, batching, s = sim.lifecycle, sim.batching, sim.slots[0]
    a, b = life.trajs
    for j in (a, b):
        sim.queue.dequeue(j)
        j.state = WAIT
    (first,) = life.try_start(a, s)
    sim.now = 0.01  # b joins a little later: the batch slows down, a finishes later than armed
    out = life.try_start(b, s)
    assert s.n_run == 2 and math.isclose(s.kv_sum, a.seg_kv + b.seg_kv)
    # b's 50 steps end before a's 200 at the new step time: a new, earlier SEG_DONE replaces the armed one.
    assert len(out) == 1 and out[0].time < first.time and out[0].b == s.version
    assert batching.reschedule(s) == []  # armed no later than needed: nothing new
    assert len(sim.q) == 0
    sim.now = out[0].time
    assert batching.pop_done(s) == [b] and s.n_run == 1 and math.isclose(s.kv_sum, a.seg_kv)
    assert all(e[3] != b.epoch for e in s.heap) and b.state == RUN  # left the set; the lifecycle moves it on


_OPS = st.lists(st.tuples(st.sampled_from(("reserve", "grow", "tool", "back", "release")),
                          st.integers(0, 5), st.integers(0, 4000)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_kv_memory_keeps_its_books(ops: list[tuple[str, int, int]]) -> None:
    specs = [SimTraj(f"t{i}", f"g{i % 2}", 1000 + 300 * (i % 3), (0,), (100,), (0.0,)) for i in range(6)]
    sim = _sim(specs)
    kv, s, trajs = sim.kv, sim.slots[0], sim.lifecycle.trajs
    for t in trajs:
        sim.queue.dequeue(t)
        t.state = WAIT
    for op, i, extra in ops:
        j = trajs[i]
        here = j.slot == s.idx
        if op in ("reserve", "grow") and here == (op == "grow"):  # admit, or grow a resident's reservation
            kv.reserve(j, s, j.ctx + extra)
        elif op == "tool" and here and j.state != TOOL:
            kv.to_tool(j)
            j.state = TOOL
        elif op == "back" and here and j.state == TOOL:
            kv.from_tool(j)
            j.state = WAIT
        elif op == "release" and here:
            kv.release(j)
            j.state = WAIT
        assert s.kv_free == s.kv_cap - s.reserved
        assert s.n_res == len(s.residents) == sum(t.slot == s.idx for t in trajs)
        assert s.reserved == sum(trajs[v].reserved for v in s.residents) + sum(g[1] for g in s.groups.values())
        assert s.idle == kv.idle_kv(s)
        assert set(s.groups) == {trajs[v].group for v in s.residents}
