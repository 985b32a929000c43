"""``validate_plan``: re-check a Plan against its snapshot, independently of the backend that made it.

Checks (every violation is collected, then one ``PlanValidationError`` lists them all):
- ``roles`` names exactly the snapshot's slots; ``placement`` exactly its unfinished trajectories, each on an
  existing slot whose role decodes (MIXED/DECODE) and whose KV capacity holds the trajectory's peak KV;
  prefill work on DECODE slots has a PREFILL slot to serve it;
- deadlines: no slot works past its return deadline, unless the status is DEADLINE_RELAXED (or FALLBACK) and
  ``violations`` names every such slot;
- actions: recomputed here from the snapshot's current state and the plan's roles/placement (own rules, not
  ``build_actions``), compared as multisets of (kind, slot, trajectory, target, role) with durations; and
  ordered by ``ACTION_ORDER``;
- numbers: the instance is rebuilt from the snapshot and the decision re-priced: makespan, switching cost,
  objective, every term and every slot finish time must match; ``objective`` == sum of term contributions;
- bounds: ``lower_bound`` == max(``bounds``) and <= makespan (relative tolerance 1e-6).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from rollplan.models.errors import PlanValidationError
from rollplan.models.types import (
    ACTION_ORDER,
    ActionKind,
    ClusterSnapshot,
    EngineState,
    Plan,
    Role,
    SolveStatus,
    Trajectory,
)
from rollplan.solver.config import PlannerConfig
from rollplan.solver.core.evaluate import evaluate, evaluate_ids
from rollplan.solver.core.instance import Instance, build_instance

REL_TOL = 1e-6
ABS_TOL = 1e-6


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= ABS_TOL + REL_TOL * max(abs(a), abs(b))


def expected_actions(
    snapshot: ClusterSnapshot,
    plan_roles: Mapping[str, Role],
    placement: Mapping[str, str],
    unfinished: Sequence[Trajectory] | None = None,
) -> Counter:
    """The multiset of (kind, slot, trajectory, target, role) the diff from the snapshot's state implies.

    ``unfinished``: ``snapshot.unfinished`` when the caller already has it (not recomputed).
    """
    want: Counter = Counter()
    ids = {s.id for s in snapshot.slots}
    for sl in snapshot.slots:
        new = plan_roles.get(sl.id, Role.OFF)
        stale = sl.weights_version < snapshot.weights_version
        if new is not Role.OFF:
            if sl.engine is EngineState.NONE:
                want[(ActionKind.START_ENGINE, sl.id, None, None, None)] += 1
            else:
                if sl.engine is EngineState.SLEEPING:
                    want[(ActionKind.WAKE_ENGINE, sl.id, None, None, None)] += 1
                if stale:
                    want[(ActionKind.SYNC_WEIGHTS, sl.id, None, None, None)] += 1
            if new is not sl.role:
                want[(ActionKind.SWITCH_ROLE, sl.id, None, None, new)] += 1
        elif sl.return_by is not None:
            if sl.engine is not EngineState.NONE:
                want[(ActionKind.STOP_ENGINE, sl.id, None, None, None)] += 1
            want[(ActionKind.RETURN_SLOT, sl.id, None, None, None)] += 1
        elif sl.role is not Role.OFF and sl.engine is EngineState.WARM:
            want[(ActionKind.SLEEP_ENGINE, sl.id, None, None, None)] += 1
    get = placement.get
    for t in snapshot.unfinished if unfinished is None else unfinished:
        home = t.slot
        if home is None or home not in ids:
            continue
        dest = get(t.id)
        if dest is not None and dest != home:
            want[("migrate", home, t.id, dest, None)] += 1
    return want


def validate_plan(
    snapshot: ClusterSnapshot,
    plan: Plan,
    config: PlannerConfig | None = None,
    *,
    instance: Instance | None = None,
) -> None:
    """Raise ``PlanValidationError`` listing every violation of ``plan`` against ``snapshot`` (see module doc).

    ``instance``: the already built instance of (snapshot, config), to skip rebuilding it (``plan()`` passes
    its own; callers checking a plan from elsewhere leave it None).
    """
    config = config or PlannerConfig()
    inst = instance if instance is not None else build_instance(snapshot, config)
    v: list[str] = []
    slot_ids = [s.id for s in snapshot.slots]
    slot_set = set(slot_ids)
    # The instance's own list when it is this snapshot's (it is snapshot.unfinished, computed once).
    own = inst.unfinished if inst.snapshot is snapshot else None
    unfinished_list = own if own is not None else snapshot.unfinished
    unfinished = {t.id for t in unfinished_list}

    if not _close(plan.time, snapshot.time):
        v.append(f"plan time {plan.time} differs from the snapshot time {snapshot.time}")
    if set(plan.roles) != slot_set:
        missing = sorted(slot_set - set(plan.roles))[:5]
        unknown = sorted(set(plan.roles) - slot_set)[:5]
        v.append(f"roles must name exactly the snapshot's slots (missing {missing}, unknown {unknown})")

    # Placement: each unfinished trajectory exactly once, on an existing decoding slot that holds its KV.
    for tid in sorted(set(plan.placement) - set(unfinished))[:10]:
        v.append(f"placement names {tid!r}, which is not an unfinished trajectory of the snapshot")
    pos = {s.id: i for i, s in enumerate(inst.slots)}
    role_list = [plan.roles.get(sl.id, Role.OFF) for sl in inst.slots]
    decodes = [r is Role.MIXED or r is Role.DECODE for r in role_list]
    capacity = [sl.kv_capacity for sl in inst.slots]
    placement = plan.placement
    x = inst.arrays
    sids = [placement.get(tid) for tid in x.ids]
    place: list[int] = [pos.get(sid, -1) if sid is not None else -1 for sid in sids]
    complete = True
    if place:
        # Vectorised screen; the per-trajectory checks below run on the flagged ones only (in order).
        pl = np.asarray(place, dtype=np.int64)
        ok = (pl >= 0) & np.asarray([*decodes, False], dtype=bool)[pl] & (x.peak <= np.asarray([*capacity, 0.0])[pl])
        flagged = np.nonzero(~ok)[0].tolist()
    else:
        flagged = []
    for j in flagged:
        tid, sid, s = x.ids[j], sids[j], place[j]
        peak = float(x.peak[j])
        if s >= 0 and decodes[s] and peak <= capacity[s]:
            continue
        if sid is None:
            v.append(f"trajectory {tid!r} is not placed")
            complete = False
        elif s < 0:
            v.append(f"trajectory {tid!r} is placed on unknown slot {sid!r}")
            complete = False
        else:
            if not decodes[s]:
                v.append(f"trajectory {tid!r} is placed on slot {sid!r} whose role {role_list[s].value} does not decode")
            if peak > capacity[s]:
                v.append(f"trajectory {tid!r} peaks at {peak:.0f} KV tokens; slot {sid!r} holds {capacity[s]:.0f}")

    # Numbers, re-priced from scratch.
    ev = evaluate(inst, role_list, place) if complete else evaluate_ids(inst, plan.roles, plan.placement)
    for p in ev.problems:
        if "does not decode" in p or "KV tokens" in p or "not placed" in p:
            continue  # reported above, in this module's words
        v.append(p)
    if not _close(ev.makespan, plan.makespan):
        v.append(f"makespan {plan.makespan:.6f} does not match the recomputed {ev.makespan:.6f}")
    if not _close(ev.switching, plan.switching_cost):
        v.append(f"switching cost {plan.switching_cost:.6f} does not match the recomputed {ev.switching:.6f}")
    if not _close(ev.objective, plan.objective):
        v.append(f"objective {plan.objective:.6f} does not match the recomputed {ev.objective:.6f}")
    if not _close(sum(t.contribution for t in plan.terms), plan.objective):
        v.append("objective is not the sum of its terms' contributions")
    mine = {t.name: t for t in ev.terms}
    theirs = {t.name: t for t in plan.terms}
    if set(mine) != set(theirs):
        v.append(f"objective terms {sorted(theirs)} differ from {sorted(mine)}")
    else:
        for name, t in mine.items():
            o = theirs[name]
            if not (_close(t.value, o.value) and _close(t.weight, o.weight)):
                v.append(f"term {name!r} = {o.weight} x {o.value} differs from the recomputed {t.weight} x {t.value}")
    if plan.slot_finish:
        for s, sl in enumerate(inst.slots):
            mine_s = plan.slot_finish.get(sl.id)
            if mine_s is None or not _close(mine_s, ev.slot_finish[s]):
                v.append(f"slot {sl.id!r} finish {mine_s} does not match the recomputed {ev.slot_finish[s]:.6f}")
                break

    # Deadlines.
    late = [inst.slots[s].id for s, o in enumerate(ev.overrun) if o > 1e-6]
    relaxed = plan.status in (SolveStatus.DEADLINE_RELAXED, SolveStatus.FALLBACK)
    for sid in late:
        listed = any(repr(sid) in msg for msg in plan.violations)
        if not (relaxed and listed):
            v.append(f"slot {sid!r} works past its return deadline (status {plan.status.value}, not listed in violations)")
    if plan.status is SolveStatus.DEADLINE_RELAXED and not late:
        v.append("status is deadline_relaxed but no slot works past its deadline")

    # Actions: independent diff, compared as multisets; durations; order.
    want = expected_actions(snapshot, plan.roles, plan.placement, unfinished_list)
    got: Counter = Counter()
    for a in plan.actions:
        if a.kind in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL):
            got[("migrate", a.slot, a.trajectory, a.target, None)] += 1
        else:
            got[(a.kind, a.slot, a.trajectory, a.target, a.role)] += 1
    if got != want:
        extra = list((got - want).elements())[:5]
        missing = list((want - got).elements())[:5]
        v.append(f"actions differ from the state diff: unexpected {extra}, missing {missing}")
    _check_durations(inst, plan, v)
    order = {k: i for i, k in enumerate(ACTION_ORDER)}
    idx = [order[a.kind] for a in plan.actions]
    if any(b < a for a, b in itertools.pairwise(idx)):
        v.append("actions are not in ACTION_ORDER")

    # Bounds.
    if plan.bounds and not _close(plan.lower_bound, max(plan.bounds.values())):
        v.append(f"lower_bound {plan.lower_bound} is not the largest of the bounds {dict(plan.bounds)}")
    if plan.lower_bound < 0 or plan.lower_bound > plan.makespan * (1 + REL_TOL) + ABS_TOL:
        v.append(f"lower bound {plan.lower_bound:.6f} exceeds the makespan {plan.makespan:.6f}")
    if v:
        raise PlanValidationError(v)


def _check_durations(inst: Instance, plan: Plan, v: list[str]) -> None:
    pos = {s.id: i for i, s in enumerate(inst.slots)}
    tpos = {tid: j for j, tid in enumerate(inst.arrays.ids)}
    rsw = inst.config.role_switch_seconds
    for a in plan.actions:
        s = pos.get(a.slot)
        if s is None:
            v.append(f"action {a.kind.value} names unknown slot {a.slot!r}")
            continue
        sl = inst.slots[s]
        want: float | None = None
        if a.kind in (ActionKind.START_ENGINE, ActionKind.WAKE_ENGINE):
            want = sl.engine_seconds
        elif a.kind is ActionKind.SYNC_WEIGHTS:
            want = sl.sync_seconds
        elif a.kind in (ActionKind.SWITCH_ROLE, ActionKind.SLEEP_ENGINE, ActionKind.STOP_ENGINE):
            want = rsw
        elif a.kind in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL):
            j, t = tpos.get(a.trajectory or ""), pos.get(a.target or "")
            if j is None or t is None:
                continue  # reported by the multiset comparison
            kv, re = inst.kv_transfer_seconds(j, t), inst.reprefill_seconds(j, t)
            want = min(kv, re)
            cheaper = ActionKind.MIGRATE_KV if kv <= re else ActionKind.MIGRATE_REPREFILL
            if a.kind is not cheaper:
                v.append(f"trajectory {a.trajectory!r} migrates by {a.kind.value} but {cheaper.value} is cheaper")
        if want is not None and not _close(a.duration, want):
            v.append(f"action {a.kind.value} on {a.slot!r} lasts {a.duration:.6f} s, expected {want:.6f} s")
