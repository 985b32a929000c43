"""Slot batching and step physics: the ``Simulator``'s component that runs each slot's batch analytically.

Owns each slot's running set and its fast-forward (``V``, ``t_ref``, ``tau``, ``version``, ``sched_t``,
``heap``, ``n_run``, ``kv_sum``, ``rho_sum``, ``rtok_sum``, ``acc_sum``, ``rho_remote``, ``pool_c``), the
DECODE slots' fluid load on the PREFILL pool (``pool_load``) and the step-time factor while an engine
cold-starts (``host_f``). Between events a slot's running set is fixed, so its step time ``tau`` is fixed and
its virtual step counter ``V`` grows linearly in time (``rollplan.sim.engine``'s module docstring has the
physics); a member that joined at ``V0`` with ``D`` steps to go finishes at ``V0 + D``, so the next completion
is computed, never stepped. Methods that can move a slot's next completion return the SEG_DONE event that
re-arms it (``reschedule``); a stale SEG_DONE (older ``version``) is ignored by its handler.

Invariants (``tests/sim/test_components.py``): ``n_run`` and the sums are those of the members in RUN whose
heap entry is current; ``tau`` is ``inf`` exactly when ``n_run`` is 0; at most one SEG_DONE per slot is
current (``version``), at ``sched_t``, no later than the slot's next completion.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from rollplan.sim.state import RUN, SEG_DONE_K

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollplan.sim.engine import Simulator
    from rollplan.sim.events import Event
    from rollplan.sim.state import SlotState, TrajState


class Batching:
    """Each slot's running batch, its step time and its next completion (see the module docstring)."""

    __slots__ = ("_life", "_new_epoch", "host_f", "pool_load", "q", "sim", "spec_adaptive", "spec_k")

    def __init__(self, sim: Simulator) -> None:
        cfg = sim.cfg
        self.sim = sim
        self.q = sim.q
        self.pool_load = 0.0  # prefill-seconds per second the DECODE slots' folded turns ask of the pool
        self.host_f = 1.0  # step-time factor on every slot while an engine starts (SimConfig.start_interference)
        self.spec_k = cfg.spec_tokens
        self.spec_adaptive = cfg.spec_adaptive

    def wire(self) -> None:
        self._life = self.sim.lifecycle
        self._new_epoch: Callable[[], int] = self.sim.lifecycle.new_epoch

    def reset(self, s: SlotState, now: float) -> None:
        """s (re)joins: an empty batch from ``now``."""
        s.V, s.t_ref, s.tau = 0.0, now, math.inf
        s.version += 1
        s.sched_t = math.inf
        s.heap.clear()
        s.n_run, s.kv_sum, s.rho_sum = 0, 0.0, 0.0
        s.rtok_sum = 0.0
        s.rho_remote = 0.0
        s.pool_c = 0.0

    def drop(self, s: SlotState) -> None:
        """s leaves: its load on the pool goes, its pending SEG_DONE is void."""
        self.pool_load = max(0.0, self.pool_load - s.pool_c)
        s.pool_c = 0.0
        s.version += 1
        s.sched_t = math.inf

    def rebase(self, s: SlotState, t: float) -> None:
        if t > s.t_ref:
            if s.n_run:
                s.V += (t - s.t_ref) / s.tau
            s.t_ref = t

    def retau(self, s: SlotState) -> None:
        """Recompute s's decode step time (and its load on the prefill pool) from its running set. Every change
        of ``n_run``/``kv_sum``/``rho_sum``/``rho_remote`` is followed by a call, so a call without such a
        change is a no-op."""
        n = s.n_run
        if n <= 0:
            s.n_run, s.kv_sum, s.rho_sum, s.rho_remote, s.rtok_sum = 0, 0.0, 0.0, 0.0, 0.0
            s.acc_sum = 0.0
            s.tau = math.inf
            c = 0.0
        else:
            perf = s.perf
            dec = perf.decode(n, s.kv_sum / n)
            k = self.spec_k
            if k:  # speculation: seconds per token = verify step / tokens per step (SimConfig docstring)
                a = s.acc_sum / n
                if a > 0.0:
                    best = dec
                    for kk in range(1, k + 1) if self.spec_adaptive else (k,):
                        e = kk + 1.0 if a >= 1.0 else (1.0 - a ** (kk + 1)) / (1.0 - a)
                        t = (dec + perf.verify_extra(n, kk)) / e
                        if t < best or not self.spec_adaptive:
                            best = t
                    dec = best
                elif not self.spec_adaptive:
                    dec += perf.verify_extra(n, k)
            tau = dec + s.rho_sum
            if s.rtok_sum > 0.0:  # batched step physics (module docstring): mixed steps share weight reads
                room = perf.chunk - n
                f = s.rtok_sum / room if room > s.rtok_sum else 1.0
                tau -= f * perf.overlap(n)
                if tau < dec:
                    tau = dec
            if self.host_f != 1.0:
                tau *= self.host_f
            s.tau = tau
            c = s.rho_remote / tau if s.rho_remote > 0 else 0.0
        if c != s.pool_c:
            self.pool_load = max(0.0, self.pool_load + c - s.pool_c)
            s.pool_c = c

    def reschedule(self, s: SlotState) -> list[Event]:
        """Make sure a SEG_DONE fires no later than the slot's next completion. Lazy: when the scheduled one
        fires no later than needed (a join slowed the batch down), it stays; firing early it just re-checks."""
        h = s.heap
        trajs = self._life.trajs
        while h:
            e = h[0]  # (finish V, seq, trajectory, epoch)
            t = trajs[e[2]]
            if t.epoch == e[3] and t.state == RUN:
                break
            heapq.heappop(h)
        if not h or not s.n_run:
            s.version += 1
            s.sched_t = math.inf
            return []
        steps = h[0][0] - s.V
        t_next = s.t_ref + (steps if steps > 0.0 else 0.0) * s.tau  # = max(0.0, steps), without the call
        if t_next >= s.sched_t:
            return []
        s.version += 1
        s.sched_t = t_next
        return [self.q.make(t_next, SEG_DONE_K, s.idx, s.version)]

    def stall(self, s: SlotState, seconds: float) -> None:
        """Pause the slot's batch for ``seconds`` from now (switching)."""
        now = self.sim.now
        self.rebase(s, now)
        s.t_ref = max(s.t_ref, now) + seconds

    def add(self, j: TrajState, s: SlotState) -> list[Event]:
        """j (in RUN with a fresh epoch, its segment planned) joins s's batch now."""
        now = self.sim.now
        if now > s.t_ref:  # self.rebase(s, now), inlined (hot)
            if s.n_run:
                s.V += (now - s.t_ref) / s.tau
            s.t_ref = now
        ep = j.epoch
        v0 = j.seg_V0 = s.V
        j.seg_t0 = now
        if j.seg_run == j.seg_D:
            kv = j.seg_kv = (j.seg_ctx0 + j.seg_ctx_end) * 0.5
        else:  # a chunk of a divided segment: its context grows over the chunk only
            kv = j.seg_kv = j.seg_ctx0 + (j.seg_ctx_end - j.seg_ctx0) * (j.seg_run / j.seg_D) * 0.5
        s.n_run += 1
        s.kv_sum += kv
        s.rho_sum += j.seg_rho
        s.rtok_sum += j.seg_rtok
        s.rho_remote += j.seg_rrho
        s.acc_sum += j.spec_a
        self.retau(s)
        heapq.heappush(s.heap, (v0 + j.seg_run, ep, j.idx, ep))
        return self.reschedule(s)

    def leave(self, j: TrajState, s: SlotState) -> None:
        """j leaves s's running set (the caller re-times s): it gets a fresh epoch, so its heap entry is stale."""
        s.n_run -= 1
        s.kv_sum -= j.seg_kv
        s.rho_sum -= j.seg_rho
        s.rtok_sum -= j.seg_rtok
        s.acc_sum -= j.spec_a
        j.epoch = self._new_epoch()
        s.rho_remote -= j.seg_rrho

    def stop(self, j: TrajState, s: SlotState) -> float:
        """j (running on s) leaves s's batch now; returns the decode steps its segment ran."""
        self.rebase(s, self.sim.now)
        steps = min(j.seg_run, max(0.0, s.V - j.seg_V0))
        self.leave(j, s)
        self.retau(s)
        return steps

    def pop_done(self, s: SlotState) -> list[TrajState]:
        """SEG_DONE on s (current version): advance s to now and take out the members whose segment (or chunk)
        is done (they leave the running set, s re-timed when any did)."""
        s.sched_t = math.inf
        now = self.sim.now
        if now > s.t_ref:  # self.rebase(s, now), inlined (hot)
            if s.n_run:
                s.V += (now - s.t_ref) / s.tau
            s.t_ref = now
        h = s.heap
        trajs = self._life.trajs
        pop = heapq.heappop
        done: list[TrajState] = []
        # Entries within a microsecond of their finish count as done (rounding of V = V0 + dt / tau).
        v = s.V
        horizon = v + (1e-6 / s.tau if s.n_run and s.tau > 0 else 0.0) + 1e-9 * v
        leave = self.leave
        while h:
            e = h[0]  # (finish V, seq, trajectory, epoch)
            j = trajs[e[2]]
            if j.epoch != e[3] or j.state != RUN:
                pop(h)
                continue
            if e[0] > horizon:
                break
            pop(h)
            leave(j, s)
            done.append(j)
        if done:
            self.retau(s)
        # else: fired early (a join slowed the slot down since it was scheduled): nothing left the running
        # set, so retau would be a no-op; the caller only re-arms.
        return done

    def set_acceptance(self, t: TrajState, s: SlotState, a: float) -> list[Event]:
        """Running member t of s has speculative acceptance ``a`` from now (its group's rose)."""
        self.rebase(s, self.sim.now)
        s.acc_sum += a - t.spec_a
        t.spec_a = a
        self.retau(s)
        return self.reschedule(s)

    def set_host_factor(self, f: float, live: list[SlotState]) -> list[Event]:
        """Every slot's step time is ``f`` times its own from now (``SimConfig.start_interference``)."""
        out: list[Event] = []
        if f == self.host_f:
            return out
        now = self.sim.now
        for s in live:
            self.rebase(s, now)
        self.host_f = f
        for s in live:
            if s.n_run:
                self.retau(s)
                out += self.reschedule(s)
        return out
