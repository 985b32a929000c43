"""Price one decision (roles + placement) exactly as the formulation does (see ``instance`` Notations).

Callers: every backend (to report the plan's objective), ``validate_plan`` (recomputes from scratch), the
local-search repair (many calls: O(|J| + |S|) each). Pure and deterministic.

``evaluate`` is the numpy form of ``evaluate_reference`` (the per-trajectory loop, kept as the specification):
the same IEEE operations on the same operands in the same order, so both return identical floats. Per-slot
sums use ``np.bincount`` (a sequential loop in input order, like ``+=``), the switching and prefill totals
``np.cumsum`` (sequential), maxima ``np.maximum.at``; the per-slot part is the reference's own loop.
Tests compare the two on random decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import ObjectiveTerm, Role
from rollplan.solver.core import pricing
from rollplan.solver.core.instance import Instance

TERM_MAKESPAN = "makespan"
TERM_SWITCHING = "switching_gpu_seconds"
TERM_OVERRUN = "deadline_overrun"


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The priced decision. ``slot_finish[s]``: T_s (0 for OFF). ``problems``: hard-constraint violations
    (trajectory on a non-decoding slot, KV that does not fit, prefill work with no PREFILL slot)."""

    slot_finish: tuple[float, ...]
    makespan: float
    switching: float
    overrun: tuple[float, ...]
    terms: tuple[ObjectiveTerm, ...]
    objective: float
    problems: tuple[str, ...]

    @property
    def total_overrun(self) -> float:
        return sum(self.overrun)


def waterfill_finish(starts: Sequence[float], rates: Sequence[float], work: float) -> float:
    """Smallest T with sum_p rates[p] * max(0, T - starts[p]) >= work (the fluid prefill share's finish)."""
    if work <= 0 or not starts:
        return 0.0
    pairs = sorted(zip(starts, rates, strict=True))
    rate_sum = 0.0
    weighted = 0.0  # sum of rate * start over slots already busy
    for i, (st, mu) in enumerate(pairs):
        rate_sum += mu
        weighted += mu * st
        finish = (work + weighted) / rate_sum
        nxt = pairs[i + 1][0] if i + 1 < len(pairs) else float("inf")
        if finish <= nxt:
            return finish
    return (work + weighted) / rate_sum


def evaluate_reference(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> Evaluation:
    """``evaluate``, one trajectory at a time: the specification the numpy version must equal exactly."""
    n_s = len(inst.slots)
    problems: list[str] = []
    sum_d = [0.0] * n_s
    max_d = [0.0] * n_s
    occ = [0.0] * n_s
    extra = [0.0] * n_s  # prefill on MIXED, KV receive on DECODE, migrations in
    stall = [0.0] * n_s  # sum_j e_js: the slot's own prefill (MIXED) / KV receive (DECODE) seconds, no moves
    cp = [0.0] * n_s  # max_j Q_js (the co-running term phi (c_s sum D + sum e) is added per slot in _finish)
    switching = 0.0
    prefill_for_decode = 0.0
    trajs, slots = inst.trajs, inst.slots
    path_z = inst.config.path_z  # critical paths at this many spreads above the means
    for j, s in enumerate(placement):
        t = trajs[j]
        role = roles[s]
        sl = slots[s]
        if role is not Role.MIXED and role is not Role.DECODE:
            problems.append(f"trajectory {t.id!r} placed on slot {sl.id!r} whose role {role.value} does not decode")
            continue
        if t.peak_kv > sl.kv_capacity:
            problems.append(f"trajectory {t.id!r} needs {t.peak_kv:.0f} KV tokens; slot {sl.id!r} holds {sl.kv_capacity:.0f}")
        d = t.decode
        sum_d[s] += d
        if d > max_d[s]:
            max_d[s] = d
        occ[s] += pricing.occupancy_work(d, t.tool, t.kbar, sl.tau_ref, sl.kv_capacity)
        move = 0.0 if t.home is None or t.home == s else inst.move_seconds(j, s)
        switching += move * sl.tp
        mu = sl.mu
        own = pricing.stall_seconds(t.prefill, role is Role.MIXED, mu, sl.cross_node_kv_rate)
        if role is not Role.MIXED:
            prefill_for_decode += t.prefill
        extra[s] += own + move
        stall[s] += own
        cp_js = pricing.critical_path(pricing.path_quantile(d, t.decode_spread, path_z),
                                      pricing.path_quantile(t.tool, t.tool_spread, path_z), t.prefill, sl.a, sl.c, mu)
        path = pricing.own_path(cp_js, d, own, inst.phi * sl.c, inst.phi)  # Q_js
        if path > cp[s]:
            cp[s] = path

    return _finish(inst, roles, sum_d, max_d, occ, extra, stall, cp, switching, prefill_for_decode, problems)


def evaluate(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> Evaluation:
    """Price ``roles[s]`` (per slot index) and ``placement[j]`` (slot index per trajectory index)."""
    n_s = len(inst.slots)
    x = inst.arrays
    pl = np.asarray(placement, dtype=np.int64)
    n_j = pl.size
    if pl.ndim != 1 or n_j > x.D.size or (n_j and (int(pl.min()) < 0 or int(pl.max()) >= n_s)) or len(roles) < n_s:
        return evaluate_reference(inst, roles, placement)  # out-of-range input: the reference's own behaviour
    is_mixed = np.array([roles[s] is Role.MIXED for s in range(n_s)], dtype=bool)
    is_decode = np.array([roles[s] is Role.DECODE for s in range(n_s)], dtype=bool)
    decodes = (is_mixed | is_decode)[pl]
    peak = x.peak[:n_j]
    bad = ~decodes | (peak > x.kv[pl])
    problems: list[str] = []
    for j in np.nonzero(bad)[0].tolist():  # rare: in trajectory order, in the reference's words
        s = int(pl[j])
        sl = inst.slots[s]
        if not decodes[j]:
            problems.append(f"trajectory {x.ids[j]!r} placed on slot {sl.id!r} whose role {roles[s].value} does not decode")
        else:
            problems.append(f"trajectory {x.ids[j]!r} needs {float(peak[j]):.0f} KV tokens; slot {sl.id!r} holds {sl.kv_capacity:.0f}")
    v = np.nonzero(decodes)[0]
    ps = pl[v]
    d = x.D[v]
    w = x.W[v]
    p = x.P[v]
    kvcap = x.kv[ps]
    tau = x.tau[ps]
    mu = x.mu[ps]
    occ_j = pricing.occupancy_work(d, w, x.kbar[v], tau, kvcap)
    # m_js (Instance.move_seconds): min(KV transfer, re-prefill) away from home, 0 at home / KV lost.
    home = x.home[v]
    away = (home >= 0) & (home != ps)
    ctx = x.ctx[v]
    src_node = x.node[np.where(home >= 0, home, 0)]
    rate = pricing.transfer_rate(src_node == x.node[ps], x.same[ps], x.cross[ps])
    with np.errstate(divide="ignore", invalid="ignore"):
        move = np.where(away, pricing.move_seconds(ctx, rate, mu), 0.0)
    mixed = is_mixed[ps]
    own = pricing.stall_seconds(p, mixed, mu, x.cross[ps])
    extra_j = own + move
    path = pricing.own_path(pricing.critical_path(x.Dq[v], x.Wq[v], p, x.a[ps], x.c[ps], mu), d, own,
                            inst.phi * x.c[ps], inst.phi)
    sum_d = np.bincount(ps, d, minlength=n_s)
    occ = np.bincount(ps, occ_j, minlength=n_s)
    extra = np.bincount(ps, extra_j, minlength=n_s)
    stall = np.bincount(ps, own, minlength=n_s)
    max_d = np.zeros(n_s)
    np.maximum.at(max_d, ps, d)
    cp = np.zeros(n_s)
    np.maximum.at(cp, ps, path)
    moved = move * x.tp[ps]
    switching = float(np.cumsum(moved)[-1]) if moved.size else 0.0
    pre = p[~mixed]
    prefill_for_decode = float(np.cumsum(pre)[-1]) if pre.size else 0.0
    return _finish(
        inst,
        roles,
        sum_d.tolist(),
        max_d.tolist(),
        occ.tolist(),
        extra.tolist(),
        stall.tolist(),
        cp.tolist(),
        switching,
        prefill_for_decode,
        problems,
    )


def close_slots(inst: Instance, roles: Sequence[Role], finish: list[float], prefill_slots: Sequence[int],
                prefill_work: float) -> list[float]:
    """The last step of pricing a decision, shared by ``evaluate`` and the search state's objective: the
    PREFILL slots (``prefill_slots``, ``finish`` = their start) finish when they have served ``prefill_work``
    prefill tokens of the trajectories on DECODE slots, water-filled over them (``finish`` updated in place;
    nothing when there is none); returns each slot's overrun past its deadline (0 for OFF slots)."""
    if prefill_work > 0 and prefill_slots:
        t_fill = waterfill_finish([finish[p] for p in prefill_slots], [inst.slots[p].mu_p for p in prefill_slots],
                                  prefill_work)
        for p in prefill_slots:
            finish[p] = max(finish[p], t_fill)
    return [max(0.0, finish[s] - sl.deadline) if roles[s] is not Role.OFF and sl.deadline is not None else 0.0
            for s, sl in enumerate(inst.slots)]


def _finish(
    inst: Instance,
    roles: Sequence[Role],
    sum_d: list[float],
    max_d: list[float],
    occ: list[float],
    extra: list[float],
    stall: list[float],
    cp: list[float],
    switching: float,
    prefill_for_decode: float,
    problems: list[str],
) -> Evaluation:
    """The per-slot part of ``evaluate`` from the per-slot trajectory sums."""
    cfg = inst.config
    n_s = len(inst.slots)
    finish = [0.0] * n_s
    prefill_slots: list[int] = []
    for s, sl in enumerate(inst.slots):
        role = roles[s]
        if role is Role.OFF:
            if sl.is_on_now:
                switching += cfg.role_switch_seconds * sl.tp
            continue
        st = sl.start_seconds(role, cfg.role_switch_seconds)
        switching += st * sl.tp
        if role is Role.PREFILL:
            prefill_slots.append(s)
            finish[s] = st
            continue
        finish[s] = pricing.slot_time(
            st, sl.a, sl.c, inst.phi * sl.c, inst.phi, sum_d[s], max_d[s], occ[s], extra[s], cp[s], stall[s]
        )

    if prefill_for_decode > 0 and not prefill_slots:
        problems.append(
            f"{prefill_for_decode:.0f} prefill tokens of trajectories on DECODE slots but no PREFILL slot"
        )
    overrun = close_slots(inst, roles, finish, prefill_slots, prefill_for_decode)
    makespan = max(finish, default=0.0)
    total_overrun = sum(overrun)
    terms = (
        ObjectiveTerm(TERM_MAKESPAN, makespan, 1.0),
        ObjectiveTerm(TERM_SWITCHING, switching, cfg.switch_weight),
        ObjectiveTerm(TERM_OVERRUN, total_overrun, cfg.deadline_penalty),
    )
    return Evaluation(
        slot_finish=tuple(finish),
        makespan=makespan,
        switching=switching,
        overrun=tuple(overrun),
        terms=terms,
        objective=sum(t.contribution for t in terms),
        problems=tuple(problems),
    )


def evaluate_ids(inst: Instance, roles: Mapping[str, Role], placement: Mapping[str, str]) -> Evaluation:
    """``evaluate`` keyed by ids (slot id -> role, trajectory id -> slot id), as a Plan stores them.

    A slot missing from ``roles`` counts as OFF; a trajectory missing from ``placement`` is a problem.
    """
    pos = {sl.id: i for i, sl in enumerate(inst.slots)}
    role_list = [roles.get(sl.id, Role.OFF) for sl in inst.slots]
    place: list[int] = []
    missing = []
    for tid in inst.arrays.ids:
        sid = placement.get(tid)
        if sid is None or sid not in pos:
            missing.append(tid)
            place.append(-1)
        else:
            place.append(pos[sid])
    if missing:
        # Price the rest; report the missing ones as problems.
        keep = [j for j, s in enumerate(place) if s >= 0]
        ev = evaluate(inst.restricted(keep), role_list, [place[j] for j in keep])
        extra = tuple(f"trajectory {tid!r} is not placed on an existing slot" for tid in missing)
        return Evaluation(ev.slot_finish, ev.makespan, ev.switching, ev.overrun, ev.terms, ev.objective, ev.problems + extra)
    return evaluate(inst, role_list, place)
