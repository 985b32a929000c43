"""Disaggregation: from role counts per slot group (the aggregate model's answer) to roles per slot and a
placement, and the length packing of load-bound instances (the greedy's candidate and the pipeline's).

``roles_from_counts`` turns slot counts per (group, role) into roles per slot, keeping the hint's (or the
current) role where the counts allow. ``place_longest_first`` places trajectories longest first, each on
the decoding slot whose finish after adding it is earliest (one heap per slot group). ``pack_decreasing``
packs by remaining decode length, next fit, bisecting the target makespan (docs/formulation_large.md,
"Length packing"). All price through ``search.state.SlotState``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from rollplan.models.types import Role
from rollplan.solver.core.tables import Tables
from rollplan.solver.search.local import PROBES
from rollplan.solver.search.state import SlotState, state_of


def roles_from_counts(
    prep: Tables,
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


PACK_LOOKBACK = 1
"""Closed slots ``pack_decreasing`` still offers each trajectory (next-fit with this many earlier bins kept
open). Measured on 256 H800 x 4,096 (deadlines family, seed 2; bisection to 14 rounds): makespan 92.07 with
0, 91.40 with 1, 91.21 with 2 at 1.0 / 1.1 / 1.4x the packing time."""


def pack_decreasing(
    prep: Tables,
    roles: Sequence[Role],
    *,
    lo: float,
    hi: float,
    until: float,
    clock: Callable[[], float],
    rounds: int = 14,
    grow: float = 0.0,
    min_gain: float = 0.0,
) -> SlotState | None:
    """Next-fit-decreasing packing by own time (critical path at batch 1 on the most common slot type, then
    length), bisecting the target makespan in [lo, hi].

    A slot's time is the larger of its body, c sum D + a max(max D, occupancy) + extra, and its longest path,
    max Q + phi (c sum D + sum e): placing trajectories of similar own time together pays each slot's head
    (max D in the body, max Q in the path) once for many of them, which longest-first spreading (one long
    trajectory per slot) does not; ordering by the critical path rather than the length alone groups the
    long tool waits too (deadlines family, 256 x 4,096 seed 2: 95.02 by length, 92.07 by critical path).
    Slots fill in order of start time up to min(target, deadline), the last ``PACK_LOOKBACK`` closed ones
    still open; the best feasible packing found before ``until`` is returned (None if none).

    ``grow`` > 0: until a target packs, the targets climb from ``lo`` instead, lo (1 + grow 2^i) (then the
    bisection): where ``hi`` is far above what packs and the packing lands near ``lo`` (a placement left
    longest-first far above its bound), a few rounds get there.

    ``min_gain`` > 0: no round starts while the window is narrower than ``min_gain`` x ``hi``. A packing
    within a target below ``hi`` lowers the makespan by at most (hi - lo) / hi, so a window narrower than the
    planner's own tolerance (``PlannerConfig.relative_gap``, what the pipeline passes) can gain only what the
    planner has said it does not chase, at one O(|J|) pass per round (the bisection's last rounds, each a
    failure closer to ``hi``, are where that time went).

    Every completed round is recorded on the instance per roles (``_pack_record``): a later call for the same
    roles (the pipeline's, after the greedy's) starts from the targets that failed and the best packing, and
    packs only new targets. A round is not started when the longest so far would end after ``until``.
    """
    # By own time (CP on the most common slot type; ties by length): a slot's time is the larger of its body
    # and its longest path, and a trajectory's own time bounds both from below.
    k = int(np.bincount(np.asarray(prep.ptype, dtype=np.int64)).argmax()) if prep.ptype else 0
    own = prep.cp[k] if prep.cp else []
    order = sorted(range(len(prep.D)), key=lambda j: (-own[j], -prep.D[j]))
    slots = sorted((s for s, r in enumerate(roles) if r.decodes), key=lambda s: (prep.start(s, roles[s]), s))
    if not slots or not order:
        return None
    # What earlier packings of these roles found (the greedy's, for the pipeline's): the failed targets
    # raise lo, the best packing lowers hi; only new targets are packed.
    record = _pack_record(prep, roles)
    known: list[int] | None = None
    for t, res in record.items():
        if res is None:
            if lo < t < hi:
                lo = t
        elif res[0] < hi:
            hi, known = res[0], res[1]
    best: SlotState | None = None
    step = grow if known is None else 0.0
    last = 0.0  # the longest round so far: a round that cannot end before ``until`` is not started
    for _ in range(rounds):
        t_round = clock()
        if t_round + last >= until or hi <= lo * (1 + 1e-4) or hi - lo < min_gain * hi:
            break
        if best is None and known is None and step > 0 and lo * (1 + step) < hi:
            target = lo * (1 + step)
            step *= 2.0
        else:
            target = 0.5 * (lo + hi)
        state, done = _pack_at(prep, roles, order, slots, target, until, clock)
        last = max(last, clock() - t_round)
        if not done:
            break  # out of time mid-round: nothing learnt
        if state is None:
            lo = target
            record[target] = None
        else:
            best, hi = state, max(state.finish)
            record[target] = (hi, list(state.where))
    if best is None and known is not None:
        best = state_of(prep, roles, known)
    return best


def _pack_record(prep: Tables, roles: Sequence[Role]) -> dict[float, tuple[float, list[int]] | None]:
    """Per target, what ``_pack_at`` gave for ``roles`` on this instance: None (no packing within it) or
    (its makespan, its placement); kept on the instance (a pure function of the instance, the roles and the
    target), and fresh when ``prep`` is on other arrays than the instance's."""
    if prep.x is not prep.inst.arrays:
        return {}
    return prep.inst.memo(("pack_decreasing", tuple(roles)), dict)


def _pack_at(
    prep: Tables,
    roles: Sequence[Role],
    order: Sequence[int],
    slots: Sequence[int],
    target: float,
    until: float,
    clock: Callable[[], float],
) -> tuple[SlotState | None, bool]:
    """(the packing at ``target``, or None when none fits within it; whether the round completed before
    ``until``)."""
    state = SlotState(prep, roles)
    cap = [min(target, prep.deadline[s]) for s in slots]
    # Adding j raises T_s by at least min(1, phi) c_s D_j (``pricing.slot_time``: the body by c D_j, the
    # longest path by phi c D_j): a slot that fails that cheap test is not priced (the margin keeps float
    # rounding on the side of pricing).
    inc = [max(0.0, min(1.0, prep.phi)) * prep.c[s] * (1.0 - 1e-9) for s in slots]
    fin = state.finish
    D = prep.D
    cur = 0
    taken = bytearray(len(order))  # by position in ``order``: placed ahead of its turn by a head fill
    back = len(order) - 1  # the shortest not yet placed is at or before this position
    for n, j in enumerate(order):
        if taken[n]:
            continue
        if n % 256 == 255 and clock() >= until:
            return None, False
        placed = False
        i = max(0, cur - PACK_LOOKBACK)  # the last closed slots stay open to shorter trajectories
        d = D[j]
        while i < len(slots):
            s = slots[i]
            if fin[s] + inc[i] * d <= cap[i] and prep.fits[prep.ptype[s]][j] and state.finish_with(j, s) <= cap[i]:
                state.add(j, s)
                placed = True
                break
            if i == cur and state.members[s]:
                # next fit: a slot that rejects a (longer-first) trajectory is closed, its head filled first
                back = _fill_head(prep, state, s, cap[i], order, taken, n, back) if PACK_FILL else back
                cur += 1
            i += 1
        if not placed:
            return None, True
    return state, True


PACK_FILL = True
"""``_pack_at`` fills the unfilled head of each slot it closes with the shortest trajectories left
(``_fill_head``). Why: a closed slot of long trajectories decodes for max D steps whatever its occupancy,
so while its occupancy is below max D a further member costs it only c D (its KV rides in steps the slot
runs anyway), where on a slot without head it costs c D + a O w. Measured by
``test_head_fill_lowers_the_packing_on_work_bound`` (work-bound 16 x 256, seeds 0-3, the packing alone,
bisected): makespan -0.19 to -0.46%; the planner bench's work-bound M gap max 5.15 -> 5.03% (README)."""


def _fill_head(
    prep: Tables,
    state: SlotState,
    s: int,
    cap: float,
    order: Sequence[int],
    taken: bytearray,
    n: int,
    back: int,
) -> int:
    """Add the shortest unplaced trajectories (``order`` from ``back`` down to just after ``n``) to the
    closing slot ``s`` while its occupancy is below its max D and each fits within ``cap``; marks them in
    ``taken`` and returns the new ``back``."""
    kind = prep.ptype[s]
    while back > n and state.max_d[s] > state.occ[s]:
        if taken[back]:
            back -= 1
            continue
        j = order[back]
        if not prep.fits[kind][j] or state.finish_with(j, s) > cap:
            break
        state.add(j, s)
        taken[back] = 1
        back -= 1
    return back


# ---------------------------------------------------------------------------------------------------------
# Local search
# ---------------------------------------------------------------------------------------------------------
