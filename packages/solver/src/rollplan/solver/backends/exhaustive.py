"""The ``exhaustive`` backend: brute force over every role assignment and placement (tiny instances, tests).

4^|S| role assignments x (decoding slots)^|J| placements, each priced by ``evaluate`` after ``release_idle``
(exactly what ``make_plan`` will price), so its optimum is the formulation's optimum: the oracle the tests
compare the other backends and the bounds against. Refuses instances beyond ``MAX_SLOTS`` / ``MAX_TRAJECTORIES``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from rollplan.models.errors import SolverError
from rollplan.models.types import Role, SolveStatus
from rollplan.solver.backends.base import Decision
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.core.instance import ROLES, Instance

NAME = "exhaustive"
MAX_SLOTS = 4
MAX_TRAJECTORIES = 6
MAX_DECISIONS = 2_000_000


@dataclass(frozen=True, slots=True)
class Optimum:
    """The exhaustive answer: the best decision by objective, and the least makespan of any feasible decision."""

    roles: tuple[Role, ...]
    placement: tuple[int, ...]
    objective: float
    makespan: float
    min_makespan: float
    decisions: int
    complete: bool = True
    min_makespan_on_time: float = math.inf


def optimum(inst: Instance, *, until: float | None = None) -> Optimum | None:
    """Enumerate every decision without problems; None if there is none (or time ran out before any).

    ``min_makespan`` (over every feasible decision) and ``min_makespan_on_time`` (over those that finish every
    slot by its deadline; inf when none does) are valid lower bounds only when ``complete``.
    """
    n_s, n_j = len(inst.slots), len(inst.trajs)
    if n_s > MAX_SLOTS or n_j > MAX_TRAJECTORIES:
        raise SolverError(
            f"exhaustive search handles at most {MAX_SLOTS} slots and {MAX_TRAJECTORIES} trajectories "
            f"(got {n_s} and {n_j})",
            fix="use the milp, cpsat or greedy backend",
        )
    clock = inst.config.clock
    best: tuple[float, int, tuple[Role, ...], tuple[int, ...], float] | None = None
    min_makespan = math.inf
    min_on_time = math.inf
    count = 0
    seen: set[tuple[tuple[Role, ...], tuple[int, ...]]] = set()
    timed_out = False
    for roles in itertools.product(ROLES, repeat=n_s):
        if timed_out:
            break
        hosts = [s for s in range(n_s) if roles[s].decodes]
        if n_j and not hosts:
            continue
        options = [[s for s in hosts if inst.fits(j, s)] for j in range(n_j)]
        if any(not o for o in options):
            continue
        for placement in itertools.product(*options):
            count += 1
            if count > MAX_DECISIONS:
                raise SolverError("exhaustive search exceeded its decision budget", fix="use a smaller instance")
            if until is not None and count % 256 == 0 and clock() >= until and best is not None:
                timed_out = True
                break
            final = tuple(release_idle(inst, roles, placement))
            key = (final, placement)
            if key in seen:
                continue
            seen.add(key)
            ev = evaluate(inst, final, placement)
            if ev.problems:
                continue
            min_makespan = min(min_makespan, ev.makespan)
            if ev.total_overrun <= 1e-9:
                min_on_time = min(min_on_time, ev.makespan)
            n_changes = sum(1 for s, sl in enumerate(inst.slots) if final[s] is not sl.current_role) + sum(
                1 for j, t in enumerate(inst.trajs) if t.home is not None and t.home != placement[j]
            )
            cand = (ev.objective, n_changes, final, tuple(placement), ev.makespan)
            tol = 1e-9 * max(1.0, abs(cand[0]))
            if best is None or cand[0] < best[0] - tol or (cand[0] <= best[0] + tol and cand[1] < best[1]):
                best = cand
    if best is None:
        return None
    return Optimum(
        roles=best[2],
        placement=best[3],
        objective=best[0],
        makespan=best[4],
        min_makespan=min_makespan,
        decisions=count,
        complete=not timed_out,
        min_makespan_on_time=min_on_time,
    )


class ExhaustiveBackend:
    """``Backend`` protocol implementation (status OPTIMAL when the enumeration completed)."""

    name = NAME

    def solve(self, inst: Instance, *, budget: float, hint: Decision | None = None) -> Decision | None:
        clock = inst.config.clock
        until = clock() + max(0.0, budget)
        opt = optimum(inst, until=until)
        if opt is None:
            return None
        done = opt.complete
        return Decision(
            roles=opt.roles,
            placement=opt.placement,
            status=SolveStatus.OPTIMAL if done else SolveStatus.FEASIBLE,
            bound=opt.min_makespan if done else None,
            info={"decisions": float(opt.decisions)},
        )


BACKEND = ExhaustiveBackend()
