"""The ``milp`` backend: the formulation protocol on PuLP, solved by HiGHS (highspy, default) or CBC.

Small instances (``formulation.is_small``) get the exact per-trajectory model (``formulation.ExactFormulation``);
larger ones the aggregate pipeline (``pipeline.solve_large``: aggregate MILP, disaggregation, repair). Both
are warm-started from the hint and return within the budget: the model-build time (measured on
``inst.config.clock``) is subtracted before the solver gets its time limit.

HiGHS through PuLP: ``_Highs`` subclasses ``pulp.HiGHS`` to pass the model to highspy in bulk (PuLP adds
columns one by one), to start from the hint (PuLP 3's HiGHS API ignores ``warmStart``; we call
``Highs.setSolution``), and to read the MIP dual bound. CBC uses PuLP's bundled binary (``warmStart=True``).

``lp_bound(inst, budget)``: a valid lower bound on the makespan of every decision from an LP relaxation:
of the exact model (objective C alone) when small, of the aggregate model with per-class minimum
coefficients when large (``aggregate.bound_lp``; see docs/formulation_large.md for why it is a relaxation).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pulp

from rollplan.models.types import SolveStatus
from rollplan.solver.backends.pipeline import FormulationBackend
from rollplan.solver.config import DETERMINISTIC_WALL_EXTRA, DETERMINISTIC_WALL_FACTOR
from rollplan.solver.core.instance import Instance
from rollplan.solver.model import aggregate
from rollplan.solver.model.formulation import (
    ExactFormulation,
    ObjectivePart,
    Sense,
    SolveLimits,
    SolveResult,
    Terms,
    Var,
    is_small,
)

log = logging.getLogger(__name__)

NAME = "milp"
SOLVERS = ("highs", "cbc")
_SENSE = {Sense.LE: pulp.LpConstraintLE, Sense.GE: pulp.LpConstraintGE, Sense.EQ: pulp.LpConstraintEQ}


@functools.cache
def _silence_highs_banner() -> None:
    """Create (and drop) one HiGHS object with stdout pointed at /dev/null.

    Reason: HiGHS prints its banner from C++ to file descriptor 1 when the first ``Highs`` object of a
    process is made, whatever ``output_flag`` says; that would corrupt ``--json`` output of the CLI and of
    the replay. Later objects print nothing, so doing this once per process is enough.
    """
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class _Highs(pulp.HiGHS):  # type: ignore[misc,valid-type]
    """``pulp.HiGHS`` with a bulk model transfer, a warm start, a clock-measured time limit and the MIP bound."""

    def __init__(
        self,
        *,
        deadline: float,
        clock: Any,
        warm: Mapping[Var, float] | None,
        seed: int,
        work: float | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(msg=False, random_seed=seed, **kw)
        self.deadline = deadline
        self.clock = clock
        self.warm = warm
        self.work = work  # deterministic mode: the work budget in nominal seconds (see work_limits)
        self.highs: Any = None

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:
        import highspy

        h: Any = lp.solverModel  # a highspy.Highs; PuLP types it loosely
        self.highs = h
        inf = highspy.kHighsInf
        variables = lp.variables()
        n = len(variables)
        lb = np.empty(n)
        ub = np.empty(n)
        cost = np.zeros(n)
        integer: list[int] = []
        for i, v in enumerate(variables):
            v.index = i  # pyright: ignore[reportAttributeAccessIssue]  (PuLP's HiGHS API reads .index)
            lb[i] = -inf if v.lowBound is None else v.lowBound
            ub[i] = inf if v.upBound is None else v.upBound
            if v.cat == pulp.LpInteger and self.mip:
                integer.append(i)
        objective: Any = lp.objective  # set by the formulation before solving
        for v, c in objective.items():
            cost[v.index] = c
        h.addVars(n, lb, ub)
        h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
        if objective.constant:
            h.changeObjectiveOffset(float(objective.constant))
        if integer:
            idx = np.asarray(integer, dtype=np.int32)
            h.changeColsIntegrality(len(idx), idx, np.full(len(idx), highspy.HighsVarType.kInteger))
        rows = list(lp._constraints.values())
        lower = np.empty(len(rows))
        upper = np.empty(len(rows))
        starts = np.empty(len(rows), dtype=np.int32)
        index: list[int] = []
        value: list[float] = []
        for i, con in enumerate(rows):
            con.index = i  # pyright: ignore[reportAttributeAccessIssue]
            starts[i] = len(index)
            for v, c in con.items():
                index.append(v.index)
                value.append(c)
            lo, hi = con.getLb(), con.getUb()
            lower[i] = -inf if lo is None else lo
            upper[i] = inf if hi is None else hi
        if rows:
            h.addRows(
                len(rows),
                lower,
                upper,
                len(index),
                starts,
                np.asarray(index, dtype=np.int32),
                np.asarray(value),
            )

    def callSolver(self, lp: pulp.LpProblem) -> None:
        h: Any = lp.solverModel  # a highspy.Highs; PuLP types it loosely
        # The time limit is what is left now, after PuLP and the transfer above. HiGHS counts its
        # time_limit from its own timer's start (the Highs object's creation), hence getRunTime().
        if self.work is not None:
            iterations, nodes, cap = work_limits(self.work)
            h.setOptionValue("simplex_iteration_limit", iterations)
            h.setOptionValue("mip_max_nodes", nodes)
            h.setOptionValue("time_limit", float(h.getRunTime()) + cap)
        else:
            left = max(1e-3, float(self.deadline - self.clock()))
            h.setOptionValue("time_limit", float(h.getRunTime()) + left)
        if self.warm and self.mip:
            vals = np.zeros(h.getNumCol())
            for v, x in self.warm.items():
                idx = getattr(v, "index", None)
                if idx is not None:
                    vals[idx] = x
            import highspy

            sol = highspy.HighsSolution()
            sol.col_value = list(vals)
            sol.value_valid = True
            h.setSolution(sol)
        h.run()

    def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:
        h: Any = lp.solverModel  # a highspy.Highs; PuLP types it loosely
        sol = h.getSolution()
        values = sol.col_value
        has_sol = h.getInfo().primal_solution_status >= 2 and len(values) == h.getNumCol()
        for v in lp.variables():
            v.varValue = values[v.index] if has_sol else None  # pyright: ignore[reportAttributeAccessIssue]
        if has_sol:
            return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
        return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound


class PulpBuilder:
    """``ModelBuilder`` on a ``pulp.LpProblem``; solves with HiGHS (highspy) or CBC per ``milp_solver``."""

    name = NAME

    def __init__(self, inst: Instance) -> None:
        solver = inst.config.milp_solver.lower()
        if solver not in SOLVERS:
            raise ValueError(f"milp_solver must be one of {SOLVERS}, not {solver!r}")
        self.solver = solver
        self.clock = inst.config.clock
        self.prob = pulp.LpProblem("rollplan", pulp.LpMinimize)
        self.warm: dict[Var, float] | None = None
        self.parts: list[ObjectivePart] = []

    def add_var(self, name: str, lb: float, ub: float, *, integer: bool) -> Var:
        cat = pulp.LpInteger if integer else pulp.LpContinuous
        return pulp.LpVariable(name, lowBound=lb, upBound=None if math.isinf(ub) else ub, cat=cat)

    def add_constraint(self, name: str, terms: Terms, sense: Sense, rhs: float) -> None:
        expr = pulp.LpAffineExpression([(v, c) for c, v in terms])
        self.prob.addConstraint(pulp.LpConstraint(expr, _SENSE[sense], name=name, rhs=rhs))

    def set_objective(self, parts: Sequence[ObjectivePart]) -> None:
        self.parts = list(parts)
        coefs: dict[Any, float] = {}
        const = 0.0
        for p in parts:
            const += p.weight * p.constant
            for c, v in p.terms:
                coefs[v] = coefs.get(v, 0.0) + p.weight * c
        self.prob.setObjective(pulp.LpAffineExpression(coefs, constant=const))

    def set_hint(self, values: Mapping[Var, float]) -> None:
        self.warm = dict(values)
        for v, x in values.items():
            v.setInitialValue(x)

    def solve(self, limits: SolveLimits) -> SolveResult:
        deadline = self.clock() + limits.time_limit
        if self.solver == "cbc":
            return self._solve_cbc(limits)
        _silence_highs_banner()
        solver = _Highs(
            deadline=deadline,
            clock=self.clock,
            warm=self.warm,
            seed=limits.seed,
            work=limits.time_limit if limits.deterministic else None,
            mip=not limits.relax,
            gapRel=limits.relative_gap,
            threads=max(1, limits.threads),
            timeLimit=limits.time_limit,
        )
        self.prob.solve(solver)
        h = solver.highs
        import highspy

        status = h.getModelStatus()
        info = h.getInfo()
        if limits.deterministic and status == highspy.HighsModelStatus.kTimeLimit:
            log.warning("milp: deterministic solve stopped by its wall-clock safety cap: not reproducible")
        has_sol = info.primal_solution_status >= 2
        stats = {
            "mip_nodes": float(max(info.mip_node_count, 0)),
            "simplex_iterations": float(info.simplex_iteration_count),
        }
        if status == highspy.HighsModelStatus.kOptimal:
            st: SolveStatus | None = SolveStatus.OPTIMAL
        elif has_sol:
            st = SolveStatus.FEASIBLE
        else:
            st = None
        bound = None
        if limits.relax:
            bound = info.objective_function_value if st is SolveStatus.OPTIMAL else None
        elif math.isfinite(info.mip_dual_bound):
            bound = info.mip_dual_bound
        return SolveResult(
            status=st,
            value=_value,
            objective=info.objective_function_value if has_sol else None,
            bound=bound,
            info=stats,
        )

    def _solve_cbc(self, limits: SolveLimits) -> SolveResult:
        _, nodes, cap = work_limits(limits.time_limit)
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            mip=not limits.relax,
            timeLimit=cap if limits.deterministic else max(0.05, limits.time_limit),
            maxNodes=nodes if limits.deterministic else None,
            gapRel=limits.relative_gap,
            threads=max(1, limits.threads),
            warmStart=self.warm is not None and not limits.relax,
            options=[f"randomCbcSeed {limits.seed + 1}"],
        )
        self.prob.solve(solver)
        found = self.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        if not found:
            return SolveResult(status=None, value=_value)
        optimal = self.prob.sol_status == pulp.LpSolutionOptimal
        st = SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE
        raw = pulp.value(self.prob.objective)
        obj = float(raw) if isinstance(raw, int | float) else None
        return SolveResult(
            status=st, value=_value, objective=obj, bound=obj if (optimal and limits.relax) else None
        )


HIGHS_ITERATIONS_PER_SECOND = 20_000
HIGHS_MIN_ITERATIONS = 1_000
HIGHS_NODES_PER_SECOND = 50
"""Deterministic budgets per nominal second (HiGHS 1.16, one thread of a loaded 2-core VM). HiGHS applies
``simplex_iteration_limit`` to each LP it solves, not to the whole MIP, so the node budget is what bounds
a MIP: measured 25-30 nodes/s with strong branching on the exact model (a node can cost ~1,000 simplex
iterations), plus a fixed root cost (presolve, cuts, sub-MIPs: 0.1-0.4 s) that no option budgets."""


def work_limits(seconds: float) -> tuple[int, int, float]:
    """(simplex iterations, MIP nodes, wall-clock safety cap in s) for a deterministic budget of ``seconds``."""
    s = max(0.0, seconds)
    return (
        max(HIGHS_MIN_ITERATIONS, round(HIGHS_ITERATIONS_PER_SECOND * s)),
        max(1, round(HIGHS_NODES_PER_SECOND * s)),
        DETERMINISTIC_WALL_FACTOR * s + DETERMINISTIC_WALL_EXTRA,
    )


def _value(v: Var) -> float:
    x = v.varValue
    return 0.0 if x is None else float(x)


def make_builder(inst: Instance) -> PulpBuilder:
    return PulpBuilder(inst)


BACKEND = FormulationBackend(NAME, make_builder)


def lp_bound(inst: Instance, budget: float, *, upper: float | None = None) -> float | None:
    """A valid lower bound on the makespan of every decision, from an LP relaxation; None if not solved in time.

    ``upper``: the makespan of a known feasible decision (e.g. the greedy plan's), which tightens the large
    instances' relaxation (slots whose start leaves no time before ``upper`` cannot help).
    """
    if not inst.trajs:
        return 0.0
    clock = inst.config.clock
    t0 = clock()
    if is_small(inst, budget):
        form = ExactFormulation(inst, makespan_only=True)
        builder = PulpBuilder(inst)
        builder.solver = "highs"
        form.build(builder)
        return aggregate.relaxed_bound(builder, inst, budget - (clock() - t0), 0.0)
    return aggregate.bound_lp(inst, PulpBuilder, budget=budget - (clock() - t0), upper=upper)
