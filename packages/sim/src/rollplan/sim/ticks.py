"""Re-plan ticks: the ``Simulator``'s component that schedules the interval re-plans (REPLAN events) and
stops ticking densely once nothing happens.

Owns whether a tick is pending, the idle-tick count, the activity mark of the previous tick and the count of
plans landed (PLAN_READY events, which are not activity). An interval tick asks the coordinator for a policy
call; after ``IDLE_TICKS`` ticks in a row that found nothing changed and nothing running, the next tick is the
first of the same grid after the next pending event (``rollplan.sim.engine``'s module docstring). Its handler
returns the next tick.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rollplan.sim.events import EvKind
from rollplan.sim.state import IN_FLIGHT

if TYPE_CHECKING:
    from rollplan.sim.engine import Simulator
    from rollplan.sim.events import Event

IDLE_TICKS = 8
"""Interval ticks in a row that found nothing changed since the previous one (no other event handled, no
policy command took effect) and nothing running, after which the simulator stops ticking densely (see the
module docstring). 8 covers two of rollplan's every-4-ticks re-plans; normal replays never get there."""


class ReplanTicks:
    """Interval re-plan ticks and idle detection (see the module docstring)."""

    __slots__ = ("idle_ticks", "mark", "pending", "plans_landed", "sim")

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.pending = False
        self.idle_ticks = 0  # interval ticks in a row that found nothing changed (see on_tick)
        self.mark: tuple[int, ...] = ()
        self.plans_landed = 0  # PLAN_READY events handled (``activity_mark``)

    def activity_mark(self) -> tuple[int, ...]:
        """Counters that move whenever anything happens: events handled (made minus queued), slot changes
        (role, readiness, presence, deadline), trajectory epochs and admissions, the pending queue, completions,
        the batch. Equal marks one tick apart (the tick itself aside) mean nothing happened in between. A plan
        landing (PLAN_READY) is not counted as an event: what it changes moves the other counters, and one
        that changes nothing is no progress (a policy whose every plan fails would otherwise never idle)."""
        sim = self.sim
        q = sim.q
        life, queue = sim.lifecycle, sim.queue
        return (q._seq - len(q._heap) - self.plans_landed, sim.fleet.slot_epoch, life.epoch, sim.kv.admit,
                queue.pseq, queue.n_pending, life.batch_left, life.batch)

    def nothing_runs(self) -> bool:
        """No slot decodes and no trajectory is being prefilled or moved: only clocks (tool waits, switches,
        availability) can change the state, and a re-plan would see the same state at every tick."""
        sim = self.sim
        if any(s.n_run for s in sim.fleet.live):
            return False
        return not any(t.state in IN_FLIGHT for t in sim.lifecycle.trajs)

    def on_tick(self, ev: Event) -> list[Event]:
        self.pending = False
        sim = self.sim
        if not sim.lifecycle.batch_active:
            return []
        mark = self.activity_mark()
        # Idle: since the previous tick nothing but this tick was handled and its policy call changed nothing.
        self.idle_ticks = self.idle_ticks + 1 if mark == self.mark else 0
        self.mark = (mark[0] + 1, *mark[1:])  # the mark the next tick sees if nothing happens
        if self.idle_ticks >= IDLE_TICKS and self.nothing_runs():
            return self.skip_idle()
        out = sim.invoke_policy("interval")
        return out + self.schedule()

    def skip_idle(self) -> list[Event]:
        """The tick after ``IDLE_TICKS`` idle ones: no policy call; the next tick is the first of the same grid
        at or after the next pending event (or the last one before the end time). Nothing pending, work left
        and no end time: ``NoProgressError``."""
        sim = self.sim
        step = sim.replan_interval_s
        heap = sim.q._heap
        end = sim.end_time
        if heap and heap[0][0] <= end and math.isfinite(heap[0][0]):
            k = max(1, math.ceil((heap[0][0] - sim.now) / step))
        elif math.isfinite(end):
            k = math.floor((end - sim.now) / step)  # the last tick dense ticking would reach
            if k < 1:
                sim.recorder.count("idle_ticks_skipped")
                return []
        else:
            raise sim.no_progress_error()
        # Policy calls not made: this tick's and those of the k - 1 ticks not scheduled.
        sim.recorder.count("idle_ticks_skipped", k)
        self.pending = True
        return [sim.q.make(sim.now + k * step, EvKind.REPLAN)]

    def schedule(self) -> list[Event]:
        """The next interval tick, unless one is pending (or ticks are off)."""
        sim = self.sim
        step = sim.replan_interval_s
        if self.pending or not math.isfinite(step) or step <= 0:
            return []
        self.pending = True
        return [sim.q.make(sim.now + step, EvKind.REPLAN)]
