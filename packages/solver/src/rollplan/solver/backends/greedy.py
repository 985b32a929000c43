"""The ``greedy`` backend: ``search.placement.solve_greedy`` (role sizing + placement + local search) as a
``Backend`` (status HEURISTIC). ``plan()`` runs the same search on every call, as the fallback and the
incumbent of the exact backends.
"""

from __future__ import annotations

from rollplan.models.types import SolveStatus
from rollplan.solver.backends.base import Decision
from rollplan.solver.core.instance import Instance
from rollplan.solver.search.placement import solve_greedy

NAME = "greedy"


class GreedyBackend:
    """``Backend`` protocol implementation (status HEURISTIC)."""

    name = NAME

    def solve(self, inst: Instance, *, budget: float, hint: Decision | None = None) -> Decision | None:
        clock = inst.config.clock
        until = clock() + max(0.0, budget)
        roles, placement, _ = solve_greedy(inst, until=until)
        return Decision(roles=tuple(roles), placement=tuple(placement), status=SolveStatus.HEURISTIC)


BACKEND = GreedyBackend()
