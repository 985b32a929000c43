"""The local search: one module, one state (``search.state.SlotState``), two move rules sharing it.

Both start from the slot that sets the makespan (``top_two``) and price every tried move exactly
(``SlotState.finish_with`` / ``finishes_without``, i.e. ``pricing.slot_time``), gaining
``makespan - lambda * switching (- penalty * overrun)``.

``improve`` (the greedy's polish): each round, the decoding slot that finishes last; its trajectories
(longest first) are tried on the four least loaded slots of the same role and, when ``open_slots``, on the
cheapest-to-start usable OFF slot of each type (turned on MIXED); the best move over all of them is made.
Stops at a local optimum, after ``max_rounds``, or at ``until``.

``repair`` (after disaggregation and packing, where slots may be past their deadline): from the first slot
past its deadline, else the makespan slot, the longest member with an improving move to one of the
``PROBES`` least loaded slots of each decoding role is moved; without one, a swap with a shorter member
there. Slots that cannot improve are skipped until something moves. Stops at a local optimum, after
``max_moves``, or at ``until`` (checked every 4 moves). ``wide`` (the final polish): moves and swaps also
with the slots of most unfilled head (``_head_room``: a slot whose longest member leaves KV steps unfilled
takes a high-occupancy trajectory for c D alone), swaps with any member of the partner slots, partners too
long for the makespan slot to end earlier not priced (``_swap_reach``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence

from rollplan.models.types import Role
from rollplan.solver.core.instance import Instance, usable_slots
from rollplan.solver.search.state import SlotState

PROBES = 3
"""Least loaded slots of each role tried as move targets per trajectory (``repair``)."""
SWAP_PROBES = 8
"""Least loaded slots of each role whose members are tried as swap partners (``repair``)."""
HEAD_PROBES = 8
"""Slots of each role with the most unfilled head (``_head_room``) the wide swaps also try as partners (the
wide moves try ``PROBES`` of them). Reason: on the work-bound family the polish stopped after ~11 moves at a
local optimum with only the least loaded slots as partners, while slots whose longest member leaves KV steps
unfilled take a high-occupancy trajectory for c D alone. Measured at 256 x 4,096, milp at 1 s, seeds 0 / 1 / 2:
makespan gap 5.09 / 4.68 / 4.55% -> 4.75 / 4.59 / 4.55%; deterministic mode with 8 / 4 / 2 / 0 of them:
work-bound seed 0 5.07 / 5.01 / 4.69 / 5.09%, heterogeneous seed 0 8.88 / 9.07 / 9.09 / 9.11%, deadlines
seed 2 4.04 / 4.17 / 4.17 / 4.18%."""
EPS = 1e-9


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




def improve(
    inst: Instance,
    state: SlotState,
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
                closed.setdefault(prep.ptype[s], []).append((st, s))
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
        for j in sorted(state.members[worst], key=lambda i: -prep.D[i]):
            without = without_of(j)
            old_move = state.move(j, worst) * inst.slots[worst].tp
            for t in targets:
                if not prep.fits[prep.ptype[t]][j]:
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
                if not prep.fits[prep.ptype[t]][j]:
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
            closed[prep.ptype[t]].pop()
            decode_slots.append(t)
        state.remove(j)
        state.add(j, t)
        moves += 1
    return moves


def repair(
    state: SlotState,
    *,
    until: float | None,
    clock: Callable[[], float],
    max_moves: int = 20000,
    wide: bool = False,
) -> int:
    """Improve ``state`` in place by moves and swaps off the worst slots (see the module docstring).

    ``wide``: swap with any member of the ``SWAP_PROBES`` least loaded slots per role (``_wide_swap``)
    instead of the 4 longest on s with the 4 shortest on the ``PROBES`` targets: a larger neighbourhood,
    ~10x the work per stalled slot (the final polish, ``pipeline.solve_large``)."""
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
        if not _improve_slot(state, target_slot, decode_slots, max(second, level), over=bool(over_slots), wide=wide):
            stalled.add(target_slot)
            if not over_slots:
                break
        else:
            moves += 1
            stalled.clear()
    return moves


def _improve_slot(
    state: SlotState, s: int, decode_slots: Sequence[int], floor: float, *, over: bool, wide: bool = False
) -> bool:
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
    if wide:
        targets += _head_room(state, by_role, cur, PROBES, targets)
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
    if best is None and not over and not wide:
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
    if best is None and not over and wide:
        best = _wide_swap(state, s, by_role, members, floor)
    if best is None:
        return False
    _, j, t, i = best
    state.remove(j)
    if i >= 0:
        state.remove(i)
        state.add(i, s)
    state.add(j, t)
    return True


def _wide_swap(
    state: SlotState, s: int, by_role: dict[Role, list[int]], members: Sequence[int], floor: float
) -> tuple[float, int, int, int] | None:
    """The best swap of the first (longest) j on s that has one, with any i on one of the ``SWAP_PROBES``
    least loaded slots or the ``HEAD_PROBES`` slots of most unfilled head of each role, either side priced
    in O(1) (``SlotState.exchanges``): (gain, j, t, i). Partners longer than ``_swap_reach`` allows are not
    priced (they cannot make s end before its finish, which every improving swap needs)."""
    p = state.prep
    fin = state.finish
    cur = fin[s]
    swap_targets: list[int] = []
    for lst in by_role.values():
        swap_targets += heapq.nsmallest(SWAP_PROBES, lst, key=fin.__getitem__)
    swap_targets += _head_room(state, by_role, cur, HEAD_PROBES, swap_targets)
    out_of_s = state.exchanges(s)
    D = p.D
    lam, move, tp = p.lam, p.move, p.tp
    # Where neither side is past its deadline the gain is at most cur - max(floor, f_s, f_t) plus lambda
    # times the moves the swap may save (j's on s, i's on t): a pair that cannot beat the best so far is not
    # priced further (the margin keeps float rounding on the side of pricing).
    timely = fin[s] <= p.deadline[s]
    priced = []
    for t in swap_targets:
        partners = sorted(state.members[t], key=D.__getitem__)
        saved = [lam * move(i, t) * tp[t] for i in partners]
        priced.append((t, state.exchanges(t), partners, [D[i] for i in partners], saved,
                       timely and fin[t] <= p.deadline[t]))
    fits = p.fits
    fits_s = fits[p.ptype[s]]
    # s's finish after the swap is at least st + c (sum D - D_j + D_i) + a max(D_i, the longest left): a
    # partner too long for that to end before cur cannot help (``_swap_reach``), and is not priced.
    d1, d2, dj, _, _, _ = state.leaders(s)
    best: tuple[float, int, int, int] | None = None
    for j in members:
        reach = _swap_reach(cur - EPS - state.st[s] - p.c[s] * (state.sum_d[s] - D[j]), p.a[s], p.c[s],
                            d2 if j == dj else d1)
        if reach < 0:
            continue
        saved_j = lam * move(j, s) * tp[s]
        for t, into_t, partners, lengths, saved, bounded in priced:
            if not fits[p.ptype[t]][j]:
                continue
            for n in range(bisect.bisect_right(lengths, reach)):
                i = partners[n]
                if not fits_s[i]:
                    continue
                f_s = out_of_s(j, i)
                if f_s >= cur - EPS:
                    continue  # s must finish earlier for the makespan to drop
                f_t = into_t(i, j)
                if bounded:
                    top = cur - max(floor, f_s, f_t) + saved_j + saved[n]
                    if top + 1e-12 * (1.0 + abs(cur)) <= (EPS if best is None else best[0]):
                        continue
                sw = (move(j, t) - move(i, t)) * tp[t] + (move(i, s) - move(j, s)) * tp[s]
                gain = _gain(state, s, t, cur, f_s, fin[t], f_t, floor, sw)
                if gain > EPS and (best is None or gain > best[0]):
                    best = (gain, j, t, i)
        if best is not None:
            break
    return best


def _swap_reach(room: float, a: float, c: float, rest: float) -> float:
    """The longest D_i with c D_i + a max(D_i, rest) < room (rounded up by 1e-9 relative: it only prunes);
    -1 when none, inf when c is 0."""
    if c <= 0:
        return math.inf
    if room <= a * rest:
        return -1.0
    reach = (room - a * rest) / c if (c + a) * rest >= room else room / (c + a)
    return reach * (1 + 1e-9) + 1e-9


def _head_room(
    state: SlotState, by_role: dict[Role, list[int]], cur: float, count: int, taken: Sequence[int]
) -> list[int]:
    """Per role, the ``count`` slots finishing before ``cur`` (not in ``taken``) with the most unfilled head,
    a_t (max D - occupancy)^+: there a member's occupancy is free (the slot already pays max D steps), so a
    trajectory of high KV occupancy joins for c D + its extra seconds only."""
    p = state.prep
    fin, max_d, occ = state.finish, state.max_d, state.occ
    skip = set(taken)
    out: list[int] = []
    for lst in by_role.values():
        cands = [t for t in lst if fin[t] < cur and t not in skip and max_d[t] > occ[t]]
        out += heapq.nlargest(count, cands, key=lambda t: p.a[t] * (max_d[t] - occ[t]))
    return out


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
