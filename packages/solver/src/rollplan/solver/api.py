"""``plan()`` and ``Planner``: the one entry point the simulator and the executor call.

Flow of one call (all timing through ``config.clock``; the planner reads no clock of its own; with
``config.deterministic`` the searches run on ``config.stopped_clock`` and the solvers on work limits, and
``config.clock`` only measures ``Plan.solve_seconds``):

0. ``inputs.check_inputs``: duplicate ids, unknown slots, contexts beyond the model's window, return
   deadlines before the snapshot time raise ``SchemaError`` (a ``UserInputError``) naming the field;
1. ``build_instance`` (raises ``InfeasiblePlanError`` when some trajectory fits no slot);
2. the greedy decision, always, with the greedy backend's own budget (the fallback, the incumbent and
   hint of the exact backends: they never return worse than greedy alone at the same time limit);
3. the previous plan mapped onto this snapshot by ids (repaired where slots vanished), when given;
4. the configured backend (``milp`` / ``cpsat`` / ``exhaustive``, looked up lazily as
   ``rollplan.solver.backends.<name>.BACKEND``) with what is left of ``config.time_limit`` after keeping a
   reserve for bounds, packing and validation; not installed, failing or out of time -> FALLBACK;
5. the best candidate by objective (ties: the one with fewer actions). When re-planning (``previous``
   given), a candidate that needs no action at all is kept unless another beats its objective by more than
   ``REPLAN_HYSTERESIS`` (relative): re-planning an unchanged state must not churn; then (``config.start_idle``)
   the OFF slots without a deadline that the choice leaves empty are started MIXED (``actions.start_idle``);
6. lower bounds (work/capacity, critical path; the LP relaxation for exact backends when time is left;
   a backend's own proven bound), ``make_plan``, ``validate_plan`` (a plan failing it is replaced by the greedy
   one, status FALLBACK; if that fails too the error propagates: a planner bug).

Status: OPTIMAL / FEASIBLE from an exact backend (FEASIBLE also when its answer lost to greedy or the previous
plan), FALLBACK when it found nothing, HEURISTIC for the greedy backend, DEADLINE_RELAXED (set by
``make_plan``) when a slot must work past its return deadline; ``Plan.violations`` then says which.
With an exact backend configured, when the greedy objective is already within ``config.relative_gap`` of a
lower bound the backend is not run and the plan is OPTIMAL (proven by the bound; common when the makespan is
one long trajectory's critical path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rollplan.models.errors import PlanValidationError, SolverError, UnknownNameError
from rollplan.models.types import Action, AvailabilityEvent, ClusterSnapshot, Plan, Role, SolveStatus
from rollplan.solver.backends.base import Backend, Decision
from rollplan.solver.config import BACKENDS, PlannerConfig
from rollplan.solver.core.actions import build_actions, make_plan, release_idle, start_idle
from rollplan.solver.core.bounds import (
    BOUND_CORUNNING,
    BOUND_CRITICAL_PATH,
    BOUND_LP,
    BOUND_PATH_HEAD,
    BOUND_WORK,
    BOUND_WORK_HEAD,
    LpBound,
    compute_bounds,
)
from rollplan.solver.core.evaluate import Evaluation, evaluate
from rollplan.solver.core.instance import Instance, build_instance, usable_slots
from rollplan.solver.core.validate import validate_plan
from rollplan.solver.inputs import check_inputs
from rollplan.solver.model.formulation import is_small
from rollplan.solver.search.placement import solve_greedy

log = logging.getLogger(__name__)

REPLAN_HYSTERESIS = 0.01
"""Relative objective gain a re-plan must bring before it replaces a state that needs no action."""
RESERVE_FIXED = 0.01
RESERVE_PER_ITEM = 1.6e-5
"""Seconds kept back from the time limit for what follows the backend (pricing the candidates with their
actions, bounds, make_plan, validation): fixed + per (slot + trajectory). On an idle 2-core VM that work
takes about half of it; the rest is for a loaded machine (with 1e-5 per item, ``rollplan bench planner``'s
heterogeneous L cell went past its 1 s limit at load 0.6)."""
LP_MIN_SECONDS = 0.05
AGGREGATING = frozenset({"milp", "cpsat"})
"""The backends that run the aggregate pipeline on large instances (``backends.pipeline.solve_large``)."""
HINT_CONFIGS = 2
"""Role configurations the greedy places as the hint of the aggregate pipeline: the best-estimated one and
"keep" (one configuration when they are the same), what ``search.placement`` places above ``LARGE``."""
OWN_BOUNDS = frozenset({BOUND_WORK, BOUND_CRITICAL_PATH, BOUND_LP, BOUND_WORK_HEAD, BOUND_PATH_HEAD, BOUND_CORUNNING})
"""The bounds ``compute_bounds`` computes itself (the others in a plan's bounds are a backend's own)."""


def _preload(name: str) -> Backend | None:
    """The exact backend ``name`` with every module its solve may import (the LP bound's PuLP/HiGHS), so the
    first ``plan()`` of a process does not spend its time limit importing (OR-Tools pulls in pandas).
    None for ``greedy`` and when the backend is not installed."""
    if name == "greedy":
        return None
    try:
        backend = load_backend(name)
    except ImportError:
        return None
    with contextlib.suppress(ImportError):  # without PuLP the LP bound is skipped where it is asked for
        importlib.import_module("rollplan.solver.backends.milp")
    return backend


def lp_relaxation() -> LpBound | None:
    """The LP relaxation bound (``rollplan.solver.backends.milp.lp_bound``), or None when PuLP/HiGHS is not
    installed. Handed to ``compute_bounds``: the core does not import the backends."""
    try:
        from rollplan.solver.backends.milp import lp_bound
    except ImportError:
        return None
    return lp_bound


def load_backend(name: str) -> Backend:
    """The backend object called ``name`` (``rollplan.solver.backends.<name>.BACKEND``).

    Raises ``UnknownNameError`` for names outside ``BACKENDS``, ``ImportError`` when the module is absent.
    """
    if name not in BACKENDS:
        raise UnknownNameError("planner backend", name, BACKENDS)
    module = importlib.import_module(f"rollplan.solver.backends.{name}")
    return module.BACKEND


@dataclass(slots=True)
class _Candidate:
    label: str
    roles: tuple[Role, ...]
    placement: tuple[int, ...]
    status: SolveStatus
    objective: float = math.nan
    n_actions: int = -1
    evaluation: Evaluation | None = None
    actions: tuple[Action, ...] | None = None

    def price(self, inst: Instance) -> bool:
        """Evaluate (after ``release_idle``); False when the decision has problems (then it is dropped).

        Keeps the evaluation and the actions of the released roles for ``make_plan`` (not recomputed).
        """
        final = release_idle(inst, self.roles, self.placement)
        ev = evaluate(inst, final, self.placement)
        if ev.problems:
            log.warning("planner: %s decision rejected: %s", self.label, "; ".join(ev.problems[:3]))
            return False
        self.roles = tuple(final)
        self.objective = ev.objective
        self.evaluation = ev
        self.actions = build_actions(inst, final, self.placement)
        self.n_actions = len(self.actions)
        return True


def map_previous(inst: Instance, previous: Plan) -> Decision | None:
    """The previous plan's decision on this instance, by ids; repaired where it no longer fits.

    Slots unknown to ``previous`` are OFF; slots past (or too close to) their deadline are OFF; a half P/D
    pair becomes MIXED (DECODE slots without PREFILL stay when no prefill work is placed on them). A trajectory keeps its previous slot when that slot still decodes and holds it,
    else goes home, else to the decoding slot hosting the fewest. None when nothing decodes.
    """
    usable = set(usable_slots(inst))
    roles = [previous.roles.get(sl.id, Role.OFF) if s in usable else Role.OFF for s, sl in enumerate(inst.slots)]
    present = set(roles)
    if Role.PREFILL in present and Role.DECODE not in present:
        roles = [Role.MIXED if r is Role.PREFILL else r for r in roles]
    hosts = [s for s, r in enumerate(roles) if r.decodes]
    if inst.trajs and not hosts:
        return None
    pos = {sl.id: s for s, sl in enumerate(inst.slots)}
    count = [0] * len(inst.slots)
    placement: list[int] = []
    # Instance.fits(j, s) and TrajCoeffs.home, read from the arrays (the same numbers) in one pass.
    x = inst.arrays
    capacity = [sl.kv_capacity for sl in inst.slots]
    decodes = [r.decodes for r in roles]
    prev = previous.placement
    for tid, home, peak in zip(x.ids, x.home.tolist(), x.peak.tolist(), strict=True):
        s = pos.get(prev.get(tid, ""), -1)
        if s < 0 or not decodes[s] or not (peak <= capacity[s]):
            s = home
        if s < 0 or not decodes[s] or not (peak <= capacity[s]):
            fitting = [h for h in hosts if peak <= capacity[h]]
            if not fitting:
                return None
            s = min(fitting, key=lambda h: (count[h], h))
        count[s] += 1
        placement.append(s)
    if Role.DECODE in present and Role.PREFILL not in present:
        # DECODE slots need a PREFILL slot only for prefill work placed on them; switching them to MIXED
        # otherwise would only pay a role switch.
        p_work = x.P.tolist()
        if any(p_work[j] > 0 and roles[s] is Role.DECODE for j, s in enumerate(placement)):
            roles = [Role.MIXED if r is Role.DECODE else r for r in roles]
    return Decision(roles=tuple(roles), placement=tuple(placement), status=SolveStatus.HEURISTIC)


def _choose(cands: Sequence[_Candidate], *, replanning: bool, prefer: str) -> _Candidate:
    """Least objective; ties: fewer actions, then the ``prefer`` label (the exact backend: its status is proof)."""
    best = min(cands, key=lambda c: c.objective)
    tol = 1e-9 * max(1.0, abs(best.objective))
    tied = [c for c in cands if c.objective <= best.objective + tol]
    choice = min(tied, key=lambda c: (c.n_actions, c.label != prefer))
    if replanning:
        idle = [c for c in cands if c.n_actions == 0]
        if idle and choice.n_actions > 0:
            calm = min(idle, key=lambda c: c.objective)
            if calm.objective <= best.objective * (1.0 + REPLAN_HYSTERESIS) + tol:
                return calm
    return choice


def plan(snapshot: ClusterSnapshot, *, previous: Plan | None = None, config: PlannerConfig | None = None) -> Plan:
    """Plan roles, P:D ratio and placement for ``snapshot`` (see the module docstring for the flow).

    Raises ``SchemaError`` for bad input (``inputs.check_inputs``), ``InfeasiblePlanError`` when some
    trajectory fits no slot, ``UnknownNameError`` for an unknown backend or model name; otherwise always returns a validated Plan within ``config.time_limit`` (+ the validation
    reserve's estimate error).
    """
    config = config or PlannerConfig()
    if config.backend not in BACKENDS:
        raise UnknownNameError("planner backend", config.backend, BACKENDS)
    backend_obj = _preload(config.backend)  # before the clock starts: a first import is not planning time
    wall = config.clock  # only for Plan.solve_seconds in deterministic mode
    t_wall = wall()
    check_inputs(snapshot)  # SchemaError (field path + fix) before any solve
    # Deterministic: the instance carries a stopped clock (build_instance), so every search below stops on
    # work caps only, and the solvers get deterministic limits (SolveLimits.deterministic).
    inst = build_instance(snapshot, config)
    clock = inst.config.clock
    t0 = clock() if config.deterministic else t_wall
    deadline = t0 + config.time_limit
    reserve = RESERVE_FIXED + RESERVE_PER_ITEM * (len(inst.slots) + len(inst.trajs))
    work_until = deadline - reserve
    exact = config.backend != "greedy"

    # The greedy search gets the same budget as the greedy backend would (it stops at its local optimum,
    # usually well before): the exact backends start from that incumbent and keep it unless they beat it,
    # so no backend returns worse than greedy alone at the same time limit. (It used to get 15% of the
    # limit, and an exact backend at 0.1-0.2 s then lost to greedy.)
    arrays = inst.arrays if inst.trajs else None
    # Before the aggregate pipeline (milp, cpsat on large instances) the greedy places the configuration its
    # fluid estimate ranks first and "keep" only: the pipeline's aggregate model chooses the role counts per
    # slot group itself (``model.aggregate``), so a third configuration placed here mostly spends the time
    # its polish needs (work-bound 256 x 4,096: the P:D split the greedy placed second took 0.06-0.14 s and
    # ended 5-15% above "keep").
    hinted = config.backend in AGGREGATING and not is_small(inst, work_until - clock())
    g_roles, g_place, _ = solve_greedy(
        inst, until=work_until, arrays=arrays, n_configs=HINT_CONFIGS if hinted else None
    )
    greedy = _Candidate("greedy", tuple(g_roles), tuple(g_place), SolveStatus.HEURISTIC)
    cands: list[_Candidate] = [greedy]

    hint = Decision(roles=greedy.roles, placement=greedy.placement, status=SolveStatus.HEURISTIC)
    if previous is not None:
        mapped = map_previous(inst, previous)
        if mapped is not None:
            cands.append(_Candidate("previous", mapped.roles, mapped.placement, SolveStatus.HEURISTIC))

    backend_bound: float | None = None
    proven = False
    if exact and inst.trajs and greedy.price(inst):
        # Greedy already within the configured relative gap of a lower bound: nothing to gain from the
        # exact backend but time. The on-time bounds hold for on-time plans only: a greedy plan past a
        # deadline is proven by nothing (where no plan can be on time they are meaningless, up to 1e9 s).
        ev = greedy.evaluation
        if ev is not None and ev.total_overrun <= 0:
            lower = max(compute_bounds(inst, arrays=arrays, on_time=True).values(), default=0.0)
            proven = lower > 0 and greedy.objective <= lower * (1 + config.relative_gap)
        if proven:
            log.info("planner: greedy is within %.2g of the lower bound; %s not run", config.relative_gap, config.backend)
    if exact and not proven:
        budget = work_until - clock()
        decision: Decision | None = None
        if budget <= 0:
            log.info("planner: no time left for backend %s", config.backend)
        else:
            backend = backend_obj
            if backend is None:
                log.warning("planner: backend %s is not installed; using greedy", config.backend)
            else:
                if len(cands) > 1:  # hint with the better of greedy and the previous plan
                    for c in cands:
                        if c.n_actions < 0:
                            c.price(inst)
                    prev = cands[1]
                    if not math.isnan(prev.objective) and prev.objective <= greedy.objective:
                        hint = Decision(roles=prev.roles, placement=prev.placement, status=SolveStatus.HEURISTIC)
                try:
                    decision = backend.solve(inst, budget=budget, hint=hint)
                except SolverError as err:  # a known limit (e.g. exhaustive's size): one line, no traceback
                    log.warning("planner: backend %s cannot solve this instance (%s); using greedy", config.backend, err)
                    decision = None
                except Exception:  # the planner must answer; the greedy plan is always there
                    log.warning("planner: backend %s failed; using greedy", config.backend, exc_info=True)
        if decision is not None:
            backend_bound = decision.bound
            cands.append(_Candidate(config.backend, tuple(decision.roles), tuple(decision.placement), decision.status))
        found = decision is not None
        for c in cands:
            if c.label != config.backend:
                # The exact backend ran: what it did not beat is FEASIBLE; if it found nothing, FALLBACK.
                c.status = SolveStatus.FEASIBLE if found else SolveStatus.FALLBACK
    if len(cands) > 1:
        cands = [c for c in cands if (c.n_actions >= 0 or c.price(inst))]
        if not any(c.label == "greedy" for c in cands):
            raise PlanValidationError(["the greedy decision has problems: planner bug"])
    if proven:
        for c in cands:
            c.status = SolveStatus.OPTIMAL  # every candidate is judged against the same proof below
    choice = _choose(cands, replanning=previous is not None, prefer=config.backend) if len(cands) > 1 else cands[0]
    if proven and choice.objective > greedy.objective:
        choice.status = SolveStatus.FEASIBLE  # kept by the re-planning hysteresis, not proven optimal
    if config.start_idle:
        choice = _idle_started(inst, choice)

    lp_budget = work_until - clock() if exact and not proven else 0.0
    extra = {f"{config.backend}_bound": backend_bound} if backend_bound is not None else {}
    lp_budget = lp_budget if lp_budget >= LP_MIN_SECONDS else 0.0
    lp = lp_relaxation() if lp_budget > 0 else None
    bounds = compute_bounds(inst, lp=lp, lp_budget=lp_budget, extra=extra, arrays=arrays, on_time=True)
    result = _pack(inst, choice, bounds, backend=config.backend, seconds=wall() - t_wall)
    try:
        validate_plan(snapshot, result, config, instance=inst)
    except PlanValidationError as err:
        if choice.label == "greedy":
            raise
        log.error("planner: %s plan failed validation (%s); returning the greedy plan", choice.label, err)
        greedy.status = SolveStatus.FALLBACK
        result = _pack(inst, greedy, bounds, backend=config.backend, seconds=wall() - t_wall)
        validate_plan(snapshot, result, config, instance=inst)
    return result


def _idle_started(inst: Instance, choice: _Candidate) -> _Candidate:
    """``choice`` with ``actions.start_idle`` applied (the same placement and makespan; the starts priced)."""
    if choice.evaluation is None:
        choice.price(inst)
    ev = choice.evaluation
    if ev is None:  # the decision has problems: make_plan / validation report them
        return choice
    roles = start_idle(inst, choice.roles, ev.makespan)
    if tuple(roles) == choice.roles:
        return choice
    started = _Candidate(choice.label, tuple(roles), choice.placement, choice.status)
    return started if started.price(inst) else choice


def _pack(inst: Instance, choice: _Candidate, bounds: dict[str, float], *, backend: str, seconds: float) -> Plan:
    """make_plan with the bounds that hold for it: the deadline-aware ones (``bounds``) when the plan meets
    every deadline, else the deadline-free ones; a bound above the makespan is dropped, loudly."""
    result = make_plan(
        inst,
        choice.roles,
        choice.placement,
        status=choice.status,
        backend=backend,
        bounds=bounds,
        solve_seconds=seconds,
        evaluation=choice.evaluation,  # priced with these (released) roles by _Candidate.price, or None
        actions=choice.actions,
    )
    if result.violations:  # a plan past a deadline is only bounded by the deadline-free bounds
        free = compute_bounds(inst, on_time=False)
        # Only a backend's own proven bound carries over; every bound compute_bounds makes was on time
        # (co_running and the heads too, even where the deadline-free call returns none of them).
        kept = {k: v for k, v in bounds.items() if k not in free and k not in OWN_BOUNDS}
        bounds = {**free, **kept}
        result = dataclasses.replace(result, bounds=bounds, lower_bound=max(bounds.values(), default=0.0))
    # A bound above the plan's makespan is wrong (a backend's bound on another model, say).
    limit = result.makespan * (1 + 1e-7) + 1e-9
    bad = {k: v for k, v in bounds.items() if v > limit}
    if bad:
        log.warning("planner: dropping bounds above the makespan %.6f: %s", result.makespan, bad)
        kept = {k: v for k, v in bounds.items() if k not in bad}
        result = dataclasses.replace(result, bounds=kept, lower_bound=max(kept.values(), default=0.0))
    return result


class Planner:
    """Keeps a config and the previous plan; ``replan`` plans the next snapshot with it as warm start.

    Not thread-safe (one planner per controller); holds no clock and does no I/O.
    """

    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.config = config or PlannerConfig()
        self.previous: Plan | None = None
        self.history: list[tuple[AvailabilityEvent | None, Plan]] = []

    def replan(self, snapshot: ClusterSnapshot, event: AvailabilityEvent | None = None) -> Plan:
        """Plan ``snapshot`` (the state after ``event``, if any) using the last plan as hint."""
        result = plan(snapshot, previous=self.previous, config=self.config)
        self.previous = result
        self.history.append((event, result))
        if len(self.history) > 64:  # bounded: a long-running controller re-plans thousands of times
            del self.history[:-64]
        return result

    def reset(self) -> None:
        """Forget the previous plan (e.g. at the start of a new rollout batch)."""
        self.previous = None
        self.history.clear()
