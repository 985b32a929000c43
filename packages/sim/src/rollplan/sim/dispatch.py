"""The pending queue: the ``Simulator``'s component that holds trajectories waiting for the policy to place
them, and dispatches them in the policy's order.

Owns the FCFS list ``pending`` of ``(pseq, trajectory)`` entries (stale entries are skipped, and compacted
when they outnumber the live ones), ``n_pending`` (the live entries), the counter ``pseq`` and the scan head;
a trajectory's ``pseq`` is > 0 exactly while it is queued. ``dispatch`` returns the events the admissions
cause; an admission that does not fit after all re-queues the trajectory (a new ``pseq``: the back of the
queue) and stops the pass, as an engine's FCFS admission blocks at its head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollplan.sim.state import PENDING, WAIT

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rollplan.sim.engine import Policy, Simulator
    from rollplan.sim.events import Event
    from rollplan.sim.state import TrajState


class PendingQueue:
    """Trajectories waiting for a slot, in FCFS order (see the module docstring)."""

    __slots__ = ("_life", "head", "n_pending", "pending", "policy", "pseq", "sim", "slots")

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.policy: Policy = sim.policy
        self.pending: list[tuple[int, int]] = []  # (pseq, trajectory) in FCFS order; stale entries skipped
        self.n_pending = 0
        self.pseq = 0
        self.head = 0

    def wire(self) -> None:
        self._life = self.sim.lifecycle
        self.slots = self.sim.fleet.slots

    def reset(self) -> None:
        """A new batch: nothing queued."""
        self.pending = []
        self.n_pending = 0
        self.head = 0

    def enqueue(self, j: TrajState) -> None:
        """j waits for the policy to place it (FCFS position = now)."""
        j.state = PENDING
        if j.pseq:
            return
        self.pseq += 1
        j.pseq = self.pseq
        self.pending.append((j.pseq, j.idx))
        self.n_pending += 1
        self.sim.dirty = True
        self.policy.enqueued(self.sim, j.idx)

    def dequeue(self, j: TrajState) -> None:
        if j.pseq:
            j.pseq = 0
            self.n_pending -= 1

    def iter_pending(self) -> Iterator[int]:
        """Pending trajectories in FCFS order (those queued during the iteration are not included)."""
        trajs = self._life.trajs
        pend = self.pending
        head = self.head
        n = len(pend)
        while head < n and trajs[pend[head][1]].pseq != pend[head][0]:
            head += 1  # entries before the first valid one are stale for good (FCFS only appends)
        self.head = head
        for i in range(head, n):
            seq, jdx = pend[i]
            if trajs[jdx].pseq == seq:
                yield jdx

    def pending_ids(self) -> list[int]:
        return list(self.iter_pending())

    def dispatch(self) -> list[Event]:
        """Place pending trajectories: in the policy's order, each on the slot the policy picks, until one
        finds no slot (the queue's head blocks, as in an engine's FCFS admission)."""
        out: list[Event] = []
        sim = self.sim
        life = self._life
        trajs = life.trajs
        slots = self.slots
        try_start = life.try_start
        choose = self.policy.choose_slot
        for jdx in self.policy.order(sim):
            j = trajs[jdx]
            if not j.pseq:
                continue
            sidx = choose(sim, jdx)
            if sidx is None:
                break
            self.dequeue(j)
            j.state = WAIT
            out += try_start(j, slots[sidx])
            if j.pseq:  # did not fit after all: queued again
                break
        if len(self.pending) > 2 * self.n_pending + 64:
            self.pending = [e for e in self.pending if trajs[e[1]].pseq == e[0]]
            self.head = 0
        return out
