"""The ``greedy`` backend: closed-form role sizing + longest-first placement + local search.

Always run by ``plan()`` (it is the fallback and the hint of the exact backends), so it must be fast:
O(|J| log |S| + |J| K) per placement round (K = distinct slot types), a few rounds per solve.

1. Role configurations (``candidate_configs``). Usable slots (deadline None or after their start) ranked by
   start cost. A fluid estimate (``_fluid``: water-filling of the total work over the slots' start times,
   deadlines capping each slot's window, + the longest critical paths + lambda * switching) prices: the
   current roles ("keep"); every on slot MIXED; that plus the cheapest off slots in growing prefixes (warm,
   then sleeping, then cold: a slot is turned on only when the makespan it saves pays its start cost); and
   P:D splits of the best set, the PREFILL count sized by prefill vs decode work. The best few by estimate
   are placed for real (every one on small instances).
2. Placement (``place``), for each configuration the better objective of: (a) homes first (a slot keeps its
   own trajectories within the fluid target: longest first on free slots, shortest first on deadline
   slots), the rest longest first onto the earliest-finishing free slot (one heap per slot type x role),
   then deadline windows filled with the shortest trajectories of the makespan slot (``_fill_windows``);
   (b) from scratch, longest first, each to the candidate with the least finish increase within a target
   makespan (clusters long trajectories: a slot already running a longer one pays only c_s D_j), the target
   bisected between the lower bound and the best makespan found (``_place_searching``).
3. Local search (``improve``): moves off the makespan slot to the least loaded slots of its role, or onto the
   cheapest OFF slot (turned on), while makespan - lambda * switching improves; then ``go_home`` sends moved
   trajectories back home where the home stays below the makespan. Stops at a local optimum, at the budget,
   or when the makespan meets the lower bound.

Every candidate is priced with the ``evaluate`` formula (incrementally, ``_State``); ``plan()`` re-prices the
chosen decision with ``evaluate`` itself.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.actions import release_idle
from rollplan.solver.backends.base import Decision
from rollplan.solver.bounds import (
    ROLE_CODE,
    InstanceArrays,
    capped_waterfill,
    critical_path_bound,
    instance_arrays,
    type_work,
    work_bound,
)
from rollplan.solver.evaluate import waterfill_finish
from rollplan.solver.instance import MAX_NUM_SEQS, Instance

log = logging.getLogger(__name__)

NAME = "greedy"
FULL_CONFIGS = 3
"""Role configurations placed for real (the best by fluid estimate; "keep" always among them)."""
HOME_SLACK = 1e-9
CLOSE_ENOUGH = 1e-3
"""Relative distance to the lower bound at which the greedy stops searching."""
TARGET_ROUNDS = 6
TARGET_ROUNDS_LARGE = 3
"""Placements per configuration while searching the target (small / large instances)."""
LARGE = 6000
"""Above this many (trajectory x slot type) pairs only the two best-estimated configurations are placed."""
SMALL = 2000
"""Up to this many (trajectory x configuration) pairs every scored configuration is placed for real."""
STALL_GAIN = 1e-3
"""A target-search round gaining less than this share of the objective ends the search (with the
co-running term the lower bound is often unreachable, and bisecting towards it only spends time)."""
CODE_ROLE = {0: Role.OFF, 1: Role.MIXED, 2: Role.PREFILL, 3: Role.DECODE}
LONGEST = 32
"""Longest trajectories whose critical paths the fluid estimate checks."""


def top_two(slots: Sequence[int], finish: Sequence[float]) -> tuple[int, float, float]:
    """One pass over ``slots``: (the slot that finishes last, its finish, the runner-up finish); (-1, -inf, -inf)
    when ``slots`` is empty. Both local searches (here and ``repair``) start from the makespan slot."""
    worst, cur, second = -1, -math.inf, -math.inf
    for s in slots:
        f = finish[s]
        if f > cur:
            worst, cur, second = s, f, cur
        elif f > second:
            second = f
    return worst, cur, second



@dataclass(frozen=True, slots=True)
class _Type:
    """Slots sharing every perf-derived coefficient."""

    a: float
    c: float
    mu: float
    kv_capacity: float
    tau_ref: float
    cross: float
    phic: float
    """phi c: each decode token on a slot of this type adds this to its critical trajectory's path."""


class _Prep:
    """Per-instance precomputation shared by every configuration (per trajectory x slot type).

    Numbers are computed with numpy, then kept as Python lists: the placement loop indexes scalars.
    """

    def __init__(self, inst: Instance, arrays: InstanceArrays | None = None) -> None:
        x = arrays if arrays is not None else instance_arrays(inst)
        self.inst = inst
        self.x = x
        self.slot_type: list[int] = x.type_of.tolist()
        self.types = [
            _Type(float(x.a[r]), float(x.c[r]), float(x.mu[r]), float(x.kv[r]), float(x.tau[r]), float(x.cross[r]),
                  inst.phi * float(x.c[r]))
            for r in x.rep
        ]
        n_types = len(self.types)
        self.decode: list[float] = x.D.tolist()
        self.prefill: list[float] = x.P.tolist()
        dec, fit = type_work(x)
        self.occ: list[list[float]] = []
        self.mix_extra: list[list[float]] = []
        self.dec_extra: list[list[float]] = []
        self.q_mix: list[list[float]] = []
        self.q_dec: list[list[float]] = []
        self.fits: list[list[bool]] = [f.tolist() for f in fit]
        self.fits_a = fit
        work = np.empty_like(dec)
        cp_all = np.empty_like(dec)
        qm_all = np.empty_like(dec)
        qd_all = np.empty_like(dec)
        occ_a = np.empty_like(dec)
        mix_a = np.empty_like(dec)
        dec_a = np.empty_like(dec)
        for k, ty in enumerate(self.types):
            mix = x.P / ty.mu
            occ_a[k] = _occ_steps(x, ty)
            mix_a[k] = mix
            dec_a[k] = x.P / ty.cross
            self.occ.append(occ_a[k].tolist())
            self.mix_extra.append(mix.tolist())
            self.dec_extra.append(dec_a[k].tolist())
            cp_all[k] = x.D * (ty.a + ty.c) + x.W + mix
            # Q_j on a MIXED / DECODE slot of this type: as evaluate computes it.
            qm_all[k] = cp_all[k] - (ty.phic * x.D + inst.phi * mix)
            qd_all[k] = cp_all[k] - (ty.phic * x.D + inst.phi * dec_a[k])
            self.q_mix.append(qm_all[k].tolist())
            self.q_dec.append(qd_all[k].tolist())
            work[k] = dec[k] + mix
        # The same tables as arrays (type x trajectory), for the vectorised passes. ``cp_a``: CP_j at batch 1
        # (ordering, estimates); ``q_mix``/``q_dec``: Q_j by role, what a slot's finish takes the max of.
        self.occ_a, self.mix_a, self.dec_a, self.cp_a = occ_a, mix_a, dec_a, cp_all
        self.qm_a, self.qd_a = qm_all, qd_all
        self.phi = inst.phi
        # Move seconds m_js (Instance.move_seconds, inlined): per-j home and context, per-slot rates and node.
        self.home: list[int] = x.home.tolist()
        self.context: list[float] = x.ctx.tolist()
        self.slot_node = [sl.node for sl in inst.slots]
        self.home_node = [self.slot_node[h] if h >= 0 else "" for h in self.home]
        self.same_rate: list[float] = x.same.tolist()
        self.cross_rate: list[float] = x.cross.tolist()
        self.slot_mu: list[float] = x.mu.tolist()
        # Longest first: by critical path on the type most slots have, then by work.
        if n_types and inst.trajs:
            ref = int(np.bincount(x.type_of, minlength=n_types).argmax())
            self.order: list[int] = np.lexsort((np.arange(x.D.size), -work[ref], -cp_all[ref])).tolist()
            rank = np.empty(len(self.order), dtype=np.int64)
            rank[np.asarray(self.order, dtype=np.int64)] = np.arange(len(self.order))
            self.rank_a = rank
            self.rank: list[int] = rank.tolist()
            self.total_work: list[float] = work.sum(axis=1).tolist()
            self.total_prefill_time: list[float] = [float((x.P / ty.mu).sum()) for ty in self.types]
            top = np.array(self.order[:LONGEST], dtype=int)
            self.top_cp = cp_all[:, top]
            self.top_fit = fit[:, top]
        else:
            ref = 0
            self.order, self.total_work, self.total_prefill_time = [], [0.0] * n_types, [0.0] * n_types
            self.rank = []
            self.rank_a = np.zeros(0, dtype=np.int64)
            self.top_cp = np.zeros((n_types, 0))
            self.top_fit = np.zeros((n_types, 0), dtype=bool)
        self.ref_type = ref


def _occ_steps(x: InstanceArrays, ty: _Type) -> np.ndarray:
    """O_j w_j on a slot of type ``ty`` (as ``Instance.occupancy`` x ``Instance.share``)."""
    share = np.maximum(x.kbar / ty.kv_capacity if ty.kv_capacity > 0 else np.inf, 1.0 / MAX_NUM_SEQS)
    return (x.D + (x.W / ty.tau_ref if ty.tau_ref > 0 else 0.0)) * share


class _State:
    """Incremental per-slot aggregates of the ``evaluate`` formula for one role assignment."""

    def __init__(self, prep: _Prep, roles: Sequence[Role]) -> None:
        inst = prep.inst
        self.prep = prep
        self.roles = list(roles)
        self.mixed = [r is Role.MIXED for r in roles]
        self.hosts = [r is Role.MIXED or r is Role.DECODE for r in roles]
        n = len(inst.slots)
        rsw = inst.config.role_switch_seconds
        self.st = [sl.start_seconds(roles[s], rsw) for s, sl in enumerate(inst.slots)]
        self.sum_d = [0.0] * n
        self.max_d = [0.0] * n
        self.occ = [0.0] * n
        self.extra = [0.0] * n
        self.stall = [0.0] * n  # sum of the members' own prefill (MIXED) / KV receive (DECODE) seconds
        self.cp = [0.0] * n  # max Q_j over the members
        self.members: list[list[int]] = [[] for _ in range(n)]
        self.finish = [self.st[s] if roles[s] is not Role.OFF else 0.0 for s in range(n)]
        self.where = [-1] * len(inst.trajs)
        self.q: list[list[float]] = [self._q_table(s) for s in range(n)]

    def _q_table(self, s: int) -> list[float]:
        """Q_j on slot s in its current role (MIXED table for non-hosting roles: unused there)."""
        p = self.prep
        k = p.slot_type[s]
        return p.q_dec[k] if self.roles[s] is Role.DECODE else p.q_mix[k]

    def _own(self, j: int, s: int) -> float:
        """e_js: j's own prefill (MIXED) or KV receive (DECODE) seconds on s."""
        p = self.prep
        k = p.slot_type[s]
        return p.mix_extra[k][j] if self.mixed[s] else p.dec_extra[k][j]

    def move(self, j: int, s: int) -> float:
        """m_js, as ``Instance.move_seconds`` computes it."""
        p = self.prep
        home = p.home[j]
        if home < 0 or home == s:
            return 0.0
        ctx = p.context[j]
        rate = p.same_rate[s] if p.slot_node[s] == p.home_node[j] else p.cross_rate[s]
        kv = 1e-3 + ctx / rate
        re = ctx / p.slot_mu[s]
        return kv if kv < re else re

    def finish_with(self, j: int, s: int) -> float:
        """T_s if j were added to s."""
        p = self.prep
        k = p.slot_type[s]
        ty = p.types[k]
        d = p.decode[j]
        md = self.max_d[s] if self.max_d[s] > d else d
        oc = self.occ[s] + p.occ[k][j]
        own = p.mix_extra[k][j] if self.mixed[s] else p.dec_extra[k][j]
        ex = self.extra[s] + own + self.move(j, s)
        cpj = self.q[s][j]
        cpv = (self.cp[s] if self.cp[s] > cpj else cpj) + (ty.phic * (self.sum_d[s] + d) + p.phi * (self.stall[s] + own))
        body = ty.c * (self.sum_d[s] + d) + ty.a * (md if md > oc else oc) + ex
        return self.st[s] + (body if body > cpv else cpv)

    def add(self, j: int, s: int) -> None:
        p = self.prep
        k = p.slot_type[s]
        d = p.decode[j]
        self.sum_d[s] += d
        if d > self.max_d[s]:
            self.max_d[s] = d
        self.occ[s] += p.occ[k][j]
        own = self._own(j, s)
        self.extra[s] += own + self.move(j, s)
        self.stall[s] += own
        q = self.q[s][j]
        if q > self.cp[s]:
            self.cp[s] = q
        self.members[s].append(j)
        self.where[j] = s
        self.finish[s] = self._finish(s)

    def remove(self, j: int) -> None:
        p = self.prep
        s = self.where[j]
        k = p.slot_type[s]
        self.sum_d[s] -= p.decode[j]
        self.occ[s] -= p.occ[k][j]
        own = self._own(j, s)
        self.extra[s] -= own + self.move(j, s)
        self.stall[s] -= own
        self.members[s].remove(j)
        mem = self.members[s]
        if p.decode[j] >= self.max_d[s]:
            self.max_d[s] = max((p.decode[i] for i in mem), default=0.0)
        qs = self.q[s]
        if qs[j] >= self.cp[s]:
            self.cp[s] = max((qs[i] for i in mem), default=0.0)
        if not mem:  # clear float residue so an empty slot prices exactly like a fresh one
            self.sum_d[s] = self.occ[s] = self.extra[s] = self.stall[s] = 0.0
        self.where[j] = -1
        self.finish[s] = self._finish(s)

    def _finish(self, s: int) -> float:
        if not self.hosts[s]:
            return self.st[s] if self.roles[s] is Role.PREFILL else 0.0
        ty = self.prep.types[self.prep.slot_type[s]]
        md, oc = self.max_d[s], self.occ[s]
        body = ty.c * self.sum_d[s] + ty.a * (md if md > oc else oc) + self.extra[s]
        cpv = self.cp[s] + (ty.phic * self.sum_d[s] + self.prep.phi * self.stall[s])
        return self.st[s] + (body if body > cpv else cpv)

    def open_start(self, s: int) -> float:
        """st_s of OFF slot s turned on MIXED."""
        return self.prep.inst.slots[s].start_seconds(Role.MIXED, self.prep.inst.config.role_switch_seconds)

    def finish_opened(self, j: int, s: int) -> float:
        """T_s if OFF slot s were turned on MIXED with j alone."""
        p = self.prep
        k = p.slot_type[s]
        ty = p.types[k]
        d = p.decode[j]
        oc = p.occ[k][j]
        body = ty.c * d + ty.a * (d if d > oc else oc) + p.mix_extra[k][j] + self.move(j, s)
        cpj = p.q_mix[k][j] + (ty.phic * d + p.phi * p.mix_extra[k][j])
        return self.open_start(s) + (body if body > cpj else cpj)

    def open(self, s: int) -> None:
        """Turn OFF slot s on, MIXED (empty)."""
        self.roles[s] = Role.MIXED
        self.mixed[s] = True
        self.hosts[s] = True
        self.st[s] = self.open_start(s)
        self.finish[s] = self.st[s]
        self.q[s] = self._q_table(s)

    def finishes_without(self, s: int) -> Callable[[int], float]:
        """j -> T_s if member j were removed from s, in O(1) per j (top-2 of D and CP taken once)."""
        p = self.prep
        k = p.slot_type[s]
        ty = p.types[k]
        mem = self.members[s]
        d1 = d2 = c1 = c2 = 0.0
        dj = cj = -1
        cps = self.q[s]
        for i in mem:
            d = p.decode[i]
            if d > d1:
                d1, d2, dj = d, d1, i
            elif d > d2:
                d2 = d
            c = cps[i]
            if c > c1:
                c1, c2, cj = c, c1, i
            elif c > c2:
                c2 = c
        st, sum_d, occ, extra, stall = self.st[s], self.sum_d[s], self.occ[s], self.extra[s], self.stall[s]
        occ_k = p.occ[k]
        ex_k = p.mix_extra[k] if self.mixed[s] else p.dec_extra[k]

        def without(j: int) -> float:
            if len(mem) == 1:
                return st
            md = d2 if j == dj else d1
            rest = sum_d - p.decode[j]
            cpv = (c2 if j == cj else c1) + (ty.phic * rest + p.phi * (stall - ex_k[j]))
            oc = occ - occ_k[j]
            body = ty.c * rest + ty.a * (md if md > oc else oc) + extra - ex_k[j] - self.move(j, s)
            return st + (body if body > cpv else cpv)

        return without

    def finish_without(self, j: int) -> float:
        """T_s of j's slot if j were removed."""
        s = self.where[j]
        self.remove(j)
        f = self.finish[s]
        self.add(j, s)
        return f

    def objective(self) -> tuple[list[Role], float]:
        """(roles after ``release_idle``, the objective ``evaluate`` gives them, up to float rounding)."""
        inst = self.prep.inst
        cfg = inst.config
        roles = release_idle(inst, self.roles, self.where)
        finish = [0.0] * len(roles)
        switching = 0.0
        prefill_work = 0.0
        pre: list[int] = []
        for s, sl in enumerate(inst.slots):
            r = roles[s]
            if r is Role.OFF:
                if sl.is_on_now:
                    switching += cfg.role_switch_seconds * sl.tp
                continue
            switching += self.st[s] * sl.tp
            if r is Role.PREFILL:
                pre.append(s)
                finish[s] = self.st[s]
            else:
                finish[s] = self.finish[s]
                if r is Role.DECODE:
                    prefill_work += sum(self.prep.prefill[j] for j in self.members[s])
        for j, m in _moves(self.prep, self.where):
            switching += m * inst.slots[self.where[j]].tp
        if prefill_work > 0 and pre:
            t_fill = waterfill_finish([finish[p] for p in pre], [inst.slots[p].mu_p for p in pre], prefill_work)
            for p in pre:
                finish[p] = max(finish[p], t_fill)
        overrun = sum(
            max(0.0, finish[s] - sl.deadline) for s, sl in enumerate(inst.slots) if roles[s] is not Role.OFF and sl.deadline is not None
        )
        if prefill_work > 0 and not pre:
            return roles, math.inf
        return roles, max(finish, default=0.0) + cfg.switch_weight * switching + cfg.deadline_penalty * overrun


def _moves(prep: _Prep, where: Sequence[int]) -> list[tuple[int, float]]:
    """(j, m_js) for every trajectory j whose move to ``where[j]`` is not 0, in order (``_State.move``, vectorised:
    the same operations, so the same floats)."""
    x = prep.x
    if not len(where):
        return []
    pl = np.asarray(where, dtype=np.int64)
    home = x.home
    moved = np.nonzero((home >= 0) & (home != pl))[0]
    if not moved.size:
        return []
    s = pl[moved]
    ctx = x.ctx[moved]
    rate = np.where(x.node[home[moved]] == x.node[s], x.same[s], x.cross[s])
    kv = 1e-3 + ctx / rate
    re = ctx / x.mu[s]
    m = np.where(kv < re, kv, re)
    keep = m != 0.0  # ``if m:`` (a zero move adds nothing)
    return list(zip(moved[keep].tolist(), m[keep].tolist(), strict=True))


def usable_slots(inst: Instance) -> list[int]:
    """Slots that can do any work: no deadline, or a deadline after the slot could start."""
    out = []
    for s, sl in enumerate(inst.slots):
        if sl.deadline is None:
            out.append(s)
            continue
        st = sl.start_seconds(Role.MIXED, inst.config.role_switch_seconds)
        if sl.deadline > st:
            out.append(s)
    return out


DEADLINE_PROBES = 3
"""Deadline slots share one heap per (type, role); this many of its least loaded are tried per trajectory."""


def place(prep: _Prep, roles: Sequence[Role], *, target: float = 0.0, homes: bool = True) -> _State | None:
    """Longest-first placement for fixed ``roles``. None when some trajectory fits no decoding slot.

    1. Home pass: a slot keeps its own trajectories while its finish stays within ``target`` and its
       deadline: longest first on slots without deadline; shortest first on slots with one (a window is
       best spent on many short trajectories: a long one sets the slot's step count, max D, by itself).
    2. Pool: everything else (evicted, homeless, homes switched off), longest first, to the slot without
       deadline of each group that finishes earliest with it (deadline slots only when none fits).
    3. Fill: deadline slots with room take the shortest trajectories of the slot finishing last, while that
       lowers its finish.
    """
    inst = prep.inst
    state = _State(prep, roles)
    hosts = state.hosts
    slot_type = prep.slot_type
    fits = prep.fits
    deadlines = [math.inf if sl.deadline is None else sl.deadline for sl in inst.slots]
    limit = [min(target + HOME_SLACK, d + 1e-9) for d in deadlines]
    timed = [d != math.inf for d in deadlines]
    pool = _home_pass(prep, state, limit, timed) if homes else list(prep.order)
    pool.sort(key=prep.rank.__getitem__)
    # One heap per (slot type, role, has deadline) of [finish, slot, version]; stale entries are skipped.
    groups: dict[tuple[int, bool, bool], list[list]] = {}
    for s in range(len(inst.slots)):
        if hosts[s]:
            key = (slot_type[s], state.mixed[s], timed[s])
            groups.setdefault(key, []).append([state.finish[s], s, 0])
    if not groups:
        return None if inst.trajs else state
    version = [0] * len(inst.slots)
    heaps = []
    for key, entries in groups.items():
        heapq.heapify(entries)
        heaps.append((key[0], key[2], entries))
    free_heaps = [h for h in heaps if not h[1]]
    # The slot each group is filling with long trajectories: one that already runs a longer trajectory
    # takes j for c_s D_j only (its step count max D is already paid), so long ones cluster (next fit).
    filling: dict[int, int] = {}
    for j in pool:
        usable = [h for h in free_heaps if fits[h[0]][j]] or heaps
        cands: list[int] = []
        for k, has_deadline, heap in usable:
            if not fits[k][j]:
                continue
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)
            if not heap:
                continue
            if has_deadline:
                cands.extend(e[1] for e in heapq.nsmallest(DEADLINE_PROBES, heap) if e[2] == version[e[1]])
            else:
                cands.append(heap[0][1])
            f = filling.get(id(heap), -1)
            if f >= 0 and f not in cands:
                cands.append(f)
        # Within the target (and deadlines): the least increase; otherwise the earliest finish.
        best_s, best_key = -1, (math.inf, math.inf, math.inf)
        for s in cands:
            f = state.finish_with(j, s)
            over = f - deadlines[s] if f > deadlines[s] else 0.0
            key = (0.0, f - state.finish[s], f) if f <= limit[s] else (1.0 + over, f, 0.0)
            if key < best_key:
                best_s, best_key = s, key
        if best_s < 0:
            return None
        state.add(j, best_s)
        version[best_s] += 1
        key = (slot_type[best_s], state.mixed[best_s], timed[best_s])
        heap = groups[key]
        heapq.heappush(heap, [state.finish[best_s], best_s, version[best_s]])
        filling[id(heap)] = best_s
    _fill_windows(state, deadlines)
    return state


def _home_pass_reference(prep: _Prep, state: _State, limit: Sequence[float], timed: Sequence[bool]) -> list[int]:
    """``place``'s home pass, one trajectory at a time (the specification of ``_home_pass``)."""
    pool: list[int] = []
    hosts, slot_type, fits = state.hosts, prep.slot_type, prep.fits
    for longest_first in (True, False):
        for j in prep.order if longest_first else reversed(prep.order):
            h = prep.home[j]
            if h < 0 or not hosts[h] or timed[h] == longest_first:
                if longest_first and (h < 0 or not hosts[h]):
                    pool.append(j)
                continue
            if fits[slot_type[h]][j] and state.finish_with(j, h) <= limit[h]:
                state.add(j, h)
            else:
                pool.append(j)
    return pool


RAGGED = 4
"""The home pass lays each slot's home trajectories out as one row of a padded matrix unless that matrix
would hold more than this many cells per trajectory (then it goes slot by slot)."""


def _home_pass(prep: _Prep, state: _State, limit: Sequence[float], timed: Sequence[bool]) -> list[int]:
    """``_home_pass_reference`` on the fresh ``state``, vectorised: the same state, the same pool (as a set).

    Each slot's home pass only reads and writes that slot (it starts empty; a trajectory at home moves
    nothing), so slots are independent. A slot's candidates are its fitting home trajectories, longest first
    (shortest first on deadline slots). While every candidate is accepted, the running sums ``add`` keeps
    are prefix sums in candidate order: ``np.cumsum`` along a row adds sequentially, as ``+=`` does, so
    every value, and each ``finish_with`` test, is the same float. A slot that rejects some candidate
    (rare: its finish would pass the target or its deadline) replays the reference loop on that slot.
    Returns the trajectories left for the pool (callers sort it).
    """
    x = prep.x
    home = x.home
    n_j = home.size
    hosts = np.asarray(state.hosts, dtype=bool)
    if n_j == 0 or not hosts.any():
        return list(range(n_j))
    safe = np.where(home >= 0, home, 0)
    at_home = (home >= 0) & hosts[safe]
    fit_home = prep.fits_a[x.type_of[safe], np.arange(n_j)]
    pool: list[int] = np.nonzero(~(at_home & fit_home))[0].tolist()
    cand = np.nonzero(at_home & fit_home)[0]
    if not cand.size:
        return pool
    h = home[cand]
    rank = prep.rank_a[cand]
    order = np.lexsort((np.where(np.asarray(timed, dtype=bool)[h], -rank, rank), h))
    cand, h = cand[order], h[order]
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    lengths = np.diff(np.r_[starts, h.size])
    rows = h[starts]
    width = int(lengths.max())
    cand_l = cand.tolist()
    segments = list(zip(rows.tolist(), starts.tolist(), lengths.tolist(), strict=True))
    if rows.size * width > RAGGED * cand.size:  # too ragged for one matrix: slot by slot
        for s, b, n in segments:
            pool += _replay(state, s, cand_l[b : b + n], limit)
        return pool
    k = x.type_of[h]
    shape = (rows.size, width)
    at = (np.repeat(np.arange(rows.size), lengths), np.arange(h.size) - np.repeat(starts, lengths))
    d2, o2, e2, c2 = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    d2[at] = x.D[cand]
    o2[at] = prep.occ_a[k, cand]
    e2[at] = np.where(np.asarray(state.mixed, dtype=bool)[h], prep.mix_a[k, cand], prep.dec_a[k, cand])
    c2[at] = np.where(np.asarray(state.mixed, dtype=bool)[h], prep.qm_a[k, cand], prep.qd_a[k, cand])
    # add(): sum_d += d; max_d = max(max_d, d); occ += o; extra += e + move (0 at home); cp = max(cp, c);
    # all from 0. Padding (zeros after a row's end) changes no prefix.
    sums = {
        "sum_d": np.cumsum(d2, axis=1),
        "max_d": np.maximum(np.maximum.accumulate(d2, axis=1), 0.0),
        "occ": np.cumsum(o2, axis=1),
        "extra": np.cumsum(e2, axis=1),
        "stall": np.cumsum(e2, axis=1),  # the moves are 0 at home: stall = extra
        "cp": np.maximum(np.maximum.accumulate(c2, axis=1), 0.0),
    }
    a = x.a[rows][:, None]
    c = x.c[rows][:, None]
    st = np.asarray(state.st)[rows][:, None]
    phic = np.array([ty.phic for ty in prep.types])[x.type_of[rows]][:, None]
    fin = st + np.maximum(c * sums["sum_d"] + a * np.maximum(sums["max_d"], sums["occ"]) + sums["extra"],
                          sums["cp"] + (phic * sums["sum_d"] + prep.phi * sums["stall"]))
    sums["finish"] = fin
    ok = (fin <= np.asarray(limit)[rows][:, None]) | (np.arange(width)[None, :] >= lengths[:, None])
    clean = ok.all(axis=1)
    last = (np.arange(rows.size), lengths - 1)
    for name, table in sums.items():
        values = getattr(state, name)
        for s, v in zip(rows[clean].tolist(), table[last][clean].tolist(), strict=True):
            values[s] = v
    where, members = state.where, state.members
    for (s, b, n), whole in zip(segments, clean.tolist(), strict=True):
        js = cand_l[b : b + n]
        if whole:
            members[s].extend(js)
            for j in js:
                where[j] = s
        else:
            pool += _replay(state, s, js, limit)
    return pool


def _replay(state: _State, s: int, js: Sequence[int], limit: Sequence[float]) -> list[int]:
    """The reference home pass on slot ``s`` alone, for its (fitting) candidates ``js`` in order."""
    rejected = []
    for j in js:
        if state.finish_with(j, s) <= limit[s]:
            state.add(j, s)
        else:
            rejected.append(j)
    return rejected


def _fill_windows(state: _State, deadlines: Sequence[float]) -> int:
    """Move the shortest trajectories of the free slot that finishes last into deadline slots with room.

    Only while that slot sets the makespan and is not bound by its own critical path (else moving its short
    trajectories gains nothing and only costs migrations).
    """
    prep = state.prep
    hosts = state.hosts
    n = len(hosts)
    windows = [s for s in range(n) if hosts[s] and deadlines[s] != math.inf]
    sources = [s for s in range(n) if hosts[s] and deadlines[s] == math.inf]
    if not windows or not sources:
        return 0
    decode, fin = prep.decode, state.finish
    # Each source's members shortest first, sorted when the source is first popped: a source's members only
    # change when it is popped (moves go from sources to windows), so this is the list at the start.
    queue: dict[int, list[int]] = {}
    pos = dict.fromkeys(sources, 0)
    heap = [(-fin[s], s) for s in sources]
    heapq.heapify(heap)
    version = [0] * n
    slack = [[-(deadlines[t] - fin[t]), t, 0] for t in windows]
    heapq.heapify(slack)
    window_max = max(fin[t] for t in windows)
    moves = 0
    while heap:
        neg, s = heapq.heappop(heap)
        if -neg != fin[s]:
            heapq.heappush(heap, (-fin[s], s))
            continue
        own = state.st[s] + state.cp[s] + (prep.types[prep.slot_type[s]].phic * state.sum_d[s] + prep.phi * state.stall[s])
        if fin[s] <= window_max + 1e-9 or fin[s] <= own + 1e-9:
            break  # the makespan is no longer set by a free slot's load
        members = queue.get(s)
        if members is None:
            members = queue[s] = sorted(state.members[s], key=lambda i: (decode[i], i))
        while pos[s] < len(members) and state.where[members[pos[s]]] != s:
            pos[s] += 1
        if pos[s] >= len(members):
            break
        j = members[pos[s]]
        pos[s] += 1
        best_t = -1
        for entry in heapq.nsmallest(DEADLINE_PROBES, slack):
            t = entry[1]
            if entry[2] != version[t] or not prep.fits[prep.slot_type[t]][j]:
                continue
            f_t = state.finish_with(j, t)
            if f_t <= deadlines[t] and f_t < fin[s]:
                best_t = t
                break
        if best_t < 0:
            break  # the shortest left fits no window in time: the windows are full
        state.remove(j)
        state.add(j, best_t)
        version[best_t] += 1
        heapq.heappush(slack, [-(deadlines[best_t] - fin[best_t]), best_t, version[best_t]])
        while slack and slack[0][2] != version[slack[0][1]]:
            heapq.heappop(slack)
        window_max = max(window_max, fin[best_t])
        moves += 1
        heapq.heappush(heap, (-fin[s], s))
    return moves


def improve(
    inst: Instance,
    state: _State,
    *,
    until: float | None,
    clock: Callable[[], float],
    max_rounds: int = 100000,
    open_slots: bool = True,
) -> int:
    """Local search in place: move work off the makespan slot. Returns the number of moves made.

    Each round takes the decoding slot that finishes last and tries its trajectories (longest first) on the
    four least loaded slots of the same role and, when ``open_slots``, on the cheapest-to-start usable OFF
    slot of each type (turned on MIXED); the move with the best gain in (makespan - lambda * added switching)
    is made. Stops when no move improves, after ``max_rounds``, or at ``until``.
    """
    roles = state.roles
    cfg = inst.config
    lam = cfg.switch_weight
    prep = state.prep
    moves = 0
    n = len(roles)
    decode_slots = [s for s in range(n) if state.hosts[s]]
    prefill_slots = [s for s in range(n) if roles[s] is Role.PREFILL]
    deadlines = [math.inf if sl.deadline is None else sl.deadline + 1e-9 for sl in inst.slots]
    closed: dict[int, list[tuple[float, int]]] = {}
    if open_slots:
        for s in usable_slots(inst):
            if roles[s] is Role.OFF:
                st = inst.slots[s].start_seconds(Role.MIXED, cfg.role_switch_seconds)
                closed.setdefault(prep.slot_type[s], []).append((st, s))
        for lst in closed.values():
            lst.sort(reverse=True)  # cheapest last: pop() opens it
    if not decode_slots:
        return 0
    for _ in range(max_rounds):
        if until is not None and clock() >= until:
            break
        fin = state.finish
        worst, cur, second = top_two(decode_slots, fin)
        if not state.members[worst]:
            break
        prefill_fin = max((fin[s] for s in prefill_slots), default=0.0)
        floor = max(second, prefill_fin)
        mixed = state.mixed[worst]
        targets = heapq.nsmallest(
            4,
            (s for s in decode_slots if s != worst and state.mixed[s] == mixed and fin[s] < deadlines[s] - 1e-6),
            key=fin.__getitem__,
        )
        fresh = [lst[-1][1] for lst in closed.values() if lst and lst[-1][0] < cur]
        best = None
        best_gain = 1e-9
        without_of = state.finishes_without(worst)
        for j in sorted(state.members[worst], key=lambda i: -prep.decode[i]):
            without = without_of(j)
            old_move = state.move(j, worst) * inst.slots[worst].tp
            for t in targets:
                if not prep.fits[prep.slot_type[t]][j]:
                    continue
                f_t = state.finish_with(j, t)
                if f_t > deadlines[t]:
                    continue
                new_ms = max(floor, without, f_t)
                new_move = state.move(j, t) * inst.slots[t].tp
                gain = (cur - new_ms) - lam * (new_move - old_move)
                if gain > best_gain:
                    best, best_gain = (j, t), gain
            for t in fresh:
                if not prep.fits[prep.slot_type[t]][j]:
                    continue
                f_t = state.finish_opened(j, t)
                if f_t > deadlines[t]:
                    continue
                sl = inst.slots[t]
                added = (state.open_start(t) - (cfg.role_switch_seconds if sl.is_on_now else 0.0)) * sl.tp
                new_ms = max(floor, without, f_t)
                gain = (cur - new_ms) - lam * (state.move(j, t) * sl.tp - old_move + added)
                if gain > best_gain:
                    best, best_gain = (j, t), gain
            if best is not None and best_gain >= (cur - floor) * 0.999:
                break  # cannot do better than reaching the runner-up's finish
        if best is None:
            break  # no improving move off the makespan slot: a local optimum
        j, t = best
        if not state.hosts[t]:
            state.open(t)
            closed[prep.slot_type[t]].pop()
            decode_slots.append(t)
        state.remove(j)
        state.add(j, t)
        moves += 1
    return moves


def _fluid(prep: _Prep, codes: np.ndarray) -> tuple[float, float]:
    """(estimated objective, estimated makespan) of the role assignment ``codes`` (``ROLE_CODE`` per slot).

    Makespan: the water-filling finish of the batch's total work over the decoding slots' start times
    (deadlines cap each slot's window), the PREFILL slots' finish for the DECODE slots' prefill share, and the
    longest critical paths from the earliest start of a slot type they fit, plus phi times the water level
    (co-running, see ``instance``). Objective adds lambda * switching.
    """
    inst, x = prep.inst, prep.x
    cfg = inst.config
    on = codes > 0
    st = np.where(on, x.on + np.where(codes != x.cur_code, cfg.role_switch_seconds, 0.0), 0.0)
    switching = float((st * x.tp).sum() + (((~on) & (x.cur_code > 0)) * cfg.role_switch_seconds * x.tp).sum())
    dec = (codes == 1) | (codes == 3)
    pre = codes == 2
    if not inst.trajs:
        ms = float(st[on].max()) if on.any() else 0.0
        return ms + cfg.switch_weight * switching, ms
    if not dec.any():
        return math.inf, math.inf
    n_decode_role = int((codes == 3).sum())
    if n_decode_role and not pre.any():
        return math.inf, math.inf
    tw = np.asarray(prep.total_work)[x.type_of]
    tp_ = np.asarray(prep.total_prefill_time)[x.type_of]
    total = np.where(codes == 3, tw - tp_, tw)
    with np.errstate(divide="ignore"):
        rates = np.where(total > 0, 1.0 / np.maximum(total, 1e-300), np.inf)
    t_dec = capped_waterfill(st[dec], rates[dec], x.deadline[dec], 1.0)
    t_pre = 0.0
    if n_decode_role:
        frac = n_decode_role / int(dec.sum())
        t_pre = waterfill_finish(st[pre].tolist(), x.mu_p[pre].tolist(), float(x.P.sum()) * frac)
    # Longest critical paths, each on the type it fits that finishes it first.
    cp = 0.0
    if prep.top_cp.shape[1]:
        best = np.full(prep.top_cp.shape[1], math.inf)
        for k in range(len(prep.types)):
            mask = dec & (x.type_of == k)
            if mask.any():
                val = float(st[mask].min()) + prep.top_cp[k]
                best = np.where(prep.top_fit[k], np.minimum(best, val), best)
        cp = float(best.max())
        if inst.phi > 0:
            # The co-running term: the slot of a long trajectory also carries about its share of the batch's
            # work (the water level above the earliest start), a share phi of which runs in its steps. More
            # slots lower that share, which the critical paths alone do not show. The level counts all the
            # work (prefill included) whatever the roles: the model has no prefill queueing at PREFILL slots,
            # so a P:D split must not look cheaper here than the same slots colocated.
            with np.errstate(divide="ignore"):
                all_rates = np.where(tw > 0, 1.0 / np.maximum(tw, 1e-300), np.inf)
            level = capped_waterfill(st[dec], all_rates[dec], x.deadline[dec], 1.0)
            if math.isfinite(level):
                cp += inst.phi * max(0.0, level - float(st[dec].min()))
    ms = max(t_dec, t_pre, cp)
    return ms + cfg.switch_weight * switching, ms


@dataclass(frozen=True, slots=True)
class _Config:
    name: str
    roles: list[Role]
    estimate: float
    makespan: float


def candidate_configs(prep: _Prep, *, limit: int = FULL_CONFIGS) -> list[_Config]:
    """Role configurations worth placing for real, best fluid estimate first ("keep" always included)."""
    inst, x = prep.inst, prep.x
    rsw = inst.config.role_switch_seconds
    usable = set(usable_slots(inst))
    n = len(inst.slots)
    keep = [sl.current_role if (s in usable and sl.current_role is not Role.OFF) else Role.OFF for s, sl in enumerate(inst.slots)]
    roles_now = {r for r in keep if r is not Role.OFF}
    if (Role.DECODE in roles_now) != (Role.PREFILL in roles_now):  # half a P/D pair cannot work: make it MIXED
        keep = [Role.MIXED if r in (Role.PREFILL, Role.DECODE) else r for r in keep]
    keep_codes = np.array([ROLE_CODE[r] for r in keep], dtype=int)
    off = sorted(
        (s for s in usable if keep[s] is Role.OFF),
        key=lambda s: (inst.slots[s].start_seconds(Role.MIXED, rsw), inst.slots[s].deadline is not None, s),
    )
    scored: list[_Config] = []

    def score(name: str, codes: np.ndarray) -> float:
        est, ms = _fluid(prep, codes)
        roles = [CODE_ROLE[c] for c in codes.tolist()]
        scored.append(_Config(name, roles, est, ms))
        return est

    score("keep", keep_codes)
    mixed_now = np.where(keep_codes > 0, 1, 0)
    # Prefixes of the off slots by start cost: 0, each start-cost level boundary, and powers of two.
    sizes = {0, len(off)}
    starts = [inst.slots[s].start_seconds(Role.MIXED, rsw) for s in off]
    for i in range(1, len(off)):
        if abs(starts[i] - starts[i - 1]) > 1.0:
            sizes.add(i)
    p2 = 1
    while p2 < len(off):
        sizes.add(p2)
        p2 *= 2
    best_val, best_codes = math.inf, mixed_now
    off_arr = np.array(off, dtype=int)
    for m in sorted(sizes):
        codes = mixed_now.copy()
        codes[off_arr[:m]] = 1
        val = score(f"mixed+{m}", codes)
        if val < best_val:
            best_val, best_codes = val, codes
    # P:D splits of the best set, sized by prefill vs decode work.
    best_set = np.nonzero(best_codes > 0)[0].tolist()
    if len(best_set) >= 2 and inst.trajs:
        k = prep.ref_type
        pre_t = prep.total_prefill_time[k]
        dec_t = prep.total_work[k] - pre_t
        n_p0 = round(len(best_set) * pre_t / max(pre_t + dec_t, 1e-12))
        # Prefer slots that are PREFILL now, then those hosting the fewest trajectories (fewest migrations).
        hosted = np.bincount(x.home[x.home >= 0], minlength=n) if x.home.size else np.zeros(n, dtype=int)
        ranked = sorted(best_set, key=lambda s: (inst.slots[s].current_role is not Role.PREFILL, int(hosted[s]), s))
        for n_p in sorted({max(1, min(len(best_set) - 1, v)) for v in (n_p0 - 1, n_p0, n_p0 + 1)}):
            codes = np.zeros(n, dtype=int)
            codes[ranked[:n_p]] = 2
            codes[ranked[n_p:]] = 3
            score(f"pd{n_p}", codes)
    scored.sort(key=lambda c: c.estimate)
    picked: list[_Config] = []
    seen: set[tuple[Role, ...]] = set()
    for cfg in scored:
        key = tuple(cfg.roles)
        if key in seen or cfg.estimate == math.inf:
            continue
        if len(picked) < limit - 1 or cfg.name == "keep" or len(inst.trajs) * len(scored) <= SMALL:
            picked.append(cfg)
            seen.add(key)
    # Last resorts (every estimate infinite: deadlines too tight): every usable slot MIXED, then every slot
    # not yet past its deadline (the work then overruns: DEADLINE_RELAXED).
    for name, on in (("usable", usable), ("all", {s for s, sl in enumerate(inst.slots) if sl.deadline is None or sl.deadline > 0})):
        roles = [Role.MIXED if s in on else Role.OFF for s in range(n)]
        if on and tuple(roles) not in seen:
            picked.append(_Config(name, roles, math.inf, math.inf))
            seen.add(tuple(roles))
    return picked


def _place_searching(
    prep: _Prep, cfg: _Config, lower: float, *, rounds: int, until: float | None
) -> _State | None:
    """The best of: ``place`` keeping homes at the fluid target, and ``place`` from scratch (homes ignored:
    long trajectories clustered, migrations priced) with its target bisected between the lower bound and the
    best makespan found (a target too low degrades to plain longest-first, too high over-clusters)."""
    clock = prep.inst.config.clock
    target = cfg.makespan if math.isfinite(cfg.makespan) else 0.0
    t_start = clock()
    best = place(prep, cfg.roles, target=target)
    if best is None:
        return None
    one_round = clock() - t_start  # a placement is not interruptible: start one only if it fits the budget
    best_obj = best.objective()[1]
    hi = _makespan(best)
    lo = max(lower, 0.0)
    if hi <= lo * (1 + CLOSE_ENOUGH):
        return best  # already at the lower bound
    has_homes = any(h >= 0 for h in prep.home)
    for r in range(max(0, rounds - 1) if has_homes else 0):
        if until is not None and clock() + 1.5 * one_round >= until:
            break
        target = lo + (hi - lo) * (0.3 if r == 0 else 0.5)
        state = place(prep, cfg.roles, target=target, homes=False)
        if state is None:
            break
        ms = _makespan(state)
        obj = state.objective()[1]
        gained = best_obj - obj
        if obj < best_obj:
            best, best_obj = state, obj
        if r > 0 and gained < STALL_GAIN * best_obj:
            break  # the last two targets changed little: the bound is likely out of reach, not the plan
        if ms <= target * (1 + 1e-3):
            hi = target
        else:
            lo, hi = target, min(hi, ms)
        if hi <= lo * (1 + 2e-3):
            break
    return best


def _makespan(state: _State) -> float:
    return max((state.finish[s] for s in range(len(state.finish)) if state.hosts[s]), default=0.0)


def go_home(inst: Instance, state: _State) -> int:
    """Send moved trajectories back home where that keeps the home slot below the makespan (saves the move)."""
    prep = state.prep
    ms = _makespan(state)
    deadlines = [math.inf if sl.deadline is None else sl.deadline for sl in inst.slots]
    moved = [j for j, h in enumerate(prep.home) if h >= 0 and state.where[j] != h and state.hosts[h]]
    moved.sort(key=lambda j: -state.move(j, state.where[j]))
    count = 0
    for j in moved:
        h = prep.home[j]
        if not prep.fits[prep.slot_type[h]][j]:
            continue
        f = state.finish_with(j, h)
        if f < ms * (1 - 1e-9) and f <= deadlines[h]:
            state.remove(j)
            state.add(j, h)
            count += 1
    return count


def solve_greedy(
    inst: Instance, *, until: float | None = None, arrays: InstanceArrays | None = None
) -> tuple[list[Role], list[int], float]:
    """The greedy decision for ``inst``: (roles, placement, estimated objective).

    The local search stops at ``until`` on ``inst.config.clock``; at least one configuration is always
    placed (so the answer can come late when ``until`` is already past: O(|J| log |S|) work).
    """
    clock = inst.config.clock
    if not inst.trajs:
        usable = set(usable_slots(inst))
        roles = [sl.current_role if s in usable else Role.OFF for s, sl in enumerate(inst.slots)]
        present = set(roles)
        if Role.DECODE in present and Role.PREFILL not in present:
            roles = [Role.MIXED if r is Role.DECODE else r for r in roles]
        roles = release_idle(inst, roles, [])
        return roles, [], 0.0
    prep = _Prep(inst, arrays)
    big = len(inst.trajs) * max(1, len(prep.types)) > LARGE
    configs = candidate_configs(prep, limit=2 if big else FULL_CONFIGS)
    best: tuple[float, int, list[Role], list[int]] | None = None
    lower = max(critical_path_bound(inst, prep.x), work_bound(inst, prep.x))
    for timed in (critical_path_bound(inst, prep.x, on_time=True), work_bound(inst, prep.x, on_time=True)):
        if math.isfinite(timed):
            lower = max(lower, timed)  # only to stop early: a plan at this value cannot be beaten on time
    rounds = TARGET_ROUNDS if not big else TARGET_ROUNDS_LARGE
    one_config = 0.0
    for i, cfg in enumerate(configs):
        if best is not None and until is not None and clock() + one_config >= until:
            break  # out of time: the first configuration that hosts everything is always placed
        t_config = clock()
        if best is not None and best[0] < cfg.estimate * (1 - 1e-9) and cfg.name in ("usable", "all"):
            break  # last resorts are only for when nothing better hosts the batch
        state = _place_searching(prep, cfg, lower, rounds=rounds, until=until)
        if state is None:
            one_config = max(one_config, clock() - t_config)
            log.debug("greedy: configuration %s cannot host every trajectory", cfg.name)
            continue
        # Share what is left of the budget between the configurations still to place.
        share = None if until is None else clock() + max(0.0, until - clock()) / (len(configs) - i)
        improve(inst, state, until=share, clock=clock)
        go_home(inst, state)
        roles, objective = state.objective()
        # What one configuration costs, end to end (placement, search, homing, pricing): the next one starts
        # only if that much time is left.
        one_config = max(one_config, clock() - t_config)
        n_moves = sum(1 for j, h in enumerate(prep.home) if h >= 0 and h != state.where[j])
        if best is None or (objective, n_moves) < (best[0], best[1]):
            best = (objective, n_moves, roles, list(state.where))
        if _makespan(state) <= lower * (1 + CLOSE_ENOUGH) and objective < inst.config.deadline_penalty * 1e-6:
            break  # at the lower bound, on time: other configurations could only save switching
    if best is None:
        raise RuntimeError("greedy found no configuration hosting every trajectory (build_instance should have refused)")
    return best[2], best[3], best[0]


class GreedyBackend:
    """``Backend`` protocol implementation (status HEURISTIC)."""

    name = NAME

    def solve(self, inst: Instance, *, budget: float, hint: Decision | None = None) -> Decision | None:
        clock = inst.config.clock
        until = clock() + max(0.0, budget)
        roles, placement, _ = solve_greedy(inst, until=until)
        return Decision(roles=tuple(roles), placement=tuple(placement), status=SolveStatus.HEURISTIC)


BACKEND = GreedyBackend()
