"""Incremental pricing, disaggregation and local-search repair for large instances.

``SlotState`` keeps, per slot, the sums the ``evaluate`` formula needs (sum D, max D, occupancy, extra
seconds, longest critical path, members), so adding or removing one trajectory re-prices its slot in
O(1) (O(members) when a maximum leaves). ``state.price()`` returns exactly what ``evaluate`` would (after
``release_idle``) for the current roles and placement: makespan (including the PREFILL water level),
switching GPU-seconds and deadline overrun. Tests check the two agree on random decisions.

``disaggregate`` turns slot counts per (slot type, role) into roles per slot and a placement: trajectories
keep their slot in the starting decision (the hint) when it still decodes; the others are placed
longest-first on the decoding slot whose finish after adding them is earliest (one heap per slot group).

``repair`` is a local search from the makespan slot and from slots past their deadline: move one
trajectory to one of the least loaded compatible slots, or swap it with a shorter one there, when that
lowers the objective (makespan + lambda * switching + penalty * overrun, priced incrementally). It stops at
a local optimum, after ``max_moves``, or at ``until`` on the instance clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import Role
from rollplan.solver.backends.greedy import top_two
from rollplan.solver.bounds import InstanceArrays, instance_arrays
from rollplan.solver.evaluate import waterfill_finish
from rollplan.solver.instance import MAX_NUM_SEQS, Instance

PROBES = 3
"""Least loaded slots of each group tried as move targets per trajectory."""
EPS = 1e-9


class Prep:
    """Per-instance coefficient tables, per perf type (slots equal in every perf coefficient) x trajectory.

    Lists, not arrays: the local search reads single entries, which is faster on Python lists.
    """

    def __init__(self, inst: Instance, arrays: InstanceArrays | None = None) -> None:
        self.inst = inst
        x = arrays if arrays is not None else instance_arrays(inst)
        self.x = x
        cfg = inst.config
        self.lam = cfg.switch_weight
        self.pen = cfg.deadline_penalty
        self.rsw = cfg.role_switch_seconds
        self.ptype: list[int] = x.type_of.tolist()
        n_types, n_j = len(x.rep), x.D.size
        self.occw_a = np.empty((n_types, n_j))
        self.cp_a = np.empty((n_types, n_j))
        self.qm_a = np.empty((n_types, n_j))
        self.qd_a = np.empty((n_types, n_j))
        self.mix_a = np.empty((n_types, n_j))
        self.dec_a = np.empty((n_types, n_j))
        self.fits_a = np.empty((n_types, n_j), dtype=bool)
        for k, r in enumerate(x.rep.tolist()):
            kv = x.kv[r]
            share = np.maximum(x.kbar / kv if kv > 0 else np.inf, 1.0 / MAX_NUM_SEQS)
            occ = x.D + (x.W / x.tau[r] if x.tau[r] > 0 else 0.0)
            self.occw_a[k] = occ * share
            self.cp_a[k] = x.D * (x.a[r] + x.c[r]) + x.W + x.P / x.mu[r]  # CP_j at batch 1
            self.mix_a[k] = x.P / x.mu[r]
            self.dec_a[k] = x.P / x.cross[r]
            # Q_j by role (``Instance.own_path``): the slot adds phi (c sum D + sum e) once (``State._finish``).
            self.qm_a[k] = self.cp_a[k] - ((inst.phi * x.c[r]) * x.D + inst.phi * self.mix_a[k])
            self.qd_a[k] = self.cp_a[k] - ((inst.phi * x.c[r]) * x.D + inst.phi * self.dec_a[k])
            self.fits_a[k] = x.peak <= kv
        self.occw: list[list[float]] = self.occw_a.tolist()
        self.cp: list[list[float]] = self.cp_a.tolist()
        self.qm: list[list[float]] = self.qm_a.tolist()
        self.qd: list[list[float]] = self.qd_a.tolist()
        self.phi = inst.phi
        self.mix: list[list[float]] = self.mix_a.tolist()
        self.dec: list[list[float]] = self.dec_a.tolist()
        self.fits: list[list[bool]] = self.fits_a.tolist()
        self.node_a = np.asarray(_codes([sl.node for sl in inst.slots]), dtype=np.int64)
        self.D: list[float] = x.D.tolist()
        self.P: list[float] = x.P.tolist()
        self.ctx: list[float] = x.ctx.tolist()
        self.home: list[int] = x.home.tolist()
        self.node_id: list[int] = self.node_a.tolist()
        self.a: list[float] = x.a.tolist()
        self.c: list[float] = x.c.tolist()
        self.phic: list[float] = (inst.phi * x.c).tolist()  # phi c_s
        self.mu: list[float] = x.mu.tolist()
        self.mu_p: list[float] = x.mu_p.tolist()
        self.same: list[float] = x.same.tolist()
        self.cross: list[float] = x.cross.tolist()
        self.tp: list[float] = x.tp.tolist()
        self.deadline: list[float] = x.deadline.tolist()
        self.on_now: list[bool] = (x.cur_code != 0).tolist()
        self.slots = inst.slots

    def move(self, j: int, s: int) -> float:
        """m_js (``Instance.move_seconds``)."""
        h = self.home[j]
        if h < 0 or h == s:
            return 0.0
        ctx = self.ctx[j]
        rate = self.same[s] if self.node_id[h] == self.node_id[s] else self.cross[s]
        return min(1e-3 + ctx / rate, ctx / self.mu[s])

    def start(self, s: int, role: Role) -> float:
        return self.slots[s].start_seconds(role, self.rsw)

    def moves_of(self, jj: np.ndarray, placement: np.ndarray) -> np.ndarray:
        """m_js for trajectories ``jj[i]`` on slots ``placement[i]`` (vectorised ``move``)."""
        x = self.x
        home = x.home[jj]
        ctx = x.ctx[jj]
        away = (home >= 0) & (home != placement)
        h = np.where(home >= 0, home, 0)
        rate = np.where(self.node_a[h] == self.node_a[placement], x.same[placement], x.cross[placement])
        m = np.minimum(1e-3 + ctx / rate, ctx / x.mu[placement])
        return np.where(away, m, 0.0)


def _codes(names: Sequence[str]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(n, len(seen)) for n in names]


@dataclass(frozen=True, slots=True)
class Price:
    objective: float
    makespan: float
    switching: float
    overrun: float


class SlotState:
    """Roles + placement with the per-slot sums of ``evaluate`` (see the module docstring)."""

    def __init__(self, prep: Prep, roles: Sequence[Role]) -> None:
        self.prep = prep
        n = len(roles)
        self.roles = list(roles)
        self.st = [prep.start(s, roles[s]) if roles[s] is not Role.OFF else 0.0 for s in range(n)]
        self.sum_d = [0.0] * n
        self.max_d = [0.0] * n
        self.occ = [0.0] * n
        self.extra = [0.0] * n
        self.cp = [0.0] * n  # max Q_j over the members
        self.stall = [0.0] * n  # sum of the members' own prefill (MIXED) / KV receive (DECODE) seconds
        self.members: list[list[int]] = [[] for _ in range(n)]
        self.finish = [self.st[s] if roles[s] is not Role.OFF else 0.0 for s in range(n)]
        self.where = [-1] * len(prep.D)
        self.prefill_work = 0.0
        self.move_sw = 0.0  # sum_j tp_s m_js

    # -- per slot -------------------------------------------------------------------------------------------
    def _own(self, j: int, s: int) -> float:
        """e_js: j's own prefill (MIXED) or KV receive (DECODE) seconds on s."""
        p = self.prep
        k = p.ptype[s]
        return p.mix[k][j] if self.roles[s] is Role.MIXED else p.dec[k][j]

    def _extra(self, j: int, s: int) -> float:
        return self._own(j, s) + self.prep.move(j, s)

    def _q(self, j: int, s: int) -> float:
        """Q_js in s's current role."""
        p = self.prep
        k = p.ptype[s]
        return p.qd[k][j] if self.roles[s] is Role.DECODE else p.qm[k][j]

    def _finish(self, s: int, sum_d: float, max_d: float, occ: float, extra: float, cp: float, stall: float) -> float:
        p = self.prep
        return self.st[s] + max(p.c[s] * sum_d + p.a[s] * (max_d if max_d > occ else occ) + extra,
                                cp + (p.phic[s] * sum_d + p.phi * stall))

    def finish_with(self, j: int, s: int) -> float:
        """T_s if j were added to s."""
        p = self.prep
        k = p.ptype[s]
        d = p.D[j]
        own = self._own(j, s)
        return self._finish(
            s,
            self.sum_d[s] + d,
            max(self.max_d[s], d),
            self.occ[s] + p.occw[k][j],
            self.extra[s] + own + p.move(j, s),
            max(self.cp[s], self._q(j, s)),
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
        max_d = self.max_d[s] if d < self.max_d[s] else max(p.D[i] for i in rest)
        cp = self.cp[s] if self._q(j, s) < self.cp[s] else max(self._q(i, s) for i in rest)
        return self._finish(
            s, self.sum_d[s] - d, max_d, self.occ[s] - p.occw[k][j], self.extra[s] - self._extra(j, s), cp,
            self.stall[s] - self._own(j, s),
        )

    def add(self, j: int, s: int) -> None:
        p = self.prep
        k = p.ptype[s]
        d = p.D[j]
        self.sum_d[s] += d
        if d > self.max_d[s]:
            self.max_d[s] = d
        self.occ[s] += p.occw[k][j]
        self.extra[s] += self._extra(j, s)
        self.stall[s] += self._own(j, s)
        q = self._q(j, s)
        if q > self.cp[s]:
            self.cp[s] = q
        self.members[s].append(j)
        self.where[j] = s
        self.move_sw += p.move(j, s) * p.tp[s]
        if self.roles[s] is Role.DECODE:
            self.prefill_work += p.P[j]
        self.finish[s] = self._finish(s, self.sum_d[s], self.max_d[s], self.occ[s], self.extra[s], self.cp[s],
                                      self.stall[s])

    def remove(self, j: int) -> None:
        s = self.where[j]
        p = self.prep
        k = p.ptype[s]
        self.members[s].remove(j)
        self.where[j] = -1
        self.move_sw -= p.move(j, s) * p.tp[s]
        if self.roles[s] is Role.DECODE:
            self.prefill_work -= p.P[j]
        rest = self.members[s]
        if not rest:
            self.sum_d[s] = self.max_d[s] = self.occ[s] = self.extra[s] = self.cp[s] = self.stall[s] = 0.0
            self.finish[s] = self.st[s]
            return
        self.sum_d[s] -= p.D[j]
        self.occ[s] -= p.occw[k][j]
        self.extra[s] -= self._extra(j, s)
        self.stall[s] -= self._own(j, s)
        if p.D[j] >= self.max_d[s]:
            self.max_d[s] = max(p.D[i] for i in rest)
        if self._q(j, s) >= self.cp[s]:
            self.cp[s] = max(self._q(i, s) for i in rest)
        self.finish[s] = self._finish(s, self.sum_d[s], self.max_d[s], self.occ[s], self.extra[s], self.cp[s],
                                      self.stall[s])

    def set_role(self, s: int, role: Role) -> None:
        """Change the role of an empty slot."""
        assert not self.members[s], "only an empty slot changes role"
        self.roles[s] = role
        self.st[s] = self.prep.start(s, role) if role is not Role.OFF else 0.0
        self.finish[s] = self.st[s]

    # -- global ---------------------------------------------------------------------------------------------
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


def state_of(prep: Prep, roles: Sequence[Role], placement: Sequence[int]) -> SlotState:
    """A ``SlotState`` for a full placement, built with numpy (O(|J| + |S|))."""
    return state_of_partial(prep, roles, np.arange(len(placement)), np.asarray(placement, dtype=np.int64))


def state_of_partial(prep: Prep, roles: Sequence[Role], jj: np.ndarray, pl: np.ndarray) -> SlotState:
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
    fin = st + np.maximum(x.c * sum_d + x.a * np.maximum(max_d, occ) + extra,
                          cp + ((prep.inst.phi * x.c) * sum_d + prep.phi * stall))
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


# ---------------------------------------------------------------------------------------------------------
# Disaggregation
# ---------------------------------------------------------------------------------------------------------


def roles_from_counts(
    prep: Prep,
    groups: Sequence[Sequence[int]],
    counts: Sequence[dict[Role, int]],
    prefer: Sequence[Role] | None,
    hosted: Sequence[int],
) -> list[Role]:
    """Roles per slot with ``counts[g][r]`` slots of ``groups[g]`` in role r.

    Within a group, a slot keeps the role it has in ``prefer`` (the hint) or now, when the counts allow, so
    that fewer trajectories move; decoding roles go first to the slots hosting the most trajectories.
    """
    roles = [Role.OFF] * len(prep.slots)
    for members, want in zip(groups, counts, strict=True):
        left = dict(want)
        free = list(members)
        for key in ("prefer", "current"):
            rest = []
            for s in free:
                r = prefer[s] if (key == "prefer" and prefer is not None) else prep.slots[s].current_role
                if r is not Role.OFF and left.get(r, 0) > 0:
                    roles[s] = r
                    left[r] -= 1
                else:
                    rest.append(s)
            free = rest
        free.sort(key=lambda s: -hosted[s])
        for r in (Role.DECODE, Role.MIXED):
            while left.get(r, 0) > 0 and free:
                roles[free.pop(0)] = r
                left[r] -= 1
        while left.get(Role.PREFILL, 0) > 0 and free:
            roles[free.pop()] = Role.PREFILL  # the slots hosting the fewest
            left[Role.PREFILL] -= 1
    return roles


def place_longest_first(
    state: SlotState,
    todo: Sequence[int],
    *,
    until: float | None = None,
    clock: Callable[[], float] | None = None,
) -> bool:
    """Place ``todo`` (trajectory indices) longest-first, each where its slot finishes earliest.

    One heap per (perf type, role, has-deadline) group keyed by finish; deadline groups probe a few of their
    least loaded slots for one that stays within its deadline. Returns False if some trajectory fits nowhere
    or ``until`` (on ``clock``) passes first.
    """
    p = state.prep
    ref = max(range(len(p.cp)), key=lambda k: p.ptype.count(k)) if p.cp else 0
    order = sorted(todo, key=lambda j: -p.cp[ref][j])
    # Lazy heaps of (finish, slot): an entry is current when its finish equals the slot's finish now.
    heap_of: dict[int, list[tuple[float, int]]] = {}
    heaps: list[tuple[int, bool, list[tuple[float, int]]]] = []
    keyed: dict[tuple[int, Role, bool], list[tuple[float, int]]] = {}
    for s, r in enumerate(state.roles):
        if r.decodes:
            key = (p.ptype[s], r, p.deadline[s] < math.inf)
            if key not in keyed:
                keyed[key] = []
                heaps.append((key[0], key[2], keyed[key]))
            keyed[key].append((state.finish[s], s))
            heap_of[s] = keyed[key]
    for _, _, hp in heaps:
        heapq.heapify(hp)
    fin = state.finish
    for n, j in enumerate(order):
        if until is not None and clock is not None and n % 64 == 63 and clock() >= until:
            return False
        best: tuple[float, float, int] | None = None
        home = p.home[j]
        if home >= 0 and state.roles[home].decodes and p.fits[p.ptype[home]][j]:
            f = state.finish_with(j, home)
            best = (max(0.0, f - p.deadline[home]), f, home)
        for k, has_deadline, heap in heaps:
            if not heap or not p.fits[k][j]:
                continue
            while heap and heap[0][0] != fin[heap[0][1]]:
                heapq.heappop(heap)  # stale
            probes = [e for e in heap[:PROBES] if e[0] == fin[e[1]]] if has_deadline else heap[:1]
            for _, s in probes:
                f = state.finish_with(j, s) + p.lam * p.move(j, s) * p.tp[s]
                over = max(0.0, f - p.deadline[s])
                if best is None or (over, f) < (best[0], best[1]):
                    best = (over, f, s)
                if over <= 0:
                    break
        if best is None:
            return False
        s = best[2]
        state.add(j, s)
        heapq.heappush(heap_of[s], (fin[s], s))
    return True


def pack_decreasing(
    prep: Prep,
    roles: Sequence[Role],
    *,
    lo: float,
    hi: float,
    until: float,
    clock: Callable[[], float],
    rounds: int = 14,
) -> SlotState | None:
    """Next-fit-decreasing packing by remaining decode length, bisecting the target makespan in [lo, hi].

    A slot's time is dominated by c sum D + a max(max D, occupancy): placing trajectories of similar length
    together pays each slot's max D once for many of them, which longest-first spreading (one long
    trajectory per slot) does not. Slots fill in order of start time up to min(target, deadline); the
    best feasible packing found before ``until`` is returned (None if none).
    """
    order = sorted(range(len(prep.D)), key=lambda j: -prep.D[j])
    slots = sorted((s for s, r in enumerate(roles) if r.decodes), key=lambda s: (prep.start(s, roles[s]), s))
    if not slots or not order:
        return None
    best: SlotState | None = None
    for _ in range(rounds):
        if clock() >= until or hi <= lo * (1 + 1e-4):
            break
        target = 0.5 * (lo + hi)
        state = _pack_at(prep, roles, order, slots, target, until, clock)
        if state is None:
            lo = target
        else:
            best, hi = state, max(state.finish)
    return best


def _pack_at(
    prep: Prep,
    roles: Sequence[Role],
    order: Sequence[int],
    slots: Sequence[int],
    target: float,
    until: float,
    clock: Callable[[], float],
) -> SlotState | None:
    state = SlotState(prep, roles)
    cap = [min(target, prep.deadline[s]) for s in slots]
    cur = 0
    for n, j in enumerate(order):
        if n % 256 == 255 and clock() >= until:
            return None
        placed = False
        i = cur
        while i < len(slots):
            s = slots[i]
            if prep.fits[prep.ptype[s]][j] and state.finish_with(j, s) <= cap[i]:
                state.add(j, s)
                placed = True
                break
            if i == cur and state.members[s]:
                cur += 1  # next fit: a slot that rejects a (longer-first) trajectory is closed
            i += 1
        if not placed:
            return None
    return state


# ---------------------------------------------------------------------------------------------------------
# Local search
# ---------------------------------------------------------------------------------------------------------


def repair(
    state: SlotState,
    *,
    until: float | None,
    clock: Callable[[], float],
    max_moves: int = 20000,
) -> int:
    """Improve ``state`` in place by moves and swaps off the worst slots (see the module docstring)."""
    p = state.prep
    decode_slots = [s for s, r in enumerate(state.roles) if r.decodes]
    if len(decode_slots) < 2:
        return 0
    moves = 0
    stalled: set[int] = set()
    for it in range(max_moves):
        if until is not None and it % 4 == 0 and clock() >= until:
            break
        level = state.prefill_level()
        fin = state.finish
        worst, cur, second = top_two(decode_slots, fin)
        over_slots = [s for s in decode_slots if fin[s] > p.deadline[s] + EPS and s not in stalled]
        target_slot = over_slots[0] if over_slots else worst
        if target_slot < 0 or target_slot in stalled or level >= cur:
            break  # the PREFILL level (or nothing) sets the makespan: moves between decode slots cannot help
        if not _improve_slot(state, target_slot, decode_slots, max(second, level), over=bool(over_slots)):
            stalled.add(target_slot)
            if not over_slots:
                break
        else:
            moves += 1
            stalled.clear()
    return moves


def _improve_slot(state: SlotState, s: int, decode_slots: Sequence[int], floor: float, *, over: bool) -> bool:
    """One improving move or swap of a trajectory on ``s``; True if made."""
    p = state.prep
    fin = state.finish
    cur = fin[s]
    by_role: dict[Role, list[int]] = {}
    for t in decode_slots:
        if t != s:
            by_role.setdefault(state.roles[t], []).append(t)
    targets: list[int] = []
    for lst in by_role.values():
        targets += heapq.nsmallest(PROBES, lst, key=fin.__getitem__)
    members = sorted(state.members[s], key=lambda i: -p.D[i])
    best: tuple[float, int, int, int] | None = None  # (gain, j, t, swap partner or -1)
    for j in members:
        without = state.finish_without(j)
        for t in targets:
            if not p.fits[p.ptype[t]][j]:
                continue
            f_t = state.finish_with(j, t)
            gain = _gain(
                state, s, t, cur, without, fin[t], f_t, floor, p.move(j, t) * p.tp[t] - p.move(j, s) * p.tp[s]
            )
            if gain > EPS and (best is None or gain > best[0]):
                best = (gain, j, t, -1)
        if best is not None:
            break  # the longest movable trajectory: good enough, keeps each step O(targets)
    if best is None and not over:
        # Swaps: j (long, on s) with i (shorter, on t).
        for j in members[:4]:
            for t in targets:
                if not p.fits[p.ptype[t]][j]:
                    continue
                for i in sorted(state.members[t], key=lambda i: p.D[i])[:4]:
                    if p.D[i] >= p.D[j] or not p.fits[p.ptype[s]][i]:
                        continue
                    state.remove(j)
                    state.remove(i)
                    state.add(j, t)
                    state.add(i, s)
                    f_s, f_t = fin[s], fin[t]
                    sw = (p.move(j, t) - p.move(i, t)) * p.tp[t] + (p.move(i, s) - p.move(j, s)) * p.tp[s]
                    state.remove(j)
                    state.remove(i)
                    state.add(j, s)
                    state.add(i, t)
                    gain = _gain(state, s, t, cur, f_s, fin[t], f_t, floor, sw)
                    if gain > EPS and (best is None or gain > best[0]):
                        best = (gain, j, t, i)
            if best is not None:
                break
    if best is None:
        return False
    _, j, t, i = best
    state.remove(j)
    if i >= 0:
        state.remove(i)
        state.add(i, s)
    state.add(j, t)
    return True


def _gain(
    state: SlotState,
    s: int,
    t: int,
    cur: float,
    new_s: float,
    old_t: float,
    new_t: float,
    floor: float,
    d_move: float,
) -> float:
    """Objective decrease of changing slot s's finish cur -> new_s and slot t's old_t -> new_t."""
    p = state.prep
    old_ms = max(cur, floor, old_t)
    new_ms = max(floor, new_s, new_t)
    d_over = (max(0.0, new_s - p.deadline[s]) - max(0.0, cur - p.deadline[s])) + (
        max(0.0, new_t - p.deadline[t]) - max(0.0, old_t - p.deadline[t])
    )
    if d_over > EPS:
        return -math.inf
    return (old_ms - new_ms) - p.lam * d_move - p.pen * d_over
