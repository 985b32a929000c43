"""The incremental decision state every search works on: roles + placement with the per-slot sums of
``evaluate`` (sum D, max D, occupancy, extra seconds, stall seconds, longest Q, members).

Adding or removing one trajectory re-prices its slot in O(1) (O(members) when a maximum leaves), through
``pricing.slot_time`` (the formula ``evaluate`` uses), so a search prices a move exactly as the plan will
be priced. ``price()`` returns what ``evaluate`` gives after ``release_idle`` (makespan with the PREFILL
water level, switching GPU-seconds, overrun; after ``release()``), ``objective()`` the same objective
recomputed from the slots (what the greedy construction compares). Tests check both against ``evaluate``
on random decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import Role
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.evaluate import close_slots, waterfill_finish
from rollplan.solver.core.pricing import slot_time
from rollplan.solver.core.tables import Tables


@dataclass(frozen=True, slots=True)
class Price:
    objective: float
    makespan: float
    switching: float
    overrun: float


class SlotState:
    """Roles + placement with the per-slot sums of ``evaluate`` (see the module docstring)."""

    def __init__(self, prep: Tables, roles: Sequence[Role]) -> None:
        self.prep = prep
        n = len(roles)
        self.roles = list(roles)
        self.mixed = [r is Role.MIXED for r in roles]
        self.hosts = [r is Role.MIXED or r is Role.DECODE for r in roles]
        self.st = [prep.start(s, roles[s]) for s in range(n)]
        self.sum_d = [0.0] * n
        self.max_d = [0.0] * n
        self.occ = [0.0] * n
        self.extra = [0.0] * n  # sum of e_js + m_js
        self.stall = [0.0] * n  # sum of the members' own prefill (MIXED) / KV receive (DECODE) seconds
        self.cp = [0.0] * n  # max Q_j over the members
        self.members: list[list[int]] = [[] for _ in range(n)]
        self.finish = [self.st[s] if roles[s] is not Role.OFF else 0.0 for s in range(n)]
        self.where = [-1] * len(prep.D)
        self.q: list[list[float]] = [self._q_table(s) for s in range(n)]
        self.prefill_work = 0.0  # P of the trajectories on DECODE slots
        self.move_sw = 0.0  # sum_j tp_s m_js

    # -- per slot -------------------------------------------------------------------------------------------
    def _q_table(self, s: int) -> list[float]:
        """Q_j on slot s in its current role (the MIXED table for non-hosting roles: unused there)."""
        p = self.prep
        k = p.ptype[s]
        return p.qd[k] if self.roles[s] is Role.DECODE else p.qm[k]

    def _own(self, j: int, s: int) -> float:
        """e_js: j's own prefill (MIXED) or KV receive (DECODE) seconds on s."""
        p = self.prep
        k = p.ptype[s]
        return p.mix[k][j] if self.mixed[s] else p.dec[k][j]

    def move(self, j: int, s: int) -> float:
        """m_js (``Instance.move_seconds``)."""
        return self.prep.move(j, s)

    def _time(self, s: int, sum_d: float, max_d: float, occ: float, extra: float, cp: float, stall: float) -> float:
        p = self.prep
        return slot_time(self.st[s], p.a[s], p.c[s], p.phic[s], p.phi, sum_d, max_d, occ, extra, cp, stall)

    def _finish(self, s: int) -> float:
        if not self.hosts[s]:
            return self.st[s] if self.roles[s] is Role.PREFILL else 0.0
        return self._time(s, self.sum_d[s], self.max_d[s], self.occ[s], self.extra[s], self.cp[s], self.stall[s])

    def finish_with(self, j: int, s: int) -> float:
        """T_s if j were added to s."""
        p = self.prep
        k = p.ptype[s]
        d = p.D[j]
        md = self.max_d[s]
        own = p.mix[k][j] if self.mixed[s] else p.dec[k][j]
        q = self.q[s][j]
        cp = self.cp[s]
        return slot_time(
            self.st[s], p.a[s], p.c[s], p.phic[s], p.phi,
            self.sum_d[s] + d,
            md if md > d else d,
            self.occ[s] + p.occw[k][j],
            self.extra[s] + own + p.move(j, s),
            cp if cp > q else q,
            self.stall[s] + own,
        )

    def finish_without(self, j: int) -> float:
        """T of j's slot if j left it."""
        s = self.where[j]
        p = self.prep
        k = p.ptype[s]
        rest = [i for i in self.members[s] if i != j]
        if not rest:
            return self.st[s]
        d = p.D[j]
        qs = self.q[s]
        max_d = self.max_d[s] if d < self.max_d[s] else max(p.D[i] for i in rest)
        cp = self.cp[s] if qs[j] < self.cp[s] else max(qs[i] for i in rest)
        own = self._own(j, s)
        return self._time(
            s, self.sum_d[s] - d, max_d, self.occ[s] - p.occw[k][j], self.extra[s] - (own + p.move(j, s)), cp,
            self.stall[s] - own,
        )

    def leaders(self, s: int) -> tuple[float, float, int, float, float, int]:
        """(largest D, runner-up D, its member, largest Q, runner-up Q, its member) over s's members (0.0 and
        -1 where there are none): what removing one member leaves as max D and max Q, for
        ``finishes_without``, ``exchanges`` and the wide swaps' pruning (``local._swap_reach``)."""
        p = self.prep
        cps = self.q[s]
        d1 = d2 = c1 = c2 = 0.0
        dj = cj = -1
        for i in self.members[s]:
            d = p.D[i]
            if d > d1:
                d1, d2, dj = d, d1, i
            elif d > d2:
                d2 = d
            c = cps[i]
            if c > c1:
                c1, c2, cj = c, c1, i
            elif c > c2:
                c2 = c
        return d1, d2, dj, c1, c2, cj

    def finishes_without(self, s: int) -> Callable[[int], float]:
        """j -> T_s if member j were removed from s, in O(1) per j (top-2 of D and Q taken once)."""
        p = self.prep
        k = p.ptype[s]
        mem = self.members[s]
        d1, d2, dj, c1, c2, cj = self.leaders(s)
        st, sum_d, occ, extra, stall = self.st[s], self.sum_d[s], self.occ[s], self.extra[s], self.stall[s]
        occ_k = p.occw[k]
        ex_k = p.mix[k] if self.mixed[s] else p.dec[k]

        def without(j: int) -> float:
            if len(mem) == 1:
                return st
            return self._time(
                s, sum_d - p.D[j], d2 if j == dj else d1, occ - occ_k[j], extra - ex_k[j] - p.move(j, s),
                c2 if j == cj else c1, stall - ex_k[j],
            )

        return without

    def exchanges(self, s: int) -> Callable[[int, int], float]:
        """(out, in_) -> T_s if member ``out`` left s and non-member ``in_`` joined it, in O(1) per pair
        (top-2 of D and Q taken once, as ``finishes_without``): the price of one side of a swap."""
        p = self.prep
        k = p.ptype[s]
        cps = self.q[s]
        d1, d2, dj, c1, c2, cj = self.leaders(s)
        st, sum_d, occ, extra, stall = self.st[s], self.sum_d[s], self.occ[s], self.extra[s], self.stall[s]
        occ_k = p.occw[k]
        ex_k = p.mix[k] if self.mixed[s] else p.dec[k]
        a, c, phic, phi, move, D = p.a[s], p.c[s], p.phic[s], p.phi, p.move, p.D

        def exchanged(out: int, in_: int) -> float:
            md = d2 if out == dj else d1
            di = D[in_]
            cp = c2 if out == cj else c1
            qi = cps[in_]
            own_in, own_out = ex_k[in_], ex_k[out]
            return slot_time(
                st, a, c, phic, phi,
                sum_d - D[out] + di,
                md if md > di else di,
                occ - occ_k[out] + occ_k[in_],
                extra - (own_out + move(out, s)) + (own_in + move(in_, s)),
                cp if cp > qi else qi,
                stall - own_out + own_in,
            )

        return exchanged

    def add(self, j: int, s: int) -> None:
        p = self.prep
        k = p.ptype[s]
        d = p.D[j]
        self.sum_d[s] += d
        if d > self.max_d[s]:
            self.max_d[s] = d
        self.occ[s] += p.occw[k][j]
        own = p.mix[k][j] if self.mixed[s] else p.dec[k][j]  # _own(j, s), inlined: the searches' hot path
        m = p.move(j, s)
        self.extra[s] += own + m
        self.stall[s] += own
        q = self.q[s][j]
        if q > self.cp[s]:
            self.cp[s] = q
        self.members[s].append(j)
        self.where[j] = s
        self.move_sw += m * p.tp[s]
        if self.roles[s] is Role.DECODE:
            self.prefill_work += p.P[j]
        self.finish[s] = self._time(
            s, self.sum_d[s], self.max_d[s], self.occ[s], self.extra[s], self.cp[s], self.stall[s]
        ) if self.hosts[s] else self._finish(s)

    def remove(self, j: int) -> None:
        p = self.prep
        s = self.where[j]
        k = p.ptype[s]
        own = self._own(j, s)
        m = p.move(j, s)
        self.move_sw -= m * p.tp[s]
        if self.roles[s] is Role.DECODE:
            self.prefill_work -= p.P[j]
        self.members[s].remove(j)
        self.where[j] = -1
        mem = self.members[s]
        if not mem:  # clear float residue so an empty slot prices exactly like a fresh one
            self.sum_d[s] = self.max_d[s] = self.occ[s] = self.extra[s] = self.cp[s] = self.stall[s] = 0.0
            self.finish[s] = self._finish(s)
            return
        self.sum_d[s] -= p.D[j]
        self.occ[s] -= p.occw[k][j]
        self.extra[s] -= own + m
        self.stall[s] -= own
        if p.D[j] >= self.max_d[s]:
            self.max_d[s] = max(p.D[i] for i in mem)
        qs = self.q[s]
        if qs[j] >= self.cp[s]:
            self.cp[s] = max(qs[i] for i in mem)
        self.finish[s] = self._finish(s)

    def set_role(self, s: int, role: Role) -> None:
        """Change the role of an empty slot."""
        assert not self.members[s], "only an empty slot changes role"
        self.roles[s] = role
        self.mixed[s] = role is Role.MIXED
        self.hosts[s] = role is Role.MIXED or role is Role.DECODE
        self.st[s] = self.prep.start(s, role)
        self.q[s] = self._q_table(s)
        self.finish[s] = self.st[s]

    def open_start(self, s: int) -> float:
        """st_s of OFF slot s turned on MIXED."""
        return self.prep.start(s, Role.MIXED)

    def finish_opened(self, j: int, s: int) -> float:
        """T_s if OFF slot s were turned on MIXED with j alone."""
        p = self.prep
        k = p.ptype[s]
        d = p.D[j]
        mix = p.mix[k][j]
        st = self.open_start(s)
        return slot_time(st, p.a[s], p.c[s], p.phic[s], p.phi, d, d, p.occw[k][j], mix + p.move(j, s), p.qm[k][j], mix)

    def open(self, s: int) -> None:
        """Turn OFF slot s on, MIXED (empty)."""
        self.set_role(s, Role.MIXED)

    # -- global ---------------------------------------------------------------------------------------------
    def makespan_of_hosts(self) -> float:
        """The latest finish of a decoding slot (0 when none)."""
        return max((self.finish[s] for s in range(len(self.finish)) if self.hosts[s]), default=0.0)

    def prefill_level(self) -> float:
        """The PREFILL water level (0 when no prefill work sits on DECODE slots)."""
        if self.prefill_work <= 0:
            return 0.0
        pre = [s for s, r in enumerate(self.roles) if r is Role.PREFILL]
        if not pre:
            return math.inf
        return waterfill_finish([self.st[s] for s in pre], [self.prep.mu_p[s] for s in pre], self.prefill_work)

    def slot_finish(self, s: int, level: float) -> float:
        if self.roles[s] is Role.PREFILL:
            return max(self.st[s], level) if self.prefill_work > 0 else self.st[s]
        return self.finish[s]

    def switching(self) -> float:
        p = self.prep
        sw = self.move_sw
        for s, r in enumerate(self.roles):
            if r is not Role.OFF:
                sw += self.st[s] * p.tp[s]
            elif p.on_now[s]:
                sw += p.rsw * p.tp[s]
        return sw

    def price(self) -> Price:
        """What ``evaluate`` returns for (roles, placement) — call after ``release`` for make_plan's price."""
        p = self.prep
        level = self.prefill_level()
        makespan = 0.0
        over = 0.0
        for s, r in enumerate(self.roles):
            if r is Role.OFF:
                continue
            f = self.slot_finish(s, level)
            makespan = max(makespan, f)
            d = p.deadline[s]
            if f > d:
                over += f - d
        sw = self.switching()
        return Price(makespan + p.lam * sw + p.pen * over, makespan, sw, over)

    def release(self) -> None:
        """``actions.release_idle`` in place: idle slots with a deadline go OFF (PREFILL kept if needed)."""
        p = self.prep
        for s, r in enumerate(self.roles):
            if r is Role.OFF or p.deadline[s] == math.inf or self.members[s]:
                continue
            if r is Role.PREFILL and self.prefill_work > 0:
                continue
            self.set_role(s, Role.OFF)

    def objective(self) -> tuple[list[Role], float]:
        """(roles after ``release_idle``, the objective ``evaluate`` gives them, up to float rounding),
        summed slot by slot from the current roles (the state itself is not changed)."""
        prep = self.prep
        inst = prep.inst
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
                    prefill_work += sum(prep.P[j] for j in self.members[s])
        switching += move_switching(prep, self.where)
        overrun = sum(close_slots(inst, roles, finish, pre, prefill_work))
        if prefill_work > 0 and not pre:
            return roles, math.inf
        return roles, max(finish, default=0.0) + cfg.switch_weight * switching + cfg.deadline_penalty * overrun


def move_switching(prep: Tables, where: Sequence[int]) -> float:
    """sum_j tp_s m_js over the placement ``where`` (vectorised; ``SlotState.move_sw`` kept incrementally)."""
    if not len(where):
        return 0.0
    x = prep.x
    pl = np.asarray(where, dtype=np.int64)
    moved = np.nonzero((x.home >= 0) & (x.home != pl))[0]
    if not moved.size:
        return 0.0
    return float((prep.moves_of(moved, pl[moved]) * x.tp[pl[moved]]).sum())


def state_of(prep: Tables, roles: Sequence[Role], placement: Sequence[int]) -> SlotState:
    """A ``SlotState`` for a full placement, built with numpy (O(|J| + |S|))."""
    return state_of_partial(prep, roles, np.arange(len(placement)), np.asarray(placement, dtype=np.int64))


def state_of_partial(prep: Tables, roles: Sequence[Role], jj: np.ndarray, pl: np.ndarray) -> SlotState:
    """A ``SlotState`` with trajectories ``jj[i]`` on slots ``pl[i]`` (the rest unplaced), built with numpy."""
    state = SlotState(prep, roles)
    n_s = len(roles)
    if not len(pl):
        return state
    x = prep.x
    kt = x.type_of[pl]
    mixed = np.asarray([r is Role.MIXED for r in roles])[pl]
    decode = np.asarray([r is Role.DECODE for r in roles])[pl]
    move = prep.moves_of(jj, pl)
    own = np.where(mixed, prep.mix_a[kt, jj], prep.dec_a[kt, jj])
    sum_d = np.bincount(pl, x.D[jj], minlength=n_s)
    occ = np.bincount(pl, prep.occw_a[kt, jj], minlength=n_s)
    extra = np.bincount(pl, own + move, minlength=n_s)
    stall = np.bincount(pl, own, minlength=n_s)
    max_d = np.zeros(n_s)
    np.maximum.at(max_d, pl, x.D[jj])
    cp = np.zeros(n_s)
    np.maximum.at(cp, pl, np.where(decode, prep.qd_a[kt, jj], prep.qm_a[kt, jj]))
    st = np.asarray(state.st)
    fin = slot_time(st, x.a, x.c, prep.phi * x.c, prep.phi, sum_d, max_d, occ, extra, cp, stall)
    used = np.bincount(pl, minlength=n_s) > 0
    state.finish = np.where(used, fin, np.asarray(state.finish)).tolist()
    state.sum_d, state.max_d, state.occ = sum_d.tolist(), max_d.tolist(), occ.tolist()
    state.extra, state.cp, state.stall = extra.tolist(), cp.tolist(), stall.tolist()
    order = np.argsort(pl, kind="stable")
    bounds = np.searchsorted(pl[order], np.arange(n_s + 1))
    ordered = jj[order].tolist()
    state.members = [ordered[bounds[s] : bounds[s + 1]] for s in range(n_s)]
    where = np.full(x.D.size, -1, dtype=np.int64)
    where[jj] = pl
    state.where = where.tolist()
    state.move_sw = float((move * x.tp[pl]).sum())
    state.prefill_work = float(x.P[jj][decode].sum())
    return state
