"""Trajectory lifecycle: the ``Simulator``'s component that moves each trajectory of the batch through its
turns.

Owns the batch (``trajs``, ``batch``, ``batch_start``, ``batch_left``, ``batch_active``), the trajectory epoch
counter (``epoch``: unique over the replay, so a stale event of an earlier state or batch never matches), the
segment index (``folds``), the speculative groups and every trajectory field but the KV and prefill-queue ones
(``rollplan.sim.state``), and each slot's ``waiting`` queue. A trajectory goes PENDING (``PendingQueue``) ->
WAIT on a slot -> PREFILL (on the pool) or straight to RUN (``Batching``) -> its segment's end: TOOL, its
next segment, or DONE; a slot leaving, a role change or a migration displaces it (MOVE while its KV travels).

Its handlers (SEG_DONE, JOIN, TOOL_DONE) and methods return the events they cause; policy commands
(``migrate``) put theirs in the coordinator's ``out``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollplan.models.types import Role
from rollplan.sim.state import DECODING, DONE, JOIN_K, MOVE, PREFILL, RUN, TOOL, TOOL_DONE_K, WAIT, TrajState

if TYPE_CHECKING:
    from rollplan.sim.batching import Batching
    from rollplan.sim.dispatch import PendingQueue
    from rollplan.sim.engine import FoldIndex, SimTraj, Simulator
    from rollplan.sim.events import Event
    from rollplan.sim.kv import KvMemory
    from rollplan.sim.prefill_pool import PrefillPool
    from rollplan.sim.state import SlotState

Segment = tuple[int, int, int, int, float, int, int]
"""A planned segment: (P0, cached, m, D, W_fold, ctx0, ctx_end) (``Lifecycle.plan_segment``)."""


class Lifecycle:
    """The batch's trajectories and their course (see the module docstring)."""

    def __init__(self, sim: Simulator) -> None:
        cfg = sim.cfg
        self.sim = sim
        self.q = sim.q
        self.rec = sim.recorder
        self.trajs: list[TrajState] = []
        self.batch = -1
        self.batch_start = 0.0
        self.batch_left = 0
        self.batch_active = False
        self.epoch = 0
        self.fold = cfg.fold_tool_s
        self.folds: dict[int, tuple[SimTraj, FoldIndex]] = {}  # id(spec) -> FoldIndex (see plan_segment)
        self.share = cfg.share_prompt
        self.spec_k = cfg.spec_tokens
        self.spec_groups: dict[str, list[int]] = {}  # group -> its trajectories in this batch (speculation)
        self.spec_done: dict[str, int] = {}  # group -> its finished trajectories in this batch
        self.divide = cfg.divide_tokens  # decode tokens per chunk (divided rollout; 0: off)
        self.back_to_slot = cfg.evicted_return == "slot" and cfg.tool_kv == "evictable"
        self.chunk_move = getattr(sim.policy, "chunk_move", None)

    def wire(self) -> None:
        sim = self.sim
        self.slots = sim.fleet.slots
        self.kv: KvMemory = sim.kv
        self.batching: Batching = sim.batching
        self.pool: PrefillPool = sim.prefill_pool
        self.queue: PendingQueue = sim.queue
        self._enqueue = sim.queue.enqueue
        self._reserve = sim.kv.reserve
        self._release = sim.kv.release
        self._prefix_bonus = sim.kv.prefix_bonus
        self._add = sim.batching.add
        self._reschedule = sim.batching.reschedule

    def new_epoch(self) -> int:
        """A fresh trajectory epoch, unique over the whole replay: a stale event of a finished batch can never
        match a trajectory of the next one (indices are reused across batches)."""
        self.epoch += 1
        return self.epoch

    def start_batch(self, index: int, specs: Sequence[SimTraj], keys: Sequence[str]) -> None:
        """Batch ``index`` starts now: its trajectories, all pending (segment index and prefill prices primed)."""
        sim = self.sim
        self.batch = index
        self.batch_start = sim.now
        self.batch_active = True
        trajs = self.trajs = [TrajState(i, sp, index, keys[i]) for i, sp in enumerate(specs)]
        if self.spec_k:
            self.spec_groups = {}
            self.spec_done = {}
            for t in trajs:
                self.spec_groups.setdefault(t.group, []).append(t.idx)
            for t in trajs:
                t.spec_a = self.spec_group_acceptance(len(self.spec_groups[t.group]), 0)
        if self.share:
            for t in trajs:
                t.share = t.spec.prompt_tokens
        slots = self.slots
        for perf in {id(s.perf): s.perf for s in slots}.values():
            perf.prime(specs)
        if slots:
            self.folds = slots[0].perf.prime_folds(specs, self.fold)
        self.queue.reset()
        for t in trajs:
            self._enqueue(t)
        self.batch_left = len(trajs)

    # -- segments -----------------------------------------------------------------------------------------------
    def plan_segment(self, j: TrajState, s: SlotState, room: int) -> Segment | None:
        """The segment j would run next on s: (P0, cached, m, D, W_fold, ctx0, ctx_end); None when even its
        next turn does not fit ``room`` KV tokens."""
        pf, dec_, tool = j.pf, j.dec, j.tool
        k = j.turn
        new = 0 if j.pf_done else pf[k]
        if j.kv_ok and j.slot == s.idx:
            cached, p0 = j.ctx, new
        else:
            # Without its own KV: a resident sibling's prompt is reused (prefix cache), the rest prefilled.
            cached = self.kv.sibling_prompt(j, s)
            p0 = j.ctx + new - cached
        ctx0 = j.ctx + new
        dec = dec_[k] - j.dec_done
        ctx_end = ctx0 + math.ceil(dec)
        if ctx_end > room:
            return None
        hit = self.folds.get(id(j.spec)) if j.dec_done == 0.0 else None
        if hit is not None and hit[0] is j.spec:
            # Fast path (a turn not started yet, whose spec was indexed at batch start): the same segment as
            # the walk below, found from prefix sums: the last turn m <= idx.last[k] whose context still fits
            # ``room`` (contexts only grow along the turns); decode tokens summed exactly as integers. Only
            # the folded tool seconds are still added one by one, in the walk's order (float sums).
            idx = hit[1]
            off = idx.off
            grow = idx.grow
            m = idx.last[off + k]
            if m > k:
                limit = room - ctx_end + grow[off + k]  # turns up to m fit while grow[off + m] <= limit
                if grow[off + m] > limit:
                    m = bisect_right(grow, limit, off + k, off + m) - 1 - off
                ctx_end += grow[off + m] - grow[off + k]
            w = 0.0
            for x in tool[k:m]:
                w += x
            return p0, cached, m, idx.cdec[off + m] - idx.cdec[off + k] + dec_[k], w, ctx0, ctx_end
        d = dec
        w = 0.0
        m = k
        fold = self.fold
        n = j.n
        while m + 1 < n and tool[m] <= fold:
            nxt = ctx_end + pf[m + 1] + dec_[m + 1]
            if nxt > room:
                break
            w += tool[m]
            ctx_end = nxt
            d += dec_[m + 1]
            m += 1
        return p0, cached, m, int(d) if d == int(d) else d, w, ctx0, ctx_end  # type: ignore[return-value]

    def try_start(self, j: TrajState, s: SlotState) -> list[Event]:
        """j (ready to run its next turn) on s: join, queue for prefill, or wait for KV."""
        sim = self.sim
        now = sim.now
        kv = self.kv
        if not s.present or s.role not in DECODING:
            return self.displace(j, lose_kv=True)
        if s.ready_at > now:
            if j.slot != s.idx:
                self._reserve(j, s, j.ctx)
            j.state = WAIT
            if j.idx not in s.waiting:
                s.waiting.append(j.idx)
            return []
        own = j.reserved if j.slot == s.idx else 0
        room = s.kv_cap - s.reserved + own + self._prefix_bonus(s, j)
        if j.slot != s.idx:
            room -= s.watermark
        seg = self.plan_segment(j, s, room)
        if seg is None and j.slot != s.idx and kv.evictable:
            while seg is None:
                victim = kv.idle_victim(s)
                if victim is None:
                    break
                kv.evict(self.trajs[victim])
                room = s.kv_cap - s.reserved - s.watermark + self._prefix_bonus(s, j)
                seg = self.plan_segment(j, s, room)
        if seg is not None and j.host and j.slot != s.idx:
            # Its KV is in the host tier: load it (the slot holds the room meanwhile), then run. A prompt a
            # resident sibling holds here is matched on the GPU, so only the rest of the context is loaded.
            load = j.ctx - kv.sibling_prompt(j, s)
            self._reserve(j, s, j.ctx)
            j.state = MOVE
            j.epoch = self.new_epoch()
            self.rec.count("kv_reloads")
            self.rec.count("kv_reload_tokens", load)
            return [self.q.make(now + s.perf.transfer(load, False), JOIN_K, j.idx, j.epoch)]
        while seg is None and j.slot == s.idx:
            victim = kv.victim(s, j.idx)
            if victim is None:
                break
            kv.evict(self.trajs[victim])
            room = s.kv_cap - s.reserved + j.reserved + self._prefix_bonus(s, j)
            seg = self.plan_segment(j, s, room)
        if seg is None:
            if j.slot != s.idx:  # a new admission that does not fit: back to the policy
                self._enqueue(j)
                return []
            j.state = WAIT
            if j.idx not in s.waiting:
                s.waiting.append(j.idx)
            return []
        if j.idx in s.waiting:
            s.waiting.remove(j.idx)
        return self.start_segment(j, s, seg)

    def start_segment(self, j: TrajState, s: SlotState, seg: Segment) -> list[Event]:
        p0, cached, m, d, w, ctx0, ctx_end = seg
        now = self.sim.now
        perf = s.perf
        j.seg_rrho = 0.0
        j.seg_rtok = 0.0
        self._reserve(j, s, ctx_end)
        if j.t_start < 0:
            j.t_start = now
        k = j.turn
        j.seg_k, j.seg_m, j.seg_D, j.seg_W = k, m, float(d), w
        # Divided rollout: the segment (planned, KV reserved and priced per step as without division) runs at
        # most one chunk here. The part of its first prefill the chunk's steps do not pay is owed to the next
        # segment on this KV (``pf_owed``); the folded later turns' prefill is fluid, as when a move interrupts.
        run = j.seg_run = j.seg_D if not self.divide or j.seg_D <= self.divide else float(self.divide)
        owed, owed_tok = j.pf_owed, j.pf_owed_tok
        if owed:
            j.pf_owed, j.pf_owed_tok = 0.0, 0.0
            if cached != j.ctx or s.role is Role.DECODE:  # prefilled again here (or on the pool): nothing owed
                owed, owed_tok = 0.0, 0.0
        j.seg_ctx0, j.seg_ctx_end, j.seg_dec0 = ctx0, ctx_end, j.dec_done
        # Prefill seconds of the folded later turns' new tokens (over their natural contexts), then of the first
        # prefill before j's next decode step; the common cases from j's memoised turn prices (one lookup).
        prices = None
        if m > k:
            prices = perf.spec_prefill(j.spec)
            cum, cum_tok = prices[1], prices[2]
            later_s, later_tok = cum[m] - cum[k], cum_tok[m] - cum_tok[k]
            # What the recorder counts: a segment after a cut re-plans turns whose tokens the cut segment's plan
            # already recorded (its seconds stay fluid, spread over each plan's steps); each turn counts once.
            rec_tok = later_tok if j.pf_rec <= k else cum_tok[m] - cum_tok[min(m, j.pf_rec)]
            if run < j.seg_D and m > j.pf_rec:
                j.pf_rec = m
        else:
            later_s, later_tok = 0.0, 0
            rec_tok = 0
        if p0 <= 0:
            first = 0.0
        elif cached == 0 and k == 0 and not j.pf_done:
            first = (prices or perf.spec_prefill(j.spec))[0]
        elif cached and k > 0 and not j.pf_done and p0 == j.pf[k]:
            cum = (prices or perf.spec_prefill(j.spec))[1]
            first = cum[k] - cum[k - 1]
        else:
            first = perf.prefill(p0, cached)
        if s.role is Role.DECODE:
            pool = self.pool
            ps = pool.pick(first)
            if ps is not None:
                # The folded later turns' prefill runs on the PREFILL pool while j decodes: a fluid load of
                # ``seg_rrho`` prefill-seconds per decode step (the pool's share of time it takes slows the queue
                # of first prefills); its latency adds to j's wait.
                if later_s > 0:
                    j.seg_rrho = later_s / j.seg_D if j.seg_D > 0 else 0.0
                    j.seg_W += later_s / pool.free() + ps.perf.transfer(later_tok, ps.node == s.node)
                    if rec_tok:
                        self.rec.prefill(now, rec_tok)
                        tau = s.tau if s.n_run else perf.decode(1, ctx0)
                        self.rec.span("prefill", now, now + j.seg_D * tau + w, rec_tok)
                j.seg_rho = 0.0
                if p0 > 0:
                    j.state = PREFILL
                    self.rec.prefill(now, p0)
                    self.rec.span("prefill", now, now, p0)
                    j.prefilled += p0
                    return pool.submit(j, ps, first, p0)
                j.kv_ok = True
                return self.join(j, s)
            # no PREFILL slot: the DECODE slot prefills itself, as a MIXED one
        f = later_s + first
        if owed:
            f += owed
        j.seg_rho = f / j.seg_D if j.seg_D > 0 else 0.0
        j.seg_rtok = (p0 + later_tok + owed_tok) / j.seg_D if j.seg_D > 0 else 0.0
        if run < j.seg_D:
            left = 1.0 - run / j.seg_D
            j.pf_owed, j.pf_owed_tok = (first + owed) * left, (p0 + owed_tok) * left
        if p0 or rec_tok:
            rec = self.rec
            rec.prefill(now, p0 + rec_tok)
            if rec.track_rates:
                rec.span("prefill", now, now, p0)
                tau = s.tau if s.n_run else perf.decode(1, ctx0)
                rec.span("prefill", now, now + j.seg_D * tau + w, rec_tok)
            j.prefilled += p0
        j.kv_ok = True
        return self.join(j, s)

    def join(self, j: TrajState, s: SlotState) -> list[Event]:
        """j starts decoding its planned segment on s now."""
        j.pf_done = True
        j.state = RUN
        self.epoch += 1  # self.new_epoch(), inlined
        j.epoch = self.epoch
        return self._add(j, s)

    def interrupt(self, j: TrajState) -> None:
        """Stop j's running segment now; keep its token progress (KV stays where it is)."""
        steps = self.batching.stop(j, self.slots[j.slot])
        self.advance(j, steps)
        j.state = WAIT  # caller decides

    def advance(self, j: TrajState, steps: float) -> None:
        """Credit ``steps`` decode steps of j's running segment (which j has left): its position (turn, tokens
        decoded in it, context), the tool seconds of the folded turns it finished (owed, waited later) and the
        tokens to the recorder; its KV stays where it is."""
        pf, dec, tool = j.pf, j.dec, j.tool
        k, m = j.seg_k, j.seg_m
        first = dec[k] - j.seg_dec0
        ctx = j.seg_ctx0
        owed = 0.0
        if steps < first or k == m:
            j.turn, j.dec_done = k, j.seg_dec0 + min(steps, first)
            ctx += min(steps, first)
        else:
            left = steps - first
            ctx += first
            owed = tool[k]
            i = k + 1
            while True:
                ctx += pf[i]
                n = dec[i]
                if left < n or i == m:
                    j.turn, j.dec_done = i, min(left, n)
                    ctx += min(left, n)
                    break
                left -= n
                ctx += n
                owed += tool[i]
                i += 1
        j.ctx = round(ctx)
        j.pf_done = True
        j.owed_tool += owed
        if steps > 0:
            now = self.sim.now
            self.rec.tokens(now, steps, j.seg_t0)
            self.rec.span("decode", j.seg_t0, now, steps)
            j.decoded += steps

    def displace(self, j: TrajState, *, lose_kv: bool) -> list[Event]:
        """Take j off its slot (KV lost when ``lose_kv``); it continues its tool or goes back to the policy."""
        if j.state == RUN:
            s = self.slots[j.slot]
            self.interrupt(j)
            out = self._reschedule(s)
        else:
            out = []
        if j.state in (PREFILL, MOVE):
            j.epoch = self.new_epoch()
        if lose_kv and j.slot >= 0:
            self.rec.count("kv_lost")
            self._release(j)
        if j.state == TOOL:
            return out
        if j.owed_tool > 0:
            return out + self.go_tool(j, j.owed_tool)
        self._enqueue(j)
        return out

    def go_tool(self, j: TrajState, seconds: float) -> list[Event]:
        j.owed_tool = 0.0
        if j.slot >= 0 and j.state != TOOL:
            self.kv.to_tool(j)
        j.state = TOOL
        self.epoch += 1  # self.new_epoch(), inlined
        j.epoch = self.epoch
        sim = self.sim
        now = sim.now
        j.tool_t0 = now
        if self.kv.evictable and j.slot >= 0 and self.queue.n_pending:
            sim.dirty = True  # its KV just became evictable: a queued admission may fit now
        until = j.tool_until = now + seconds
        return [self.q.make(until, TOOL_DONE_K, j.idx, j.epoch)]

    def complete(self, j: TrajState) -> list[Event]:
        sim = self.sim
        now = sim.now
        j.state = DONE
        j.t_done = now
        self.rec.traj_done(j.batch, now - self.batch_start, now, sum(j.dec))
        sim.policy.on_traj_done(sim, j.idx)
        self.batch_left -= 1
        out = self.spec_sibling_done(j) if self.spec_k else []
        if self.batch_left == 0 and self.batch_active:
            self.batch_active = False
            self.rec.batch_done(self.batch, now)
            return out + sim.driver.on_batch_done(sim)
        return out

    def spec_group_acceptance(self, size: int, done: int) -> float:
        cfg = self.sim.cfg
        if size <= 1:
            return cfg.spec_base_acceptance
        return cfg.spec_base_acceptance + (cfg.spec_acceptance - cfg.spec_base_acceptance) * done / (size - 1)

    def spec_sibling_done(self, j: TrajState) -> list[Event]:
        """j finished: its group's acceptance rises (SimConfig docstring); running siblings' slots re-time."""
        members = self.spec_groups.get(j.group)
        if not members or len(members) <= 1:
            return []
        done = self.spec_done[j.group] = self.spec_done.get(j.group, 0) + 1
        a = self.spec_group_acceptance(len(members), done)
        out: list[Event] = []
        for idx in members:
            t = self.trajs[idx]
            if t.state == DONE or t.spec_a == a:
                continue
            if t.state == RUN and t.slot >= 0:
                out += self.batching.set_acceptance(t, self.slots[t.slot], a)
            else:
                t.spec_a = a
        return out

    def drain_waiting(self, s: SlotState) -> list[Event]:
        out: list[Event] = []
        if not s.waiting or s.ready_at > self.sim.now:
            return out
        for jdx in list(s.waiting):
            if jdx not in s.waiting:  # evicted by an earlier admission of this loop
                continue
            j = self.trajs[jdx]
            if j.state != WAIT or j.slot != s.idx:
                s.waiting.remove(jdx)
                continue
            out += self.try_start(j, s)
            if j.state == WAIT:
                break  # FIFO: the head waits for memory
        return out

    def chunk_done(self, j: TrajState, s: SlotState) -> list[Event]:
        """j decoded a whole chunk on s (divided rollout; it has left s's batch): credit it, then ask the
        policy where its next chunk runs (``chunk_move``): on s with its KV (no cost), or moved by KV transfer
        (``move_kv``, migrate's path) or by re-prefill on the new slot (its KV here dropped)."""
        self.advance(j, j.seg_run)
        j.state = WAIT
        self.rec.count("chunks")
        move = self.chunk_move(self.sim, j.idx) if self.chunk_move is not None else None
        if move is None or move[0] == s.idx:
            return self.try_start(j, s)
        dst = self.slots[move[0]]
        if move[1]:
            # As for a new request, the engine may evict the KV of residents in tool calls to take it in.
            self.kv.evict_idle_for(dst, j)
            if self.move_kv(j, dst, "chunk_moves_kv"):
                return []
        self.rec.count("chunk_moves_reprefill")
        self._release(j)
        out = self.drain_waiting(s)
        j.state = WAIT
        return out + self.try_start(j, dst)

    # -- handlers -----------------------------------------------------------------------------------------------
    def on_seg_done(self, ev: Event) -> list[Event]:
        s = self.slots[ev[3]]  # (time, kind, seq, slot index, slot version)
        if ev[4] != s.version or not s.present:
            return []
        done = self.batching.pop_done(s)
        if not done:
            return self._reschedule(s)
        out: list[Event] = []
        freed = to_tool = False
        rec = self.rec
        now = self.sim.now
        for j in done:
            if j.seg_run < j.seg_D:  # a chunk of a divided segment: back to the dispatcher
                out += self.chunk_done(j, s)
                continue
            rec.tokens(now, j.seg_D, j.seg_t0)
            if rec.track_rates:
                rec.span("decode", j.seg_t0, now, j.seg_D)
            j.decoded += j.seg_D
            m = j.seg_m
            j.turn, j.dec_done, j.pf_done, j.ctx, j.kv_ok = m + 1, 0.0, False, j.seg_ctx_end, True
            wait = j.seg_W + j.tool[m] + j.owed_tool
            j.owed_tool = 0.0
            if j.turn >= j.n:
                self._release(j)
                freed = True
                j.final = True
                out += self.go_tool(j, wait) if wait > 0 else self.complete(j)
            elif wait > 0:
                out += self.go_tool(j, wait)
                to_tool = True
            else:
                j.state = WAIT
                out += self.try_start(j, s)
        out += self._reschedule(s)
        if freed:
            out += self.drain_waiting(s)
            self.sim.dirty = True
        elif to_tool and s.waiting:
            # A resident waiting on a tool may now be evicted for the head of the slot's queue (an engine
            # retries its waiting requests every step; without this the head waited for a completion).
            out += self.drain_waiting(s)
        return out

    def on_join(self, ev: Event) -> list[Event]:
        j = self.trajs[ev[3]]  # (time, kind, seq, trajectory, epoch)
        if j.epoch != ev[4]:
            return []
        s = self.slots[j.slot] if j.slot >= 0 else None
        if s is None or not s.present:
            return self.displace(j, lose_kv=True)
        if j.state == PREFILL:
            j.kv_ok = True
            if s.ready_at > self.sim.now or not s.role.decodes:
                j.state = WAIT
                return self.try_start(j, s)
            return self.join(j, s)
        if j.state == MOVE:
            j.kv_ok = True
            j.host = False
            if j.owed_tool > 0:
                return self.go_tool(j, j.owed_tool)
            j.state = WAIT
            return self.try_start(j, s)
        return []

    def on_tool_done(self, ev: Event) -> list[Event]:
        j = self.trajs[ev[3]]  # (time, kind, seq, trajectory, epoch)
        if j.epoch != ev[4] or j.state != TOOL:
            return []
        if j.final:
            return self.complete(j)
        now = self.sim.now
        if j.slot >= 0 and (j.kv_ok or j.move_ready > now):
            self.kv.from_tool(j)  # it leaves its tool call, keeping its KV
        if j.move_ready > now and j.slot >= 0:
            j.state = MOVE
            j.epoch = self.new_epoch()
            return [self.q.make(j.move_ready, JOIN_K, j.idx, j.epoch)]
        if j.slot >= 0 and j.kv_ok:
            j.state = WAIT
            return self.try_start(j, self.slots[j.slot])
        if j.slot >= 0:
            self._release(j)
        home, j.evicted_from = j.evicted_from, -1
        if self.back_to_slot and home >= 0:
            s = self.slots[home]
            if s.present and s.role in DECODING:
                # The executor sends the turn to the engine that evicted its KV (it never learns of the
                # eviction): it waits there for KV, the slot holding its context, and re-prefills it.
                j.state = WAIT
                self._reserve(j, s, j.ctx)
                return self.try_start(j, s)
        self._enqueue(j)
        return []

    # -- policy commands and queries -------------------------------------------------------------------------
    def migrate(self, j: int, target: int, *, by_kv: bool) -> bool:
        """Policy command: move trajectory ``j`` to slot ``target``, by KV transfer or by re-prefill there.

        Returns False (nothing done) when j has no KV anywhere (then it is only marked ``preferred``), is
        in flight (prefill/transfer), or the target cannot take its KV now."""
        t = self.trajs[j]
        dst = self.slots[target]
        if t.state == DONE or not dst.present or not dst.role.decodes:
            return False
        t.preferred = target
        if t.slot == target or t.slot < 0 or not t.kv_ok or t.state in (PREFILL, MOVE):
            return False
        if by_kv:
            return self.move_kv(t, dst, "migrations_kv")
        self.rec.count("migrations_reprefill")
        src = self.slots[t.slot]
        out = self.sim.out
        out.extend(self.displace(t, lose_kv=True))
        out.extend(self.drain_waiting(src))
        return True

    def move_kv(self, t: TrajState, dst: SlotState, counter: str) -> bool:
        """Move t's KV (on its slot, ``kv_ok``) to ``dst`` by transfer: ``FastPerf.transfer`` seconds over the
        link between the two (same node or not), during which t is in MOVE (or keeps its tool call); the
        room is held on ``dst`` from now. False (nothing done) when ``dst`` cannot hold t's context now.
        Counted as ``counter``; its GPU-seconds as migration GPU-seconds. Events go to the coordinator's
        ``out``."""
        if dst.kv_cap - dst.reserved + self._prefix_bonus(dst, t) < t.ctx:
            return False
        sim = self.sim
        src = self.slots[t.slot]
        if t.state == RUN:
            self.interrupt(t)
            sim.out.extend(self._reschedule(src))
        self.queue.dequeue(t)
        xfer = src.perf.transfer(t.ctx, src.node == dst.node)
        was_tool = t.state == TOOL
        self._release(t)
        self._reserve(t, dst, t.ctx)
        self.rec.count(counter)
        self.rec.gpu_seconds_migrate(xfer * src.tp)
        sim.out.extend(self.drain_waiting(src))
        if was_tool:
            t.kv_ok = True
            t.move_ready = sim.now + xfer
            return True
        t.state = MOVE
        t.epoch = self.new_epoch()
        sim.out.extend([self.q.make(sim.now + xfer, JOIN_K, t.idx, t.epoch)])
        return True

    def progress(self, j: TrajState) -> tuple[float, int, float, int]:
        """(tokens decoded so far, turns finished, tool seconds of finished turns, context now) of j, as an
        observer sees it (for RUN: the part of its segment done by now)."""
        if j.state != RUN:
            done_turns = j.turn
            return j.decoded, done_turns, sum(j.tool[:done_turns]), j.ctx
        s = self.slots[j.slot]
        v = s.V + (max(0.0, self.sim.now - s.t_ref) / s.tau if s.n_run else 0.0)
        steps = min(j.seg_run, max(0.0, v - j.seg_V0))
        k, m = j.seg_k, j.seg_m
        left = steps - (j.dec[k] - j.seg_dec0)
        turns = k
        ctx = j.seg_ctx0 + steps
        while left >= 0 and turns < m:
            turns += 1
            ctx += j.pf[turns]
            left -= j.dec[turns]
        return j.decoded + steps, turns, sum(j.tool[:turns]), int(ctx)

    def credit_running(self) -> None:
        """End of the replay: credit the part of every running segment done by now (tokens, not position)."""
        now = self.sim.now
        rebase = self.batching.rebase
        for s in self.slots:
            if s.present and s.n_run:
                rebase(s, now)
                for _fv, _seq, j, ep in list(s.heap):
                    t = self.trajs[j]
                    if t.epoch == ep and t.state == RUN:
                        steps = min(t.seg_run, max(0.0, s.V - t.seg_V0))
                        if steps > 0:
                            self.rec.tokens(now, steps, t.seg_t0)
                            t.decoded += steps
