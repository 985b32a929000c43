"""Lower bounds on the optimal makespan of the formulation (``instance`` Notations, priced by ``evaluate``).

Every bound here is valid for *every* decision ``evaluate`` accepts without problems (each trajectory on a
decoding slot its peak KV fits, a PREFILL slot whenever a DECODE slot hosts prefill work), deadlines
included or not: a DEADLINE_RELAXED plan is still bounded. So ``bound <= min makespan <= any plan's makespan``.

Let stlb_s = on_s + (role_switch if slot s is OFF now else 0): the least st_s of any role but OFF.

``critical_path`` — for slot s hosting j (either decoding role), ``evaluate`` gives
    T_s >= st_s + max(CP_js, c_s D_j + a_s D_j + m_js + min(P_j / mu_s, x_js))
(decode_time >= (c_s + a_s) D_j since max(max D, sum O w) >= D_j; extra >= m_js + its own prefill share:
P_j / mu_s on MIXED, x_js on DECODE). Hence C >= max_j min_{s: j fits s} (stlb_s + that). For s != home(j),
m_js >= min(1e-3 + ctx_j / max(same_s, cross_s), ctx_j / mu_s); at home m = 0 (and m = 0 when the KV is lost).

``work`` — every slot s spends at most C - st_s <= C - stlb_s seconds working, and j costs its host
dec_js = c_s D_j + a_s O_js w_js seconds (sum of the per-slot decode time's linear part: a max(.) >= a sum O w)
plus P_j / mu_q on whichever slot q prefills it (its MIXED host, or a PREFILL slot). For any weights v_s >= 0:
    sum_s v_s (C - stlb_s)^+ >= sum_j [ min_{s: fits} v_s dec_js + P_j min_q v_q / mu_q ] = W_v
so C >= the water-filling finish of W_v over starts stlb_s at rates v_s. Weights are taken per slot type
(slots of one type share every coefficient): uniform, and 1 / (mean work of a trajectory on the type); the
larger result is kept. KV transfer and migration seconds are dropped (>= 0), which keeps it valid.

Deadlines (``on_time``): a plan without violations finishes every slot by its deadline, so for such plans
the work bound closes each slot's window at min(C, d_s) and the critical-path bound only counts slots where
j's own time ends by d_s. ``plan()`` reports these when its plan has no violations, the deadline-free ones
otherwise (a DEADLINE_RELAXED plan may beat an on-time bound).

``work_head`` — the work bound with the per-slot heads: ``evaluate``'s decode time on s is
c_s sum D + a_s max(M_s, sum O w) (M_s = the largest D on s) >= c_s sum D + a_s (theta M_s + (1 - theta) sum O w)
for any theta in [0, 1]. Summed over the slots (uniform weights, windows as for ``work``):
    sum_s (C - stlb_s)^+ >= W_theta + theta a_min sum_s M_s,
    W_theta = sum_j min_{types j fits} (c D_j + (1 - theta) a O_j w_j) + sum_j P_j / max mu.
With D sorted decreasing, let m_k be the number of slots hosting one of the k longest. Each such slot has
M_s >= D_k, so for any alpha in [0, 1] its own members cost sum (c D_j + (1 - alpha) a O w) <= C - st_min -
alpha a_min D_k: m_k >= ceil(sum_{j <= k} least cost / that room) (none can exist when the room is <= 0; m_k
<= the number of slots; m_k grows with k); with alpha = 0 also at least the fewest slots whose own windows
(largest first: a lent slot's ends at its deadline when on time) hold that cost. Layer cake: sum_s M_s =
int #{s: M_s >= t} dt >= sum_k (D_k - D_{k+1}) m_k. The left side grows with C and the right side shrinks,
so the smallest C satisfying every (theta in ``HEAD_THETAS``) inequality is found by bisection; the bound is
the last C shown infeasible.
Weighted like ``work`` (slot weights v per type: every cost and window times v_s; a_min becomes min v a,
the room max v (C - st_min) - alpha min(v a) D_k): uniform, v = 1 / a (heads counted in decode steps, so a
mix of GPU kinds loses nothing to the fastest one's a) and ``work``'s 1 / mean work; the largest is kept. Reason: with ~16
trajectories per slot and long contexts the heads a (M_s - occupancy) are 3-11% of the slots' time (bench
families), which ``work`` misses.
*Heads no slot can fill*: a slot whose longest member decodes M tokens and that finishes by C spends
c_s sum D <= C - st_s - a_s M on decoding (the rest is at least a_s M), so its occupancy is at most F_k(C - st_k -
a_k M): the most occupancy any set of trajectories fitting its type k holds for that much c-priced work (a
fractional knapsack over all trajectories by O w / c D, tabulated once per type; st_k the type's least start).
Its head is then at least h_k(M) = max(0, M - F_k(C - st_k - a_k M)), which grows with M; so max(M_s, sum O w) >=
theta M_s + (1 - theta) (sum O w + h(M_s)) and, by the same layer cake over the hosts m_k,
sum_s v_s a_s h_s(M_s) >= sum_k (g(D_k) - g(D_{k+1})) m_k with g(d) = min_k v_k a_k h_k(d) (made nonincreasing
along the sorted D by lowering). Each inequality becomes
    sum_s v_s (C - stlb_s)^+ >= W_theta + theta (v a)_min sum_s M_s + (1 - theta) sum_s v_s a_s h_s(M_s).
Reason: on the heterogeneous family the head is forced on every slot hosting a long trajectory (its KV share
is too small to fill M steps within C); measured at M (256 x 4,096) seed 0: 90.16 -> 93.53.
*Pooled heads* (theta = 0): the fillers of the hosts' heads come from one pool, each trajectory counted once.
Let H be the n slots hosting one of the k longest (n >= m_k), A_k = sum_{l < k} (D_l - D_{l+1}) m_l. By the
layer cake restricted to H, sum_H M_s >= A_k + D_k n. Per j let cost_j = min_types v c D_j and value_j =
max_types v a O_j w_j (over the types j fits), and G(B) the most value of any set of trajectories of total cost
<= B (a fractional knapsack by value / cost: concave, piecewise linear; ``_PoolFill``). The hosts' c-priced
decode work is at most sum_H v_s (C - st_s) - sum_H v_s a_s M_s <= n room_k - (v a)_min A_k, room_k = v_max (C -
st_min) - (v a)_min D_k, so their occupancy value is at most G(n room_k - (v a)_min A_k) and their unfilled heads
    sum_H v_s a_s (M_s - sum O w)^+ >= g_k(n) = (v a)_min (A_k + D_k n) - G(n room_k - (v a)_min A_k)
(the right side grows with sum_H M_s, so its least value is at the layer-cake minimum). g_k is convex in n (G
concave): its least over n in [m_k, |S|] is at the clipped stationary point, G'(n room_k - (v a)_min A_k) =
(v a)_min D_k / room_k (``_PoolFill.cost_at``). The unfilled heads are time beyond W_0, so the theta = 0
inequality becomes sum_s v_s (C - stlb_s)^+ >= W_0 + max_k g_k(n_k) (one evaluation per k).
*Nested hosts* (``nested_hosts``; for ``path_head`` too, with levels q and scale v_min): the hosts H_k of the
k longest all have M_s >= D_k, and the layers above D_k are counted by the hosts of the longer ones, so
summing each host's inequality over H_k (h_k = |H_k|) gives
    sum_{s in H_k} (v_s (min(C, d_s) - st_s) - alpha (v a)_min D_k) >= need_alpha[k] + alpha (v a)_min A_k,
A_k = sum_{l < k} (D_l - D_{l+1}) h_l; the left side is at most the sum of the h_k largest such rooms (only
positive rooms can host: a host's time is at least its alpha-weighted head plus its members' costs). Solved
for the least h_k, k in order, with the lower bounds found so far in A_k (a larger A only raises h_k). This
charges each host the room it has under its own, longer head, where the plain count gives every host the
room of the k-th; and a lent slot's window (on time) caps its room. Evaluated on ``NESTED_GRID`` points of k
(between them the last point's value, h growing with k; layers between points counted at the upper point's
count: an under-count, still valid). Measured at M (256 x 4,096, on time): deadlines seed 2 path_head 79.80
-> 84.90; heterogeneous seed 2 92.14 -> 92.60, seed 0 93.53 -> 93.87; work-bound +0.1%.

``path_head`` — the longest path and the heads together: a decoding slot's T_s - st_s is at least its
longest path max_j Q_js + phi sum_k (c_s D_k + e_ks) (``pricing.slot_time``) and its body c_s sum D + a_s
max(M_s, sum O w) + extra, so for theta_p + theta_h <= 1 it is at least theta_p (Q*_s^+ + phi U_s) + theta_h
(c_s sum D + a_s M_s) + (1 - theta_p - theta_h)(body with the filled head above), U_s = sum_k (c_s D_k + e_ks)
(the clip Q*^+ holds: when Q* < 0 the body alone is >= U_s >= phi U_s). Summed like ``work_head``, with
per-trajectory least values (q_j = min over the types it fits and both roles of Q_js, u_j = min (c D + e)),
and a second layer cake over q: the slots hosting one of the k largest q number at least
ceil(sum_{i <= k} (alpha phi u_i + (1 - alpha) b_i) / ((C - st_min) - alpha q_k)) (b = c D + a O w + e). Prefill
slots count (1 - theta_p) of their prefill seconds. Reason: where a trajectory's tool waits make its path
exceed its slot's body (deadline family), the heads alone miss it; it is strictly the best bound on 147 of 500
tiny family instances. Both head bounds report only what is above work and critical path (0 otherwise), and
start their bisection there (the cost at 1,024 x 16,384: ~0.1 s).

``co_running`` — what one slot can host by C, counted per slot (the other bounds pool the slots' time; a
slot that starts late may hold time but no whole path). Per slot type k and role (MIXED / DECODE), for j
fitting k: u_jk = c_k D_j + e_jk (``pricing.corunning_increment``: what j adds to each co-resident's path
before phi), b_jk = dec_jk + e_jk (what j adds to its slot's body). A slot s hosting J_s has
    T_s - st_s >= max_{j in J_s} (CP_js + phi sum_{i in J_s, i != j} u_is)    (Q_js + phi sum_i u_is)
    T_s - st_s >= sum_{i in J_s} b_is    (max(max D, sum O w) >= sum O w; moves >= 0).
So for any set L of trajectories, a slot hosting n members of L needs at least
    R^L(n) = max( min_{j in L} (CP_j + phi sigma_{n-1}(L - j)), beta_n(L) ),
sigma_m(X) the sum of the m smallest u over X and beta_n the n smallest b over L (each the least over the
n-subsets; further members only add, u, b >= 0, so R grows with n). With L sorted by increasing u (rank r),
sigma_{n-1}(L - j) = sigma_n - u_j when r_j <= n - 2 and sigma_{n-1} otherwise: R^L(n) for every n from one
prefix minimum of CP - phi u and one suffix minimum of CP (``corunning_need``). Slot s then hosts at most
N^M_s(C) (MIXED) or N^D_s(C) (DECODE) = #{n : stlb_s + R^L(n) <= min(C, d_s)} members of L (on time: the
window ends at d_s). The DECODE-hosted ones need their prefill served: F members on DECODE slots carry at
least Pi(F) prefill tokens (the F smallest P of L, convex in F), and the PREFILL slots serve at most
sum_P mu_p (min(C, d_p) - stlb_p)^+ by C; every tangent of Pi gives F <= kappa_i + sum_P sigma_p / pi_i
(pi_i = the (i + 1)-th smallest P, kappa_i = i - Pi(i) / pi_i). For any lam >= 0 the hosted count is then
at most (Lagrangian relaxation of that constraint, each slot taking its best role)
    H(C) = sum_s max(N^M_s, (1 - lam)^+ N^D_s, lam sigma_s / pi_i, 0) + lam kappa_i,
minimised over the breakpoints in lam (convex, piecewise linear) and a few tangents (``most_fed``). Every
member of L is hosted, so a makespan C needs H(C) >= |L|; the bound is the largest C shown to fail for one
of the sets L = the k longest by least critical path (k on ``CORUN_LEVELS`` geometric points up to |J|),
by bisection (H grows with C). Reason: a replay snapshot (9 warm, 4 lent and 7 cold slots, 61.4 s cold
start, 256 alike trajectories) planned at 183.9 against bounds of 145.4 (work, path_head): a cold slot
hosting one trajectory ends at 61.4 + its 118 s path, which no pooled bound sees; the count gives 165.7
(and the plan, with the late slots as PREFILL, 171.3).

``lp`` — the LP relaxation of the MILP (``rollplan.solver.backends.milp.lp_bound``), when the caller hands it
to ``compute_bounds`` (``plan()`` does for the exact backends when the budget allows): this module imports
nothing above the core.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping

import numpy as np

from rollplan.solver.core import pricing
from rollplan.solver.core.evaluate import waterfill_finish
from rollplan.solver.core.instance import Instance, InstanceArrays

log = logging.getLogger(__name__)

BOUND_WORK = "work_capacity"
BOUND_CRITICAL_PATH = "critical_path"
BOUND_LP = "lp_relaxation"
BOUND_WORK_HEAD = "work_head"
BOUND_PATH_HEAD = "path_head"
BOUND_CORUNNING = "co_running"
HEAD_THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
HEAD_ALPHAS = (0.0, 0.5, 1.0)
HEAD_BISECTIONS = 48


def capped_waterfill_reference(starts: np.ndarray, rates: np.ndarray, ends: np.ndarray, work: float) -> float:
    """``capped_waterfill``, one event at a time (the specification of the vectorised version)."""
    if starts.size == 0:
        return math.inf
    if np.isinf(rates).any():  # a slot with nothing to do per batch: any open window holds the batch
        return float(starts[np.isinf(rates)].min())
    if work <= 0:
        return 0.0
    events: list[tuple[float, float]] = []
    for s_, r, e in zip(starts.tolist(), rates.tolist(), ends.tolist(), strict=True):
        if r > 0 and e > s_:
            events.append((s_, r))
            if e != math.inf:
                events.append((e, -r))
    if not events:
        return math.inf
    events.sort()
    t, cap, slope = events[0][0], 0.0, 0.0
    for tau, delta in events:
        if slope > 0:
            reach = cap + slope * (tau - t)
            if reach >= work:
                return t + (work - cap) / slope
            cap = reach
        t = tau
        slope += delta
    return t + (work - cap) / slope if slope > 1e-300 else math.inf


def capped_waterfill(starts: np.ndarray, rates: np.ndarray, ends: np.ndarray, work: float) -> float:
    """Smallest T with sum rate * (min(T, end) - start)^+ >= work (inf when the windows cannot hold it).

    Exact: the capacity is piecewise linear in T with breakpoints at the starts and ends; one sorted sweep.
    Vectorised ``capped_waterfill_reference``: events sorted as the tuples sort (time, then delta); the
    slope before each event and the capacity reached at it are sequential running sums (``np.cumsum``),
    so every float is the one the reference loop computes.
    """
    if starts.size == 0:
        return math.inf
    if np.isinf(rates).any():  # a slot with nothing to do per batch: any open window holds the batch
        return float(starts[np.isinf(rates)].min())
    if work <= 0:
        return 0.0
    open_ = (rates > 0) & (ends > starts)
    if not open_.any():
        return math.inf
    closing = open_ & (ends != math.inf)
    times = np.concatenate([starts[open_], ends[closing]])
    deltas = np.concatenate([rates[open_], -rates[closing]])
    order = np.lexsort((deltas, times))
    times, deltas = times[order], deltas[order]
    slope_after = np.cumsum(deltas)  # slope += delta, in event order
    slope = np.concatenate([[0.0], slope_after[:-1]])  # the slope while reaching event i
    prev = np.concatenate([times[:1], times[:-1]])  # t: the previous event's time (the first's own)
    rising = slope > 0
    step = np.where(rising, slope * (times - prev), 0.0)  # cap + 0.0 == cap where the slope is not positive
    reach = np.cumsum(step)  # cap after event i (cap stays when not rising: adding 0.0 is exact)
    hit = np.nonzero(rising & (reach >= work))[0]
    if hit.size:
        i = int(hit[0])
        cap = float(reach[i - 1]) if i > 0 else 0.0
        return float(prev[i]) + (work - cap) / float(slope[i])
    t, cap, last = float(times[-1]), float(reach[-1]), float(slope_after[-1])
    return t + (work - cap) / last if last > 1e-300 else math.inf


def _memo_bound(inst: Instance, arrays: InstanceArrays | None, name: str, on_time: bool,
                fn: Callable[[InstanceArrays, bool], float]) -> float:
    """``fn(arrays, on_time)``, memoised on the instance when ``arrays`` are its own (0 when there is nothing
    to place or nowhere to place it)."""
    if not len(inst.trajs) or not inst.slots:
        return 0.0
    if arrays is not None and arrays is not inst.arrays:
        return fn(arrays, on_time)
    return inst.memo((name, on_time), lambda: fn(inst.arrays, on_time))


def critical_path_bound(inst: Instance, arrays: InstanceArrays | None = None, *, on_time: bool = False) -> float:
    """max_j min_s (stlb_s + j's own time on s): see the module docstring.

    ``on_time``: valid only for decisions that finish every slot by its deadline; a slot then counts for j
    only when j's own time on it ends by the deadline (inf when some j has no such slot).
    Computed once per instance (``plan()`` asks several times; a pure function of the instance).
    """
    return _memo_bound(inst, arrays, "critical_path_bound", on_time, _critical_path_bound)


def _critical_path_bound(x: InstanceArrays, on_time: bool) -> float:
    d, p, ctx, home = x.D, x.P, x.ctx, x.home
    dq, wq = x.Dq, x.Wq  # the paths' inputs (``PlannerConfig.path_z``)
    best = np.full(d.shape, math.inf)
    lost = home < 0
    for k, r in enumerate(x.rep):
        a, c, mu, cross, same = x.a[r], x.c[r], x.mu[r], x.cross[r], x.same[r]
        fits = x.peak <= x.kv[r]
        cp = pricing.critical_path(dq, wq, p, a, c, mu)
        own_prefill = np.minimum(p / mu, pricing.kv_receive_seconds(p, cross))
        move = np.where(lost, 0.0, pricing.move_seconds(ctx, max(same, cross), mu))
        own = np.maximum(cp, d * (a + c) + move + own_prefill)
        members = np.nonzero(x.type_of == k)[0]
        if on_time:
            # The earliest start among the type's slots whose window (deadline - start) holds j's own time:
            # windows sorted descending, prefix minimum of the starts, one binary search per j.
            st_m = x.stlb[members]
            win = x.deadline[members] - st_m
            order = np.argsort(-win, kind="stable")
            prefix_min = np.minimum.accumulate(st_m[order])
            count = np.searchsorted(-win[order], -own + 1e-9, side="right")
            away = np.where(count > 0, prefix_min[np.maximum(count - 1, 0)] + own, math.inf)
        else:
            away = x.stlb[members].min() + own
        best = np.where(fits, np.minimum(best, away), best)
    # At home: no move.
    j = np.nonzero(~lost)[0]
    if j.size:
        h = home[j]
        a, c, mu, cross = x.a[h], x.c[h], x.mu[h], x.cross[h]
        fits = x.peak[j] <= x.kv[h]
        cp = pricing.critical_path(dq[j], wq[j], p[j], a, c, mu)
        val = x.stlb[h] + np.maximum(cp, d[j] * (a + c) + np.minimum(p[j] / mu, pricing.kv_receive_seconds(p[j], cross)))
        if on_time:
            fits &= val <= x.deadline[h] + 1e-9
        best[j] = np.where(fits, np.minimum(best[j], val), best[j])
    if on_time:
        return float(best.max())  # inf: some trajectory cannot finish on time anywhere
    best = best[np.isfinite(best)]
    return float(best.max()) if best.size else 0.0


def type_work(x: InstanceArrays) -> tuple[np.ndarray, np.ndarray]:
    """(dec[k, j], fit[k, j]): dec_jk = c_k D_j + a_k O_jk w_jk on slot type k, and whether j's KV fits k."""
    n_types, n_j = len(x.rep), x.D.size
    dec = np.empty((n_types, n_j))
    fit = np.empty((n_types, n_j), dtype=bool)
    for k, r in enumerate(x.rep):
        occw = pricing.occupancy_work(x.D, x.W, x.kbar, x.tau[r], x.kv[r])
        dec[k] = pricing.additive_work(x.D, occw, x.a[r], x.c[r])
        fit[k] = x.peak <= x.kv[r]
    return dec, fit


def work_bound(inst: Instance, arrays: InstanceArrays | None = None, *, on_time: bool = False) -> float:
    """Water-filling of the weighted total work over slot start times: see the module docstring.

    ``on_time``: valid only for decisions that finish every slot by its deadline: each slot's window then
    closes at its deadline (inf when the windows cannot hold the work).
    Computed once per instance (``plan()`` asks several times; a pure function of the instance).
    """
    return _memo_bound(inst, arrays, "work_bound", on_time, _work_bound)


def _work_bound(x: InstanceArrays, on_time: bool) -> float:
    dec, fit = type_work(x)
    n_types = len(x.rep)
    p = x.P
    mu = x.mu[x.rep]
    weightings = [np.ones(n_types)]
    if n_types > 1:
        mean_work = np.array(
            [dec[k][fit[k]].mean() + (p / mu[k]).mean() if fit[k].any() else np.inf for k in range(n_types)]
        )
        with np.errstate(divide="ignore"):  # 1 / 0 is masked by the where
            weightings.append(np.where(np.isfinite(mean_work) & (mean_work > 0), 1.0 / mean_work, 0.0))
    best = 0.0
    for v in weightings:
        if not (v > 0).any():
            continue
        host = np.where(fit, v[:, None] * dec, np.inf).min(axis=0)
        if not np.isfinite(host).all():
            continue  # some j fits no positively weighted type: this weighting gives nothing
        prefill_rate = (v / mu).min()
        total = float(host.sum() + p.sum() * prefill_rate)
        if on_time:
            best = max(best, capped_waterfill(x.stlb, v[x.type_of], x.deadline, total))
        else:
            best = max(best, waterfill_finish(x.stlb.tolist(), v[x.type_of].tolist(), total))
    return best


def _least_infeasible(feasible: Callable[[float], bool], st_min: float, floor: float) -> float:
    """The largest C shown infeasible (bisection to ``HEAD_BISECTIONS`` halvings or 1e-9 relative): a valid
    lower bound, never above the threshold of the monotone test ``feasible``. 0.0 when it says nothing above
    ``floor`` (another valid bound; ``feasible`` passes 1e-6 above it), or when no C passes (the windows
    cannot hold the work on time: the other bounds say so)."""
    lo = max(st_min, floor)
    if lo > st_min and feasible(lo * (1.0 + 1e-6)):
        return 0.0  # nothing worth reporting above the floor
    hi = lo + max(1.0, 0.01 * (lo - st_min))
    for _ in range(64):
        if feasible(hi):
            break
        lo, hi = hi, st_min + (hi - st_min) * 2.0
    else:
        return 0.0
    for _ in range(HEAD_BISECTIONS):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo


WINDOW_PIECES = 8
"""Distinct window values ``nested_hosts`` walks (more are binned, rounded up)."""
NESTED_GRID = 96
"""Points of the nested host recursion (``nested_hosts``): its cost per bisection step is this many scalar
steps per alpha; a coarser grid only under-counts the layers above each point (still valid)."""


def _nested_grid(n: int) -> np.ndarray:
    """Indices 0 <= g_0 < ... < g_last = n - 1 where ``nested_hosts`` evaluates its recursion: dense at the
    top (the longest trajectories, where the hosts' levels differ most), spread evenly below."""
    if n <= NESTED_GRID:
        return np.arange(n)
    half = NESTED_GRID // 2
    top = np.unique(np.round(np.geomspace(1.0, float(n), half)).astype(np.int64) - 1)
    even = np.round(np.linspace(0.0, n - 1.0, half)).astype(np.int64)
    return np.unique(np.concatenate([top, even, [n - 1]]))


def window_pieces(windows: np.ndarray) -> tuple[list[float], list[int]]:
    """The slots' weighted windows v_s (min(C, d_s) - st_s), positive ones, as (values decreasing, counts):
    at most ``WINDOW_PIECES`` values, each rounded up to the largest in its bin (rooms over-counted: still
    valid for ``nested_hosts``)."""
    w = np.sort(windows[windows > 0])[::-1]
    if not w.size:
        return [], []
    vals, counts = np.unique(-w, return_counts=True)
    if vals.size > WINDOW_PIECES:  # bins of equal count, each at its largest value
        cuts = np.linspace(0, w.size, WINDOW_PIECES + 1).round().astype(np.int64).tolist()
        bins = [(a, b) for a, b in itertools.pairwise(cuts) if b > a]
        return [float(w[a]) for a, _ in bins], [b - a for a, b in bins]
    return (-vals).tolist(), counts.tolist()


def nested_hosts(
    pieces: tuple[list[float], list[int]], need: Mapping[float, np.ndarray], level: np.ndarray, scale: float,
    grid: np.ndarray
) -> np.ndarray | None:
    """Per k (levels sorted decreasing), a lower bound on h_k, the slots hosting one of the k first: the h_k
    largest rooms (window - alpha scale level_k, positive ones; ``pieces`` from ``window_pieces``) hold
    need_alpha[k] + alpha scale A_k, A_k = sum_{l < k} (level_l - level_l+1) h_l (module docstring, "nested
    hosts"), evaluated on ``grid`` (between grid points the last one's value: h_k grows with k). None when
    the rooms cannot hold some need (no decision finishes by C)."""
    lv = level[grid].tolist()
    needs = [(alpha, w[grid].tolist()) for alpha, w in need.items()]
    vals, counts = pieces
    above = 0.0  # A at the current grid point (the layers above it, counted with the lower bounds so far)
    h = 0.0
    out = [0.0] * grid.size
    for i in range(grid.size):
        if i:
            above += (lv[i - 1] - lv[i]) * h
        for alpha, w in needs:
            base = alpha * scale * lv[i]
            target = w[i] + alpha * scale * above
            if target <= 0:
                continue
            held, m = 0.0, 0
            for val, cnt in zip(vals, counts, strict=True):
                r = val - base
                if r <= 0:
                    return None
                if held + cnt * r >= target * (1.0 - 1e-12):
                    m += max(0, math.ceil((target - held) / r - 1e-9))
                    break
                held += cnt * r
                m += cnt
            else:
                return None
            if m > h:
                h = float(m)
        out[i] = h
    idx = np.searchsorted(grid, np.arange(level.size), side="right") - 1
    return np.asarray(out)[idx]


def work_head_bound(inst: Instance, *, on_time: bool = False) -> float:
    """The work bound with per-slot heads (``work_head`` in the module docstring); 0 when it says nothing.

    ``on_time``: valid only for decisions that finish every slot by its deadline (windows end there).
    Computed once per instance (O((|J| + |S|) log) per bisection step, ~``HEAD_BISECTIONS`` steps).
    """
    if not len(inst.trajs) or not inst.slots:
        return 0.0
    key = ("work_head_bound", on_time)
    return inst.memo(key, lambda: _work_head_bound(inst.arrays, on_time, _floor(inst, on_time)))


def _work_head_bound(x: InstanceArrays, on_time: bool, floor: float) -> float:
    dec, fit = type_work(x)
    a_t, c_t = x.a[x.rep], x.c[x.rep]
    if not x.D.size or float(x.D.max()) <= 0 or (a_t <= 0).any() or (c_t < 0).any():
        return 0.0
    weightings = [np.ones(a_t.size)]
    if a_t.size > 1:
        weightings.append(1.0 / a_t)  # heads in decode steps: no loss to the fastest type's a
        mu_t = x.mu[x.rep]
        mean_work = np.array(
            [dec[k][fit[k]].mean() + (x.P / mu_t[k]).mean() if fit[k].any() else np.inf for k in range(a_t.size)]
        )
        if (np.isfinite(mean_work) & (mean_work > 0)).all():
            weightings.append(1.0 / mean_work)  # the work bound's second weighting
    fill = _HeadFill(x, fit)
    best = 0.0
    for v in weightings:  # each weighting only has to beat the best so far
        best = max(best, _work_head_weighted(x, dec, fit, v, on_time, fill, max(floor, best)))
    return best


class _HeadFill:
    """Per slot type k, F_k(B): the most occupancy a slot of type k can hold with B seconds of its c-priced
    decode work (a fractional knapsack over every trajectory that fits k, by O w / c D), tabulated once per
    instance. ``head(C, d, v)``: min_k v_k a_k max(0, d - F_k(C - st_k - a_k d)) per leader length d, st_k the
    type's least start: the least weighted head of any slot whose longest member decodes d tokens."""

    def __init__(self, x: InstanceArrays, fit: np.ndarray) -> None:
        self.a = x.a[x.rep]
        self.st = np.array([float(x.stlb[x.type_of == k].min()) for k in range(len(x.rep))])
        self.tables: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for k, r in enumerate(x.rep):
            occ = np.where(fit[k], pricing.occupancy_work(x.D, x.W, x.kbar, x.tau[r], x.kv[r]), 0.0)
            cost = np.where(fit[k], float(x.c[r]) * x.D, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(cost > 0, occ / cost, np.where(occ > 0, np.inf, 0.0))
            order = np.argsort(-ratio, kind="stable")
            cost, occ = cost[order], occ[order]
            self.tables.append(
                (cost, occ, np.concatenate([[0.0], np.cumsum(cost)]), np.concatenate([[0.0], np.cumsum(occ)]))
            )

    def most(self, k: int, budget: np.ndarray) -> np.ndarray:
        """F_k(budget), element-wise (the knapsack's value, linear within each item)."""
        cost, occ, cum_cost, cum_occ = self.tables[k]
        b = np.clip(budget, 0.0, cum_cost[-1])
        i = np.minimum(np.searchsorted(cum_cost, b, side="right") - 1, cost.size - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(cost[i] > 0, (b - cum_cost[i]) / cost[i], 1.0)
        return cum_occ[i] + np.clip(frac, 0.0, 1.0) * occ[i]

    def head(self, C: float, d: np.ndarray, v: np.ndarray) -> np.ndarray:
        out = np.full(d.shape, np.inf)
        for k in range(self.a.size):
            h = np.maximum(0.0, d - self.most(k, C - self.st[k] - self.a[k] * d))
            out = np.minimum(out, v[k] * self.a[k] * h)
        return out


class _PoolFill:
    """The fill pool of ``work_head``'s pooled heads, for slot weights ``v``: per trajectory j its least
    weighted c-priced cost min_k v_k c_k D_j and its largest weighted occupancy max_k v_k a_k O_jk w_jk over
    the types it fits, sorted by value / cost (decreasing). ``most(B)``: G(B), the most weighted occupancy
    any set of trajectories, each counted once, holds for a total weighted cost B (a fractional knapsack;
    concave, piecewise linear). ``cost_at(r)``: the cost of every item whose ratio is >= r (where G's slope
    falls below r)."""

    def __init__(self, x: InstanceArrays, fit: np.ndarray, v: np.ndarray) -> None:
        a_t, c_t = x.a[x.rep], x.c[x.rep]
        occw = np.stack([pricing.occupancy_work(x.D, x.W, x.kbar, x.tau[r], x.kv[r]) for r in x.rep])
        cost = np.where(fit, (v * c_t)[:, None] * x.D[None, :], np.inf).min(axis=0)
        value = np.where(fit, (v * a_t)[:, None] * occw, 0.0).max(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(cost > 0, value / cost, np.where(value > 0, np.inf, 0.0))
        order = np.argsort(-ratio, kind="stable")
        self.cost, self.value, self.ratio = cost[order], value[order], ratio[order]
        self.cum_cost = np.concatenate([[0.0], np.cumsum(self.cost)])
        self.cum_value = np.concatenate([[0.0], np.cumsum(self.value)])

    def most(self, budget: np.ndarray) -> np.ndarray:
        b = np.clip(budget, 0.0, self.cum_cost[-1])
        i = np.minimum(np.searchsorted(self.cum_cost, b, side="right") - 1, self.cost.size - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(self.cost[i] > 0, (b - self.cum_cost[i]) / self.cost[i], 1.0)
        return self.cum_value[i] + np.clip(frac, 0.0, 1.0) * self.value[i]

    def cost_at(self, r: np.ndarray) -> np.ndarray:
        return self.cum_cost[np.searchsorted(-self.ratio, -r, side="right")]


def _work_head_weighted(
    x: InstanceArrays,
    dec: np.ndarray,
    fit: np.ndarray,
    v: np.ndarray,
    on_time: bool,
    fill: _HeadFill,
    floor: float,
) -> float:
    """``work_head`` with slot weights ``v`` per type (module docstring, weighted as ``work`` is)."""
    a_t, c_t, mu_t = x.a[x.rep], x.c[x.rep], x.mu[x.rep]
    cpart = c_t[:, None] * x.D[None, :]
    apart = dec - cpart  # a_k O_jk w_jk
    prefill = float(x.P.sum()) * float((v / mu_t).min())
    va_min = float((v * a_t).min())
    v_max = float(v.max())
    weight = v[x.type_of]

    def least(theta: float) -> np.ndarray:  # min over the types j fits of v (c D_j + (1 - theta) a O w)
        return np.where(fit, v[:, None] * (cpart + (1.0 - theta) * apart), np.inf).min(axis=0)

    totals = [float(least(theta).sum()) + prefill for theta in HEAD_THETAS]
    order = np.argsort(-x.D, kind="stable")
    d_sorted = x.D[order]
    layer = d_sorted - np.concatenate([d_sorted[1:], [0.0]])  # D_k - D_{k+1} >= 0
    need = {alpha: np.cumsum(least(alpha)[order]) for alpha in HEAD_ALPHAS}
    st_min = float(x.stlb.min())
    n_slots = x.stlb.size
    ends = x.deadline if on_time else np.full(x.stlb.shape, math.inf)
    pool = _PoolFill(x, fit, v)
    grid = _nested_grid(d_sorted.size)

    def pooled(C: float, hosts: np.ndarray) -> float:
        """The pooled heads of the slots hosting one of the k longest, at least (module docstring), over k."""
        room = v_max * (C - st_min) - va_min * d_sorted  # a host's weighted c-priced room, at most
        if (room <= 0).any():
            return 0.0
        above = np.concatenate([[0.0], np.cumsum(layer * hosts)[:-1]])  # A_k: the layers above D_k
        # g(n) = va (A_k + D_k n) - G(n room_k - va A_k) is convex in n: least at the clipped stationary n.
        n = (pool.cost_at(va_min * d_sorted / room) + va_min * above) / room
        n = np.minimum(np.maximum(n, hosts), float(n_slots))
        g = va_min * (above + d_sorted * n) - pool.most(n * room - va_min * above)
        return max(0.0, float(g.max()))

    def feasible(C: float) -> bool:
        cap = float((weight * np.clip(np.minimum(C, ends) - x.stlb, 0.0, None)).sum())
        hosts = np.ones(d_sorted.size)  # m_k: slots hosting one of the k longest, at least
        for alpha, w in need.items():
            room = v_max * (C - st_min) - alpha * va_min * d_sorted  # >= any host's weighted room
            if ((room <= 0) & (w > 0)).any():
                return False  # a slot hosting one of them would finish after C
            m = np.where(w > 0, np.ceil(w / np.where(room > 0, room, 1.0) - 1e-9), 0.0)
            hosts = np.maximum(hosts, m)
        # The hosts' own windows hold their members: at least as many as the largest windows that do.
        windows = np.cumsum(np.sort(weight * np.clip(np.minimum(C, ends) - x.stlb, 0.0, None))[::-1])
        if need[0.0][-1] > windows[-1] * (1.0 + 1e-12):
            return False
        hosts = np.maximum(hosts, np.searchsorted(windows, need[0.0] * (1.0 - 1e-12), side="left") + 1.0)
        nested = nested_hosts(window_pieces(weight * (np.minimum(C, ends) - x.stlb)), need, d_sorted, va_min, grid)
        if nested is None:
            return False
        hosts = np.maximum(hosts, nested)
        hosts = np.maximum.accumulate(hosts)
        if hosts[-1] > n_slots:
            return False
        head = va_min * float((layer * hosts).sum())  # layer cake: sum_s M_s >= sum_k (D_k - D_k+1) m_k
        # The least head of a slot led by D_k, made nonincreasing in k by lowering (it is, up to rounding).
        least_head = np.minimum.accumulate(fill.head(C, d_sorted, v))
        fill_layer = least_head - np.concatenate([least_head[1:], [0.0]])
        filled = float((fill_layer * hosts).sum())  # sum_s v_s a_s h_s(M_s), the same layer cake
        if cap < totals[0] + pooled(C, hosts):  # theta = 0: the heads of the long trajectories' hosts
            return False
        return all(
            cap >= w + theta * head + (1.0 - theta) * filled for theta, w in zip(HEAD_THETAS, totals, strict=True)
        )

    return _least_infeasible(feasible, st_min, floor)


def path_head_bound(inst: Instance, *, on_time: bool = False) -> float:
    """The work bound with the slots' longest paths and heads (``path_head`` in the module docstring); 0 when
    it says nothing (no co-running share, or no trajectory).

    ``on_time``: valid only for decisions that finish every slot by its deadline (windows end there).
    Computed once per instance (O((|J| + |S|) log) per bisection step, ~``HEAD_BISECTIONS`` steps).
    """
    if not len(inst.trajs) or not inst.slots or inst.phi <= 0:
        return 0.0
    def compute() -> float:
        floor = max(_floor(inst, on_time), work_head_bound(inst, on_time=on_time))
        return _path_head_bound(inst.arrays, inst.phi, on_time, floor)

    return inst.memo(("path_head_bound", on_time), compute)


def _floor(inst: Instance, on_time: bool) -> float:
    """The work and critical-path bounds' larger value (the head bounds only report what is above it)."""
    value = max(work_bound(inst, on_time=on_time), critical_path_bound(inst, on_time=on_time))
    return value if math.isfinite(value) else 0.0


def _path_head_bound(x: InstanceArrays, phi: float, on_time: bool, floor: float) -> float:
    dec, fit = type_work(x)
    a_t, c_t, mu_t, cross_t = x.a[x.rep], x.c[x.rep], x.mu[x.rep], x.cross[x.rep]
    if not x.D.size or float(x.D.max()) <= 0 or (a_t <= 0).any() or (c_t < 0).any():
        return 0.0
    weightings = [np.ones(a_t.size)]
    if a_t.size > 1:
        mean_work = np.array(
            [dec[k][fit[k]].mean() + (x.P / mu_t[k]).mean() if fit[k].any() else np.inf for k in range(a_t.size)]
        )
        if (np.isfinite(mean_work) & (mean_work > 0)).all():
            weightings.append(1.0 / mean_work)  # the work bound's second weighting
    # Per type k and trajectory j: e_min = the least own stall (MIXED prefill or DECODE KV receive), Q_min =
    # the least Q_jk over both roles (the largest stall), cD = c_k D_j.
    cd = c_t[:, None] * x.D[None, :]
    e_mixed = x.P[None, :] / mu_t[:, None]
    e_recv = pricing.kv_receive_seconds(x.P[None, :], cross_t[:, None])
    e_min = np.minimum(e_mixed, e_recv)
    d_row, w_row, p_row = x.Dq[None, :], x.Wq[None, :], x.P[None, :]
    cp = pricing.critical_path(d_row, w_row, p_row, a_t[:, None], c_t[:, None], mu_t[:, None])
    q = pricing.own_path(cp, x.D[None, :], np.maximum(e_mixed, e_recv), phi * c_t[:, None], phi)
    parts = (cd, e_min, dec, q)
    fill = _HeadFill(x, fit)
    best = 0.0
    for v in weightings:  # each weighting only has to beat the best so far
        best = max(best, _path_head_weighted(x, phi, fit, v, parts, on_time, fill, max(floor, best)))
    return best


def _path_head_weighted(
    x: InstanceArrays,
    phi: float,
    fit: np.ndarray,
    v: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    on_time: bool,
    fill: _HeadFill,
    floor: float,
) -> float:
    """``path_head`` with slot weights ``v`` per type (module docstring, weighted as ``work`` is)."""
    cd, e_min, dec, q = parts
    a_t, mu_t = x.a[x.rep], x.mu[x.rep]
    vv = v[:, None]

    def least(values: np.ndarray) -> np.ndarray:  # min over the types j fits of v * values
        return np.where(fit, vv * values, np.inf).min(axis=0)

    prefill = x.P * float((v / mu_t).min())  # P_j / mu on whichever slot prefills j, weighted
    v_min = float(v.min())
    va_min = float((v * a_t).min())
    v_max = float(v.max())
    u = cd + e_min  # c D + e: what j adds to its host's co-running term (before phi)
    b = dec + e_min  # c D + a O w + e: what j adds to its host's body
    totals = {
        (tp, th): float((least(tp * phi * u + th * cd + (1.0 - tp - th) * dec) + (1.0 - tp) * prefill).sum())
        for tp in HEAD_THETAS
        for th in HEAD_THETAS
        if tp + th <= 1.0
    }
    # Layer cake over Q (least over types and roles, clipped at 0: a slot's T - st >= max(Q*, 0) + phi U).
    q_least = np.maximum(np.where(fit, q, np.inf).min(axis=0), 0.0)
    q_order = np.argsort(-q_least, kind="stable")
    q_sorted = q_least[q_order]
    q_layer = q_sorted - np.concatenate([q_sorted[1:], [0.0]])
    q_need = {alpha: np.cumsum(least(alpha * phi * u + (1.0 - alpha) * b)[q_order]) for alpha in HEAD_ALPHAS}
    # Layer cake over D (as work_head).
    d_order = np.argsort(-x.D, kind="stable")
    d_sorted = x.D[d_order]
    d_layer = d_sorted - np.concatenate([d_sorted[1:], [0.0]])
    d_need = {alpha: np.cumsum(least(cd + (1.0 - alpha) * (dec - cd))[d_order]) for alpha in HEAD_ALPHAS}
    st_min = float(x.stlb.min())
    n_slots = x.stlb.size
    ends = x.deadline if on_time else np.full(x.stlb.shape, math.inf)
    weight = v[x.type_of]
    grid = _nested_grid(q_sorted.size)

    def hosts(C: float, need: Mapping[float, np.ndarray], level: np.ndarray, scale: float) -> np.ndarray | None:
        """At least how many slots host one of the k first (per k); None when some would finish after C."""
        out = np.ones(level.size)
        for alpha, w in need.items():
            room = v_max * (C - st_min) - alpha * scale * level  # >= any host's weighted room
            if ((room <= 0) & (w > 0)).any():
                return None
            m = np.where(w > 0, np.ceil(w / np.where(room > 0, room, 1.0) - 1e-9), 0.0)
            out = np.maximum(out, m)
        nested = nested_hosts(window_pieces(weight * (np.minimum(C, ends) - x.stlb)), need, level, scale, grid)
        if nested is None:
            return None
        out = np.maximum(out, nested)
        out = np.maximum.accumulate(out)
        return None if out[-1] > n_slots else out

    def feasible(C: float) -> bool:
        cap = float((weight * np.clip(np.minimum(C, ends) - x.stlb, 0.0, None)).sum())
        h = hosts(C, q_need, q_sorted, v_min)
        m = hosts(C, d_need, d_sorted, va_min)
        if h is None or m is None:
            return False
        path = v_min * float((q_layer * h).sum())  # sum_s Q*_s >= sum_k (q_k - q_k+1) h_k
        head = va_min * float((d_layer * m).sum())  # sum_s M_s >= sum_k (D_k - D_k+1) m_k
        least_head = np.minimum.accumulate(fill.head(C, d_sorted, v))
        filled = float(((least_head - np.concatenate([least_head[1:], [0.0]])) * m).sum())
        return all(cap >= w + tp * path + th * head + (1.0 - tp - th) * filled for (tp, th), w in totals.items())

    return _least_infeasible(feasible, st_min, floor)



CORUN_LEVELS = 24
"""Sets L (the k longest by least critical path) ``co_running`` checks: k on a geometric grid up to |J|."""


def corunning_bound(inst: Instance, *, on_time: bool = False) -> float:
    """The per-slot count of what a slot can host by C with its co-running stretch (``co_running`` in the
    module docstring); 0 when it says nothing above the work and critical-path bounds.

    ``on_time``: valid only for decisions that finish every slot by its deadline (windows end there).
    Computed once per instance (O(levels x types x |J|) to build, O(levels x |S| log |J|) per bisection step).
    """
    if not len(inst.trajs) or not inst.slots:
        return 0.0
    key = ("corunning_bound", on_time)
    return inst.memo(key, lambda: _corunning_bound(inst.arrays, inst.phi, on_time, _floor(inst, on_time)))


def corunning_need(cp: np.ndarray, u: np.ndarray, b_sorted: np.ndarray, phi: float) -> np.ndarray:
    """R(n), n = 1..|L|: the least T_s - st_s of a slot hosting n of the trajectories L (per trajectory, in
    increasing ``u``: its critical path ``cp`` and co-running increment ``u``; ``b_sorted``: the body
    increments, increasing; all on the slot's type and role; module docstring, ``co_running``), made
    nondecreasing (it is, up to rounding)."""
    if not cp.size:
        return cp
    sigma = np.concatenate([[0.0], np.cumsum(u)])  # sigma[n]: the n smallest u
    lead_small = np.minimum.accumulate(cp - phi * u)  # [r]: min over ranks <= r of CP - phi u
    lead_large = np.minimum.accumulate(cp[::-1])[::-1]  # [r]: min over ranks >= r of CP
    n = np.arange(1, cp.size + 1)
    path = lead_large[n - 1] + phi * sigma[n - 1]  # the leader ranks >= n - 1: its others are the n - 1 smallest
    small = lead_small[np.maximum(n - 2, 0)] + phi * sigma[n]  # the leader among the n - 1 smallest
    path = np.where(n >= 2, np.minimum(path, small), path)
    return np.maximum.accumulate(np.maximum(path, np.cumsum(b_sorted)))


def most_fed(mixed: np.ndarray, decode: np.ndarray, served: np.ndarray, counts: np.ndarray,
             least_p: np.ndarray) -> float:
    """An upper bound on the members of a set L that slots can host by C, each slot MIXED (at most ``mixed``
    of them), DECODE (``decode``) or PREFILL (serving ``served`` prefill tokens), per slot group of
    ``counts`` slots, when the DECODE-hosted members' prefill must be served: min over the Lagrangian
    multipliers and the tangents of the least-prefill curve (``least_p``: prefix sums of L's sorted P) of
    sum_s max(mixed_s, (1 - lam) decode_s, lam served_s / pi, 0) + lam kappa (module docstring)."""
    plain = float((counts * np.maximum(mixed, decode)).sum())
    if not (decode > mixed).any():
        return plain
    size = least_p.size - 1
    steps = np.diff(least_p)  # the sorted P: p_(i+1) = steps[i]
    best = plain
    for i in sorted({0, size // 8, size // 4, size // 2, (3 * size) // 4}):
        pi = float(steps[i])
        if pi <= 0:
            continue
        kappa = i - float(least_p[i]) / pi  # F <= kappa + (served total) / pi
        feed = served / pi
        with np.errstate(divide="ignore", invalid="ignore"):
            cand = np.concatenate([
                [0.0, 1.0],
                np.where(decode > 0, (decode - mixed) / decode, 0.0),
                np.where(feed > 0, mixed / feed, 0.0),
                np.where(decode + feed > 0, decode / (decode + feed), 0.0),
            ])
        lam = np.unique(cand[np.isfinite(cand) & (cand >= 0)])
        if lam.size > 64:  # any multiplier gives a valid bound: keep an even subset
            lam = lam[np.linspace(0, lam.size - 1, 64).round().astype(np.int64)]
        lam_col = lam[:, None]
        per_slot = np.maximum(np.maximum(mixed, np.maximum(1.0 - lam_col, 0.0) * decode), lam_col * feed)
        value = (per_slot * counts).sum(axis=1) + lam * kappa
        best = min(best, float(value.min()))
    return best


def _corunning_bound(x: InstanceArrays, phi: float, on_time: bool, floor: float) -> float:
    if not x.D.size or not x.stlb.size:
        return 0.0
    dec, fit = type_work(x)
    a_t, c_t, mu_t, cross_t = x.a[x.rep], x.c[x.rep], x.mu[x.rep], x.cross[x.rep]
    col = (slice(None), None)
    cp = pricing.critical_path(x.Dq[None, :], x.Wq[None, :], x.P[None, :], a_t[col], c_t[col], mu_t[col])
    cp_least = np.where(fit, cp, np.inf).min(axis=0)
    if not np.isfinite(cp_least).all():
        return 0.0  # a trajectory no slot fits: the instance is infeasible (checked elsewhere)
    order = np.argsort(-cp_least, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)  # j is in the level of the k longest iff rank[j] < k
    # Per (type, role): the fitting trajectories in increasing u (with their CP) and their b increasing,
    # each with its rank, so that a level is a mask on these orders (no sort per level).
    tables: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for t in range(a_t.size):
        js = np.nonzero(fit[t])[0]
        for mixed in (True, False):
            e = pricing.stall_seconds(x.P[js], mixed, mu_t[t], cross_t[t])
            u = pricing.corunning_increment(x.D[js], e, c_t[t])
            b = dec[t][js] + e
            by_u = np.argsort(u, kind="stable")
            by_b = np.argsort(b, kind="stable")
            tables[t, mixed] = (rank[js][by_u], cp[t][js][by_u], u[by_u], rank[js][by_b], b[by_b])
    n_j = order.size
    sizes = np.unique(np.round(np.geomspace(1.0, float(n_j), min(CORUN_LEVELS, n_j))).astype(np.int64))
    sizes = np.unique(np.concatenate([sizes, [n_j]]))
    p_by_rank = x.P[order]
    # Slots grouped by (type, least start, deadline): every count is per group, times its size.
    ends = x.deadline if on_time else np.full(x.stlb.shape, math.inf)
    keys = np.stack([x.type_of.astype(float), x.stlb, ends], axis=1)
    uniq, counts = np.unique(keys, axis=0, return_counts=True)
    g_type, g_st, g_end = uniq[:, 0].astype(np.int64), uniq[:, 1], uniq[:, 2]
    g_mup = x.mu_p[x.rep][g_type]
    # Per level: per type the needs R(n) hosting as MIXED and as DECODE, and the prefix sums of the least P.
    levels: list[tuple[int, dict[tuple[int, bool], np.ndarray], np.ndarray]] = []
    for k in sizes.tolist():
        needs = {}
        for key, (r_u, cp_u, u, r_b, b) in tables.items():
            in_u = r_u < k
            needs[key] = corunning_need(cp_u[in_u], u[in_u], b[r_b < k], phi)
        least_p = np.concatenate([[0.0], np.cumsum(np.sort(p_by_rank[:k], kind="stable"))])
        levels.append((k, needs, least_p))

    def hosted(needs: dict[tuple[int, bool], np.ndarray], mixed: bool, window: np.ndarray, slack: float) -> np.ndarray:
        out = np.zeros(window.size)
        for t in range(a_t.size):
            sel = g_type == t
            need = needs[t, mixed]
            if need.size and sel.any():
                out[sel] = np.searchsorted(need, window[sel] + slack, side="right")
        return out

    def most_hosted(C: float, level: tuple[int, dict[tuple[int, bool], np.ndarray], np.ndarray]) -> float:
        """The most members of the level any roles can host by C, at least (module docstring, ``co_running``)."""
        _, needs, least_p = level
        window = np.minimum(C, g_end) - g_st
        slack = 1e-9 * max(1.0, abs(C))  # a threshold a rounding above the window still counts: over-counts
        served = g_mup * np.clip(window, 0.0, None)  # prefill tokens a PREFILL slot serves by C
        return most_fed(hosted(needs, True, window, slack), hosted(needs, False, window, slack), served, counts,
                        least_p)

    last_failed = [0]

    def feasible(C: float) -> bool:
        for i in [last_failed[0], *range(len(levels))]:
            if most_hosted(C, levels[i]) < levels[i][0] * (1.0 - 1e-12):
                last_failed[0] = i
                return False
        return True

    return _least_infeasible(feasible, float(x.stlb.min()), floor)


LpBound = Callable[[Instance, float], "float | None"]
"""An LP relaxation bound: (instance, seconds) -> a valid lower bound on every decision's makespan, or None."""


def compute_bounds(
    inst: Instance,
    *,
    lp: LpBound | None = None,
    lp_budget: float = 0.0,
    extra: Mapping[str, float | None] | None = None,
    arrays: InstanceArrays | None = None,
    on_time: bool = False,
) -> dict[str, float]:
    """Every bound by name (the LP one only when ``lp`` is given, ``lp_budget`` > 0 and it returns a value;
    an ``lp`` that raises is logged and skipped: a failing optional bound never fails the plan).

    ``extra``: further proven bounds (e.g. a backend's ``Decision.bound``), included when not None.
    ``on_time``: the bounds hold for decisions that meet every deadline (a plan without violations); each
    is at least its deadline-free version, and an infinite one (no on-time decision) falls back to it.
    """
    x = arrays if arrays is not None else inst.arrays
    out = {BOUND_WORK: work_bound(inst, x), BOUND_CRITICAL_PATH: critical_path_bound(inst, x)}
    if x is inst.arrays:  # the head bounds only when they say more than work and critical path (else 0)
        heads = {BOUND_WORK_HEAD: work_head_bound(inst), BOUND_PATH_HEAD: path_head_bound(inst),
                 BOUND_CORUNNING: corunning_bound(inst)}
        out.update({name: val for name, val in heads.items() if val > 0})
    if on_time and inst.trajs and np.isfinite(x.deadline).any():
        timed = {BOUND_WORK: work_bound(inst, x, on_time=True), BOUND_CRITICAL_PATH: critical_path_bound(inst, x, on_time=True)}
        if x is inst.arrays:
            timed[BOUND_WORK_HEAD] = work_head_bound(inst, on_time=True)
            timed[BOUND_PATH_HEAD] = path_head_bound(inst, on_time=True)
            timed[BOUND_CORUNNING] = corunning_bound(inst, on_time=True)
        for name, val in timed.items():
            if math.isfinite(val) and (val > 0 or name in out):
                out[name] = max(out.get(name, 0.0), val)
    if lp is not None and lp_budget > 0 and inst.trajs:
        try:
            value = lp(inst, lp_budget)
        except Exception:  # the other bounds still hold
            log.warning("LP relaxation bound failed", exc_info=True)
            value = None
        if value is not None and math.isfinite(value):
            out[BOUND_LP] = float(value)
    for name, val in (extra or {}).items():
        if val is not None and math.isfinite(val):
            out[name] = float(val)
    return out
