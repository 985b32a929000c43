"""The data model that crosses package boundaries: cluster snapshots, availability events, plans.

All classes are frozen, slotted dataclasses. Mapping fields hold plain dicts that nobody mutates (by
contract); build new objects with ``dataclasses.replace``. JSON round-trip lives in ``rollplan.models.io``.

Times are seconds. ``ClusterSnapshot.time`` is an absolute clock (simulation or wall time, the caller's
choice); deadlines (``Slot.return_by``, ``AvailabilityEvent.deadline``) use the same clock; plan durations
(``Plan.makespan``, action durations) are relative to the snapshot time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    """What a slot does. MIXED = colocated prefill+decode; PREFILL/DECODE = P/D disaggregation."""

    OFF = "off"
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def decodes(self) -> bool:
        """True when trajectories can be placed (decode) on a slot with this role."""
        return self in (Role.MIXED, Role.DECODE)


class SlotSource(StrEnum):
    DEDICATED = "dedicated"
    LENT_BY_TRAINING = "lent_by_training"
    PREEMPTIBLE = "preemptible"


class EngineState(StrEnum):
    """Engine on a slot as the planner sees it: none (cold start needed), sleeping (wake), warm (serving)."""

    NONE = "none"
    SLEEPING = "sleeping"
    WARM = "warm"


class Phase(StrEnum):
    PREFILL_PENDING = "prefill_pending"
    DECODING = "decoding"
    IN_TOOL = "in_tool"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A predicted quantity: point estimate ``mean`` and a spread (standard deviation, same unit)."""

    mean: float
    spread: float = 0.0


@dataclass(frozen=True, slots=True)
class Slot:
    """The unit one engine runs on: ``tp`` GPUs of kind ``gpu`` on node ``node``.

    ``return_by``: absolute time the slot must be empty and given back (lent GPU reclaimed, preemption
    notice), or None. ``role``/``engine``/``weights_version`` describe its current state.
    """

    id: str
    gpu: str
    node: str
    tp: int = 1
    source: SlotSource = SlotSource.DEDICATED
    return_by: float | None = None
    role: Role = Role.OFF
    engine: EngineState = EngineState.NONE
    weights_version: int = 0


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One unfinished (or finished) multi-turn rollout.

    ``context_tokens``: tokens currently held in KV (prompt + generated so far). ``slot``: where that KV
    lives / where it runs (None if nowhere yet, e.g. a new trajectory or one whose slot vanished).
    ``remaining_*``: predictions over all remaining turns. ``tool_until``: absolute time the current tool
    call returns, when in a tool and known.
    """

    id: str
    group: str
    phase: Phase
    context_tokens: int
    slot: str | None = None
    remaining_decode_tokens: Estimate = Estimate(0.0)
    remaining_prefill_tokens: Estimate = Estimate(0.0)
    remaining_tool_seconds: Estimate = Estimate(0.0)
    remaining_turns: Estimate = Estimate(1.0)
    tool_until: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything the planner knows at ``time``: the slots now available and the batch's trajectories."""

    time: float
    model: str
    slots: tuple[Slot, ...]
    trajectories: tuple[Trajectory, ...]
    weights_version: int = 0

    def slot(self, slot_id: str) -> Slot:
        for s in self.slots:
            if s.id == slot_id:
                return s
        raise KeyError(slot_id)

    @property
    def unfinished(self) -> tuple[Trajectory, ...]:
        return tuple(t for t in self.trajectories if t.phase is not Phase.DONE)


class EventKind(StrEnum):
    ARRIVE = "arrive"  # slots join (spot/preemptible allocation, new node)
    LEAVE = "leave"  # slots vanish now, no notice (KV lost)
    NOTICE = "notice"  # slots will leave at ``deadline`` (preemption notice)
    LEND = "lend"  # training lends slots until ``deadline``
    RECLAIM = "reclaim"  # training wants lent slots back by ``deadline``


@dataclass(frozen=True, slots=True)
class AvailabilityEvent:
    """A change in which slots exist. ``slots`` are the slots arriving/lent (full objects) or, for
    leave/notice/reclaim, identified by ``slot_ids``."""

    time: float
    kind: EventKind
    slot_ids: tuple[str, ...] = ()
    slots: tuple[Slot, ...] = ()
    deadline: float | None = None


class ActionKind(StrEnum):
    START_ENGINE = "start_engine"
    WAKE_ENGINE = "wake_engine"
    SLEEP_ENGINE = "sleep_engine"
    STOP_ENGINE = "stop_engine"
    SWITCH_ROLE = "switch_role"
    SYNC_WEIGHTS = "sync_weights"
    MIGRATE_KV = "migrate_kv"
    MIGRATE_REPREFILL = "migrate_reprefill"
    RETURN_SLOT = "return_slot"


# Order in which a plan's actions are applied: bring capacity up, retarget, move work, then release.
ACTION_ORDER: tuple[ActionKind, ...] = (
    ActionKind.START_ENGINE,
    ActionKind.WAKE_ENGINE,
    ActionKind.SYNC_WEIGHTS,
    ActionKind.SWITCH_ROLE,
    ActionKind.MIGRATE_KV,
    ActionKind.MIGRATE_REPREFILL,
    ActionKind.SLEEP_ENGINE,
    ActionKind.STOP_ENGINE,
    ActionKind.RETURN_SLOT,
)


@dataclass(frozen=True, slots=True)
class Action:
    """One step from the current state toward a plan.

    ``slot``: the slot acted on (for migrations: the source). ``target``: destination slot of a migration.
    ``role``: the new role of a switch. ``duration``: predicted seconds. ``deadline``: absolute time by
    which it must be done (returns, drains), if any.
    """

    kind: ActionKind
    slot: str
    trajectory: str | None = None
    target: str | None = None
    role: Role | None = None
    duration: float = 0.0
    deadline: float | None = None


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"  # proven optimal (within the configured relative gap)
    FEASIBLE = "feasible"  # time limit hit; best feasible solution found by the solver
    FALLBACK = "fallback"  # solver found nothing in time (or failed); the greedy plan is returned
    HEURISTIC = "heuristic"  # produced by a heuristic backend / baseline policy
    DEADLINE_RELAXED = "deadline_relaxed"  # a hard deadline cannot be met: returned anyway, see Plan.violations


@dataclass(frozen=True, slots=True)
class ObjectiveTerm:
    """A named term of the objective: ``weight * value`` is its contribution."""

    name: str
    value: float
    weight: float = 1.0

    @property
    def contribution(self) -> float:
        return self.weight * self.value


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer for one snapshot.

    ``roles``: slot id -> role for every slot in the snapshot. ``placement``: trajectory id -> slot id for
    every unfinished trajectory. ``actions``: ordered (see ``ACTION_ORDER``). ``makespan``: predicted seconds
    from ``time`` until the last trajectory finishes. ``switching_cost``: GPU-seconds spent on actions.
    ``lower_bound``: a proven lower bound on the makespan; ``bounds`` holds each bound by name.
    ``terms``: the objective breakdown; ``objective`` == sum of contributions.
    """

    time: float
    roles: Mapping[str, Role]
    placement: Mapping[str, str]
    actions: tuple[Action, ...]
    makespan: float
    switching_cost: float
    lower_bound: float
    objective: float
    terms: tuple[ObjectiveTerm, ...]
    status: SolveStatus
    backend: str
    solve_seconds: float = 0.0
    bounds: Mapping[str, float] = field(default_factory=dict)
    slot_finish: Mapping[str, float] = field(default_factory=dict)
    violations: tuple[str, ...] = ()

    @property
    def gap(self) -> float:
        """makespan / lower_bound - 1 (0 when the bound is 0 and so is the makespan)."""
        if self.lower_bound <= 0:
            return 0.0 if self.makespan <= 0 else float("inf")
        return max(0.0, self.makespan / self.lower_bound - 1.0)

    @property
    def prefill_slots(self) -> int:
        return sum(1 for r in self.roles.values() if r is Role.PREFILL)

    @property
    def decode_slots(self) -> int:
        return sum(1 for r in self.roles.values() if r is Role.DECODE)

    @property
    def pd_ratio(self) -> str:
        """"P:D" of disaggregated slots, plus the MIXED count, e.g. "2:6 +8 mixed"."""
        mixed = sum(1 for r in self.roles.values() if r is Role.MIXED)
        return f"{self.prefill_slots}:{self.decode_slots}" + (f" +{mixed} mixed" if mixed else "")


@dataclass(frozen=True, slots=True)
class PlanDiff:
    """What changed from ``old`` to ``new`` plan: roles, moved trajectories, actions only in the new one."""

    role_changes: Mapping[str, tuple[Role, Role]]
    moved: Mapping[str, tuple[str | None, str]]
    new_actions: tuple[Action, ...]

    @property
    def empty(self) -> bool:
        return not (self.role_changes or self.moved or self.new_actions)


def diff_plans(old: Plan | None, new: Plan) -> PlanDiff:
    """The difference between two plans (``old`` None: everything in ``new`` is new)."""
    old_roles: Mapping[str, Role] = old.roles if old else {}
    old_place: Mapping[str, str] = old.placement if old else {}
    role_changes = {
        s: (old_roles.get(s, Role.OFF), r) for s, r in new.roles.items() if old_roles.get(s, Role.OFF) is not r
    }
    moved = {t: (old_place.get(t), s) for t, s in new.placement.items() if old_place.get(t) != s}
    old_actions = set(old.actions) if old else set()
    new_actions = tuple(a for a in new.actions if a not in old_actions)
    return PlanDiff(role_changes=role_changes, moved=moved, new_actions=new_actions)
