"""The backend protocol: every planner backend turns an ``Instance`` into a ``Decision``.

Called by ``rollplan.solver.plan`` once per solve with the seconds left of the time limit (``budget``)
and, when available, a hint (the greedy decision or the previous plan mapped onto this instance).
A backend must return within ``budget`` (+ a small constant for model teardown) and returns None when it
found no feasible decision in time; ``plan()`` then falls back to the greedy decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.core.instance import Instance


@dataclass(frozen=True, slots=True)
class Decision:
    """Roles per slot index and a slot index per trajectory index, with how it was found.

    ``bound``: a proven lower bound on the *makespan* the backend established (e.g. the MILP's best
    bound on C, or an LP relaxation), or None. ``info``: backend statistics (nodes, iterations, ...).
    """

    roles: tuple[Role, ...]
    placement: tuple[int, ...]
    status: SolveStatus
    bound: float | None = None
    info: Mapping[str, float] = field(default_factory=dict)


class Backend(Protocol):
    name: str

    def solve(self, inst: Instance, *, budget: float, hint: Decision | None) -> Decision | None: ...
