"""Simulator events and their one total order.

An event is a small named tuple ``(time, kind, seq, a, b)``; the heap orders events by ``event_key``:
time first, then the kind's priority (``EvKind`` values *are* the priorities, lowest first), then ``seq``
(a per-simulation counter: among equal time and kind, first scheduled runs first). ``seq`` is unique, so
two events never compare on their payload.

Why this kind order, at equal times: work that completes at ``t`` is credited before anything can take it
away (a segment that ends exactly when its slot leaves counts); KV that arrives is installed before tools
return and compete for the same memory; a slot finishing its switch is usable by whatever happens at ``t``;
availability changes are applied before deadlines are enforced (a NOTICE can arrive at its own deadline);
the RL loop (training done, next batch) runs after the state at ``t`` is final; a plan whose solve ends at
``t`` is applied next, and re-plans come last so they see everything that happened at ``t`` (a plan applied
included).

Handlers (the components' ``on_*`` methods: ``lifecycle`` for SEG_DONE / JOIN / TOOL_DONE, ``fleet`` for
ACTION_DONE / AVAIL / DEADLINE, ``ticks`` for REPLAN; the driver and the policy for the rest, through
``rollplan.sim.engine.Simulator``) take one event and *return* the new events it causes; the main loop
pushes them. Payload meaning per kind: see ``EvKind``.
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import NamedTuple


class EvKind(IntEnum):
    """Event kinds; the value is the priority at equal times (lower runs first).

    Payload ``(a, b)``: SEG_DONE (slot index, slot version); JOIN (trajectory index, trajectory epoch);
    TOOL_DONE (trajectory index, epoch); ACTION_DONE (slot index, action epoch); AVAIL (index into the
    scenario's availability events, -1 for lending events: b then indexes the driver's lending events);
    DEADLINE (slot index, slot presence epoch); TRAIN_DONE (training step index, 0); BATCH_START (batch index,
    0); PLAN_READY (the policy's plan token, 0): a plan solved earlier takes effect now (its solve time is
    charged in simulated time, see ``Simulator.call_policy_at``); REPLAN (0, 0).
    """

    SEG_DONE = 0
    JOIN = 1
    TOOL_DONE = 2
    ACTION_DONE = 3
    AVAIL = 4
    DEADLINE = 5
    TRAIN_DONE = 6
    BATCH_START = 7
    PLAN_READY = 8
    REPLAN = 9


class Event(NamedTuple):
    """One scheduled event. Compare with ``event_key``; tuple order is the same by construction."""

    time: float
    kind: int
    seq: int
    a: int = 0
    b: int = 0


def event_key(ev: Event) -> tuple[float, int, int]:
    """The heap order of events: (time, kind priority, seq). The single definition of event order."""
    return (ev.time, ev.kind, ev.seq)


class EventQueue:
    """A binary heap of ``Event`` in ``event_key`` order, with the ``seq`` counter.

    Events are plain tuples whose first three fields are exactly ``event_key``, so heapq's tuple order is
    ``event_key`` order (``seq`` is unique; the payload is never compared).
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def make(self, time: float, kind: EvKind | int, a: int = 0, b: int = 0) -> Event:
        """A new event with the next ``seq`` (not yet queued)."""
        self._seq += 1
        return Event(time, int(kind), self._seq, a, b)

    def push(self, ev: Event) -> None:
        heapq.heappush(self._heap, ev)

    def push_all(self, events: list[Event]) -> None:
        for ev in events:
            heapq.heappush(self._heap, ev)

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def peek_time(self) -> float:
        """Time of the next event (inf when empty)."""
        return self._heap[0].time if self._heap else float("inf")

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
