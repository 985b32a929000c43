"""The planner's prices, written once: every (trajectory, slot) coefficient and the per-slot finish time.

``evaluate``, the greedy placement, the local search, the disaggregation, the bounds and the MILP/CP-SAT
coefficients all call these functions (notation of ``rollplan.solver.core.instance``), so a change to the
model is one change here. Each function takes plain numbers and works alike on Python floats and on numpy
arrays (broadcast element by element): the same IEEE operations in the same order either way, so a scalar
hot loop and a vectorised pass price a decision to the same float.

  share          w_js = max(kbar_j / Kcap_s, 1 / nmax)          KV share of one occupancy step
  occupancy      O_js = D_j + W_j / tau_ref_s                   decode-slot occupancy in steps
  occupancy_work O_js w_js
  additive_work  c_s D_j + a_s O_js w_js                        what j adds to its host's decode time, at least
  move_seconds   m_js = min(KV transfer, re-prefill)            moving j's KV away from its home
  stall_seconds  e_js = P_j / mu_s (MIXED) | P_j / cross_s (DECODE)
  critical_path  CP_js = D_j (a_s + c_s) + W_j + P_j / mu_s
  own_path       Q_js = CP_js - phi (c_s D_j + e_js)
  corunning_increment  u_js = c_s D_j + e_js                  what j adds to each co-resident's path (before phi)
  slot_time      T_s = st_s + max(c ΣD + a max(max D, Σ O w) + extra, max Q + phi (c ΣD + Σ e))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``: concurrent sequences per engine (nmax)."""
MIN_SHARE = 1.0 / MAX_NUM_SEQS
KV_TRANSFER_LATENCY = 1e-3
"""Fixed seconds of one KV transfer (connection set-up), on top of bytes / bandwidth."""

N = Any
"""A float or a numpy array (element-wise)."""


def _is_array(*xs: object) -> bool:
    return any(isinstance(x, np.ndarray) for x in xs)


def lower(x: Any, y: Any) -> Any:
    """min(x, y), element-wise for arrays (the value the builtin gives for non-NaN numbers)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.minimum(x, y)
    return x if x < y else y


def upper(x: Any, y: Any) -> Any:
    """max(x, y), element-wise for arrays (the value the builtin gives for non-NaN numbers)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.maximum(x, y)
    return x if x > y else y


def share(kbar: N, kv_capacity: Any) -> N:
    """w_js: the share of slot s's KV (or sequence) budget one occupancy step of j takes; inf without KV."""
    if _is_array(kv_capacity):
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(kv_capacity > 0, kbar / kv_capacity, math.inf)
    else:
        w = kbar / kv_capacity if kv_capacity > 0 else math.inf
    return upper(w, MIN_SHARE)


def occupancy(decode: N, tool: N, tau_ref: Any) -> N:
    """O_js: decode steps j holds its KV on s (a tool wait counts as W / tau_ref steps)."""
    if _is_array(tau_ref):
        with np.errstate(divide="ignore", invalid="ignore"):
            return decode + np.where(tau_ref > 0, tool / tau_ref, 0.0)
    return decode + (tool / tau_ref if tau_ref > 0 else 0.0)


def occupancy_work(decode: N, tool: N, kbar: N, tau_ref: Any, kv_capacity: Any) -> N:
    """O_js w_js: j's occupancy in slot-steps (what the KV memory allows in parallel is 1 per step)."""
    return occupancy(decode, tool, tau_ref) * share(kbar, kv_capacity)


def additive_work(decode: N, occw: N, a: Any, c: Any) -> N:
    """c_s D_j + a_s O_js w_js: the part of a slot's decode time that adds up over its trajectories
    (a max(max D, Σ O w) >= a Σ O w)."""
    return c * decode + a * occw


def transfer_rate(same_node: Any, same: Any, cross: Any) -> Any:
    """The destination's KV receive rate (tokens/s): same-node link when the source is on its node."""
    if _is_array(same_node, same, cross):
        return np.where(same_node, same, cross)
    return same if same_node else cross


def kv_transfer_seconds(context: N, rate: Any) -> N:
    """Seconds to send ``context`` KV tokens at ``rate`` tokens/s."""
    return KV_TRANSFER_LATENCY + context / rate


def reprefill_seconds(context: N, mu: Any) -> N:
    """Seconds to recompute ``context`` tokens of KV at prefill rate ``mu``."""
    return context / mu


def move_seconds(context: N, rate: Any, mu: Any) -> N:
    """m_js away from home: the cheaper of the KV transfer (at ``rate``) and the re-prefill (at ``mu``).
    0 at home and when the KV is already lost is the caller's case (``Instance.move_seconds``)."""
    return lower(kv_transfer_seconds(context, rate), reprefill_seconds(context, mu))


def kv_receive_seconds(prefill: N, cross: Any) -> N:
    """x_js: receiving j's newly prefilled KV on a DECODE slot from a PREFILL slot (cross-node, conservative)."""
    return prefill / cross


def stall_seconds(prefill: N, mixed: Any, mu: Any, cross: Any) -> N:
    """e_js: seconds j's own prefill (MIXED: P_j / mu_s) or KV receive (DECODE: x_js) stalls slot s."""
    if _is_array(mixed):
        return np.where(mixed, prefill / mu, kv_receive_seconds(prefill, cross))
    return prefill / mu if mixed else kv_receive_seconds(prefill, cross)


def path_quantile(mean: N, spread: N, z: float) -> N:
    """A critical path's input (decode tokens, tool seconds) at ``z`` spreads above its mean
    (``PlannerConfig.path_z``): what every ``critical_path`` of the instance is priced with."""
    return mean + z * spread if z else mean


def critical_path(decode: N, tool: N, prefill: N, a: Any, c: Any, mu: Any) -> N:
    """CP_js: j's own remaining time on s at batch 1 (decode steps, tool waits, its prefill)."""
    return decode * (a + c) + tool + prefill / mu


def corunning_increment(decode: N, own: N, c: Any) -> N:
    """u_js = c_s D_j + e_js: what j adds to the path of every other trajectory on its slot, before phi (its
    decode tokens run in their steps, its prefill or KV receive stalls them)."""
    return c * decode + own


def own_path(cp: N, decode: N, own: N, phic: Any, phi: float) -> N:
    """Q_js = CP_js - phi (c_s D_j + e_js) (``phic`` = phi c_s): j's path without the co-running term, which
    its slot adds once for all its members (``slot_time``)."""
    return cp - (phic * decode + phi * own)


def slot_time(
    st: Any, a: Any, c: Any, phic: Any, phi: float, sum_d: Any, max_d: Any, occ: Any, extra: Any, cp: Any, stall: Any
) -> Any:
    """T_s of a decoding slot from its members' sums: st_s + max(decode time + extra, longest path).

    decode time = c ΣD + a max(max D, Σ O w); extra = Σ (e_js + m_js); longest path = max_j Q_js +
    phi (c ΣD + Σ e_js) (``phic`` = phi c_s). An empty slot gives st_s (all sums 0).
    """
    if type(occ) is not float and (isinstance(max_d, np.ndarray) or isinstance(occ, np.ndarray)):
        body = c * sum_d + a * np.maximum(max_d, occ) + extra
        return st + np.maximum(body, longest_path(cp, phic, phi, sum_d, stall))
    # Scalars (the searches' hot loops: ~10^6 calls per large solve): the same operations, without calls.
    body = c * sum_d + a * (max_d if max_d > occ else occ) + extra
    path = cp + (phic * sum_d + phi * stall)
    return st + (body if body > path else path)


def longest_path(cp: Any, phic: Any, phi: float, sum_d: Any, stall: Any) -> Any:
    """max_j Q_js + phi (c ΣD + Σ e): a decoding slot's longest member path with the co-running term, from
    ``cp`` = max_j Q_js (``phic`` = phi c_s); T_s >= st_s + this."""
    return cp + (phic * sum_d + phi * stall)
