"""The PREFILL pool: the ``Simulator``'s component that queues first prefills on PREFILL slots.

Owns each PREFILL slot's FCFS queue (``pf_busy``: when its queue drains; ``pf_jobs``: trajectory -> epoch of
the jobs booked there), a trajectory's ``pf_start`` / ``pf_secs`` / ``pf_seq`` / ``pf_tokens``, the booking
counter (``pf_seq``) and two caches keyed by the slot epoch (the PREFILL slots; their count). A job runs at the
pool's free share (``free``: what the DECODE slots' folded turns leave, ``Batching.pool_load``), then its KV is
shipped to the trajectory's slot: the JOIN event it returns fires when the KV lands.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rollplan.models.types import Role
from rollplan.sim.state import JOIN_K, PREFILL, WAIT

if TYPE_CHECKING:
    from rollplan.sim.engine import Simulator
    from rollplan.sim.events import Event
    from rollplan.sim.state import SlotState, TrajState


class PrefillPool:
    """FCFS prefill queues on the PREFILL slots (see the module docstring)."""

    __slots__ = ("_batching", "_fleet", "_life", "_n", "_n_key", "_slots_key", "_slots_pf", "pf_seq", "q", "sim",
                 "slots")

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.q = sim.q
        self.pf_seq = 0
        self._n_key = -1
        self._n = 0
        self._slots_key = -1
        self._slots_pf: list[SlotState] = []

    def wire(self) -> None:
        sim = self.sim
        self._fleet = sim.fleet
        self.slots = sim.fleet.slots
        self._batching = sim.batching
        self._life = sim.lifecycle

    def reset(self, s: SlotState, now: float) -> None:
        """s (re)joins: no prefill queued on it."""
        s.pf_busy = now
        s.pf_jobs.clear()

    def free(self) -> float:
        """Share of a PREFILL slot's time left for first prefills after the folded turns' fluid load (the
        pool's load spread over its slots; at least 5%: an overloaded pool queues, it does not stop)."""
        fleet = self._fleet
        if self._n_key != fleet.slot_epoch:
            self._n_key = fleet.slot_epoch
            self._n = sum(1 for s in fleet.live if s.role is Role.PREFILL)
        load = self._batching.pool_load
        if load <= 0 or not self._n:
            return 1.0
        return max(0.05, 1.0 - load / self._n)

    def pick(self, work: float) -> SlotState | None:
        """The PREFILL slot that would finish ``work`` seconds of prefill first (FCFS queue + background)."""
        fleet = self._fleet
        if self._slots_key != fleet.slot_epoch:
            # Slots that were PREFILL when the slot epoch last changed, in ``live`` order. A slot only turns
            # PREFILL or joins ``live`` with an epoch bump, so this holds every present PREFILL slot; the
            # role test below drops one that left PREFILL since (its epoch bump may come later).
            self._slots_key = fleet.slot_epoch
            self._slots_pf = [s for s in fleet.live if s.role is Role.PREFILL]
        best = None
        best_t = math.inf
        now = self.sim.now
        dt: float | None = None
        for s in self._slots_pf:
            if s.role is Role.PREFILL:
                if dt is None:
                    dt = work / self.free()  # the same for every slot of the loop
                t = now  # max(now, s.pf_busy, s.ready_at) without the call
                if s.pf_busy > t:
                    t = s.pf_busy
                if s.ready_at > t:
                    t = s.ready_at
                t += dt
                if t < best_t:
                    best, best_t = s, t
        return best

    def submit(self, j: TrajState, ps: SlotState, secs: float, tokens: int) -> list[Event]:
        """j's first prefill (``secs`` seconds alone, ``tokens`` tokens) joins the pool's FCFS order on ``ps``."""
        j.pf_secs = secs
        j.pf_tokens = tokens
        self.pf_seq += 1
        j.pf_seq = self.pf_seq
        return self.book(j, ps)

    def book(self, j: TrajState, ps: SlotState) -> list[Event]:
        """Queue j's first prefill on PREFILL slot ``ps`` (FCFS behind its queue); JOIN when its KV lands."""
        now = self.sim.now
        start = max(now, ps.pf_busy, ps.ready_at)
        done = start + j.pf_secs / self.free()
        ps.pf_busy = done
        j.epoch = self._life.new_epoch()
        j.pf_start = start
        ps.pf_jobs[j.idx] = j.epoch
        t_join = done + ps.perf.transfer(j.pf_tokens, ps.node == self.slots[j.slot].node)
        return [self.q.make(t_join, JOIN_K, j.idx, j.epoch)]

    def rebalance(self) -> list[Event]:
        """The PREFILL slots changed: their not-yet-started jobs form one FCFS queue again, re-dealt over the
        current pool (a shared prefill queue: new PREFILL slots take queued work, as a router would)."""
        now = self.sim.now
        pool = [s for s in self._fleet.live if s.role is Role.PREFILL]
        if not pool:
            return []
        trajs = self._life.trajs
        queued: list[TrajState] = []
        for s in pool:
            busy = max(now, s.ready_at)
            for jdx, ep in list(s.pf_jobs.items()):
                j = trajs[jdx]
                if j.epoch != ep or j.state != PREFILL:
                    del s.pf_jobs[jdx]
                elif j.pf_start > now + 1e-9:
                    del s.pf_jobs[jdx]
                    queued.append(j)
                else:  # in service: keeps its slot
                    busy = max(busy, j.pf_start + j.pf_secs / self.free())
            s.pf_busy = busy
        out: list[Event] = []
        queued.sort(key=lambda j: j.pf_seq)
        for j in queued:
            ps = min(pool, key=lambda s: (max(now, s.pf_busy, s.ready_at), s.idx))
            out += self.book(j, ps)
        return out

    def rebook(self, s: SlotState) -> list[Event]:
        """s stops prefilling (it leaves, or its role changes): its booked jobs start over from their slots."""
        out: list[Event] = []
        jobs = list(s.pf_jobs.items())
        s.pf_jobs.clear()
        life = self._life
        trajs = life.trajs
        for jdx, ep in jobs:
            j = trajs[jdx]
            if j.epoch == ep and j.state == PREFILL and j.slot >= 0:
                j.epoch = life.new_epoch()
                j.state = WAIT
                out += life.try_start(j, self.slots[j.slot])
        return out
