"""rollplan.solver: plan GPU roles, the P:D ratio and trajectory placement for one cluster snapshot.

Pure: no I/O beyond explicit load/save functions, no clock reads (``PlannerConfig.clock`` is injected),
never imports ray, vllm or torch.

    from rollplan.solver import plan, Planner, PlannerConfig
    p = plan(snapshot, config=PlannerConfig(backend="greedy", time_limit=0.5))
    p.roles, p.placement, p.actions, p.makespan, p.lower_bound, p.gap, p.status

See docs/formulation.md for the model and ``rollplan.solver.core.instance`` for its notations. Layers (imports
run downward only; tests/solver/test_imports.py checks it): ``core`` (instance, pricing, evaluate, bounds,
actions, validate, tables) < ``search`` (state, placement, local search, disaggregation) and ``model``
(the MILP/CP-SAT formulation) < ``backends`` < ``api`` and the CLI modules.
"""

from rollplan.solver.api import Planner, load_backend, map_previous, plan
from rollplan.solver.config import BACKENDS, PlannerConfig
from rollplan.solver.core.bounds import compute_bounds, critical_path_bound, work_bound
from rollplan.solver.core.evaluate import Evaluation, evaluate, evaluate_ids
from rollplan.solver.core.instance import Instance, build_instance
from rollplan.solver.core.validate import validate_plan
from rollplan.solver.examples import example_snapshot
from rollplan.solver.families import FAMILIES, family_snapshot
from rollplan.solver.inputs import check_inputs

__all__ = [
    "BACKENDS",
    "FAMILIES",
    "Evaluation",
    "Instance",
    "Planner",
    "PlannerConfig",
    "build_instance",
    "check_inputs",
    "compute_bounds",
    "critical_path_bound",
    "evaluate",
    "evaluate_ids",
    "example_snapshot",
    "family_snapshot",
    "load_backend",
    "map_previous",
    "plan",
    "validate_plan",
    "work_bound",
]
