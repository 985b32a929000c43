"""Planner configuration (frozen). Passed to ``plan()`` / ``Planner``; never mutated."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollplan.models.errors import UserInputError
from rollplan.models.perf import PerfProvider

BACKENDS = ("milp", "cpsat", "greedy", "exhaustive")
DETERMINISTIC_WALL_FACTOR = 20.0
DETERMINISTIC_WALL_EXTRA = 2.0
"""In deterministic mode, the safety wall-clock cap of one solver call: FACTOR x its work budget + EXTRA
seconds (HiGHS' root work, which no option budgets, can take ~0.5 s on a loaded 2-core machine)."""


def stopped_clock() -> float:
    """The clock of a deterministic solve's searches: time never passes, so only work caps stop them."""
    return 0.0


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """How to plan.

    ``backend``: milp (PuLP -> HiGHS or CBC, see ``milp_solver``) | cpsat (OR-Tools) | greedy | exhaustive
    (tiny instances, tests). ``time_limit``: seconds for the whole ``plan()`` call, always honoured.
    ``switch_weight`` (lambda): objective weight of one switching GPU-second against one second of makespan.
    ``perf``: maps (gpu kind, tp) to a PerfModel; None = roofline presets for the snapshot's model
    (calibrated fits when ``calibrated``). ``clock``: injected monotonic clock used only to honour the time
    limit (the planner reads no clock of its own; tests inject a fake one). ``co_running`` (phi, in [0, 1]): the
    share of a slot's other decode tokens that lengthen its critical trajectory's path (see ``instance``
    Notations); None = estimated per instance (``co_running_share``), 0 = each trajectory's path at batch 1.

    ``deterministic``: the same snapshot and config give the same plan whatever the machine's load.
    ``time_limit`` is then a work budget, not a wall-clock limit: the planner's own searches run on a
    stopped clock (each to its local optimum or its move/round cap), CP-SAT gets ``max_deterministic_time``
    = its share of the budget with ``threads`` workers and ``seed`` (interleaved search when threads > 1),
    HiGHS a node and simplex-iteration budget proportional to it with ``threads`` and ``seed``, CBC a node
    budget. A wall-clock cap (``DETERMINISTIC_WALL_FACTOR`` x the share + ``DETERMINISTIC_WALL_EXTRA`` s)
    stays on each solver call as a safety net only (reaching it would break determinism; it is logged).
    The wall time is not bounded by ``time_limit`` then: small budgets overrun by the solvers' fixed root
    work (HiGHS presolve / cuts / sub-MIPs, up to ~0.7 s measured at a 0.05 s budget on 2 loaded cores).

    ``path_z``: each trajectory's critical path is priced at its predicted decode tokens and tool seconds
    plus ``path_z`` spreads (the snapshot's ``Estimate.spread``), its work at the means: a batch ends when its
    longest trajectory does, and of uncertain trajectories the long ones decide that. 0 (the default): the
    means alone, which is also what the simulator's rollplan policy (``rollplan.sim.policies.PATH_Z``) and
    the executor plan with; 1.77 (``DISPATCH_Z``) was measured and not adopted (docs/simulator.md, "The replay
    bench's record", "Critical paths at a quantile").

    ``start_idle``: the plan also starts, as MIXED, the OFF slots without a return deadline that it leaves
    empty and that could serve before its makespan (``core.actions.start_idle``): available GPUs serve what
    the dispatcher cannot place on the planned ones. False: the plan uses only the GPUs its placement needs.
    """

    backend: str = "milp"
    milp_solver: str = "highs"
    time_limit: float = 1.0
    seed: int = 0
    threads: int = 1
    switch_weight: float = 0.01
    relative_gap: float = 0.01
    mem_util: float = 0.9
    calibrated: bool = False
    perf: PerfProvider | None = None
    exact_max_trajectories: int = 64
    role_switch_seconds: float = 0.05
    deadline_penalty: float = 1e4
    co_running: float | None = None
    deterministic: bool = False
    start_idle: bool = True
    path_z: float = 0.0
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        if not (self.path_z >= 0.0 and math.isfinite(self.path_z)):
            raise UserInputError(f"PlannerConfig.path_z={self.path_z!r} is not a finite number >= 0",
                                 fix="pass the spreads to add to each critical path, e.g. 0 (the means) or 1.77")
        if self.co_running is not None and not 0.0 <= self.co_running <= 1.0:
            raise UserInputError(f"PlannerConfig.co_running={self.co_running!r} is outside [0, 1]",
                                 fix="pass a share in [0, 1], or None to estimate it per snapshot")
