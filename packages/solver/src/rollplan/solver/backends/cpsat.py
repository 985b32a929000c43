"""The ``cpsat`` backend: the formulation protocol on OR-Tools CP-SAT, in integer milliseconds.

Same models as ``milp`` (``formulation.ExactFormulation`` when small, ``aggregate`` when large), written
through ``CpSatBuilder``. CP-SAT needs integers; one scaling function does it all, ``to_ms``:

- a continuous model variable (seconds) becomes an integer variable in milliseconds (value = to_ms(seconds));
  integer and binary variables stay as they are;
- every constraint row is multiplied by 1000: the coefficient of variable v becomes to_ms(coef / unit_v)
  (unit_v = 1000 for millisecond variables, 1 for integers) and the right-hand side to_ms(rhs);
- the objective likewise, so its unit is one millisecond of objective.

Inequality rows round to the safe side (see ``CpSatBuilder.add_constraint``), so CP-SAT never
under-estimates a finish time; its optimum differs from the MILP's by about a millisecond per term of a
row. Decisions are re-priced exactly by ``evaluate`` downstream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ortools.sat.python import cp_model

from rollplan.models.types import SolveStatus
from rollplan.solver.backends.pipeline import FormulationBackend
from rollplan.solver.config import DETERMINISTIC_WALL_EXTRA, DETERMINISTIC_WALL_FACTOR
from rollplan.solver.core.instance import Instance
from rollplan.solver.model.formulation import (
    ObjectivePart,
    Sense,
    SolveLimits,
    SolveResult,
    Terms,
    Var,
)

NAME = "cpsat"
MS_PER_SECOND = 1000
Rounding = Literal["nearest", "down", "up"]
UNBOUNDED_SECONDS = 1e7
"""Upper bound given to continuous variables the model leaves unbounded (CP-SAT domains are finite)."""


def to_ms(seconds: float, rounding: Rounding = "nearest") -> int:
    """The single model-to-CP-SAT scaling: a real number of seconds as integer milliseconds.

    ``rounding``: "nearest" (objective, equalities), "down" or "up" (inequality rows, see ``CpSatBuilder``).
    A micro-tolerance keeps exact values exact (2.0 s is 2000 ms whichever way, not 2001).
    """
    x = seconds * MS_PER_SECOND
    if rounding == "down":
        return math.floor(x + 1e-6)
    if rounding == "up":
        return math.ceil(x - 1e-6)
    return round(x)


@dataclass(frozen=True, slots=True)
class _ScaledVar:
    """A CP-SAT variable and its units per model unit (1000 for seconds held in ms, 1 for integers)."""

    var: cp_model.IntVar
    unit: int

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


class CpSatBuilder:
    """``ModelBuilder`` on a ``cp_model.CpModel`` (see the module docstring for the scaling)."""

    name = NAME

    def __init__(self, inst: Instance) -> None:
        self.model = cp_model.CpModel()
        self.solver: cp_model.CpSolver | None = None
        self.hinted = False

    def add_var(self, name: str, lb: float, ub: float, *, integer: bool) -> Var:
        if integer:
            lo, hi = math.ceil(lb - 1e-9), math.floor(min(ub, UNBOUNDED_SECONDS) + 1e-9)
            v = self.model.new_bool_var(name) if (lo, hi) == (0, 1) else self.model.new_int_var(lo, hi, name)
            return _ScaledVar(v, 1)
        ub = min(ub, UNBOUNDED_SECONDS)  # CP-SAT domains are finite
        return _ScaledVar(self.model.new_int_var(to_ms(lb, "down"), to_ms(ub, "up"), name), MS_PER_SECOND)

    @staticmethod
    def _expr(terms: Terms, rounding: Rounding = "nearest") -> cp_model.LinearExpr:
        variables = [sv.var for _, sv in terms]
        coefs = [to_ms(c / sv.unit, rounding) for c, sv in terms]
        return cp_model.LinearExpr.weighted_sum(variables, coefs)

    def add_constraint(self, name: str, terms: Terms, sense: Sense, rhs: float) -> None:
        # Inequalities round to the safe side (every variable is >= 0): a ">=" row gets its coefficients
        # rounded down and its right-hand side up, so whatever satisfies the integer row satisfies the real
        # one. Finish times are then never under-estimated and a deadline met in CP-SAT is met for real.
        if sense is Sense.LE:
            ct = self.model.add(self._expr(terms, "up") <= to_ms(rhs, "down"))
        elif sense is Sense.GE:
            ct = self.model.add(self._expr(terms, "down") >= to_ms(rhs, "up"))
        else:
            ct = self.model.add(self._expr(terms) == to_ms(rhs))
        ct.with_name(name)

    def set_objective(self, parts: Sequence[ObjectivePart]) -> None:
        terms = [(p.weight * c, v) for p in parts for c, v in p.terms]
        const = sum(p.weight * p.constant for p in parts)
        self.model.minimize(self._expr(terms) + to_ms(const))

    def set_hint(self, values: Mapping[Var, float]) -> None:
        # Only the integer (decision) variables: millisecond values of the continuous ones, rounded, can
        # violate rows rounded to the safe side, and an infeasible hint misleads the search.
        self.model.clear_hints()
        self.hinted = False
        for sv, x in values.items():
            if sv.unit == 1:
                self.model.add_hint(sv.var, round(x))
                self.hinted = True

    def solve(self, limits: SolveLimits) -> SolveResult:
        if limits.relax:
            raise ValueError("CP-SAT has no LP relaxation to solve; use milp.lp_bound")
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = max(1, limits.threads)
        p.random_seed = limits.seed
        if limits.deterministic:
            # Work, not wall time: CP-SAT's deterministic clock; the wall cap is only a safety net.
            p.max_deterministic_time = max(1e-3, limits.time_limit)
            p.max_time_in_seconds = DETERMINISTIC_WALL_FACTOR * limits.time_limit + DETERMINISTIC_WALL_EXTRA
            p.interleave_search = p.num_workers > 1  # the deterministic parallel mode
        else:
            p.max_time_in_seconds = max(1e-3, limits.time_limit)
        p.relative_gap_limit = limits.relative_gap
        p.log_search_progress = False
        code = solver.solve(self.model)
        self.solver = solver
        info = {"branches": float(solver.num_branches), "conflicts": float(solver.num_conflicts)}
        if code == cp_model.OPTIMAL:
            st: SolveStatus | None = SolveStatus.OPTIMAL
        elif code == cp_model.FEASIBLE:
            st = SolveStatus.FEASIBLE
        else:
            return SolveResult(status=None, value=lambda sv: 0.0, info=info)

        def value(sv: Var) -> float:
            return solver.value(sv.var) / sv.unit

        return SolveResult(
            status=st,
            value=value,
            objective=solver.objective_value / MS_PER_SECOND,
            bound=solver.best_objective_bound / MS_PER_SECOND,
            info=info,
        )


def make_builder(inst: Instance) -> CpSatBuilder:
    return CpSatBuilder(inst)


BACKEND = FormulationBackend(NAME, make_builder)
