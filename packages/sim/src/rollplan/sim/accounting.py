"""GPU-seconds by category: the ``Simulator``'s component that turns slot transitions into the recorder's
role accounting.

Owns ``cat_counts`` (GPUs per category now) and each slot's ``cat`` / ``cat_since``. A slot's category is
"switching" while its engine starts, wakes, syncs or switches, "off" when present without a role, else its
role; an absent slot has none. ``update`` is called after every change of a slot's role, readiness or
presence (by ``rollplan.sim.fleet.Fleet``); the seconds spent in the previous category are
credited then, times the slot's GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollplan.models.types import Role

if TYPE_CHECKING:
    from rollplan.sim.engine import Simulator
    from rollplan.sim.state import SlotState


class GpuSeconds:
    """Category accounting of GPU-seconds (see the module docstring). Reads the coordinator's clock."""

    __slots__ = ("cat_counts", "rec", "sim")

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.rec = sim.recorder
        self.cat_counts: dict[str, int] = {}

    def reset(self, s: SlotState, now: float) -> None:
        """s (re)joins: no category yet (``update`` gives it one)."""
        s.cat, s.cat_since = "", now

    def category(self, s: SlotState) -> str:
        if not s.present:
            return ""
        if s.ready_at > self.sim.now:
            return "switching"
        return "off" if s.role is Role.OFF else s.role.value

    def flush(self, s: SlotState) -> None:
        """Credit s's GPU-seconds in its category up to now."""
        now = self.sim.now
        if s.cat:
            gs = self.rec.gpu_seconds
            gs[s.cat] = gs.get(s.cat, 0.0) + (now - s.cat_since) * s.tp
        s.cat_since = now

    def update(self, s: SlotState) -> None:
        """s's role, readiness or presence may have changed: move it to its category now."""
        new = self.category(s)
        if new == s.cat:
            return
        self.flush(s)
        counts = self.cat_counts
        if s.cat:
            counts[s.cat] -= s.tp
        if new:
            counts[new] = counts.get(new, 0) + s.tp
        s.cat = new
        self.rec.roles(self.sim.now, counts)

    def close(self, s: SlotState) -> None:
        """s leaves: credit its category up to now and take it out of the counts."""
        self.flush(s)
        if s.cat:
            self.cat_counts[s.cat] -= s.tp
            s.cat = ""
            self.rec.roles(self.sim.now, self.cat_counts)
