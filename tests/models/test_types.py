"""Data model: JSON round-trip, schema errors with field paths, plan diffs, error hierarchy.

Invariants (hypothesis):
- any snapshot/plan built from valid parts survives to_json -> from_json unchanged;
- diff_plans(p, p) is empty; diff_plans(None, p) lists every non-OFF role and every placement.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models import (
    Action,
    ActionKind,
    AvailabilityEvent,
    ClusterSnapshot,
    EngineState,
    Estimate,
    EventKind,
    InfeasiblePlanError,
    ObjectiveTerm,
    Phase,
    Plan,
    Role,
    RollplanError,
    SchemaError,
    Slot,
    SlotSource,
    SolveStatus,
    Trajectory,
    UnknownNameError,
    diff_plans,
    gpu_kind,
    model_spec,
)
from rollplan.models.io import (
    event_from_json,
    from_json,
    json_schema,
    plan_from_json,
    snapshot_from_json,
    to_json,
)

ids = st.text("abcdefgh0123456789", min_size=1, max_size=6)
est = st.builds(Estimate, st.floats(0, 1e5), st.floats(0, 1e3))


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    slot_ids = draw(st.lists(ids, min_size=1, max_size=5, unique=True))
    slots = tuple(
        Slot(
            id=s,
            gpu=draw(st.sampled_from(["h800", "h100", "h200", "a100"])),
            node=f"n{i % 2}",
            tp=draw(st.sampled_from([1, 2, 4])),
            source=draw(st.sampled_from(list(SlotSource))),
            return_by=draw(st.none() | st.floats(0, 1e4)),
            role=draw(st.sampled_from(list(Role))),
            engine=draw(st.sampled_from(list(EngineState))),
            weights_version=draw(st.integers(0, 3)),
        )
        for i, s in enumerate(slot_ids)
    )
    traj_ids = draw(st.lists(ids, max_size=6, unique=True))
    trajs = tuple(
        Trajectory(
            id=t,
            group=f"g{i // 2}",
            phase=draw(st.sampled_from(list(Phase))),
            context_tokens=draw(st.integers(0, 30000)),
            slot=draw(st.none() | st.sampled_from(slot_ids)),
            remaining_decode_tokens=draw(est),
            remaining_prefill_tokens=draw(est),
            remaining_tool_seconds=draw(est),
            remaining_turns=draw(est),
            tool_until=draw(st.none() | st.floats(0, 100)),
        )
        for i, t in enumerate(traj_ids)
    )
    return ClusterSnapshot(time=draw(st.floats(0, 1e5)), model="qwen3-8b", slots=slots, trajectories=trajs)


def make_plan(**kw: object) -> Plan:
    base: dict[str, object] = dict(
        time=0.0,
        roles={"a": Role.MIXED, "b": Role.OFF},
        placement={"t1": "a"},
        actions=(Action(ActionKind.START_ENGINE, "a", duration=60.0),),
        makespan=10.0,
        switching_cost=60.0,
        lower_bound=9.0,
        objective=10.6,
        terms=(ObjectiveTerm("makespan", 10.0), ObjectiveTerm("switching_gpu_seconds", 60.0, 0.01)),
        status=SolveStatus.OPTIMAL,
        backend="milp",
    )
    base.update(kw)
    return Plan(**base)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_snapshot_round_trip(snap: ClusterSnapshot) -> None:
    assert snapshot_from_json(to_json(snap)) == snap


def test_plan_round_trip_and_properties() -> None:
    p = make_plan(roles={"a": Role.PREFILL, "b": Role.DECODE, "c": Role.DECODE, "d": Role.MIXED})
    assert plan_from_json(to_json(p)) == p
    assert p.pd_ratio == "1:2 +1 mixed"
    assert p.gap == pytest.approx(10.0 / 9.0 - 1.0)


def test_event_round_trip() -> None:
    ev = AvailabilityEvent(5.0, EventKind.NOTICE, slot_ids=("a",), deadline=35.0)
    assert event_from_json(to_json(ev)) == ev


def test_schema_error_names_field_path() -> None:
    doc = json.loads(to_json(ClusterSnapshot(0.0, "qwen3-8b", (Slot("a", "h800", "n0"),), ())))
    doc["slots"][0]["tp"] = "two"
    with pytest.raises(SchemaError) as err:
        snapshot_from_json(json.dumps(doc), source="snap.json")
    assert "snap.json: slots.0.tp" in str(err.value)
    assert "To fix:" in str(err.value)


def test_semantic_checks_name_the_field() -> None:
    slot = Slot("a", "h800", "n0")
    bad = ClusterSnapshot(0.0, "qwen3-8b", (slot,), (Trajectory("t", "g", Phase.DECODING, -5, slot="a"),))
    with pytest.raises(SchemaError, match=r"trajectories\.0\.context_tokens"):
        snapshot_from_json(to_json(bad))
    dup = ClusterSnapshot(0.0, "qwen3-8b", (slot, slot), ())
    with pytest.raises(SchemaError, match=r"slots\.1\.id"):
        snapshot_from_json(to_json(dup))
    ghost = ClusterSnapshot(0.0, "qwen3-8b", (slot,), (Trajectory("t", "g", Phase.DECODING, 5, slot="zz"),))
    with pytest.raises(SchemaError, match=r"trajectories\.0\.slot"):
        snapshot_from_json(to_json(ghost))


def test_invalid_json_names_line() -> None:
    with pytest.raises(SchemaError, match=r"x.json:2"):
        from_json(ClusterSnapshot, '{\n  "time": ,\n}', source="x.json")


def test_diff_plans() -> None:
    p = make_plan()
    assert diff_plans(p, p).empty
    d = diff_plans(None, p)
    assert d.role_changes == {"a": (Role.OFF, Role.MIXED)}
    assert d.moved == {"t1": (None, "a")}
    q = make_plan(roles={"a": Role.DECODE, "b": Role.OFF}, placement={"t1": "b"}, actions=())
    d2 = diff_plans(p, q)
    assert d2.role_changes == {"a": (Role.MIXED, Role.DECODE)}
    assert d2.moved == {"t1": ("a", "b")}
    assert d2.new_actions == ()


def test_errors_carry_values_and_hint() -> None:
    err = UnknownNameError("GPU kind", "h900", ["h100", "h800"])
    assert isinstance(err, RollplanError)
    assert err.values["name"] == "h900"
    assert str(err) == "unknown GPU kind 'h900'. To fix: use one of: h100, h800."
    inf = InfeasiblePlanError(["trajectory 't' needs 9 KV tokens"])
    assert inf.reasons == ("trajectory 't' needs 9 KV tokens",)
    with pytest.raises(UnknownNameError):
        gpu_kind("h900")
    with pytest.raises(UnknownNameError):
        model_spec("gpt-9")


def test_json_schema_is_documented() -> None:
    schema = json_schema(ClusterSnapshot)
    assert "slots" in schema["properties"]
    assert "trajectories" in schema["properties"]


def test_errors_survive_pickling() -> None:
    import pickle

    from rollplan.models import ActionFailures, IllegalTransitionError, PlanValidationError, TraceError

    errors = [
        UnknownNameError("model", "gpt-9", ["qwen3-8b"]),
        SchemaError("snap.json: slots.0.tp", "bad"),
        TraceError("trace.csv", 3, "bad row", fix="fix it"),
        InfeasiblePlanError(["no slot"]),
        PlanValidationError(["v1", "v2"]),
        IllegalTransitionError("engine", "stopped", "wake"),
        ActionFailures([("start s1", RuntimeError("boom"))]),
    ]
    for err in errors:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert back.values.keys() == err.values.keys()
