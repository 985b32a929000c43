"""The aggregate model of large instances: slot groups x trajectory classes, its decision MILP and its LP bound.

Used by both ``milp`` and ``cpsat`` when the exact model is too big (``formulation.is_small``; the pipeline
around it is ``backends.pipeline.solve_large``); the model is written once, through the formulation
protocol (``formulation.ModelBuilder``). Math and the validity
argument of the bound: docs/formulation_large.md.

Aggregation
  slot groups g: slots equal in every perf coefficient (perf type), engine state, current role, weight
      staleness and deadline bucket; n_g slots, start st_g(r), tp_g, deadline d_g (the bucket's earliest).
  trajectory classes k: geometric buckets of the critical path on the most common perf type (ratio
      ``LENGTH_RATIO``, ``LENGTH_BUCKETS`` buckets, the shortest lumped) x the set of perf types its KV fits;
      n_k members; per perf type: mean work (decision model) or least work (bound), longest critical path.
  work of j on a slot of role r: c D_j + a O_j w_j + (P_j / mu on MIXED | P_j / cross-node KV rate on
      DECODE): the linear part of ``evaluate``'s per-slot time (a max(maxD, occ) >= a occ).

Decision model (makespan on a grid C_1 < ... < C_G between the critical-path bound and the hint's makespan;
v_i selects C_i; Mg[g,r,i] = N[g,r] v_i linearises N * C exactly)
  a1_slot_count[g]      sum_r N[g,r] <= n_g                               N integer, r in {MIXED, PREFILL, DECODE}
  a2_assign[k]          sum_{g,r} X[k,g,r] = n_k                          X >= 0, r in {MIXED, DECODE}
  a3_longest_fit        X[k,g,r] <= n_k sum_{i: st_g(r) + CPmax_kg <= C_i} v_i
  a4_grid               sum_i Mg[g,r,i] = N[g,r],  sum_r Mg[g,r,i] <= n_g v_i,  sum_i v_i = 1,  C = sum_i C_i v_i
                        (one grid point when the hint already meets the critical-path bound: C fixed, no v, Mg)
  a5_capacity[g,r]      sum_k work_kgr X[k,g,r] + h_g N[g,r] <= sum_i (C_i - st_g(r)) Mg[g,r,i] + O[g,r]
                        (h_g: the hint's mean per-slot a (max(maxD, occ) - occ), the part additive work misses;
                        O >= 0: overflow, priced 1 per second, keeps every role count feasible)
  a6_prefill            sum_g mu_g pf[g] >= sum_{k,g} Pbar_k X[k,g,DECODE],  pf[g] <= sum_i (C_i - st_g(P)) Mg[g,P,i] + O[g,P]
  a7_deadline[g,r]      (d_g < C_G) work on the group's slots <= (d_g - st_g(r)) N[g,r] + E[g,r]
  a8_release[g,r]       (deadline groups) N[g,r] <= sum_k X[k,g,r]
  objective  C + lam (sum tp st N + switched-off slots' role change + moves of trajectories whose home slot
             stops decoding) + penalty sum E + sum O
  A solve that times out without a good incumbent simply loses to the hint below.
The solved counts N become roles per slot (``search.disaggregate``, in ``backends.pipeline.solve_large``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.core import pricing
from rollplan.solver.core.bounds import critical_path_bound
from rollplan.solver.core.evaluate import TERM_MAKESPAN, TERM_OVERRUN, TERM_SWITCHING
from rollplan.solver.core.instance import Instance
from rollplan.solver.core.tables import Tables
from rollplan.solver.model.formulation import (
    DECODING,
    ON_ROLES,
    LinearModel,
    ModelBuilder,
    ObjectivePart,
    Sense,
    SolveLimits,
    Var,
)

log = logging.getLogger(__name__)

TERM_OVERFLOW = "capacity_overflow"
LENGTH_RATIO = 0.8
LENGTH_BUCKETS = 12
DEADLINE_BUCKETS = 4
GRID_POINTS = 6
GRID_STEP = 0.01


# ---------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotGroup:
    members: tuple[int, ...]
    ptype: int
    st: dict[Role, float]
    tp: float
    off_cost: float  # role-switch GPU-seconds of turning one slot of the group OFF (0 if OFF now)
    deadline: float  # the bucket's earliest deadline, inf when none (or none that matters)
    mu: float
    mu_p: float  # prefill-only throughput of one slot (a PREFILL slot)
    homed: int  # trajectories whose KV lives on the group's slots
    move_mean: float  # mean seconds to move one of them elsewhere

    @property
    def n(self) -> int:
        return len(self.members)


@dataclass(slots=True)
class Aggregation:
    groups: list[SlotGroup]
    classes: list[np.ndarray]
    work: dict[tuple[int, int, Role], float] = field(default_factory=dict)  # (k, ptype, role) -> seconds
    cpmax: dict[tuple[int, int], float] = field(default_factory=dict)
    fitcount: dict[tuple[int, int], int] = field(default_factory=dict)
    pbar: list[float] = field(default_factory=list)
    head: list[float] = field(default_factory=list)  # per ptype: a * mean head length

    def n_k(self, k: int) -> int:
        return int(self.classes[k].size)


def _classes(prep: Tables) -> list[np.ndarray]:
    """Trajectory classes: critical-path buckets on the most common perf type x KV-fit signature."""
    n_types = prep.cp_a.shape[0]
    ref = int(np.bincount(prep.x.type_of, minlength=n_types).argmax()) if prep.ptype else 0
    cp = prep.cp_a[ref]
    if cp.size == 0:
        return []
    top = max(float(cp.max()), 1e-12)
    ratio = np.maximum(cp, 1e-12) / top
    bucket = np.minimum(np.floor(np.log(ratio) / math.log(LENGTH_RATIO) + 1e-9), LENGTH_BUCKETS - 1).astype(
        np.int64
    )
    sig = np.zeros(cp.size, dtype=np.int64)
    for k in range(n_types):
        sig |= prep.fits_a[k].astype(np.int64) << k
    key = bucket * (1 << n_types) + sig
    order = np.argsort(key, kind="stable")
    cuts = np.nonzero(np.diff(key[order]))[0] + 1
    return [g for g in np.split(order, cuts) if g.size]


def _head(prep: Tables, pt: int, top_d: np.ndarray, excess: Sequence[float]) -> float:
    a = float(prep.x.a[prep.x.rep[pt]])
    if excess:
        return a * float(np.mean(excess))
    return a * float(top_d.mean()) if top_d.size else 0.0


def _deadline_buckets(values: Sequence[float]) -> list[float]:
    """Upper edges of at most DEADLINE_BUCKETS buckets of the finite deadlines (quantiles)."""
    finite = sorted(v for v in values if v < math.inf)
    if not finite:
        return []
    qs = np.quantile(np.asarray(finite), np.linspace(0, 1, DEADLINE_BUCKETS + 1)[1:])
    return sorted(set(float(q) for q in qs))


def aggregate(
    prep: Tables,
    *,
    upper: float,
    hint_decoding: int,
    use_deadlines: bool,
    least: bool = False,
    head_excess: Mapping[int, Sequence[float]] | None = None,
) -> Aggregation:
    """Group slots and classify trajectories. ``least``: per-class least work (the bound), else the mean.

    The head allowance h (per perf type): a x the mean of ``head_excess[type]`` (the hint's decoding slots'
    max(maxD, occ) - occ, the part of a slot's time the additive work misses); without them, a x the mean
    of the ``hint_decoding`` longest D's.
    """
    inst = prep.inst
    x = prep.x
    rsw = prep.rsw
    # -- slot groups
    relevant = [d if (use_deadlines and d < upper) else math.inf for d in prep.deadline]
    edges = _deadline_buckets(relevant)
    keyed: dict[tuple[object, ...], list[int]] = {}
    for s, sl in enumerate(inst.slots):
        d = relevant[s]
        b = next((i for i, e in enumerate(edges) if d <= e), -1) if d < math.inf else -1
        key = (prep.ptype[s], sl.engine, sl.current_role, sl.sync_seconds > 0, b)
        keyed.setdefault(key, []).append(s)
    gid = np.empty(len(inst.slots), dtype=np.int64)
    for g, members in enumerate(keyed.values()):
        gid[members] = g
    n_g = len(keyed)
    has_home = x.home >= 0
    home_g = gid[x.home[has_home]]
    homed = np.bincount(home_g, minlength=n_g)
    groups = []
    for g, members in enumerate(keyed.values()):
        s0 = members[0]
        sl = inst.slots[s0]
        mu = prep.mu[s0]
        move_mean = 0.0
        if homed[g]:
            ctx = x.ctx[has_home][home_g == g]
            move_mean = float(pricing.move_seconds(ctx, prep.cross[s0], mu).mean())
        groups.append(
            SlotGroup(
                members=tuple(members),
                ptype=prep.ptype[s0],
                st={r: sl.start_seconds(r, rsw) for r in ON_ROLES},
                tp=prep.tp[s0],
                off_cost=rsw * prep.tp[s0] if sl.is_on_now else 0.0,
                deadline=min(relevant[s] for s in members),
                mu=mu,
                mu_p=float(x.mu_p[s0]),
                homed=int(homed[g]),
                move_mean=move_mean,
            )
        )
    # -- classes and their coefficients per perf type
    classes = _classes(prep)
    agg = Aggregation(groups=groups, classes=classes)
    D = x.D
    label = np.empty(D.size, dtype=np.int64)
    for k, members in enumerate(classes):
        label[members] = k
    n_k = len(classes)
    sizes = np.bincount(label, minlength=n_k)
    top_d = np.sort(D)[::-1][: max(1, min(hint_decoding, D.size))]
    for pt, r in enumerate(x.rep.tolist()):
        fits = prep.fits_a[pt]
        base = pricing.additive_work(D, prep.occw_a[pt], x.a[r], x.c[r])
        fitcount = np.bincount(label[fits], minlength=n_k)
        tables = {
            Role.MIXED: base + prep.mix_a[pt],
            Role.DECODE: base + prep.dec_a[pt],
        }
        stats: dict[Role, np.ndarray] = {}
        for role, w in tables.items():
            if least:
                v = np.full(n_k, np.inf)
                np.minimum.at(v, label[fits], w[fits])
            else:
                v = np.bincount(label[fits], w[fits], minlength=n_k) / np.maximum(fitcount, 1)
            stats[role] = v
        cpm = np.zeros(n_k)
        np.maximum.at(cpm, label[fits], prep.cp_a[pt][fits])
        for k in range(n_k):
            agg.fitcount[k, pt] = int(fitcount[k])
            if fitcount[k]:
                agg.work[k, pt, Role.MIXED] = float(stats[Role.MIXED][k])
                agg.work[k, pt, Role.DECODE] = float(stats[Role.DECODE][k])
                agg.cpmax[k, pt] = float(cpm[k])
        agg.head.append(0.0 if least else _head(prep, pt, top_d, (head_excess or {}).get(pt, ())))
    if least:
        pmin = np.full(n_k, np.inf)
        np.minimum.at(pmin, label, x.P)
        agg.pbar = pmin.tolist()
    else:
        agg.pbar = (np.bincount(label, x.P, minlength=n_k) / np.maximum(sizes, 1)).tolist()
    return agg


# ---------------------------------------------------------------------------------------------------------
# The aggregate decision model
# ---------------------------------------------------------------------------------------------------------


class AggregateFormulation:
    """The decision model of the module docstring on one ``Aggregation`` and makespan grid."""

    def __init__(self, inst: Instance, agg: Aggregation, grid: Sequence[float]) -> None:
        self.inst = inst
        self.agg = agg
        self.grid = list(grid)
        self.N: dict[tuple[int, Role], Var] = {}
        self.X: dict[tuple[int, int, Role], Var] = {}
        self.v: dict[int, Var] = {}
        self.Mg: dict[tuple[int, Role, int], Var] = {}
        self.E: dict[tuple[int, Role], Var] = {}
        self.pf: dict[int, Var] = {}
        self.O: dict[tuple[int, Role], Var] = {}
        self.C: Var = None
        self.m: LinearModel | None = None

    def build(self, builder: ModelBuilder) -> None:
        self.m = LinearModel(builder)
        self._variables()
        self._a1_slot_count()
        self._a2_assign()
        self._a3_longest_fit()
        self._a4_grid()
        self._a5_capacity()
        self._a6_prefill()
        self._a7_deadline()
        self._a8_release()
        builder.set_objective(self._objective())

    def _usable(self, g: int, r: Role) -> bool:
        grp = self.agg.groups[g]
        st = grp.st[r]
        return st < self.grid[-1] and st < grp.deadline

    def _variables(self) -> None:
        m = self.m
        assert m is not None
        agg = self.agg
        top = self.grid[-1]
        multi = len(self.grid) > 1
        for g, grp in enumerate(agg.groups):
            for r in ON_ROLES:
                usable = self._usable(g, r)
                self.N[g, r] = m.var(f"N_g{g}_{r.value}", 0.0, float(grp.n) if usable else 0.0, integer=True)
                for i, c in enumerate(self.grid):
                    if multi and usable and grp.st[r] <= c:
                        self.Mg[g, r, i] = m.var(f"Mg_g{g}_{r.value}_c{i}", 0.0, float(grp.n))
                if grp.deadline < math.inf and usable:
                    self.E[g, r] = m.var(f"E_g{g}_{r.value}", 0.0, top * grp.n)
            self.pf[g] = m.var(f"pf_g{g}", 0.0, top * grp.n)
            for r in ON_ROLES:
                self.O[g, r] = m.var(f"O_g{g}_{r.value}", 0.0, math.inf)
            for k in range(len(agg.classes)):
                if (k, grp.ptype) in agg.cpmax:
                    for r in DECODING:
                        self.X[k, g, r] = m.var(f"X_k{k}_g{g}_{r.value}", 0.0, float(agg.n_k(k)))
        if multi:
            for i in range(len(self.grid)):
                self.v[i] = m.binary(f"v_c{i}")
        self.C = m.var("C", self.grid[0] if not multi else 0.0, top)

    def _a1_slot_count(self) -> None:
        m = self.m
        assert m is not None
        for g, grp in enumerate(self.agg.groups):
            m.add(f"a1_slot_count_g{g}", [(1.0, self.N[g, r]) for r in ON_ROLES], Sense.LE, float(grp.n))

    def _a2_assign(self) -> None:
        m = self.m
        assert m is not None
        agg = self.agg
        for k in range(len(agg.classes)):
            terms = [(1.0, v) for (kk, _g, _r), v in self.X.items() if kk == k]
            m.add(f"a2_assign_k{k}", terms, Sense.EQ, float(agg.n_k(k)))
            by_pt: dict[int, list[tuple[float, Var]]] = {}
            for (kk, g, _r), v in self.X.items():
                if kk == k:
                    by_pt.setdefault(agg.groups[g].ptype, []).append((1.0, v))
            for pt, t in by_pt.items():
                if agg.fitcount[k, pt] < agg.n_k(k):
                    m.add(f"a2_fit_count_k{k}_t{pt}", t, Sense.LE, float(agg.fitcount[k, pt]))

    def _a3_longest_fit(self) -> None:
        m = self.m
        assert m is not None
        agg = self.agg
        for (k, g, r), xv in self.X.items():
            grp = agg.groups[g]
            reach = grp.st[r] + agg.cpmax[k, grp.ptype]
            ok = [i for i, c in enumerate(self.grid) if reach <= c * (1 + 1e-9)]
            if len(ok) == len(self.grid):
                continue  # allowed at every makespan of the grid: the row is redundant
            allowed = [(-float(agg.n_k(k)), self.v[i]) for i in ok]
            m.add(f"a3_longest_fit_k{k}_g{g}_{r.value}", [(1.0, xv), *allowed], Sense.LE, 0.0)

    def _a4_grid(self) -> None:
        m = self.m
        assert m is not None
        if len(self.grid) == 1:
            return  # one makespan: C is fixed and N * C is linear
        m.add("a4_one_makespan", [(1.0, v) for v in self.v.values()], Sense.EQ, 1.0)
        m.add(
            "a4_makespan", [(1.0, self.C), *[(-c, self.v[i]) for i, c in enumerate(self.grid)]], Sense.EQ, 0.0
        )
        for g, grp in enumerate(self.agg.groups):
            for r in ON_ROLES:
                # Mg[g,r,i] = N[g,r] v_i; a slot whose start is after C_i has no Mg there (it cannot be on).
                mg = [(-1.0, v) for (gg, rr, _i), v in self.Mg.items() if gg == g and rr is r]
                m.add(f"a4_grid_link_g{g}_{r.value}", [(1.0, self.N[g, r]), *mg], Sense.EQ, 0.0)
            for i in range(len(self.grid)):
                # Summed over roles: exact, as sum_r N[g,r] <= n_g and every Mg >= 0.
                mg = [(1.0, v) for (gg, _r, ii), v in self.Mg.items() if gg == g and ii == i]
                if mg:
                    m.add(f"a4_grid_cap_g{g}_c{i}", [*mg, (-float(grp.n), self.v[i])], Sense.LE, 0.0)

    def _capacity(self, g: int, r: Role) -> list[tuple[float, Var]]:
        """-(C - st_g(r)) N[g,r] as terms: through Mg on a grid, directly when C is fixed."""
        st = self.agg.groups[g].st[r]
        if len(self.grid) == 1:
            return [(-(self.grid[0] - st), self.N[g, r])]
        return [(-(self.grid[i] - st), v) for (gg, rr, i), v in self.Mg.items() if gg == g and rr is r]

    def _load(self, g: int, r: Role) -> list[tuple[float, Var]]:
        agg = self.agg
        pt = agg.groups[g].ptype
        terms = [(agg.work[k, pt, r], v) for (k, gg, rr), v in self.X.items() if gg == g and rr is r]
        terms.append((agg.head[pt], self.N[g, r]))
        return terms

    def _a5_capacity(self) -> None:
        m = self.m
        assert m is not None
        for g in range(len(self.agg.groups)):
            for r in DECODING:
                load = [*self._load(g, r), *self._capacity(g, r), (-1.0, self.O[g, r])]
                m.add(f"a5_capacity_g{g}_{r.value}", load, Sense.LE, 0.0)

    def _a6_prefill(self) -> None:
        m = self.m
        assert m is not None
        agg = self.agg
        need = [(-agg.pbar[k], v) for (k, _g, r), v in self.X.items() if r is Role.DECODE and agg.pbar[k] > 0]
        m.add(
            "a6_prefill_balance",
            [(grp.mu_p, self.pf[g]) for g, grp in enumerate(agg.groups)] + need,
            Sense.GE,
            0.0,
        )
        for g in range(len(agg.groups)):
            cap = [(1.0, self.pf[g]), *self._capacity(g, Role.PREFILL), (-1.0, self.O[g, Role.PREFILL])]
            m.add(f"a6_prefill_cap_g{g}", cap, Sense.LE, 0.0)

    def _a7_deadline(self) -> None:
        m = self.m
        assert m is not None
        for (g, r), e in self.E.items():
            grp = self.agg.groups[g]
            room = grp.deadline - grp.st[r]
            load = self._load(g, r) if r.decodes else [(1.0, self.pf[g])]
            m.add(f"a7_deadline_g{g}_{r.value}", [*load, (-room, self.N[g, r]), (-1.0, e)], Sense.LE, 0.0)

    def _a8_release(self) -> None:
        m = self.m
        assert m is not None
        for g, grp in enumerate(self.agg.groups):
            if grp.deadline == math.inf:
                continue
            for r in DECODING:
                xs = [(-1.0, v) for (k, gg, rr), v in self.X.items() if gg == g and rr is r]
                m.add(f"a8_release_g{g}_{r.value}", [(1.0, self.N[g, r]), *xs], Sense.LE, 0.0)

    def _objective(self) -> list[ObjectivePart]:
        cfg = self.inst.config
        sw: list[tuple[float, Var]] = []
        const = 0.0
        for g, grp in enumerate(self.agg.groups):
            const += grp.off_cost * grp.n
            # Trajectories at home on the group's slots move when their slot stops decoding (expected share).
            per_slot_moves = grp.homed / grp.n * grp.move_mean * grp.tp if grp.n else 0.0
            const += per_slot_moves * grp.n
            for r in ON_ROLES:
                coef = grp.tp * grp.st[r] - grp.off_cost - (per_slot_moves if r.decodes else 0.0)
                sw.append((coef, self.N[g, r]))
        parts = [
            ObjectivePart(TERM_MAKESPAN, 1.0, [(1.0, self.C)]),
            ObjectivePart(TERM_SWITCHING, cfg.switch_weight, sw, const),
        ]
        if self.E:
            parts.append(
                ObjectivePart(TERM_OVERRUN, cfg.deadline_penalty, [(1.0, e) for e in self.E.values()])
            )
        # Work beyond a group's capacity at C: it would lengthen the makespan by overflow / N, so one
        # second per second over-prices it; it keeps every role count feasible (the hint's too).
        parts.append(ObjectivePart(TERM_OVERFLOW, 1.0, [(1.0, o) for o in self.O.values()]))
        return parts

    def counts(self, value: object) -> list[dict[Role, int]]:
        val = value  # SolveResult.value
        return [{r: round(val(self.N[g, r])) for r in ON_ROLES} for g in range(len(self.agg.groups))]  # type: ignore[operator]


def makespan_grid(lo: float, hi: float, points: int = GRID_POINTS, step: float = GRID_STEP) -> list[float]:
    """Geometric grid from ``lo`` to ``hi`` (both included), steps of at least ``step`` (relative), at
    most ``points`` points; one point when they (nearly) coincide. ``lo <= 0`` (no critical path: e.g. no
    trajectory left): the grid's top ``points`` points below ``hi``, ``step`` apart."""
    if lo <= 0:
        if hi <= 0:
            return [0.0]
        lo = hi / (1 + step) ** (points - 1)
    if hi <= lo * (1 + 1e-6):
        return [max(lo, hi)]
    n = int(min(points, 1 + math.ceil(math.log(hi / lo) / math.log1p(step))))
    n = max(n, 2)
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


# ---------------------------------------------------------------------------------------------------------
# The LP bound for large instances
# ---------------------------------------------------------------------------------------------------------


def bound_lp(inst: Instance, factory: type, *, budget: float, upper: float | None = None) -> float | None:
    """A valid lower bound on every decision's makespan: the aggregate LP with least coefficients.

    Variables per group g (all slots equal in perf type, engine, current role, staleness; deadlines ignored)
    Y[g,r] in [0, n_g], per class k X[k,g,r] >= 0, pf[g] >= 0; minimise C subject to
      b1 sum_r Y[g,r] <= n_g;   b2 sum_{g,r} X[k,g,r] = n_k;   b2' per perf type at most the members that fit it
      b3 X[k,g,r] <= n_k Y[g,r]                              (x_jsr <= y_sr summed)
      b4 n_g C >= sum_r st_g(r) Y[g,r] + sum_{k,r} wmin_kgr X[k,g,r] + pf[g]   (C >= T_s summed over g's slots)
      b5 (``upper`` given) sum_k wmin X[k,g,r] <= (upper - st_g(r)) Y[g,r], pf[g] <= (upper - st_g(P)) Y[g,P]
      b6 sum_g mu_g pf[g] >= sum_{k,g} Pmin_k X[k,g,DECODE];   b7 C >= critical_path_bound
    See docs/formulation_large.md for why each row holds for every decision.
    """
    clock = inst.config.clock
    t0 = clock()
    x = inst.arrays
    prep = Tables(inst, x)
    agg = aggregate(prep, upper=math.inf, hint_decoding=1, use_deadlines=False, least=True)
    builder = factory(inst)
    builder.solver = "highs"
    m = LinearModel(builder)
    Y: dict[tuple[int, Role], Var] = {}
    X: dict[tuple[int, int, Role], Var] = {}
    pf: dict[int, Var] = {}
    for g, grp in enumerate(agg.groups):
        for r in ON_ROLES:
            usable = upper is None or grp.st[r] <= upper
            Y[g, r] = m.var(f"Y_g{g}_{r.value}", 0.0, float(grp.n) if usable else 0.0)
        pf[g] = m.var(f"pf_g{g}", 0.0, math.inf)
        for k in range(len(agg.classes)):
            if (k, grp.ptype) in agg.cpmax:
                for r in DECODING:
                    X[k, g, r] = m.var(f"X_k{k}_g{g}_{r.value}", 0.0, float(agg.n_k(k)))
    C = m.var("C", 0.0, math.inf)
    for g, grp in enumerate(agg.groups):
        m.add(f"b1_slot_count_g{g}", [(1.0, Y[g, r]) for r in ON_ROLES], Sense.LE, float(grp.n))
    for k in range(len(agg.classes)):
        m.add(
            f"b2_assign_k{k}",
            [(1.0, v) for (kk, _g, _r), v in X.items() if kk == k],
            Sense.EQ,
            float(agg.n_k(k)),
        )
        by_pt: dict[int, list[tuple[float, Var]]] = {}
        for (kk, g, _r), v in X.items():
            if kk == k:
                by_pt.setdefault(agg.groups[g].ptype, []).append((1.0, v))
        for pt, t in by_pt.items():
            if agg.fitcount[k, pt] < agg.n_k(k):
                m.add(f"b2_fit_count_k{k}_t{pt}", t, Sense.LE, float(agg.fitcount[k, pt]))
    for (k, g, r), v in X.items():
        m.add(f"b3_on_k{k}_g{g}_{r.value}", [(1.0, v), (-float(agg.n_k(k)), Y[g, r])], Sense.LE, 0.0)
    for g, grp in enumerate(agg.groups):
        load = {
            r: [(agg.work[k, grp.ptype, r], v) for (k, gg, rr), v in X.items() if gg == g and rr is r]
            for r in DECODING
        }
        terms = [(float(grp.n), C), *[(-grp.st[r], Y[g, r]) for r in ON_ROLES], (-1.0, pf[g])]
        terms += [(-c, v) for r in DECODING for c, v in load[r]]
        m.add(f"b4_capacity_g{g}", terms, Sense.GE, 0.0)
        if upper is not None:
            for r in DECODING:
                m.add(f"b5_window_g{g}_{r.value}", [*load[r], (-(upper - grp.st[r]), Y[g, r])], Sense.LE, 0.0)
            m.add(
                f"b5_window_g{g}_prefill",
                [(1.0, pf[g]), (-(upper - grp.st[Role.PREFILL]), Y[g, Role.PREFILL])],
                Sense.LE,
                0.0,
            )
    need = [(-agg.pbar[k], v) for (k, _g, r), v in X.items() if r is Role.DECODE and agg.pbar[k] > 0]
    m.add("b6_prefill_balance", [(grp.mu_p, pf[g]) for g, grp in enumerate(agg.groups)] + need, Sense.GE, 0.0)
    cp = critical_path_bound(inst, x)
    m.add("b7_longest_path", [(1.0, C)], Sense.GE, cp)
    builder.set_objective([ObjectivePart(TERM_MAKESPAN, 1.0, [(1.0, C)])])
    return relaxed_bound(builder, inst, budget - (clock() - t0), cp)


def relaxed_bound(builder: Any, inst: Instance, left: float, floor: float) -> float | None:
    """The optimum of ``builder``'s model solved as an LP, as a valid lower bound on the makespan (None: not
    solved within ``left`` seconds). HiGHS' optimum is exact up to its feasibility tolerance, so it is shaved
    to stay valid; never below ``floor`` (a bound already proven). Used by ``bound_lp`` and the milp
    backend's ``lp_bound`` on the exact formulation."""
    if left <= 0:
        return None
    res = builder.solve(SolveLimits.of(inst.config, left, relax=True))
    if res.status is not SolveStatus.OPTIMAL or res.bound is None:
        return None
    return max(floor, res.bound * (1.0 - 1e-7) - 1e-7)
