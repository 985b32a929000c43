"""From a decision (roles + placement) to the ordered actions and the ``Plan`` object.

Every backend ends with ``make_plan``: it releases idle slots that must be returned, derives the actions
from the snapshot's current state, prices the decision with ``evaluate`` and packs the Plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rollplan.models.types import ACTION_ORDER, Action, ActionKind, EngineState, Plan, Role, SolveStatus
from rollplan.solver.core import pricing
from rollplan.solver.core.evaluate import Evaluation, evaluate
from rollplan.solver.core.instance import Instance

_ORDER = {k: i for i, k in enumerate(ACTION_ORDER)}


def release_idle(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> list[Role]:
    """Turn OFF slots that have a return deadline and carry no trajectory (and no prefill duty).

    Reason: an idle lent or noticed slot has no value to the batch and must go back; keeping it on would
    never be priced by the makespan, so the rule is explicit here.
    """
    used = set(placement)
    out = list(roles)
    if not any(sl.deadline is not None and out[s] is not Role.OFF and s not in used for s, sl in enumerate(inst.slots)):
        return out  # nothing to release
    needs_prefill = _needs_prefill(inst, roles, placement)
    for s, sl in enumerate(inst.slots):
        if sl.deadline is None or out[s] is Role.OFF:
            continue
        if s in used:
            continue
        if out[s] is Role.PREFILL and needs_prefill:
            continue
        out[s] = Role.OFF
    return out


def start_idle(inst: Instance, roles: Sequence[Role], makespan: float) -> list[Role]:
    """Start, as MIXED, every OFF slot without a return deadline that could serve before ``makespan``.

    Reason: the decision prices a slot only by the trajectories it places there now, at their predicted means,
    so an OFF slot it leaves empty is worth nothing to it; but the slot is available (it carries no deadline),
    and between re-plans the dispatcher gives a serving slot what the placed ones cannot take when it comes:
    trajectories whose true lengths exceed their predictions, work that loses its KV to a preemption or to a
    tool wait, later turns it cannot admit. An empty slot finishes at its start ``st_s``, so starting it only
    where ``st_s < makespan`` leaves the makespan unchanged; the objective pays its start in the switching
    term. ``release_idle`` is the converse for slots that must be returned. ``PlannerConfig.start_idle``
    turns this off (a plan that uses the fewest GPUs). Called by ``plan()`` on its chosen decision.
    """
    out = list(roles)
    cfg = inst.config
    for s, sl in enumerate(inst.slots):
        if out[s] is Role.OFF and sl.deadline is None and sl.start_seconds(Role.MIXED, cfg.role_switch_seconds) < makespan:
            out[s] = Role.MIXED
    return out


def _needs_prefill(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> bool:
    """Whether some trajectory with prefill work sits on a DECODE slot."""
    decode_slots = [s for s, r in enumerate(roles) if r is Role.DECODE]
    if not decode_slots or not len(placement):
        return False
    is_decode = np.zeros(len(roles), dtype=bool)
    is_decode[decode_slots] = True
    pl = np.asarray(placement, dtype=np.int64)
    return bool((is_decode[pl] & (inst.arrays.P[: pl.size] > 0)).any())


def build_actions(inst: Instance, roles: Sequence[Role], placement: Sequence[int]) -> tuple[Action, ...]:
    """The ordered actions that take the snapshot's current state to (roles, placement)."""
    cfg = inst.config
    snap_time = inst.snapshot.time
    acts: list[Action] = []
    for s, sl in enumerate(inst.slots):
        new, cur = roles[s], sl.current_role
        deadline = None if sl.deadline is None else snap_time + sl.deadline
        if new is not Role.OFF:
            if sl.engine is EngineState.NONE:
                acts.append(Action(ActionKind.START_ENGINE, sl.id, duration=sl.engine_seconds))
            elif sl.engine is EngineState.SLEEPING:
                acts.append(Action(ActionKind.WAKE_ENGINE, sl.id, duration=sl.engine_seconds))
            if sl.sync_seconds > 0:
                acts.append(Action(ActionKind.SYNC_WEIGHTS, sl.id, duration=sl.sync_seconds))
            if new is not cur:
                acts.append(Action(ActionKind.SWITCH_ROLE, sl.id, role=new, duration=cfg.role_switch_seconds))
        else:
            if sl.deadline is not None:
                if sl.engine is not EngineState.NONE:
                    acts.append(Action(ActionKind.STOP_ENGINE, sl.id, duration=cfg.role_switch_seconds, deadline=deadline))
                acts.append(Action(ActionKind.RETURN_SLOT, sl.id, deadline=deadline))
            elif cur is not Role.OFF and sl.engine is EngineState.WARM:
                acts.append(Action(ActionKind.SLEEP_ENGINE, sl.id, duration=cfg.role_switch_seconds))
    x = inst.arrays
    pl = np.asarray(placement, dtype=np.int64)
    home = x.home[: pl.size]
    moved = np.nonzero((home >= 0) & (home != pl))[0]  # the moved trajectories, in order
    if moved.size:
        # ``Instance.move_by_kv`` / ``move_seconds`` for all of them at once (the same ``pricing`` floats).
        src_s, dst_s = home[moved], pl[moved]
        rate = pricing.transfer_rate(x.node[src_s] == x.node[dst_s], x.same[dst_s], x.cross[dst_s])
        ctx, mu = x.ctx[moved], x.mu[dst_s]
        by_kv = (pricing.kv_transfer_seconds(ctx, rate) <= pricing.reprefill_seconds(ctx, mu)).tolist()
        seconds = pricing.move_seconds(ctx, rate, mu).tolist()
        slot_ids = [sl.id for sl in inst.slots]
        src_deadline = [None if sl.deadline is None else snap_time + sl.deadline for sl in inst.slots]
        for j, s, h, kv, sec in zip(moved.tolist(), dst_s.tolist(), src_s.tolist(), by_kv, seconds, strict=True):
            kind = ActionKind.MIGRATE_KV if kv else ActionKind.MIGRATE_REPREFILL
            acts.append(
                Action(kind, slot_ids[h], trajectory=x.ids[j], target=slot_ids[s], duration=sec, deadline=src_deadline[h])
            )
    acts.sort(key=lambda a: _ORDER[a.kind])  # stable: slot order within a kind
    return tuple(acts)


def make_plan(
    inst: Instance,
    roles: Sequence[Role],
    placement: Sequence[int],
    *,
    status: SolveStatus,
    backend: str,
    bounds: Mapping[str, float],
    solve_seconds: float = 0.0,
    evaluation: Evaluation | None = None,
    actions: Sequence[Action] | None = None,
) -> Plan:
    """Pack a decision into a ``Plan`` (releases idle deadline slots first; prices with ``evaluate``).

    ``evaluation`` / ``actions``: ``evaluate`` / ``build_actions`` of (``release_idle`` of the decision,
    ``placement``) when the caller already has them (then they are not recomputed; passing anything else
    is a caller bug that ``validate_plan`` reports).
    """
    final_roles = release_idle(inst, roles, placement)
    ev: Evaluation = evaluation if evaluation is not None else evaluate(inst, final_roles, placement)
    violations = tuple(
        f"slot {inst.slots[s].id!r} works {o:.2f} s past its return deadline" for s, o in enumerate(ev.overrun) if o > 1e-6
    )
    if violations and status is not SolveStatus.FALLBACK:
        status = SolveStatus.DEADLINE_RELAXED
    lower = max(bounds.values(), default=0.0)
    slot_ids = [sl.id for sl in inst.slots]
    return Plan(
        time=inst.snapshot.time,
        roles={sl.id: final_roles[s] for s, sl in enumerate(inst.slots)},
        placement=dict(zip(inst.arrays.ids, [slot_ids[s] for s in placement], strict=True)),
        actions=tuple(actions) if actions is not None else build_actions(inst, final_roles, placement),
        makespan=ev.makespan,
        switching_cost=ev.switching,
        lower_bound=lower,
        objective=ev.objective,
        terms=ev.terms,
        status=status,
        backend=backend,
        solve_seconds=solve_seconds,
        bounds=dict(bounds),
        slot_finish={sl.id: ev.slot_finish[s] for s, sl in enumerate(inst.slots)},
        violations=violations,
    )
