"""Home exchanges: a trajectory placed away from its home slot goes home in exchange for a member of that
slot that is itself away from home, where the pair of slots ends no later and works less.

Why: the length packing (``search.disaggregate.pack_decreasing``) groups trajectories of like own time, so
it moves nearly every mid-flight trajectory off its home (work-bound family: ~96% of them), and each move
costs its new slot m_js seconds (a KV transfer, ``pricing.move_seconds``). Two trajectories of like length
trade places at little cost to either slot's head or occupancy, and the trade saves one or two moves.

Notations (``rollplan.solver.core.instance``; per round, on the state's current sums):
  j  an *exile*: home h = home(j) decodes, j sits on s = where(j) != h, and j fits h's type
  k  a *guest* of h: where(k) = h != home(k) (a new trajectory, without a home, included), k fits s's
     type; the candidates are the guests of h nearest to j in D (one on each side in the D order of h's
     guests)
  f_s, f_h            the two slots' finish now (``pricing.slot_time``)
  f'_s, f'_h          after the trade: s loses j and takes k, h loses k and takes j (``SlotState.exchanges``)
A trade is taken when f'_s + f'_h < f_s + f_h (the pair works less), f'_s <= f_s and f'_h <= f_h (neither
slot ends later than it did, so the makespan cannot rise) and each ends by its deadline. Why neither, not
only the later of the two: a trade may then lift the earlier slot up to the other's finish, which the
model does not mind, but the plan is a prediction; slots brought up to the makespan leave less room for
the trajectories that run longer than predicted.
Each round prices every candidate at once (numpy, the same ``pricing.slot_time``), then makes the best
trades greedily with each slot in at most one (so every price made on the round's sums stays exact).
Rounds repeat until none is taken, ``max_rounds``, or ``until`` (a round that would end after it is not
started).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rollplan.solver.core import pricing
from rollplan.solver.search.state import SlotState

EXCHANGE_ROUNDS = 32
"""Rounds of ``home_exchanges`` at most (its work cap in deterministic mode). Each slot takes part in at
most one trade per round, so a slot with g guests needs about g rounds; the packing leaves ~16 per slot
at 16 trajectories per slot, and the rounds' trades fall off geometrically after the first few."""
EPS = 1e-9


def home_exchanges(
    state: SlotState,
    *,
    until: float | None = None,
    clock: Callable[[], float] | None = None,
    max_rounds: int = EXCHANGE_ROUNDS,
) -> int:
    """Make home exchanges on ``state`` in place (module docstring); returns the number of trades."""
    p = state.prep
    x = p.x
    n_j = len(p.D)
    if n_j == 0:
        return 0
    home = np.asarray(p.home, dtype=np.int64)
    hosts = np.asarray(state.hosts, dtype=bool)
    mixed = np.asarray(state.mixed, dtype=bool)
    ptype = x.type_of
    D = x.D
    deadline = np.asarray(p.deadline)
    a_s, c_s, phic_s = np.asarray(p.a), np.asarray(p.c), np.asarray(p.phic)
    span = 2.0 * (1.0 + float(D.max(initial=0.0)))  # (slot, D) as one sortable key: slot * span + D
    trades = 0
    longest = 0.0  # the longest round so far: a round that cannot end before ``until`` is not started
    for _ in range(max_rounds):
        t_round = clock() if clock is not None else 0.0
        if until is not None and clock is not None and t_round + longest >= until:
            break
        where = np.asarray(state.where, dtype=np.int64)
        h_safe = np.where(home >= 0, home, 0)
        placed = where >= 0
        exile = placed & (home >= 0) & (home != where) & hosts[h_safe] & p.fits_a[ptype[h_safe], np.arange(n_j)]
        guest = placed & (home != where)
        jj = np.nonzero(exile)[0]
        gg = np.nonzero(guest)[0]  # every exile is a guest of its own slot, so gg is not empty when jj is not
        if jj.size == 0:
            break
        # Guests ordered by (slot, D): each exile j looks up the guests of its home on each side of D_j.
        gg = gg[np.lexsort((D[gg], where[gg]))]
        g_slot = where[gg]
        pos = np.searchsorted(g_slot * span + D[gg], home[jj] * span + D[jj])
        cand_j: list[np.ndarray] = []
        cand_k: list[np.ndarray] = []
        for idx in (pos - 1, pos):
            idx_c = np.clip(idx, 0, gg.size - 1)
            ok = (idx >= 0) & (idx < gg.size) & (g_slot[idx_c] == home[jj])
            cand_j.append(jj[ok])
            cand_k.append(gg[idx_c[ok]])
        cj = np.concatenate(cand_j)
        ck = np.concatenate(cand_k)
        s = where[cj]
        h = home[cj]
        fit = p.fits_a[ptype[s], ck]
        cj, ck, s, h = cj[fit], ck[fit], s[fit], h[fit]
        if cj.size == 0:
            break
        lead = _leaders(state, np.unique(np.concatenate([s, h])))
        new_s = _exchanged(state, s, cj, ck, a_s, c_s, phic_s, mixed, lead)
        new_h = _exchanged(state, h, ck, cj, a_s, c_s, phic_s, mixed, lead)
        fin = np.asarray(state.finish)
        old_s, old_h = fin[s], fin[h]
        gain = (old_s + old_h) - (new_s + new_h)
        ok = (
            (gain > EPS * (1.0 + old_s + old_h))
            & (new_s <= old_s + EPS)
            & (new_h <= old_h + EPS)
            & (new_s <= deadline[s] + EPS)
            & (new_h <= deadline[h] + EPS)
        )
        if not ok.any():
            break
        pick = np.nonzero(ok)[0]
        pick = pick[np.argsort(-gain[pick], kind="stable")]
        used: set[int] = set()
        done_round = 0
        for i in pick.tolist():
            si, hi, j, k = int(s[i]), int(h[i]), int(cj[i]), int(ck[i])
            if si in used or hi in used:
                continue
            used.add(si)
            used.add(hi)
            state.remove(j)
            state.remove(k)
            state.add(j, hi)
            state.add(k, si)
            done_round += 1
        trades += done_round
        if clock is not None:
            longest = max(longest, clock() - t_round)
        if done_round == 0:
            break
    return trades


def _leaders(state: SlotState, slots: np.ndarray) -> tuple[np.ndarray, ...]:
    """``SlotState.leaders`` of ``slots`` as six arrays indexed by slot (other slots: zeros, -1)."""
    n = len(state.roles)
    cols = [np.zeros(n), np.zeros(n), np.full(n, -1, np.int64), np.zeros(n), np.zeros(n), np.full(n, -1, np.int64)]
    for t in slots.tolist():
        for col, v in zip(cols, state.leaders(t), strict=True):
            col[t] = v
    return tuple(cols)


def _exchanged(
    state: SlotState,
    slot: np.ndarray,
    out: np.ndarray,
    into: np.ndarray,
    a_s: np.ndarray,
    c_s: np.ndarray,
    phic_s: np.ndarray,
    mixed: np.ndarray,
    lead: tuple[np.ndarray, ...],
) -> np.ndarray:
    """T of ``slot[i]`` if member ``out[i]`` left it and ``into[i]`` joined it (vectorised
    ``SlotState.exchanges``, on the state's current sums)."""
    p = state.prep
    x = p.x
    k = x.type_of[slot]
    d1, d2, dj, c1, c2, cjm = (col[slot] for col in lead)
    st = np.asarray(state.st)[slot]
    sum_d = np.asarray(state.sum_d)[slot]
    occ = np.asarray(state.occ)[slot]
    extra = np.asarray(state.extra)[slot]
    stall = np.asarray(state.stall)[slot]
    mx = mixed[slot]
    ex_in = np.where(mx, p.mix_a[k, into], p.dec_a[k, into])
    ex_out = np.where(mx, p.mix_a[k, out], p.dec_a[k, out])
    q_in = np.where(mx, p.qm_a[k, into], p.qd_a[k, into])
    md = np.where(out == dj, d2, d1)
    di = x.D[into]
    cp = np.where(out == cjm, c2, c1)
    return pricing.slot_time(
        st, a_s[slot], c_s[slot], phic_s[slot], p.phi,
        sum_d - x.D[out] + di,
        np.maximum(md, di),
        occ - p.occw_a[k, out] + p.occw_a[k, into],
        extra - (ex_out + p.moves_of(out, slot)) + (ex_in + p.moves_of(into, slot)),
        np.maximum(cp, q_in),
        stall - ex_out + ex_in,
    )

