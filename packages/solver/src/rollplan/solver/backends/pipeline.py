"""The solve pipelines both formulation backends (``milp``, ``cpsat``) run, over one model builder.

``FormulationBackend.solve``: on small instances (``formulation.is_small``) the large pipeline first, on a
share of the budget, as a better hint, then the exact model (``solve_exact``); on large ones
``solve_large``:

  hint (greedy or previous plan)
    -> aggregate MILP over slot groups x trajectory classes  (``model.aggregate``)
    -> disaggregate: role counts -> roles per slot; hint placement kept where its slot still decodes;
       the others longest-first on the slot that finishes earliest  (``search.disaggregate``)
    -> repair: local search  (``search.local.repair``)
    -> if the makespan is still > ``PACK_TRIGGER`` x the critical-path bound: next-fit-decreasing packing by
       length (continuing the greedy's packing of the same roles, recorded on the instance), then repair
    -> the best of {hint, hint repaired, aggregate, packed} by the exact objective
    -> polish: the same local search with wide swaps (any member of the least loaded slots and of those
       with the most unfilled head; each side priced in O(1)) on what is left of the budget, at most
       ``POLISH_MOVES`` moves; then home exchanges (``search.exchange``) and a second, shorter polish

Never worse than the hint: every candidate is priced exactly (``search.state.SlotState``) and the hint is
one (``better_of`` on the exact path). Timing: docs/formulation_large.md, "Time limit".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.models.types import Role, SolveStatus
from rollplan.solver.backends.base import Decision
from rollplan.solver.core.actions import release_idle
from rollplan.solver.core.bounds import critical_path_bound
from rollplan.solver.core.evaluate import evaluate
from rollplan.solver.core.instance import Instance
from rollplan.solver.core.tables import Tables
from rollplan.solver.model.aggregate import AggregateFormulation, Aggregation, aggregate, makespan_grid
from rollplan.solver.model.formulation import BuilderFactory, ExactFormulation, SolveLimits, is_small
from rollplan.solver.search.disaggregate import pack_decreasing, place_longest_first, roles_from_counts
from rollplan.solver.search.exchange import home_exchanges
from rollplan.solver.search.local import repair
from rollplan.solver.search.state import SlotState, state_of, state_of_partial

TEARDOWN_SECONDS = 0.01
"""Reserved from the budget for reading the solution back and building the Decision."""
AGG_SHARE = 0.4
"""Share of the remaining budget the aggregate MILP may use (the rest: disaggregation and repair)."""
MARGIN = 0.01
FIXED_SECONDS_PER_TRAJECTORY = 6e-6
FIXED_SECONDS_PER_SLOT = 5e-5
"""Measured CPU cost of the untimed preparation (numpy tables, hint pricing, one aggregate build)."""
PACK_TRIGGER = 1.02
"""Length packing runs when the best makespan so far exceeds the critical-path bound by this factor."""
PACK_SHARE = 0.75
"""Share of the budget left after the aggregate that the length packing (and its repair) may use: its
bisection needs ~14 rounds of O(|J|) to land within 1e-4 of its best target, and at 4,096 trajectories half
the budget left ~7 (deadlines family, 256 x 4,096 seed 2 at 0.5 s: 97.0 -> 92.1 with the whole bisection)."""
PACK_RESOLUTION = 0.25
"""The length packing's bisection stops once its window (hi - lo, the most a packing found in it could lower
the makespan) is below this share of ``PlannerConfig.relative_gap`` x hi (``pack_decreasing``'s
``min_gain``): 0.25% of the makespan at the default 1% tolerance. Each round is one O(|J|) pass; the last
rounds of a bisection that keeps failing close to hi (work-bound and heterogeneous at M, where the greedy's
packing already failed 0.2-0.7% below the best makespan) gain nothing and take the polish's time. A quarter
rather than the whole tolerance: on the deadlines family the packing wins by successive 0.5-1% steps, and a
window of 1% stopped it one step early (docs/formulation_large.md, "Time limit")."""
SMALL_PRE_SHARE = 0.2
"""Share of a small instance's budget the aggregate pipeline gets before the exact model (a better hint)."""
POLISH_MOVES = 256
"""Moves of the final wide-swap polish (its work cap in deterministic mode, where no clock stops it)."""
EXCHANGE_SHARE = 0.3
"""Share of the polish's time given to the home exchanges (``search.exchange.home_exchanges``, half of it)
and the second polish after them (the other half); 0 turns both off. Why after a first polish: the
exchanges change which members sit where on slots the polish has not yet balanced, and the polish then
has less to move and stalls higher; after it, the trades lower the slots' move seconds and the second
polish spends them on the makespan."""
AGG_GAP = 1e-5
"""Relative gap of the aggregate MILP: tight, since its switching terms are ~1e-3 of the objective."""


# ---------------------------------------------------------------------------------------------------------
# The exact model
# ---------------------------------------------------------------------------------------------------------


def decision_objective(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> float:
    """The objective ``make_plan`` will report for a decision (inf when it has hard problems)."""
    final = release_idle(inst, roles, placement)
    ev = evaluate(inst, final, placement)
    return math.inf if ev.problems else ev.objective


def solve_exact(
    inst: Instance, factory: BuilderFactory, *, budget: float, hint: Decision | None
) -> Decision | None:
    """Build the exact model with ``factory``, warm-start it from ``hint``, solve within ``budget`` seconds."""
    cfg = inst.config
    clock = cfg.clock
    t0 = clock()
    form = ExactFormulation(inst)
    builder = factory(inst)
    form.build(builder)
    if hint is not None:
        vals = form.hint_values(hint.roles, hint.placement)
        if vals is not None:
            builder.set_hint(vals)
    built = clock() - t0
    left = budget - built - TEARDOWN_SECONDS
    if left <= 0:
        return _hint_fallback(inst, hint, reason="no time left after building the model")
    res = builder.solve(
        SolveLimits.of(cfg, left, relative_gap=cfg.relative_gap)
    )
    info = {"build_seconds": built, **res.info}
    if res.status is None:
        return _hint_fallback(inst, hint, reason="the solver found no feasible solution in time")
    roles, placement = form.decision(res)
    if any(s < 0 for s in placement):
        return _hint_fallback(inst, hint, reason="the solver returned an incomplete placement")
    roles = release_idle(inst, roles, placement)
    bound = None
    # CP-SAT's bound is on the millisecond-rounded model: only the MILP's bounds the real makespan.
    if (
        builder.name == "milp"
        and res.status is SolveStatus.OPTIMAL
        and res.bound is not None
        and _bound_is_makespan(inst)
    ):
        bound = res.bound
    dec = Decision(tuple(roles), tuple(placement), res.status, bound=bound, info=info)
    return better_of(inst, dec, hint)


def _bound_is_makespan(inst: Instance) -> bool:
    """The objective bound bounds the makespan only when the objective is the makespan alone."""
    return inst.config.switch_weight == 0 and all(sl.deadline is None for sl in inst.slots)


def _hint_fallback(inst: Instance, hint: Decision | None, *, reason: str) -> Decision | None:
    if hint is None:
        return None
    return Decision(hint.roles, hint.placement, SolveStatus.FEASIBLE, bound=None, info={"used_hint": 1.0})


def better_of(inst: Instance, dec: Decision, hint: Decision | None) -> Decision:
    """``dec`` unless the hint prices strictly lower (then the hint, marked FEASIBLE)."""
    if hint is None:
        return dec
    mine = decision_objective(inst, dec.roles, dec.placement)
    theirs = decision_objective(inst, hint.roles, hint.placement)
    tol = 1e-9 * max(1.0, abs(theirs))
    if theirs < mine - tol:
        return Decision(
            hint.roles,
            hint.placement,
            SolveStatus.FEASIBLE,
            bound=dec.bound,
            info={**dec.info, "used_hint": 1.0},
        )
    return dec


# ---------------------------------------------------------------------------------------------------------
# Large instances
# ---------------------------------------------------------------------------------------------------------


def _head_excess(prep: Tables, hint: SlotState | None) -> dict[int, list[float]]:
    """Per slot type, max(maxD, occ) - occ of the hint's decoding slots with members (the aggregate's heads)."""
    out: dict[int, list[float]] = {}
    if hint is None:
        return out
    for s, r in enumerate(hint.roles):
        if r.decodes and hint.members[s]:
            out.setdefault(prep.ptype[s], []).append(max(hint.max_d[s], hint.occ[s]) - hint.occ[s])
    return out


def _from_counts(
    prep: Tables,
    agg: Aggregation,
    counts: Sequence[dict[Role, int]],
    hint: SlotState | None,
    *,
    until: float,
    clock: Callable[[], float],
) -> SlotState | None:
    """Disaggregate: roles from counts (preferring the hint's), hint placement kept where it still decodes."""
    n_s = len(prep.slots)
    hosted = [0] * n_s
    if hint is not None:
        for s in range(n_s):
            hosted[s] = len(hint.members[s])
    else:
        for h in prep.home:
            if h >= 0:
                hosted[h] += 1
    roles = roles_from_counts(
        prep, [g.members for g in agg.groups], counts, hint.roles if hint is not None else None, hosted
    )
    if not any(r.decodes for r in roles):
        return None
    pd = {r for r in roles if r in (Role.PREFILL, Role.DECODE)}
    if Role.DECODE in pd and Role.PREFILL not in pd and any(x > 0 for x in prep.P):
        roles = [Role.MIXED if r is Role.DECODE else r for r in roles]
    x = prep.x
    start = np.asarray(hint.where if hint is not None else prep.home, dtype=np.int64)
    decodes = np.asarray([r.decodes for r in roles])
    safe = np.where(start >= 0, start, 0)
    keep = (start >= 0) & decodes[safe] & prep.fits_a[x.type_of[safe], np.arange(start.size)]
    kept = np.nonzero(keep)[0]
    state = state_of_partial(prep, roles, kept, start[kept])
    todo = np.nonzero(~keep)[0].tolist()
    if not place_longest_first(state, todo, until=until, clock=clock):
        return None
    return state


def solve_large(
    inst: Instance, factory: BuilderFactory, *, budget: float, hint: Decision | None, backend: str
) -> Decision | None:
    """Aggregate, solve, disaggregate, repair; never worse than ``hint`` (see the module docstring)."""
    cfg = inst.config
    clock = cfg.clock
    t0 = clock()
    until = t0 + budget - MARGIN
    fixed = FIXED_SECONDS_PER_TRAJECTORY * len(inst.trajs) + FIXED_SECONDS_PER_SLOT * len(inst.slots)
    if hint is not None and budget < 2.0 * fixed:
        # Preparation alone would eat the budget: the hint is the answer.
        return Decision(
            hint.roles, hint.placement, SolveStatus.FEASIBLE, info={"used_hint": 1.0, "from_hint": 1.0}
        )
    x = inst.arrays
    prep = Tables(inst, x)
    hint_state: SlotState | None = None
    if hint is not None and len(hint.placement) == len(inst.trajs) and len(hint.roles) == len(inst.slots):
        roles = release_idle(inst, hint.roles, hint.placement)
        pl = np.asarray(hint.placement, dtype=np.int64)
        decodes = np.asarray([r.decodes for r in roles])
        if pl.size == 0 or (decodes[pl].all() and prep.fits_a[x.type_of[pl], np.arange(pl.size)].all()):
            hint_state = state_of(prep, roles, hint.placement)
    hint_price = hint_state.price() if hint_state is not None else None
    lo = critical_path_bound(inst, x)
    if hint_price is not None and math.isfinite(hint_price.makespan) and hint_price.overrun <= 0:
        hi = max(lo, hint_price.makespan)
    else:
        hi = max(lo, 1.0) * 2.0
    n_dec = sum(1 for r in hint_state.roles if r.decodes) if hint_state is not None else len(inst.slots)
    info: dict[str, float] = {"prep_seconds": clock() - t0}
    best: tuple[float, SlotState, str] | None = None
    if hint_state is not None and hint_price is not None:
        best = (hint_price.objective, hint_state, "hint")

    # 1. Aggregate model.
    agg = aggregate(prep, upper=hi, hint_decoding=n_dec, use_deadlines=True, head_excess=_head_excess(prep, hint_state))
    form = AggregateFormulation(inst, agg, makespan_grid(lo, hi))
    builder = factory(inst)
    form.build(builder)
    info["aggregate_build_seconds"] = clock() - t0
    left = until - clock()
    state: SlotState | None = None
    if left > 0:
        res = builder.solve(
            SolveLimits.of(cfg, AGG_SHARE * left, relative_gap=AGG_GAP)
        )
        info["aggregate_seconds"] = clock() - t0
        if res.status is not None:
            info["aggregate_makespan"] = float(res.value(form.C))
            state = _from_counts(prep, agg, form.counts(res.value), hint_state, until=until, clock=clock)
            info["disaggregate_seconds"] = clock() - t0
    # 2. Repair the disaggregated decision; polish the hint instead when that did not beat it.
    if state is not None:
        share = clock() + 0.6 * max(0.0, until - clock()) if hint_state is not None else until
        info["repair_moves"] = float(repair(state, until=share, clock=clock))
        info["repair_seconds"] = clock() - t0
        state.release()
        price = state.price()
        info["aggregate_objective"] = price.objective
        if best is None or price.objective < best[0] - 1e-9 * max(1.0, abs(best[0])):
            best = (price.objective, state, "aggregate")
    # 3. Load-bound instances (the hint well above the critical-path bound): pack by length.
    if best is not None and best[1].price().makespan > PACK_TRIGGER * lo and clock() < until:
        pack_until = clock() + PACK_SHARE * max(0.0, until - clock())
        packed = pack_decreasing(
            prep, best[1].roles, lo=lo, hi=best[1].price().makespan, until=pack_until, clock=clock,
            min_gain=PACK_RESOLUTION * cfg.relative_gap,
        )
        if packed is not None:
            info["pack_repair_moves"] = float(repair(packed, until=pack_until, clock=clock))
            packed.release()
            price = packed.price()
            info["pack_objective"] = price.objective
            if price.objective < best[0] - 1e-9 * max(1.0, abs(best[0])):
                best = (price.objective, packed, "packed")
        info["pack_seconds"] = clock() - t0
    if hint_state is not None and best is not None and best[2] == "hint" and clock() < until:
        polished = state_of(prep, hint_state.roles, hint_state.where)
        info["hint_repair_moves"] = float(repair(polished, until=until, clock=clock))
        polished.release()
        price = polished.price()
        if best is None or price.objective < best[0] - 1e-9 * max(1.0, abs(best[0])):
            best = (price.objective, polished, "hint_repaired")
    # 5. Polish the best with the wide swaps (``repair(wide=True)``) on what is left of the budget, with home
    #    exchanges (``search.exchange``) between a first and a second polish.
    if best is not None and clock() < until:
        polished = state_of(prep, best[1].roles, best[1].where)
        left = until - clock()
        first = clock() + (1.0 - EXCHANGE_SHARE) * left
        info["polish_moves"] = float(repair(polished, until=first, clock=clock, max_moves=POLISH_MOVES, wide=True))
        if EXCHANGE_SHARE > 0 and clock() < until:
            info["home_exchanges"] = float(
                home_exchanges(polished, until=clock() + 0.5 * (until - clock()), clock=clock)
            )
            if clock() < until:
                info["polish_moves"] += float(
                    repair(polished, until=until, clock=clock, max_moves=POLISH_MOVES // 2, wide=True)
                )
        polished.release()
        price = polished.price()
        if price.objective < best[0] - 1e-9 * max(1.0, abs(best[0])):
            best = (price.objective, polished, f"{best[2]}_polished")
    if best is None:
        return None
    info["seconds"] = clock() - t0
    info["from_hint"] = 1.0 if best[2].startswith("hint") else 0.0
    st = best[1]
    return Decision(tuple(st.roles), tuple(st.where), SolveStatus.FEASIBLE, bound=None, info=info)




@dataclass(frozen=True, slots=True)
class FormulationBackend:
    """``Backend`` protocol over one model builder (PuLP or CP-SAT): the exact per-trajectory model when the
    instance is small (``formulation.is_small``), aggregate + disaggregate + repair when it is large."""

    name: str
    make_builder: BuilderFactory

    def solve(self, inst: Instance, *, budget: float, hint: Decision | None = None) -> Decision | None:
        if is_small(inst, budget):
            # The aggregate pipeline first, on a share of the budget, as a better hint: on small instances the
            # exact model's search can end above what aggregate + repair finds in milliseconds (measured: 6
            # H100/H800/A100 x 60 trajectories, 77.52 after 20 s vs 77.38 at 0.2 s, when is_small flipped with
            # the budget), and the exact solve never returns worse than its hint: more time, never worse.
            clock = inst.config.clock
            t0 = clock()
            pre = solve_large(
                inst, self.make_builder, budget=SMALL_PRE_SHARE * budget, hint=hint, backend=self.name
            )
            if pre is not None:
                hint = Decision(pre.roles, pre.placement, SolveStatus.HEURISTIC)
            return solve_exact(inst, self.make_builder, budget=budget - (clock() - t0), hint=hint)
        return solve_large(inst, self.make_builder, budget=budget, hint=hint, backend=self.name)
