"""Test factories for the planner: snapshots with defaults, hypothesis strategies, a fake clock, apply_plan.

    make_slot("s0")                                   # a warm dedicated MIXED h800 slot
    make_traj("t0", slot="s0", decode=2000)           # a decoding trajectory at home on s0
    make_snapshot(slots=[...], trajectories=[...])    # time 1000, qwen3-8b, weights version 1
    tiny_snapshots(max_slots=3, max_trajectories=4)   # hypothesis strategy
    planner_config(backend="milp")                    # PlannerConfig, deterministic by default
    greedy_state("work-bound", 8, 128, seed=1)         # (instance, search state of its greedy plan)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rollplan.models.types import (
    ClusterSnapshot,
    EngineState,
    Estimate,
    Phase,
    Plan,
    Role,
    Slot,
    SlotSource,
    Trajectory,
)
from rollplan.solver.config import PlannerConfig
from rollplan.solver.core.instance import Instance
from rollplan.solver.search.state import SlotState

T0 = 1000.0
VERSION = 1

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
"""Hypothesis settings of the planner tests: derandomized (reproducible in CI), no per-example deadline."""


def planner_config(**kw: object) -> PlannerConfig:
    """``PlannerConfig(**kw)`` with ``deterministic=True`` unless given: the tests' default, so a loaded CI
    machine cannot change a plan. Tests about wall-clock time limits pass ``deterministic=False`` (or a
    ``clock``, which implies it)."""
    if "clock" in kw:
        kw.setdefault("deterministic", False)
    kw.setdefault("deterministic", True)
    return PlannerConfig(**kw)  # type: ignore[arg-type]


def make_slot(
    id: str = "s0",
    *,
    gpu: str = "h800",
    node: str | None = None,
    tp: int = 1,
    source: SlotSource = SlotSource.DEDICATED,
    return_by: float | None = None,
    role: Role = Role.MIXED,
    engine: EngineState | None = None,
    weights_version: int = VERSION,
) -> Slot:
    """A slot; ``engine`` defaults to WARM when ``role`` is on, else NONE (cold)."""
    if engine is None:
        engine = EngineState.WARM if role is not Role.OFF else EngineState.NONE
    return Slot(
        id=id,
        gpu=gpu,
        node=node or f"node-{id}",
        tp=tp,
        source=source,
        return_by=return_by,
        role=role,
        engine=engine,
        weights_version=weights_version,
    )


def make_traj(
    id: str = "t0",
    *,
    group: str | None = None,
    slot: str | None = "s0",
    phase: Phase = Phase.DECODING,
    context: int = 1000,
    decode: float = 1000.0,
    prefill: float = 0.0,
    tool: float = 0.0,
    turns: float = 1.0,
    tool_until: float | None = None,
) -> Trajectory:
    return Trajectory(
        id=id,
        group=group or f"g-{id}",
        phase=phase,
        context_tokens=context,
        slot=slot,
        remaining_decode_tokens=Estimate(decode, decode * 0.2),
        remaining_prefill_tokens=Estimate(prefill, prefill * 0.2),
        remaining_tool_seconds=Estimate(tool, tool * 0.2),
        remaining_turns=Estimate(turns),
        tool_until=tool_until,
    )


def make_snapshot(
    slots: Sequence[Slot] | None = None,
    trajectories: Sequence[Trajectory] | None = None,
    *,
    time: float = T0,
    model: str = "qwen3-8b",
    weights_version: int = VERSION,
) -> ClusterSnapshot:
    """A snapshot; defaults: one warm MIXED slot "s0" and one trajectory decoding on it."""
    if slots is None:
        slots = [make_slot("s0")]
    if trajectories is None:
        trajectories = [make_traj("t0", slot=slots[0].id if slots else None)]
    return ClusterSnapshot(
        time=time, model=model, slots=tuple(slots), trajectories=tuple(trajectories), weights_version=weights_version
    )


def apply_plan(snapshot: ClusterSnapshot, plan: Plan) -> ClusterSnapshot:
    """The snapshot after ``plan``'s actions completed, at the same time and with the same predictions.

    Slots on in the plan are warm with current weights in their planned role; slots turned off sleep (a warm
    engine) or, with a deadline, are returned (gone); trajectories live where the plan put them.
    """
    slots = []
    for s in snapshot.slots:
        role = plan.roles.get(s.id, Role.OFF)
        if role is Role.OFF and s.return_by is not None:
            continue  # returned
        if role is not Role.OFF:
            s = dataclasses.replace(s, role=role, engine=EngineState.WARM, weights_version=snapshot.weights_version)
        else:
            engine = EngineState.SLEEPING if s.engine is EngineState.WARM and s.role is not Role.OFF else s.engine
            s = dataclasses.replace(s, role=Role.OFF, engine=engine)
        slots.append(s)
    trajs = []
    for t in snapshot.trajectories:
        if t.id in plan.placement:
            t = dataclasses.replace(t, slot=plan.placement[t.id])
        trajs.append(t)
    return dataclasses.replace(snapshot, slots=tuple(slots), trajectories=tuple(trajs))


class FakeClock:
    """A fake monotonic clock (a real one cannot be made slow on demand): advances ``step`` per read.

    ``jump_after``: after that many reads, time leaps by ``jump`` once (a stalled machine).
    """

    def __init__(self, step: float = 0.0, *, start: float = 100.0, jump_after: int | None = None, jump: float = 0.0):
        self.now = start
        self.step = step
        self.reads = 0
        self.jump_after = jump_after
        self.jump = jump

    def __call__(self) -> float:
        self.reads += 1
        if self.jump_after is not None and self.reads == self.jump_after:
            self.now += self.jump
        self.now += self.step
        return self.now


# -- hypothesis strategies -------------------------------------------------------------------------------

GPUS = ("h800", "h800", "h100", "a100")


@st.composite
def slot_lists(draw: st.DrawFn, min_slots: int = 1, max_slots: int = 4, gpus: Sequence[str] = GPUS) -> list[Slot]:
    n = draw(st.integers(min_slots, max_slots))
    out = []
    for i in range(n):
        engine = draw(st.sampled_from([EngineState.WARM, EngineState.WARM, EngineState.SLEEPING, EngineState.NONE]))
        role = draw(st.sampled_from(list(Role))) if engine is EngineState.WARM else Role.OFF
        source = draw(st.sampled_from(list(SlotSource)))
        return_by = None
        if source is not SlotSource.DEDICATED and draw(st.booleans()):
            return_by = T0 + draw(st.sampled_from([0.0, 0.5, 20.0, 90.0, 400.0]))
        out.append(
            Slot(
                id=f"s{i}",
                gpu=draw(st.sampled_from(list(gpus))),
                node=f"n{i // 2}",
                tp=1,
                source=source,
                return_by=return_by,
                role=role,
                engine=engine,
                weights_version=draw(st.sampled_from([VERSION, VERSION, VERSION - 1])),
            )
        )
    return out


@st.composite
def traj_lists(draw: st.DrawFn, slot_ids: Sequence[str], max_trajectories: int = 6) -> list[Trajectory]:
    n = draw(st.integers(0, max_trajectories))
    out = []
    n_groups = max(1, n // 2)
    for i in range(n):
        phase = draw(st.sampled_from([Phase.DECODING, Phase.DECODING, Phase.IN_TOOL, Phase.PREFILL_PENDING, Phase.DONE]))
        slot = draw(st.sampled_from([*slot_ids, None])) if slot_ids else None
        decode = draw(st.sampled_from([0.0, 50.0, 400.0, 2000.0, 8000.0, 20000.0]))
        prefill = draw(st.sampled_from([0.0, 0.0, 300.0, 2000.0]))
        out.append(
            make_traj(
                f"t{i}",
                group=f"g{i % n_groups}",
                slot=slot,
                phase=phase,
                context=draw(st.sampled_from([0, 200, 3000, 12000])),
                decode=decode,
                prefill=prefill,
                tool=draw(st.sampled_from([0.0, 0.0, 2.0, 15.0])),
                tool_until=T0 + 3.0 if phase is Phase.IN_TOOL else None,
            )
        )
    return out


@st.composite
def snapshots(draw: st.DrawFn, max_slots: int = 4, max_trajectories: int = 6, gpus: Sequence[str] = GPUS) -> ClusterSnapshot:
    """Random valid snapshots (every trajectory fits some slot: qwen3-8b fits every preset GPU)."""
    slots = draw(slot_lists(1, max_slots, gpus))
    trajs = draw(traj_lists([s.id for s in slots], max_trajectories))
    return make_snapshot(slots, trajs)


def tiny_snapshots(max_slots: int = 3, max_trajectories: int = 4) -> st.SearchStrategy[ClusterSnapshot]:
    """Snapshots small enough for the exhaustive backend."""
    return snapshots(max_slots=max_slots, max_trajectories=max_trajectories)


def greedy_state(family: str, slots: int, trajectories: int, *, seed: int = 0) -> tuple[Instance, SlotState]:
    """A bench family snapshot's instance and the search state (``search.state.SlotState``) of its greedy
    plan: the starting point of the local-search tests."""
    from rollplan.solver import build_instance, plan
    from rollplan.solver.core.tables import Tables
    from rollplan.solver.families import family_snapshot
    from rollplan.solver.search.state import state_of

    snap = family_snapshot(family, slots, trajectories, seed=seed)
    inst = build_instance(snap, planner_config())
    p = plan(snap, config=planner_config(backend="greedy"))
    ids = {s.id: i for i, s in enumerate(inst.slots)}
    state = state_of(Tables(inst), [p.roles[s.id] for s in inst.slots], [ids[p.placement[t.id]] for t in inst.trajs])
    return inst, state
