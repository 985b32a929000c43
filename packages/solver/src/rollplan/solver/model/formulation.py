"""One formulation protocol for the ``milp`` (PuLP -> HiGHS/CBC) and ``cpsat`` (OR-Tools) backends, and the
exact per-trajectory model written against it (its coefficients are ``core.pricing``'s, through ``Instance``).

A formulation writes its model once, through the solver-neutral ``ModelBuilder`` protocol: variables keyed
by domain tuples, every constraint group a small named method adding named rows, and the objective as a
list of named terms. ``milp.PulpBuilder`` and ``cpsat.CpSatBuilder`` implement the protocol; the exact
per-trajectory model below and the aggregate model (``aggregate.py``) are written against it, so both
backends solve literally the same model (CP-SAT in integer milliseconds, see ``cpsat.to_ms``).

Exact model (notation of ``rollplan.solver.core.instance``; r in R = {OFF, MIXED, PREFILL, DECODE},
D = {MIXED, DECODE} the decoding roles, F(j) = slots whose KV capacity holds j's peak)

  variables  y[s,r] in {0,1}              role r of slot s
             x[j,s,r] in {0,1}, s in F(j), r in D   j runs on s in role r   (x[j,s] = sum_r x[j,s,r])
             T[s] >= 0                    finish time of s;   C >= 0 makespan
             U[s] >= 0                    a_s * max(max_j D_j x[j,s], sum_j O_js w_js x[j,s])  (linearised max)
             V[s] >= 0                    co-running seconds on s (c6_co_running; only when phi > 0)
             pf[p] >= 0, z[p] in {0,1}    seconds of decode-slot prefill done by p (L_p / mu_p), p does some
             G >= 0                       finish of the fluid prefill share (the water level)
             ov[s] >= 0                   overrun of s past its deadline (slots with a deadline only)
  st_s(r) = on_s + sw_s(r) (0 for OFF): constants, so st_s = sum_r st_s(r) y[s,r] is linear.

  c1_one_role[s]       sum_r y[s,r] = 1
  c2_assign_once[j]    sum_{s,r} x[j,s,r] = 1
  c3_kv_fit[j,s,r]     x[j,s,r] <= y[s,r]           (x exists only for s in F(j): the KV fit is the domain)
  c4_max_len[j,s]      U[s] >= a_s D_j x[j,s]
  c4_occupancy[s]      U[s] >= a_s sum_j O_js w_js x[j,s]
  c4_finish[s]         T[s] >= st_s + c_s sum_j D_j x[j,s] + U[s] + sum_j (P_j/mu_s + m_js) x[j,s,MIXED]
                               + sum_j (kv_recv_js + m_js) x[j,s,DECODE]
  c5_balance           sum_p mu_p pf[p] >= sum_{j,s} P_j x[j,s,DECODE]
  c5_share_on[p]       pf[p] <= (sum_j P_j / mu_p) z[p];   c5_used_is_prefill[p]  z[p] <= y[p,PREFILL]
  c5_fill[p]           G >= st_p(PREFILL) z[p] + pf[p]
  c5_prefill_finish[p] T[p] >= G - M_G (1 - y[p,PREFILL])
  c6_co_running[s]     V[s] >= phi sum_k (c_s D_k x[k,s] + (P_k/mu_s) x[k,s,MIXED] + x_ks x[k,s,DECODE])  (phi > 0)
  c6_critical_path[j,s] T[s] >= st_s + sum_r Q_jsr x[j,s,r] + V[s]   (Q_jsr = CP_js - phi (c_s D_j + e_jsr); with
                       x[j,s] = 0 the row is implied by c4_finish, as phi <= 1: no big-M needed)
  c7_deadline[s]       ov[s] >= T[s] - d_s (1 - y[s,OFF])   (ov[s] >= T[s] - d_s when d_s > 0: OFF has T = 0)
  c8_makespan[s]       C >= T[s]
  c9_release_idle[s]   (slots with a deadline) y[s,r] <= sum_j x[j,s,r] for r in D;
                       y[s,PREFILL] <= sum_{j,s'} x[j,s',DECODE] over j with P_j > 0
  c10_symmetry[s,s']   identical slots (same coefficients, node, no trajectory at home there) switch on in order
  c11_longest_path     C >= max_j min_{s in F(j), r in D} (st_s(r) + CP_js)   (a valid cut; the CP bound)
  objective  makespan C  +  lam * switching_gpu_seconds  +  penalty * deadline_overrun, with
             switching = sum_s tp_s (sum_{r != OFF} st_s(r) y[s,r] + [s on now] sw y[s,OFF])
                         + sum_{j,s,r} tp_s m_js x[j,s,r];   deadline_overrun = sum_s ov[s]

Why this equals ``evaluate``: per slot, T[s] at its smallest is st_s + max(c ΣD + a max(maxD, occ) + extra,
max_j (Q_js + phi (c ΣD + Σe))) (c4 and c6 are the two branches of the max; U is the inner max). The PREFILL slots: the smallest G
with G >= st_p + pf_p over the slots that prefill and sum_p mu_p pf_p >= W is the water level of
``waterfill_finish``, so T[p] = max(st_p, G) as in ``evaluate``. c9 makes the model's decision a fixed point
of ``actions.release_idle`` (an idle slot with a deadline is switched OFF by ``make_plan``), so the priced
plan is the solved one; it removes no optimum (releasing never increases the makespan). c10 removes
permutations of interchangeable slots only. c3 by rows rather than an aggregated row keeps the LP tight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.config import PlannerConfig
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.evaluate import (
    TERM_MAKESPAN,
    TERM_OVERRUN,
    TERM_SWITCHING,
    evaluate,
    waterfill_finish,
)
from rollplan.solver.core.instance import Instance

DECODING: tuple[Role, Role] = (Role.MIXED, Role.DECODE)
ON_ROLES: tuple[Role, Role, Role] = (Role.MIXED, Role.PREFILL, Role.DECODE)
ROLE_ORDER: tuple[Role, ...] = (Role.OFF, Role.MIXED, Role.PREFILL, Role.DECODE)
EXACT_MAX_PAIRS = 4096
"""The exact per-trajectory model is used when |J| <= config.exact_max_trajectories and |J| * |S| <= this."""
BUILD_SECONDS_PER_PAIR = 2.5e-4
"""Measured cost of writing the exact model per (trajectory, slot) pair through PuLP or CP-SAT (2-core VM)."""


class Sense(StrEnum):
    LE = "<="
    GE = ">="
    EQ = "=="


Var = Any
"""A builder's variable handle (``pulp.LpVariable`` for the MILP, ``cpsat._ScaledVar`` for CP-SAT)."""
Terms = Sequence[tuple[float, Var]]


@dataclass(frozen=True, slots=True)
class ObjectivePart:
    """A named objective term: ``weight * (sum coef * var + constant)``."""

    name: str
    weight: float
    terms: Terms
    constant: float = 0.0


@dataclass(frozen=True, slots=True)
class SolveLimits:
    """``time_limit``: seconds for the solver call; ``relax``: solve the LP relaxation (MILP only).

    ``deterministic``: ``time_limit`` is a work budget (``PlannerConfig.deterministic``): CP-SAT's
    deterministic time, HiGHS/CBC node and iteration budgets; the wall clock only as a safety cap.
    """

    time_limit: float
    threads: int = 1
    seed: int = 0
    relative_gap: float = 0.0
    relax: bool = False
    deterministic: bool = False

    @staticmethod
    def of(cfg: PlannerConfig, time_limit: float, **kw: Any) -> SolveLimits:
        """The limits of one solver call under ``cfg`` (threads, seed, deterministic) with ``time_limit``."""
        return SolveLimits(
            time_limit=time_limit, threads=cfg.threads, seed=cfg.seed, deterministic=cfg.deterministic, **kw
        )


@dataclass(frozen=True, slots=True)
class SolveResult:
    """What a builder's solve returns. ``status`` None: nothing feasible found (or infeasible).

    ``value(var)`` reads a variable (seconds for continuous ones); ``bound``: the solver's proven bound on
    the objective (the LP value when relaxed).
    """

    status: SolveStatus | None
    value: Callable[[Var], float]
    objective: float | None = None
    bound: float | None = None
    info: Mapping[str, float] = field(default_factory=dict)


class ModelBuilder(Protocol):
    """A solver-neutral linear model. Continuous variables are seconds (CP-SAT stores them in ms)."""

    name: str

    def add_var(self, name: str, lb: float, ub: float, *, integer: bool) -> Var: ...

    def add_constraint(self, name: str, terms: Terms, sense: Sense, rhs: float) -> None: ...

    def set_objective(self, parts: Sequence[ObjectivePart]) -> None: ...

    def set_hint(self, values: Mapping[Var, float]) -> None: ...

    def solve(self, limits: SolveLimits) -> SolveResult: ...


BuilderFactory = Callable[[Instance], ModelBuilder]


def _merge(terms: Terms) -> list[tuple[float, Var]]:
    """Sum coefficients of repeated variables and drop zeros (both solvers want one entry per variable)."""
    acc: dict[int, list[Any]] = {}
    for coef, var in terms:
        if coef == 0.0:
            continue
        key = id(var)
        if key in acc:
            acc[key][0] += coef
        else:
            acc[key] = [coef, var]
    return [(c, v) for c, v in acc.values() if c != 0.0]


class LinearModel:
    """Thin helper over a builder: merges terms and keeps constraint names unique and readable."""

    def __init__(self, builder: ModelBuilder) -> None:
        self.b = builder
        self.rows = 0

    def var(self, name: str, lb: float, ub: float, *, integer: bool = False) -> Var:
        return self.b.add_var(name, lb, ub, integer=integer)

    def binary(self, name: str) -> Var:
        return self.b.add_var(name, 0.0, 1.0, integer=True)

    def add(self, name: str, terms: Terms, sense: Sense, rhs: float) -> None:
        self.b.add_constraint(name, _merge(terms), sense, rhs)
        self.rows += 1


# ---------------------------------------------------------------------------------------------------------
# The exact per-trajectory formulation
# ---------------------------------------------------------------------------------------------------------


class ExactFormulation:
    """The exact model of the module docstring for one ``Instance``.

    ``build(builder)`` writes it; ``decision(result)`` reads roles/placement back (binaries > 0.5);
    ``hint_values(roles, placement)`` maps a decision onto every variable (a feasible warm start).
    ``makespan_only``: objective C alone (the LP bound on the makespan, see ``milp.lp_bound``).
    """

    def __init__(self, inst: Instance, *, makespan_only: bool = False) -> None:
        self.inst = inst
        self.makespan_only = makespan_only
        cfg = inst.config
        self.rsw = cfg.role_switch_seconds
        n_s, n_j = len(inst.slots), len(inst.trajs)
        self.S = range(n_s)
        self.J = range(n_j)
        self.fit: list[list[int]] = [[s for s in self.S if inst.fits(j, s)] for j in self.J]
        self.st = [{r: sl.start_seconds(r, self.rsw) for r in ROLE_ORDER} for sl in inst.slots]
        self.prefill_total = sum(t.prefill for t in inst.trajs)
        self.has_prefill = self.prefill_total > 0
        # Per (j, s) coefficients, computed once (the instance computes them on demand).
        self.cp: dict[tuple[int, int], float] = {}
        self.q: dict[tuple[int, int, Role], float] = {}
        self.occw: dict[tuple[int, int], float] = {}
        self.move: dict[tuple[int, int], float] = {}
        self.recv: dict[tuple[int, int], float] = {}
        self.e: dict[tuple[int, int, Role], float] = {}  # e_jsr: own prefill (MIXED) / KV receive (DECODE)
        for j in self.J:
            for s in self.fit[j]:
                self.cp[j, s] = inst.critical_path(j, s)
                for r in DECODING:
                    self.q[j, s, r] = inst.own_path(j, s, r)
                self.occw[j, s] = inst.occupancy(j, s) * inst.share(j, s)
                self.move[j, s] = inst.move_seconds(j, s)
                self.recv[j, s] = inst.kv_receive_seconds(j, s)
                for r in DECODING:
                    self.e[j, s, r] = inst.stall_seconds(j, s, r)
        self.y: dict[tuple[int, Role], Var] = {}
        self.x: dict[tuple[int, int, Role], Var] = {}
        self.T: dict[int, Var] = {}
        self.U: dict[int, Var] = {}
        self.V: dict[int, Var] = {}
        self.pf: dict[int, Var] = {}
        self.z: dict[int, Var] = {}
        self.ov: dict[int, Var] = {}
        self.G: Var = None
        self.C: Var = None
        self.sym_pairs = self._identical_pairs()
        self.m: LinearModel | None = None

    # -- bounds used by big-M rows and CP-SAT domains ---------------------------------------------------
    @property
    def big_g(self) -> float:
        """M_G: the water level never exceeds the latest PREFILL start + all prefill on the slowest slot."""
        if not self.has_prefill:
            return 0.0
        slowest = min(sl.mu_p for sl in self.inst.slots)
        return (max(st[Role.PREFILL] for st in self.st) + self.prefill_total / slowest) * 1.001 + 0.01

    def pf_cap(self, p: int) -> float:
        """Big-M of pf[p]: all prefill on p, with slack so that CP-SAT's millisecond rounding keeps it valid."""
        return self.prefill_total / self.inst.slots[p].mu_p * 1.001 + 0.01

    @property
    def horizon(self) -> float:
        """An upper bound on every finish time of any decision (domains for CP-SAT)."""
        inst = self.inst
        per_j = 0.0
        for j in self.J:
            t = inst.trajs[j]
            worst = 0.0
            for s in self.fit[j]:
                sl = inst.slots[s]
                w = sl.c * t.decode + sl.a * (t.decode + self.occw[j, s]) + t.prefill / sl.mu
                w += self.recv[j, s] + self.move[j, s] + self.cp[j, s]
                worst = max(worst, w)
            per_j += worst
        start = max((max(st.values()) for st in self.st), default=0.0)
        return start + per_j + self.big_g + 1.0

    # -- build --------------------------------------------------------------------------------------------
    def build(self, builder: ModelBuilder) -> LinearModel:
        self.m = LinearModel(builder)
        self._variables()
        self._c1_one_role()
        self._c2_assign_once()
        self._c3_kv_fit()
        self._c4_decode_time()
        self._c5_prefill_share()
        self._c6_critical_path()
        self._c7_deadline()
        self._c8_makespan()
        self._c9_release_idle()
        self._c10_symmetry()
        self._c11_longest_path()
        self.m.b.set_objective(self.objective_parts())
        return self.m

    def _variables(self) -> None:
        m = self.m
        assert m is not None
        inst = self.inst
        h = self.horizon
        for s in self.S:
            for r in ROLE_ORDER:
                self.y[s, r] = m.binary(f"y_s{s}_{r.value}")
        for j in self.J:
            for s in self.fit[j]:
                for r in DECODING:
                    self.x[j, s, r] = m.binary(f"x_j{j}_s{s}_{r.value}")
        for s, sl in enumerate(inst.slots):
            self.T[s] = m.var(f"T_s{s}", 0.0, h)
            self.U[s] = m.var(f"U_s{s}", 0.0, h)
            if inst.phi * sl.c > 0:
                self.V[s] = m.var(f"V_s{s}", 0.0, h)
            if sl.deadline is not None:
                self.ov[s] = m.var(f"ov_s{s}", 0.0, h)
        if self.has_prefill:
            for p in range(len(inst.slots)):
                self.pf[p] = m.var(f"pf_s{p}", 0.0, self.pf_cap(p))
                self.z[p] = m.binary(f"z_s{p}")
            self.G = m.var("G", 0.0, self.big_g)
        self.C = m.var("C", 0.0, h)

    def _xs(self, j: int, s: int) -> list[tuple[float, Var]]:
        """x[j,s] = sum_r x[j,s,r] as terms."""
        return [(1.0, self.x[j, s, r]) for r in DECODING]

    def _start(self, s: int, roles: Sequence[Role] = ON_ROLES) -> list[tuple[float, Var]]:
        """st_s = sum_r st_s(r) y[s,r] as terms."""
        return [(self.st[s][r], self.y[s, r]) for r in roles]

    def _c1_one_role(self) -> None:
        m = self.m
        assert m is not None
        for s in self.S:
            m.add(f"c1_one_role_s{s}", [(1.0, self.y[s, r]) for r in ROLE_ORDER], Sense.EQ, 1.0)

    def _c2_assign_once(self) -> None:
        m = self.m
        assert m is not None
        for j in self.J:
            m.add(f"c2_assign_once_j{j}", [t for s in self.fit[j] for t in self._xs(j, s)], Sense.EQ, 1.0)

    def _c3_kv_fit(self) -> None:
        m = self.m
        assert m is not None
        for (j, s, r), xv in self.x.items():
            m.add(f"c3_kv_fit_j{j}_s{s}_{r.value}", [(1.0, xv), (-1.0, self.y[s, r])], Sense.LE, 0.0)

    def _on_slot(self) -> dict[int, list[int]]:
        on: dict[int, list[int]] = {s: [] for s in self.S}
        for j in self.J:
            for s in self.fit[j]:
                on[s].append(j)
        return on

    def _c4_decode_time(self) -> None:
        m = self.m
        assert m is not None
        inst = self.inst
        for s, js in self._on_slot().items():
            sl = inst.slots[s]
            U = self.U[s]
            for j in js:
                d = inst.trajs[j].decode
                m.add(
                    f"c4_max_len_j{j}_s{s}",
                    [(1.0, U), *[(-sl.a * d, v) for _, v in self._xs(j, s)]],
                    Sense.GE,
                    0.0,
                )
            occ = [(-sl.a * self.occw[j, s], v) for j in js for _, v in self._xs(j, s)]
            m.add(f"c4_occupancy_s{s}", [(1.0, U), *occ], Sense.GE, 0.0)
            terms: list[tuple[float, Var]] = [(1.0, self.T[s]), (-1.0, U)]
            terms += [(-c, v) for c, v in self._start(s)]
            for j in js:
                t = inst.trajs[j]
                terms += [(-sl.c * t.decode, v) for _, v in self._xs(j, s)]
                for r in DECODING:
                    terms.append((-(self.e[j, s, r] + self.move[j, s]), self.x[j, s, r]))
            m.add(f"c4_finish_s{s}", terms, Sense.GE, 0.0)

    def _c5_prefill_share(self) -> None:
        m = self.m
        assert m is not None
        inst = self.inst
        if not self.has_prefill:
            # No prefill work anywhere: PREFILL slots only start (T >= st, in c4_finish) and never fill.
            return
        work = [
            (-inst.trajs[j].prefill, self.x[j, s, Role.DECODE])
            for j in self.J
            if inst.trajs[j].prefill > 0
            for s in self.fit[j]
        ]
        m.add("c5_balance", [(sl.mu_p, self.pf[p]) for p, sl in enumerate(inst.slots)] + work, Sense.GE, 0.0)
        big_g = self.big_g
        for p in range(len(inst.slots)):
            m.add(f"c5_share_on_s{p}", [(1.0, self.pf[p]), (-self.pf_cap(p), self.z[p])], Sense.LE, 0.0)
            m.add(
                f"c5_used_is_prefill_s{p}", [(1.0, self.z[p]), (-1.0, self.y[p, Role.PREFILL])], Sense.LE, 0.0
            )
            m.add(
                f"c5_fill_s{p}",
                [(1.0, self.G), (-self.st[p][Role.PREFILL], self.z[p]), (-1.0, self.pf[p])],
                Sense.GE,
                0.0,
            )
            m.add(
                f"c5_prefill_finish_s{p}",
                [(1.0, self.T[p]), (-1.0, self.G), (-big_g, self.y[p, Role.PREFILL])],
                Sense.GE,
                -big_g,
            )

    def _c6_critical_path(self) -> None:
        m = self.m
        assert m is not None
        inst = self.inst
        for s, js in self._on_slot().items():
            if s in self.V:
                phic = inst.phi * inst.slots[s].c
                co = [(-(phic * inst.trajs[j].decode + inst.phi * self.e[j, s, r]), self.x[j, s, r])
                      for j in js for r in DECODING]
                m.add(f"c6_co_running_s{s}", [(1.0, self.V[s]), *co], Sense.GE, 0.0)
        for j in self.J:
            for s in self.fit[j]:
                terms = [(1.0, self.T[s])] + [(-c, v) for c, v in self._start(s, DECODING)]
                terms += [(-self.q[j, s, r], self.x[j, s, r]) for r in DECODING]
                if s in self.V:
                    terms.append((-1.0, self.V[s]))
                m.add(f"c6_critical_path_j{j}_s{s}", terms, Sense.GE, 0.0)

    def _c7_deadline(self) -> None:
        m = self.m
        assert m is not None
        for s, ov in self.ov.items():
            d = self.inst.slots[s].deadline
            assert d is not None
            if d > 0:
                # OFF gives T = 0 < d, so the role term is not needed (and CP-SAT's rounding stays exact).
                m.add(f"c7_deadline_s{s}", [(1.0, ov), (-1.0, self.T[s])], Sense.GE, -d)
            else:
                m.add(
                    f"c7_deadline_s{s}",
                    [(1.0, ov), (-1.0, self.T[s]), (-d, self.y[s, Role.OFF])],
                    Sense.GE,
                    -d,
                )

    def _c8_makespan(self) -> None:
        m = self.m
        assert m is not None
        for s in self.S:
            m.add(f"c8_makespan_s{s}", [(1.0, self.C), (-1.0, self.T[s])], Sense.GE, 0.0)

    def _c9_release_idle(self) -> None:
        m = self.m
        assert m is not None
        inst = self.inst
        on = self._on_slot()
        fed = [
            (-1.0, self.x[j, s, Role.DECODE])
            for j in self.J
            if inst.trajs[j].prefill > 0
            for s in self.fit[j]
        ]
        for s, sl in enumerate(inst.slots):
            if sl.deadline is None:
                continue
            for r in DECODING:
                m.add(
                    f"c9_release_idle_s{s}_{r.value}",
                    [(1.0, self.y[s, r]), *[(-1.0, self.x[j, s, r]) for j in on[s]]],
                    Sense.LE,
                    0.0,
                )
            m.add(f"c9_release_idle_s{s}_prefill", [(1.0, self.y[s, Role.PREFILL]), *fed], Sense.LE, 0.0)

    def _identical_pairs(self) -> list[tuple[int, int]]:
        """Consecutive members of each class of interchangeable slots (same coefficients and node, no homes)."""
        inst = self.inst
        homes = {t.home for t in inst.trajs if t.home is not None}
        classes: dict[tuple[Any, ...], list[int]] = {}
        for s, sl in enumerate(inst.slots):
            if s in homes:
                continue
            key = (sl.node, sl.tp, sl.gpu, sl.a, sl.c, sl.mu, sl.kv_capacity, sl.on_seconds, sl.current_role,
                   sl.deadline, sl.tau_ref, sl.same_node_kv_rate, sl.cross_node_kv_rate)  # fmt: skip
            classes.setdefault(key, []).append(s)
        return [(g[i], g[i + 1]) for g in classes.values() for i in range(len(g) - 1)]

    def _c10_symmetry(self) -> None:
        m = self.m
        assert m is not None
        for s, t in self.sym_pairs:
            # s on (in any role) whenever t is on: y[t,OFF] >= y[s,OFF].
            m.add(
                f"c10_symmetry_s{s}_s{t}",
                [(1.0, self.y[t, Role.OFF]), (-1.0, self.y[s, Role.OFF])],
                Sense.GE,
                0.0,
            )

    def longest_path_cut(self) -> float:
        """max_j min over hosts (st + CP): a lower bound on the makespan of every decision."""
        best = 0.0
        for j in self.J:
            cand = [min(self.st[s][r] for r in DECODING) + self.cp[j, s] for s in self.fit[j]]
            if cand:
                best = max(best, min(cand))
        return best

    def _c11_longest_path(self) -> None:
        m = self.m
        assert m is not None
        m.add("c11_longest_path", [(1.0, self.C)], Sense.GE, self.longest_path_cut())

    # -- objective -----------------------------------------------------------------------------------------
    def switching_terms(self) -> tuple[list[tuple[float, Var]], float]:
        """(terms, constant) of switching GPU-seconds (the ``evaluate`` definition)."""
        inst = self.inst
        terms: list[tuple[float, Var]] = []
        for s, sl in enumerate(inst.slots):
            terms += [(sl.tp * c, v) for c, v in self._start(s)]
            if sl.is_on_now:
                terms.append((sl.tp * self.rsw, self.y[s, Role.OFF]))
        for (j, s, _r), v in self.x.items():
            if self.move[j, s] > 0:
                terms.append((inst.slots[s].tp * self.move[j, s], v))
        return terms, 0.0

    def objective_parts(self) -> list[ObjectivePart]:
        cfg = self.inst.config
        parts = [ObjectivePart(TERM_MAKESPAN, 1.0, [(1.0, self.C)])]
        if self.makespan_only:
            return parts
        sw, const = self.switching_terms()
        parts.append(ObjectivePart(TERM_SWITCHING, cfg.switch_weight, sw, const))
        if self.ov:
            parts.append(
                ObjectivePart(TERM_OVERRUN, cfg.deadline_penalty, [(1.0, v) for v in self.ov.values()])
            )
        return parts

    # -- solution <-> decision ---------------------------------------------------------------------------
    def decision(self, res: SolveResult) -> tuple[list[Role], list[int]]:
        val = res.value
        roles = []
        for s in self.S:
            chosen = [r for r in ROLE_ORDER if val(self.y[s, r]) > 0.5]
            roles.append(chosen[0] if chosen else Role.OFF)
        placement = []
        for j in self.J:
            where = [s for s in self.fit[j] for r in DECODING if val(self.x[j, s, r]) > 0.5]
            placement.append(where[0] if where else -1)
        return roles, placement

    def canonical(self, roles: Sequence[Role], placement: Sequence[int]) -> tuple[list[Role], list[int]]:
        """Relabel interchangeable slots so that ``c10_symmetry`` holds (the objective is unchanged)."""
        roles, placement = list(roles), list(placement)
        groups: list[list[int]] = []
        for s, t in self.sym_pairs:
            if groups and groups[-1][-1] == s:
                groups[-1].append(t)
            else:
                groups.append([s, t])
        for g in groups:
            order = sorted(g, key=lambda s: (roles[s] is Role.OFF, g.index(s)))
            relabel = dict(zip(order, g, strict=True))  # old slot -> new slot
            new_roles = {relabel[s]: roles[s] for s in g}
            for s in g:
                roles[s] = new_roles[s]
            placement = [relabel.get(s, s) for s in placement]
        return roles, placement

    def hint_values(self, roles: Sequence[Role], placement: Sequence[int]) -> dict[Var, float] | None:
        """Every variable's value for the decision (after ``release_idle`` and relabelling), or None if invalid."""
        inst = self.inst
        if len(placement) != len(self.J) or any(not (0 <= s < len(self.S)) for s in placement):
            return None
        roles = release_idle(inst, roles, placement)
        roles, placement = self.canonical(roles, placement)
        ev = evaluate(inst, roles, placement)
        if ev.problems:
            return None
        vals: dict[Var, float] = {}
        for (s, r), v in self.y.items():
            vals[v] = 1.0 if roles[s] is r else 0.0
        for (j, s, r), v in self.x.items():
            vals[v] = 1.0 if placement[j] == s and roles[s] is r else 0.0
        max_d = [0.0] * len(self.S)
        occ = [0.0] * len(self.S)
        co = [0.0] * len(self.S)
        for j, s in enumerate(placement):
            max_d[s] = max(max_d[s], inst.trajs[j].decode)
            occ[s] += self.occw[j, s]
            co[s] += inst.phi * inst.slots[s].c * inst.trajs[j].decode + inst.phi * inst.stall_seconds(j, s, roles[s])
        for s, sl in enumerate(inst.slots):
            vals[self.T[s]] = ev.slot_finish[s]
            vals[self.U[s]] = sl.a * max(max_d[s], occ[s])
            if s in self.V:
                vals[self.V[s]] = co[s]
            if s in self.ov:
                vals[self.ov[s]] = ev.overrun[s]
        if self.has_prefill:
            work = sum(inst.trajs[j].prefill for j, s in enumerate(placement) if roles[s] is Role.DECODE)
            pre = [p for p in self.S if roles[p] is Role.PREFILL]
            level = 0.0
            if work > 0:
                level = waterfill_finish(
                    [self.st[p][Role.PREFILL] for p in pre], [inst.slots[p].mu_p for p in pre], work
                )
            g = 0.0
            for p in self.S:
                share = max(0.0, level - self.st[p][Role.PREFILL]) if p in pre and work > 0 else 0.0
                vals[self.pf[p]] = share
                vals[self.z[p]] = 1.0 if share > 0 else 0.0
                if share > 0:
                    g = max(g, self.st[p][Role.PREFILL] + share)
            vals[self.G] = g
        vals[self.C] = ev.makespan
        return vals


def is_small(inst: Instance, budget: float | None = None) -> bool:
    """Whether the exact per-trajectory model is used (else the aggregate pipeline).

    Small: |J| <= ``exact_max_trajectories`` and |J| |S| <= ``EXACT_MAX_PAIRS``, and, given a ``budget``,
    the model's estimated build time (``BUILD_SECONDS_PER_PAIR``) leaves at least half of it to the solver.
    """
    n_j, n_s = len(inst.trajs), len(inst.slots)
    if n_j > inst.config.exact_max_trajectories or n_j * n_s > EXACT_MAX_PAIRS:
        return False
    return budget is None or n_j * n_s * BUILD_SECONDS_PER_PAIR <= 0.5 * budget
