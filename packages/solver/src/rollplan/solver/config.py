"""Planner configuration (frozen). Passed to ``plan()`` / ``Planner``; never mutated."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rollplan.models.errors import UserInputError
from rollplan.models.perf import PerfProvider

BACKENDS = ("milp", "cpsat", "greedy", "exhaustive")


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
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        if self.co_running is not None and not 0.0 <= self.co_running <= 1.0:
            raise UserInputError(f"PlannerConfig.co_running={self.co_running!r} is outside [0, 1]",
                                 fix="pass a share in [0, 1], or None to estimate it per snapshot")
