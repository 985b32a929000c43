"""KV memory: the ``Simulator``'s component that reserves, releases and evicts trajectories' KV on slots.

Owns each slot's KV fields (``reserved``, ``idle``, ``kv_free``, ``residents``, ``n_res``, ``groups``), a
trajectory's ``slot`` / ``reserved`` / ``sh`` / ``admit_seq`` / ``host``, and the admission counter
(``admit``). Invariants (``tests/sim/test_components.py``): ``kv_free == kv_cap - reserved`` and ``n_res ==
len(residents)`` after every call; ``idle`` equals ``idle_kv`` (the scan); a group's prompt is reserved once per
slot while any of its samples is resident (``SimConfig.share_prompt``). Queries for policies (``need_new``,
``fits_new``, ``prefix_bonus``, ``free_for_new``) read it; nothing here makes events.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rollplan.sim.state import TOOL, WAIT

if TYPE_CHECKING:
    from rollplan.sim.engine import Simulator
    from rollplan.sim.state import SlotState, TrajState


class KvMemory:
    """KV reservations on slots (see the module docstring)."""

    __slots__ = ("_enqueue", "_life", "admit", "evictable", "offload", "rec", "sim", "slots")

    def __init__(self, sim: Simulator) -> None:
        cfg = sim.cfg
        self.sim = sim
        self.rec = sim.recorder
        self.admit = 0  # admissions so far (a trajectory's ``admit_seq``)
        self.evictable = cfg.tool_kv != "pinned"
        self.offload = cfg.tool_kv == "offload"

    def wire(self) -> None:
        sim = self.sim
        self.slots = sim.fleet.slots
        self._life = sim.lifecycle
        self._enqueue = sim.queue.enqueue

    def reset(self, s: SlotState) -> None:
        """s (re)joins: its KV is empty, nothing waits for it."""
        s.reserved = 0
        s.residents.clear()
        s.groups.clear()
        s.idle = 0
        s.kv_free, s.n_res = s.kv_cap, 0
        s.waiting.clear()

    def reserve(self, j: TrajState, s: SlotState, tokens: int) -> None:
        """Reserve ``tokens`` of KV (j's whole context) for j on s; a shared prompt is held once per slot."""
        if j.slot == s.idx:
            tokens -= j.sh
            s.reserved += tokens - j.reserved
            if j.state == TOOL:
                s.idle += tokens - j.reserved
        else:
            if j.slot >= 0:
                self.release(j)
            if j.share:
                # The group's prompt is held once: the first sibling's; the others share up to their own.
                # It is evictable (``s.idle``) while every resident of the group is in a tool call.
                g = s.groups.get(j.group)
                if g is None:
                    g = s.groups[j.group] = [0, j.share, 0]
                    s.reserved += j.share
                was_idle = g[0] > 0 and not g[2]
                g[0] += 1
                if j.state != TOOL:
                    g[2] += 1
                if not g[2] and not was_idle:
                    s.idle += g[1]
                elif was_idle and g[2]:
                    s.idle -= g[1]
                j.sh = min(j.share, g[1])
                tokens -= j.sh
            s.reserved += tokens
            if j.state == TOOL:
                s.idle += tokens
            s.residents[j.idx] = None
            s.n_res = len(s.residents)
            j.slot = s.idx
            self.admit += 1
            j.admit_seq = self.admit
        j.reserved = tokens
        s.kv_free = s.kv_cap - s.reserved

    def release(self, j: TrajState) -> None:
        """Free j's KV reservation on its slot (j keeps nothing there)."""
        if j.slot >= 0:
            s = self.slots[j.slot]
            s.reserved -= j.reserved
            if j.state == TOOL:
                s.idle -= j.reserved
            if j.share:
                g = s.groups[j.group]
                was_idle = not g[2]
                g[0] -= 1
                if j.state != TOOL:
                    g[2] -= 1
                if not g[0]:
                    del s.groups[j.group]
                    s.reserved -= g[1]
                    if was_idle:
                        s.idle -= g[1]
                elif not g[2] and not was_idle:
                    s.idle += g[1]
                j.sh = 0
            s.residents.pop(j.idx, None)
            s.kv_free, s.n_res = s.kv_cap - s.reserved, len(s.residents)
            if j.idx in s.waiting:
                s.waiting.remove(j.idx)
            self.sim.dirty = True
        j.slot = -1
        j.reserved = 0
        j.kv_ok = False

    def to_tool(self, j: TrajState) -> None:
        """j (resident, not in a tool call) goes to one: its KV, and its group's prompt once no sibling here is
        active, becomes evictable."""
        s = self.slots[j.slot]
        s.idle += j.reserved
        if j.share:
            g = s.groups[j.group]
            g[2] -= 1
            if not g[2]:
                s.idle += g[1]

    def from_tool(self, j: TrajState) -> None:
        """j (resident) leaves its tool call keeping its KV: the reverse of ``to_tool``."""
        s = self.slots[j.slot]
        s.idle -= j.reserved
        if j.share:
            g = s.groups[j.group]
            g[2] += 1
            if g[2] == 1:
                s.idle -= g[1]

    def victim(self, s: SlotState, keep: int) -> int | None:
        """The youngest resident of s that is not decoding (in a tool call or waiting), other than ``keep``."""
        trajs = self._life.trajs
        for v in reversed(s.residents):
            if v != keep and trajs[v].state in (TOOL, WAIT):
                return v
        return None

    def idle_victim(self, s: SlotState) -> int | None:
        """The resident in a tool call whose KV a new admission takes first (``tool_kv`` evictable / offload):
        the least recently used, i.e. the one that went to its tool earliest (an engine does not know when a
        tool call will return)."""
        trajs = self._life.trajs
        best, best_t = None, math.inf
        for v in s.residents:
            t = trajs[v]
            if t.state == TOOL and t.tool_t0 < best_t:
                best, best_t = v, t.tool_t0
        return best

    def idle_kv(self, s: SlotState) -> int:
        """KV tokens on ``s`` held by residents in a tool call (evictable unless ``tool_kv`` is "pinned"), by
        a scan: the reference for ``s.idle``, which ``reserve``/``release``/``to_tool``/``from_tool`` keep up to
        date (tests compare the two)."""
        trajs = self._life.trajs
        n = 0
        active: dict[str, int] = {}
        for v in s.residents:
            t = trajs[v]
            if t.state == TOOL:
                n += t.reserved
            if t.share:
                active[t.group] = active.get(t.group, 0) + (t.state != TOOL)
        # A shared prompt is evictable once every resident of its group is in a tool call.
        return n + sum(g[1] for grp, g in s.groups.items() if not active.get(grp, 0))

    def evict(self, v: TrajState) -> None:
        """Preempt v's KV (recompute later), as vLLM does when memory runs out."""
        self.rec.count("evictions")
        if v.state == TOOL:
            v.evicted_from = v.slot
            self.release(v)
            if self.offload:
                v.host = True
        else:
            self.release(v)
            self._enqueue(v)

    def evict_idle_for(self, dst: SlotState, j: TrajState) -> None:
        """Evict residents of ``dst`` in tool calls (LRU first) until j's context fits there, as an engine does
        for a new request (evictable ``tool_kv`` only)."""
        trajs = self._life.trajs
        while self.evictable and dst.kv_cap - dst.reserved + self.prefix_bonus(dst, j) < j.ctx:
            victim = self.idle_victim(dst)
            if victim is None:
                break
            self.evict(trajs[victim])

    # -- queries (policies read these) ------------------------------------------------------------------------
    def need_new(self, j: TrajState) -> int:
        """KV tokens pending ``j``'s next turn takes (a slot admits it when its free KV minus the admission
        watermark covers this)."""
        k = j.turn
        return j.ctx + (0 if j.pf_done else j.pf[k]) + math.ceil(j.dec[k] - j.dec_done)

    def fits_new(self, s: SlotState, j: TrajState) -> bool:
        """Whether pending ``j`` could start its next turn on ``s`` now (KV, with the admission watermark)."""
        return self.free_for_new(s) + self.prefix_bonus(s, j) >= self.need_new(j)

    def prefix_bonus(self, s: SlotState, j: TrajState) -> int:
        """KV tokens of j's context already held on ``s`` for its group (``share_prompt``): the group's prompt
        (up to j's own) when any resident of its group is there, j itself included (held once per slot)."""
        if not j.share:
            return 0
        g = s.groups.get(j.group)
        return min(j.share, g[1]) if g is not None else 0

    def sibling_prompt(self, j: TrajState, s: SlotState) -> int:
        """Prompt tokens j can take from a resident sibling's KV on ``s`` (0 unless ``share_prompt``)."""
        if not j.share:
            return 0
        g = s.groups.get(j.group)
        if g is None or g[0] - (1 if j.slot == s.idx else 0) <= 0:
            return 0
        return min(j.share, g[1])

    def free_for_new(self, s: SlotState) -> int:
        """KV tokens a new admission may take on ``s`` (free KV minus the admission watermark)."""
        if self.evictable:
            return s.kv_cap - s.reserved - s.watermark + s.idle
        return s.kv_cap - s.reserved - s.watermark
