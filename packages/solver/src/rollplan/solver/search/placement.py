"""The greedy search (the ``greedy`` backend, and the incumbent of every exact one): closed-form role sizing + longest-first placement + local search.

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
   (b) on the first configuration placed, the length packing (``search.disaggregate.pack_decreasing``:
   next fit by own time, ``PACK_ROUNDS`` targets climbing from the lower bound, every core bound included);
   (c) from scratch, longest first, each to the candidate with the least finish increase within a target
   makespan (clusters long trajectories: a slot already running a longer one pays only c_s D_j), the target
   bisected between the lower bound and the best makespan found (``_place_searching``).
3. Local search (``search.local.improve``): moves off the makespan slot to the least loaded slots of its role, or onto the
   cheapest OFF slot (turned on), while makespan - lambda * switching improves; then ``go_home`` sends moved
   trajectories back home where the home stays below the makespan. Stops at a local optimum, at the budget,
   or when the makespan meets the lower bound.

Every candidate is priced with the ``evaluate`` formula (incrementally, ``search.state.SlotState``); ``plan()`` re-prices the
chosen decision with ``evaluate`` itself.
"""


from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import Role
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.bounds import capped_waterfill, compute_bounds, type_work
from rollplan.solver.core.evaluate import waterfill_finish
from rollplan.solver.core.instance import ROLE_CODE, Instance, InstanceArrays, usable_slots
from rollplan.solver.core.pricing import longest_path, slot_time
from rollplan.solver.core.tables import Tables
from rollplan.solver.search.disaggregate import pack_decreasing
from rollplan.solver.search.local import improve
from rollplan.solver.search.state import SlotState

log = logging.getLogger(__name__)

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
PACK_ROUNDS = 4
"""Rounds of the length packing the greedy runs on its first configuration (its work cap in deterministic
mode; a round is one O(|J|) pass). Reason: at 1,024 x 16,384 two placements from scratch (0.1-0.25 s each)
end 1-13% above the bound where the packing, in about the same time, ends 0.1-7% above it; measured on seed
2 at L (makespan / objective after ``go_home``, 4 rounds vs 2 placements): heterogeneous 108.3 / 118.2 vs
116.1 / 122.3, work-bound 84.6 / 95.7 vs 87.2 / 95.9, deadlines 122.1 / 124.5 vs 130.4 / 132.4, long-tail
390.3 / 390.7 vs 398.7 / 398.8, example 318.8 / 321.2 vs 321.4 / 324.0; 6 rounds gained <= 0.5% for 1.3-2x
the time. Checked on seeds 0, 1 (greedy and milp at 1 s, makespan gap): heterogeneous L 9.52 -> 0.12% and
9.87 -> 0.01%, work-bound L 7.54 -> 7.12% and 7.89 -> 7.11% (objective 94.4 -> 93.1, 95.9 -> 94.7),
deadlines L 8.00 -> 0.12% and 7.08 -> 0.09%."""
PACK_GROW = 0.01
"""The packing's first target is lower bound x (1 + this), doubling the excess after each target that does
not pack (``pack_decreasing``'s ``grow``). Measured with ``PACK_ROUNDS`` = 4 at L, seed 2, objective: 0.01 /
0.02 / plain bisection from the bound to the placement's makespan: heterogeneous 118.2 / 117.6 / 118.3,
work-bound 95.7 / 96.3 / 95.8, deadlines 124.5 / 124.7 / 127.8, long-tail 390.7 / 391.1 / 393.9."""
SCRATCH_PER_PACK_ROUND = 2.0
"""A placement from scratch costs about this many packing rounds (both one pass over the trajectories in
Python; the home placement, vectorised, says little about it): what ``_place_searching`` checks against the
budget before starting one. Measured at L (work-bound seed 2): a packing round 0.07 s, a placement 0.10-0.17 s."""
TAIL_SECONDS_PER_TRAJECTORY = 5e-6
"""Measured CPU cost, per trajectory, of what ``solve_greedy`` runs after a configuration's placement and
cannot interrupt (``go_home``, the objective, the move count; ``go_home`` 1-7.4 us, the objective 0.1-0.2 us
at 256 x 4,096 and 1,024 x 16,384, work-bound, heterogeneous and deadlines seed 0, on this 2-core machine):
kept back from the budget where the first configuration's packing and placements decide whether to start
another round, so the greedy ends by its ``until`` rather than one tail after it (at 1,024 x 16,384 a
placement started with time left for itself alone ended the greedy 0.07 s past its budget)."""
CODE_ROLE = {0: Role.OFF, 1: Role.MIXED, 2: Role.PREFILL, 3: Role.DECODE}
LONGEST = 32


class Prep(Tables):
    """The coefficient tables (``core.tables.Tables``) plus what every configuration's placement shares:
    the longest-first order (by critical path on the type most slots have, then by work), each type's
    total work and prefill time, and the longest critical paths the fluid estimate checks."""

    def __init__(self, inst: Instance, arrays: InstanceArrays | None = None) -> None:
        super().__init__(inst, arrays)
        x = self.x
        n_types = len(x.rep)
        dec, _ = type_work(x)
        work = dec + self.mix_a
        if n_types and inst.trajs:
            ref = int(np.bincount(x.type_of, minlength=n_types).argmax())
            self.order: list[int] = np.lexsort((np.arange(x.D.size), -work[ref], -self.cp_a[ref])).tolist()
            rank = np.empty(len(self.order), dtype=np.int64)
            rank[np.asarray(self.order, dtype=np.int64)] = np.arange(len(self.order))
            self.rank_a = rank
            self.rank: list[int] = rank.tolist()
            self.total_work: list[float] = work.sum(axis=1).tolist()
            self.total_prefill_time: list[float] = [float(self.mix_a[k].sum()) for k in range(n_types)]
            top = np.array(self.order[:LONGEST], dtype=int)
            self.top_cp = self.cp_a[:, top]
            self.top_fit = self.fits_a[:, top]
        else:
            ref = 0
            self.order, self.total_work, self.total_prefill_time = [], [0.0] * n_types, [0.0] * n_types
            self.rank = []
            self.rank_a = np.zeros(0, dtype=np.int64)
            self.top_cp = np.zeros((n_types, 0))
            self.top_fit = np.zeros((n_types, 0), dtype=bool)
        self.ref_type = ref
        self.n_types = n_types


DEADLINE_PROBES = 3
"""Deadline slots share one heap per (type, role); this many of its least loaded are tried per trajectory."""


def place(prep: Prep, roles: Sequence[Role], *, target: float = 0.0, homes: bool = True) -> SlotState | None:
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
    state = SlotState(prep, roles)
    hosts = state.hosts
    slot_type = prep.ptype
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


def _home_pass_reference(prep: Prep, state: SlotState, limit: Sequence[float], timed: Sequence[bool]) -> list[int]:
    """``place``'s home pass, one trajectory at a time (the specification of ``_home_pass``)."""
    pool: list[int] = []
    hosts, slot_type, fits = state.hosts, prep.ptype, prep.fits
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


def _home_pass(prep: Prep, state: SlotState, limit: Sequence[float], timed: Sequence[bool]) -> list[int]:
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
    o2[at] = prep.occw_a[k, cand]
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
    phic = np.asarray(prep.phic)[rows][:, None]
    fin = slot_time(st, a, c, phic, prep.phi, sums["sum_d"], sums["max_d"], sums["occ"], sums["extra"], sums["cp"],
                    sums["stall"])
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
            if state.roles[s] is Role.DECODE:
                state.prefill_work += float(x.P[js].sum())
        else:
            pool += _replay(state, s, js, limit)
    return pool


def _replay(state: SlotState, s: int, js: Sequence[int], limit: Sequence[float]) -> list[int]:
    """The reference home pass on slot ``s`` alone, for its (fitting) candidates ``js`` in order."""
    rejected = []
    for j in js:
        if state.finish_with(j, s) <= limit[s]:
            state.add(j, s)
        else:
            rejected.append(j)
    return rejected


def _fill_windows(state: SlotState, deadlines: Sequence[float]) -> int:
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
    decode, fin = prep.D, state.finish
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
        own = state.st[s] + longest_path(state.cp[s], prep.phic[s], prep.phi, state.sum_d[s], state.stall[s])
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
            if entry[2] != version[t] or not prep.fits[prep.ptype[t]][j]:
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




def _fluid(prep: Prep, codes: np.ndarray) -> tuple[float, float]:
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
        for k in range(prep.n_types):
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


def candidate_configs(prep: Prep, *, limit: int = FULL_CONFIGS) -> list[_Config]:
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
    prep: Prep, cfg: _Config, lower: float, *, rounds: int, until: float | None, pack: bool = True
) -> SlotState | None:
    """The best of: ``place`` keeping homes at the fluid target; when ``pack``, the length packing
    (``pack_decreasing``, ``PACK_ROUNDS`` targets climbing from ``lower``); and ``place`` from scratch (homes
    ignored: long trajectories clustered, migrations priced) with its target bisected between the lower bound
    and the best makespan found (a target too low degrades to plain longest-first, too high over-clusters).
    A placement from scratch starts only when its cost (the packing's rounds tell it, ``SCRATCH_PER_PACK_ROUND``,
    then its own) fits before ``until``."""
    clock = prep.inst.config.clock
    target = cfg.makespan if math.isfinite(cfg.makespan) else 0.0
    tail = TAIL_SECONDS_PER_TRAJECTORY * len(prep.D)
    until = None if until is None else until - tail  # what solve_greedy still runs after this returns
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
    scratch = one_round  # what a placement from scratch costs (the home pass above is vectorised: cheaper)
    if pack and PACK_ROUNDS and hi > lo * (1 + PACK_GROW):
        t_pack = clock()
        pack_until = math.inf if until is None else until
        packed = pack_decreasing(prep, cfg.roles, lo=lo, hi=hi, until=pack_until, clock=clock, rounds=PACK_ROUNDS,
                                 grow=PACK_GROW)
        # A round of the packing and a placement are both one pass over the trajectories in Python.
        scratch = max(scratch, SCRATCH_PER_PACK_ROUND * (clock() - t_pack) / PACK_ROUNDS)
        if packed is not None:
            # The packing moves nearly every trajectory; sent home where that keeps each home below the
            # makespan, it keeps its makespan and drops most of those moves (work-bound L seed 2: objective
            # 96.6 -> 93.8) before it competes.
            go_home(prep.inst, packed)
            obj = packed.objective()[1]
            if obj < best_obj:
                best, best_obj = packed, obj
            hi = min(hi, _makespan(packed))
    has_homes = any(h >= 0 for h in prep.home)
    for r in range(max(0, rounds - 1) if has_homes else 0):
        if until is not None and clock() + 1.5 * scratch >= until:
            break
        target = lo + (hi - lo) * (0.3 if r == 0 else 0.5)
        t_round = clock()
        state = place(prep, cfg.roles, target=target, homes=False)
        scratch = max(scratch, clock() - t_round)
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


def _makespan(state: SlotState) -> float:
    return state.makespan_of_hosts()


def go_home(inst: Instance, state: SlotState) -> int:
    """Send moved trajectories back home where that keeps the home slot below the makespan (saves the move).

    Largest move first; the candidates (away from a hosting home they fit) and their moves are taken with
    numpy, the homing itself one trajectory at a time (each changes its home's finish)."""
    prep = state.prep
    x = prep.x
    ms = _makespan(state)
    deadlines = [math.inf if sl.deadline is None else sl.deadline for sl in inst.slots]
    home = x.home
    if not home.size:
        return 0
    where = np.asarray(state.where, dtype=np.int64)
    safe = np.where(home >= 0, home, 0)
    away = (home >= 0) & (where != home) & np.asarray(state.hosts, dtype=bool)[safe]
    cand = np.nonzero(away & prep.fits_a[x.type_of[safe], np.arange(home.size)])[0]
    if not cand.size:
        return 0
    m = prep.moves_of(cand, where[cand])
    count = 0
    for j in cand[np.argsort(-m, kind="stable")].tolist():
        h = prep.home[j]
        f = state.finish_with(j, h)
        if f < ms * (1 - 1e-9) and f <= deadlines[h]:
            state.remove(j)
            state.add(j, h)
            count += 1
    return count


def solve_greedy(
    inst: Instance,
    *,
    until: float | None = None,
    arrays: InstanceArrays | None = None,
    n_configs: int | None = None,
) -> tuple[list[Role], list[int], float]:
    """The greedy decision for ``inst``: (roles, placement, estimated objective).

    The local search stops at ``until`` on ``inst.config.clock``; at least one configuration is always
    placed (so the answer can come late when ``until`` is already past: O(|J| log |S|) work). ``n_configs``:
    how many role configurations ``candidate_configs`` picks (default ``FULL_CONFIGS``, 2 above ``LARGE``).
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
    prep = Prep(inst, arrays)
    big = len(inst.trajs) * max(1, prep.n_types) > LARGE
    configs = candidate_configs(prep, limit=n_configs if n_configs is not None else 2 if big else FULL_CONFIGS)
    best: tuple[float, int, list[Role], list[int]] | None = None
    # Every core bound, the on-time ones too (a plan at this value cannot be beaten on time): where the search
    # stops and where the packing's targets start. Memoised on the instance: plan() reports the same ones.
    lower = max(compute_bounds(inst, arrays=prep.x, on_time=True).values(), default=0.0)
    rounds = TARGET_ROUNDS if not big else TARGET_ROUNDS_LARGE
    one_config = 0.0
    for i, cfg in enumerate(configs):
        if best is not None and until is not None and clock() + one_config >= until:
            break  # out of time: the first configuration that hosts everything is always placed
        t_config = clock()
        if best is not None and best[0] < cfg.estimate * (1 - 1e-9) and cfg.name in ("usable", "all"):
            break  # last resorts are only for when nothing better hosts the batch
        state = _place_searching(prep, cfg, lower, rounds=rounds, until=until, pack=best is None)
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

