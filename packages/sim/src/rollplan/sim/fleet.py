"""The fleet: the ``Simulator``'s component for the slots themselves, their availability and their engines.

Owns the slot table (``slots``, ``slot_index``; a slot's record is kept when it leaves and reused when it comes
back), the present slots (``live``, by index), ``slot_epoch`` (bumped whenever a slot's role, readiness,
presence or return deadline changes: policies cache on it), the scenario's availability events, the engines'
weights version and the cold starts in progress (``starts``, for ``SimConfig.start_interference``), and each
slot's ``present`` / ``presence`` / ``role`` / ``engine`` / ``weights`` / ``ready_at`` / ``action_epoch`` /
``return_by``.

Availability: ARRIVE adds preemptible slots (no engine: cold start), LEND adds lent slots (sleeping engine: wake
+ sync), NOTICE/RECLAIM set a return deadline, LEAVE (and a passed deadline) remove a slot: everything on it
loses its KV. Engines: ``set_role`` starts, wakes, syncs or switches an engine (the slot is unusable for
``switch_seconds``, its ACTION_DONE event ends that). Handlers (AVAIL, DEADLINE, ACTION_DONE) return the events
they cause; policy commands (``set_role``) put theirs in the coordinator's ``out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollplan.models.types import AvailabilityEvent, EngineState, EventKind, Role, Slot, SlotSource
from rollplan.sim.events import EvKind
from rollplan.sim.state import DECODING, SlotState

if TYPE_CHECKING:
    from rollplan.sim.accounting import GpuSeconds
    from rollplan.sim.batching import Batching
    from rollplan.sim.engine import Simulator
    from rollplan.sim.events import Event
    from rollplan.sim.kv import KvMemory
    from rollplan.sim.lifecycle import Lifecycle
    from rollplan.sim.prefill_pool import PrefillPool


class Fleet:
    """The slots: arrivals, departures, deadlines, roles and engine switches (see the module docstring)."""

    def __init__(self, sim: Simulator, events: Sequence[AvailabilityEvent], dedicated: Sequence[Slot]) -> None:
        self.sim = sim
        self.q = sim.q
        self.rec = sim.recorder
        self.events = tuple(events)
        self.dedicated = tuple(dedicated)
        self.slots: list[SlotState] = []
        self.slot_index: dict[str, int] = {}
        self.live: list[SlotState] = []  # present slots, by index
        self.slot_epoch = 0  # bumped whenever a slot's role, readiness, presence or return deadline changes
        self.weights_version = 0
        self.starts: dict[int, int] = {}  # slots cold-starting now -> their action epoch (start_interference)

    def wire(self) -> None:
        sim = self.sim
        self.acct: GpuSeconds = sim.accounting
        self.batching: Batching = sim.batching
        self.kv: KvMemory = sim.kv
        self.pool: PrefillPool = sim.prefill_pool
        self.life: Lifecycle = sim.lifecycle

    def start(self) -> list[Event]:
        """The replay starts: the dedicated slots are present, the availability events queued."""
        q = self.q
        for d in self.dedicated:
            s = self.add_slot(d)
            self.present(s, d.engine, None)
        return [q.make(ev.time, EvKind.AVAIL, i, 0) for i, ev in enumerate(self.events)]

    def add_slot(self, slot: Slot) -> SlotState:
        idx = self.slot_index.get(slot.id)
        if idx is None:
            perf = self.sim.perf_for(slot.gpu, slot.tp)
            s = SlotState(len(self.slots), slot, perf, int(self.sim.cfg.admit_watermark * perf.kv_cap))
            self.slots.append(s)
            self.slot_index[slot.id] = s.idx
        else:
            s = self.slots[idx]
        return s

    def present(self, s: SlotState, engine: EngineState, return_by: float | None) -> None:
        self.slot_epoch += 1
        if s.present:
            s.return_by = return_by
            return
        now = self.sim.now
        s.present = True
        s.presence += 1
        s.role = Role.OFF
        s.engine = engine
        s.ready_at = now
        s.return_by = return_by
        self.batching.reset(s, now)
        self.kv.reset(s)
        self.pool.reset(s, now)
        self.acct.reset(s, now)
        self.live = sorted([*self.live, s], key=lambda x: x.idx)
        self.touched(s)

    def touched(self, s: SlotState) -> None:
        """s's role, readiness, presence or deadline may have changed (every such change comes through here)."""
        self.slot_epoch += 1
        self.acct.update(s)

    # -- availability events ----------------------------------------------------------------------------------
    def on_avail(self, ev: Event) -> list[Event]:
        sim = self.sim
        aev = self.events[ev.a] if ev.a >= 0 else sim.driver.lending_event(ev.b)
        out = self.apply(aev)
        out += sim.invoke_policy(f"avail:{aev.kind.value}")
        return out

    def apply(self, aev: AvailabilityEvent) -> list[Event]:
        """Apply one availability event to the slots (physics only; the caller re-invokes the policy)."""
        out: list[Event] = []
        kind = aev.kind
        now = self.sim.now
        if kind in (EventKind.ARRIVE, EventKind.LEND):
            for sl in aev.slots:
                known = sl.id in self.slot_index
                s = self.add_slot(sl)
                if kind is EventKind.ARRIVE:
                    engine = EngineState.NONE  # a fresh node: cold start
                elif not known:
                    # A colocated engine sleeps on the training GPUs (ROLL/PEARL): wake + weight sync.
                    engine = EngineState.SLEEPING if sl.engine is EngineState.NONE else sl.engine
                else:
                    engine = s.engine
                deadline = aev.deadline if kind is EventKind.LEND else sl.return_by
                self.present(s, engine, deadline)
                if deadline is not None:
                    out.append(self.q.make(deadline, EvKind.DEADLINE, s.idx, s.presence))
        elif kind in (EventKind.NOTICE, EventKind.RECLAIM):
            for sid in aev.slot_ids:
                idx = self.slot_index.get(sid)
                if idx is None or not self.slots[idx].present:
                    continue
                s = self.slots[idx]
                s.return_by = aev.deadline
                self.slot_epoch += 1
                if aev.deadline is not None:
                    if aev.deadline <= now:
                        out += self.remove(s, forced=True)
                    else:
                        out.append(self.q.make(aev.deadline, EvKind.DEADLINE, s.idx, s.presence))
        elif kind is EventKind.LEAVE:
            for sid in aev.slot_ids:
                idx = self.slot_index.get(sid)
                if idx is not None and self.slots[idx].present:
                    out += self.remove(self.slots[idx], forced=False)
        self.sim.dirty = True
        return out

    def on_deadline(self, ev: Event) -> list[Event]:
        s = self.slots[ev.a]
        if s.presence != ev.b or not s.present:
            return []
        out = self.remove(s, forced=True)
        return out + self.sim.invoke_policy("deadline")

    def remove(self, s: SlotState, *, forced: bool) -> list[Event]:
        """The slot goes away now: everything on it loses its KV (token progress kept)."""
        out: list[Event] = []
        busy = [j for j in s.residents]
        if forced and busy:
            self.rec.count("deadline_kv_lost", len(busy))
        life = self.life
        trajs = life.trajs
        for jdx in busy:
            out += life.displace(trajs[jdx], lose_kv=True)
        out += self.pool.rebook(s)
        self.set_role_now(s, Role.OFF)
        self.acct.close(s)
        self.batching.drop(s)
        s.present = False
        self.slot_epoch += 1
        self.live = [x for x in self.live if x is not s]
        s.presence += 1
        if s.source is SlotSource.LENT_BY_TRAINING and s.engine is not EngineState.NONE:
            s.engine = EngineState.SLEEPING
        self.sim.dirty = True
        return out

    # -- engines -------------------------------------------------------------------------------------------------
    def on_action_done(self, ev: Event) -> list[Event]:
        s = self.slots[ev.a]
        if ev.b != s.action_epoch or not s.present:
            return []
        sim = self.sim
        self.touched(s)
        if s.role is Role.PREFILL:
            sim.pool_dirty = True
        sim.dirty = True
        if self.starts:
            self.host_refresh()
        return self.life.drain_waiting(s)

    def host_refresh(self) -> None:
        """Drop finished or cancelled cold starts; when whether any engine starts changed, re-time every running
        batch at the new step-time factor (``SimConfig.start_interference``)."""
        sim = self.sim
        now = sim.now
        slots = self.slots
        for idx, epoch in list(self.starts.items()):
            s = slots[idx]
            if not s.present or s.action_epoch != epoch or s.ready_at <= now:
                del self.starts[idx]
        f = 1.0 + sim.cfg.start_interference if self.starts else 1.0
        sim.out.extend(self.batching.set_host_factor(f, self.live))

    def action(self, s: SlotState, seconds: float) -> list[Event]:
        """s is busy ``seconds`` from now (or from the end of its current action): its batch pauses meanwhile."""
        if seconds <= 0:
            return []
        batching = self.batching
        if s.n_run:
            batching.stall(s, seconds)
        s.ready_at = max(s.ready_at, self.sim.now) + seconds
        s.action_epoch += 1
        self.touched(s)
        if s.n_run:
            self.sim.out.extend(batching.reschedule(s))
        return [self.q.make(s.ready_at, EvKind.ACTION_DONE, s.idx, s.action_epoch)]

    def sync_weights(self, version: int) -> list[Event]:
        """New weights: warm engines serving a role sync them (a batch starts)."""
        out: list[Event] = []
        for s in self.slots:
            if s.present and s.role is not Role.OFF and s.engine is EngineState.WARM and s.weights < version:
                out += self.action(s, s.perf.sync)
                s.weights = version
        return out

    def switch_seconds(self, s: SlotState, role: Role) -> float:
        """Seconds before ``s`` serves in ``role`` if switched now (0 for OFF or no change)."""
        if role is Role.OFF or (role is s.role and s.engine is EngineState.WARM):
            return 0.0
        sec = 0.0
        if s.engine is EngineState.NONE:
            sec += s.perf.cold_start
        else:
            if s.engine is EngineState.SLEEPING:
                sec += s.perf.wake
            if s.weights < self.weights_version:
                sec += s.perf.sync
        if role is not s.role and s.role is not Role.OFF:
            sec += self.sim.cfg.role_switch_s
        return sec

    def set_role(self, slot: int, role: Role) -> None:
        """Policy command: ``slot`` serves ``role`` (starting/waking/syncing its engine as needed; the slot is
        unusable for that long). Trajectories on a slot whose new role does not decode lose their KV unless
        the policy migrated them first."""
        s = self.slots[slot]
        if not s.present or (role is s.role and (role is Role.OFF or s.engine is EngineState.WARM)):
            return
        self.set_role_now(s, role)

    def set_role_now(self, s: SlotState, role: Role) -> None:
        sim = self.sim
        sec = self.switch_seconds(s, role)
        cold = s.engine is EngineState.NONE and role is not Role.OFF
        old = s.role
        if Role.PREFILL in (old, role):
            sim.pool_dirty = True
        if role is not Role.OFF:
            if s.engine is EngineState.NONE:
                s.weights = self.weights_version
            s.engine = EngineState.WARM
            s.weights = max(s.weights, self.weights_version)
        if not role.decodes and s.residents:
            life = self.life
            for jdx in list(s.residents):
                sim.out.extend(life.displace(life.trajs[jdx], lose_kv=True))
        if old is Role.PREFILL and role is not Role.PREFILL:
            s.role = role
            sim.out.extend(self.pool.rebook(s))
        s.role = role
        if role is Role.OFF:
            if s.engine is EngineState.WARM:
                s.engine = EngineState.SLEEPING
            if s.ready_at > sim.now:
                s.ready_at = sim.now
                s.action_epoch += 1
            if s.idx in self.starts:  # a start cut short (the slot left, or turned off)
                self.host_refresh()
        else:
            self.rec.gpu_seconds_switch(sec * s.tp)
            sim.out.extend(self.action(s, sec))
            if cold and sec > 0 and sim.cfg.start_interference > 0:
                self.starts[s.idx] = s.action_epoch
                self.host_refresh()
        if role is Role.PREFILL:
            s.pf_busy = max(s.pf_busy, s.ready_at)
        self.touched(s)
        sim.dirty = True

    def decode_slots(self) -> list[SlotState]:
        """Present slots whose role decodes and that are usable now."""
        now = self.sim.now
        return [s for s in self.live if s.role in DECODING and s.ready_at <= now]
