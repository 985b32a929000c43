"""Executor parts that run without Ray or vLLM: lifecycle, prediction, fallback policy, snapshot,
measured perf model, engine settings, the tiny model builder, the CLI registration.

Invariants checked with hypothesis:
- lifecycle: a transition happens iff the table allows it; otherwise ``IllegalTransitionError`` and the
  state is unchanged; STOPPED is absorbing; the error survives pickling (it crosses Ray).
- prediction (the controller through the decision core's ``rollplan.policy.Predictor``): every estimate is
  finite and >= 0; remaining decode tokens never exceed the item's budget left; with a finished sibling of
  total T, a sibling that made g < T tokens is predicted T - g; a prompt seen in an earlier batch is
  predicted from that history in the next.
- fallback plan: every unfinished trajectory is placed on a slot without a deadline (when one exists), a new
  placement on one that serves now when one does;
  actions come in ``ACTION_ORDER``; every slot with a deadline is returned.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.executor.agent import RolloutItem, SamplingConfig, TrajectoryRun
from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
from rollplan.executor.controller import Controller, fallback_plan
from rollplan.executor.lifecycle import TRANSITIONS, EngineStatus, Lifecycle
from rollplan.executor.perf import MeasuredPerfModel, from_profile_records, measured_provider
from rollplan.executor.pool import SlotRuntime
from rollplan.models import (
    ACTION_ORDER,
    Action,
    ActionKind,
    ClusterSnapshot,
    EngineState,
    Estimate,
    IllegalTransitionError,
    Phase,
    Plan,
    Role,
    Slot,
    SolveStatus,
    Trajectory,
    gpu_kind,
    model_spec,
)
from rollplan.policy.predict import SURVIVAL

EVENTS = sorted(TRANSITIONS)


# -- lifecycle -----------------------------------------------------------------------------------------------
def test_lifecycle_happy_path() -> None:
    life = Lifecycle("s0")
    for event, state in [
        ("load", "loading"),
        ("ready", "serving"),
        ("sleep", "sleeping"),
        ("wake", "serving"),
        ("drain", "draining"),
        ("undrain", "serving"),
        ("stop", "stopped"),
    ]:
        assert life.fire(event, 1.0).value == state
    assert [e for _, e, _ in life.history] == ["load", "ready", "sleep", "wake", "drain", "undrain", "stop"]


@given(st.lists(st.sampled_from([*EVENTS, "bogus"]), max_size=30))
def test_lifecycle_fires_exactly_the_allowed_transitions(events: list[str]) -> None:
    life = Lifecycle("s")
    for ev in events:
        before = life.state
        allowed = before in TRANSITIONS.get(ev, {})
        if allowed:
            assert life.fire(ev) is TRANSITIONS[ev][before]
        else:
            with pytest.raises(IllegalTransitionError) as info:
                life.fire(ev)
            assert life.state is before
            again = pickle.loads(pickle.dumps(info.value))
            assert isinstance(again, IllegalTransitionError) and str(again) == str(info.value)
        if before is EngineStatus.STOPPED:
            assert life.state is EngineStatus.STOPPED


def test_only_serving_accepts_requests() -> None:
    assert [s for s in EngineStatus if s.accepts_requests] == [EngineStatus.SERVING]


# -- prediction ----------------------------------------------------------------------------------------------
def _controller() -> Controller:
    return Controller(ExecutorConfig(engine=EngineConfig(model="unused"), clock=lambda: 0.0), plan_fn=None)


def _run(rid: str, group: str = "g", generated: int = 0, turn: int = 0, max_turns: int = 4,
         per_turn: int = 32) -> TrajectoryRun:
    item = RolloutItem(rid, (1, 2, 3), group=group, max_turns=max_turns, sampling=SamplingConfig(max_tokens=per_turn))
    return TrajectoryRun(item=item, prompt_ids=[1, 2, 3], context=[1, 2, 3], generated=generated, turn=turn)


def _finish(ctl: Controller, run: TrajectoryRun, tokens: int, turns: int = 3) -> None:
    """``run`` finished after ``turns`` turns that generated ``tokens`` tokens in all (a real result record)."""
    from rollplan.executor.agent import TrajectoryResult, TurnRecord

    sizes = [tokens // turns + (1 if i < tokens % turns else 0) for i in range(turns)]
    recs = tuple(TurnRecord(i, 3, (7,) * n, None, "stop", ("a/0",), None, 0, 0, 0.0, 0.0, 0.0)
                 for i, n in enumerate(sizes))
    ids = (1, 2, 3, *(x for r in recs for x in r.token_ids))
    ctl.trajectory_finished(run, TrajectoryResult(run.id, run.group, "done", ids, 3, recs, 0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["g0", "g1", "g2"]), st.integers(1, 400)), max_size=6),
    st.sampled_from(["g0", "g1", "g9"]),
    st.integers(0, 200),
    st.integers(0, 4),
)
def test_prediction_estimates_are_finite_and_bounded(obs, group, made, turns_done) -> None:
    ctl = _controller()
    ctl.start_batch()
    for k, (g, tokens) in enumerate(obs):
        _finish(ctl, _run(f"done{k}", g), tokens)
    made = min(made, 4 * 64)
    out = ctl.predict(_run("x", group, generated=made, turn=turns_done, per_turn=64))
    for est in (out.decode, out.prefill, out.tool, out.turns):
        assert math.isfinite(est.mean) and est.mean >= 0 and math.isfinite(est.spread) and est.spread >= 0
    assert out.decode.mean <= max(4 * 64 - made, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 120), st.data())
def test_first_finished_sibling_predicts_the_rest_and_history_carries_over(total: int, data) -> None:
    ctl = _controller()
    ctl.start_batch()
    assert ctl.predict(_run("a", per_turn=64)).source == "default"  # the item's budget prior
    _finish(ctl, _run("b", per_turn=64), total)
    made = data.draw(st.integers(0, total // 2))  # well before the end (past it, the survival rule applies)
    out = ctl.predict(_run("c", generated=made, per_turn=64))
    assert out.source == "group"
    assert out.decode.mean == pytest.approx(total - made)
    # Another prompt has no finished sibling: the mean over every finished trajectory stands in.
    assert ctl.predict(_run("d", group="other", per_turn=64)).source == "global"
    # Next batch: the group restarts, the prompt's history predicts it.
    ctl.start_batch()
    nxt = ctl.predict(_run("e", per_turn=64))
    assert nxt.source == "history" and nxt.decode.mean == pytest.approx(total)


def test_a_running_sibling_past_the_finished_ones_raises_the_groups_prediction() -> None:
    """Group survival in the controller, as in the simulator's policy: at a snapshot the most advanced unfinished
    run of a group is its floor (``group_floors``), also once a sibling has finished (it finished first)."""

    async def go() -> tuple[float, float, float]:
        ctl = _controller()
        ctl.start_batch()
        _finish(ctl, _run("short", per_turn=256, max_turns=8), 60)  # the group's first finisher: 60 tokens
        ahead = _run("ahead", generated=400, turn=2, per_turn=256, max_turns=8)
        pending = _run("pending", per_turn=256, max_turns=8)
        ctl.runs = {"ahead": ahead, "pending": pending}
        before = ctl.predict(pending).decode.mean  # no snapshot yet: the finished sibling alone
        ctl.snapshot()
        return before, ctl.predict(pending).decode.mean, ctl.path(pending)

    before, after, path = asyncio.run(go())
    assert before == pytest.approx(60.0)
    assert after == pytest.approx((1.0 + SURVIVAL) * 400.0)  # 600: the running sibling has done 400
    assert path > 0


# -- fallback plan and snapshot ------------------------------------------------------------------------------
slot_st = st.builds(
    Slot,
    id=st.sampled_from(["s0", "s1", "s2", "s3"]),
    gpu=st.just("cpu"),
    node=st.just("n"),
    role=st.sampled_from(list(Role)),
    engine=st.sampled_from(list(EngineState)),
    return_by=st.one_of(st.none(), st.floats(0, 100)),
)


@settings(max_examples=60)
@given(st.lists(slot_st, min_size=1, max_size=4, unique_by=lambda s: s.id), st.integers(0, 12), st.data())
def test_fallback_plan_places_everything_and_orders_actions(slots, n, data) -> None:
    ids = [s.id for s in slots]
    trajs = tuple(
        Trajectory(
            f"t{j}",
            f"g{j % 3}",
            Phase.DECODING,
            10,
            data.draw(st.one_of(st.none(), st.sampled_from(ids))),
            Estimate(float(j)),
        )
        for j in range(n)
    )
    snap = ClusterSnapshot(0.0, "tiny", tuple(slots), trajs)
    plan = fallback_plan(snap)
    keep = {s.id for s in slots if s.return_by is None}
    if keep:
        assert set(plan.placement) == {t.id for t in trajs}
        assert set(plan.placement.values()) <= keep
        # New placements go to slots that serve now (a trajectory already on a kept slot stays there).
        warm = {s.id for s in slots if s.return_by is None and s.engine is EngineState.WARM}
        if warm:
            for t in trajs:
                if t.slot not in keep:
                    assert plan.placement[t.id] in warm
    order = [ACTION_ORDER.index(a.kind) for a in plan.actions]
    assert order == sorted(order)
    returned = {a.slot for a in plan.actions if a.kind.value == "return_slot"}
    assert returned == {s.id for s in slots if s.return_by is not None}


def test_snapshot_reflects_slots_runs_and_predictions() -> None:
    async def go() -> ClusterSnapshot:
        ctl = Controller(
            ExecutorConfig(engine=EngineConfig(model="unused"), clock=lambda: 42.0), plan_fn=None
        )
        ctl.add_slot(SlotRuntime("a/0", "node-a", "r", "cpu"))
        gone = SlotRuntime("b/0", "node-b", "r", "cpu")
        ctl.add_slot(gone)
        ctl.lose_slot("b/0")
        item = RolloutItem("t0", (1, 2, 3), group="g", max_turns=3, sampling=SamplingConfig(max_tokens=10))
        run = TrajectoryRun(
            item=item, prompt_ids=[1, 2, 3], context=[1, 2, 3, 4, 5], home="b/0", generated=2, turn=1
        )
        ctl.runs = {"t0": run}
        return ctl.snapshot()

    snap = asyncio.run(go())
    assert snap.time == 42.0 and [s.id for s in snap.slots] == ["a/0"]
    assert snap.slots[0].engine is EngineState.NONE and snap.slots[0].role is Role.OFF
    (t,) = snap.trajectories
    assert t.slot is None  # its KV was on the lost slot
    assert t.context_tokens == 5 and t.phase is Phase.PREFILL_PENDING
    assert 0 < t.remaining_decode_tokens.mean <= 3 * 10 - 2


def test_manual_role_switch_is_not_undone_by_a_plan_solved_before_it() -> None:
    """A re-plan in flight (solved on the state before a manual switch) lands before the switch, never after
    it: the switch's roles and moves are the last word (``Controller.set_roles`` holds the plan lock)."""
    release = threading.Event()

    def stale_plan(snap: ClusterSnapshot, **_: object) -> Plan:
        release.wait(10)  # still solving when the switch comes
        return Plan(snap.time, {"a/0": Role.MIXED, "b/0": Role.MIXED}, {"t0": "a/0"},
                    tuple(Action(ActionKind.SWITCH_ROLE, s, role=Role.MIXED) for s in ("a/0", "b/0")),
                    0.0, 0.0, 0.0, 0.0, (), SolveStatus.FEASIBLE, "stale")

    async def go() -> tuple[Role, Role, str | None, bool]:
        ctl = Controller(ExecutorConfig(engine=EngineConfig(model="unused"), clock=lambda: 0.0), plan_fn=stale_plan)
        for sid in ("a/0", "b/0"):
            ctl.add_slot(SlotRuntime(sid, f"node-{sid[0]}", "r", "cpu"))
        run = _run("t0")
        run.placement = "a/0"
        ctl.runs = {"t0": run}
        replan = asyncio.create_task(ctl.replan("interval"))
        while not ctl._plan_lock.locked():
            await asyncio.sleep(0)
        switch = asyncio.create_task(ctl.set_roles({"a/0": Role.PREFILL, "b/0": Role.DECODE}))
        await asyncio.sleep(0.05)
        waited = not switch.done()
        release.set()
        await asyncio.gather(replan, switch)
        return ctl.slots["a/0"].role, ctl.slots["b/0"].role, run.placement, waited

    a, b, placed, waited = asyncio.run(go())
    assert waited, "the switch did not wait for the plan in flight"
    assert (a, b, placed) == (Role.PREFILL, Role.DECODE, "b/0")


def test_emptying_a_slot_counts_a_failed_move_and_makes_the_others() -> None:
    moved: list[str] = []

    async def go() -> Controller:
        ctl = _controller()
        for sid, role in (("a/0", Role.PREFILL), ("b/0", Role.DECODE)):
            ctl.add_slot(SlotRuntime(sid, f"node-{sid[0]}", "r", "cpu", role=role))
        ctl.runs = {f"t{i}": _run(f"t{i}") for i in range(3)}
        for r in ctl.runs.values():
            r.placement = "a/0"
        real = ctl.migrate

        async def migrate(traj: str, target: str, **kw: object) -> None:
            if traj == "t1":
                ctl.slots["b/0"].lost = True  # the target vanished under this one move
                try:
                    await real(traj, target, kv=False)
                finally:
                    ctl.slots["b/0"].lost = False
            moved.append(traj)
            await real(traj, target, kv=False)

        ctl.migrate = migrate  # type: ignore[method-assign]
        await ctl.empty_slot(ctl.slots["a/0"])
        return ctl

    ctl = asyncio.run(go())
    assert ctl.stats.moves_failed == 1 and moved == ["t0", "t2"]
    assert {r.id: r.placement for r in ctl.runs.values()} == {"t0": "b/0", "t1": "a/0", "t2": "b/0"}


def test_a_failed_kv_export_is_counted_and_the_move_still_made(tmp_path: Path) -> None:
    """A trajectory in a tool call moves at once; when its source cannot re-store its KV through the
    connector, the move is still made (the target recomputes) and the failure counted."""

    class Remote:
        def __init__(self, fail: bool) -> None:
            self.fail, self.calls = fail, 0

        async def remote(self, *args: object) -> dict:
            self.calls += 1
            if self.fail:
                raise ConnectionError("engine gone")
            return {"token_ids": [1], "finish_reason": "length"}

    async def go(fail: bool) -> tuple[Controller, TrajectoryRun, int]:
        engine = EngineConfig(model="unused", connector=KVConnectorConfig(kind="example", storage_path=str(tmp_path)))
        ctl = Controller(ExecutorConfig(engine=engine, clock=lambda: 0.0), plan_fn=None)
        gen = Remote(fail)
        src = SlotRuntime("a/0", "node-a", "r", "cpu", role=Role.MIXED)
        handle = SimpleNamespace(serving=True, alive=True, actor=SimpleNamespace(generate=gen))
        src.engine = handle  # type: ignore[assignment]  # an engine handle whose actor's generate we script
        ctl.add_slot(src)
        ctl.add_slot(SlotRuntime("b/0", "node-b", "r", "cpu", role=Role.MIXED))
        run = _run("t0")
        run.placement = run.home = "a/0"  # between turns (no request in flight), its KV on a/0
        ctl.runs = {"t0": run}
        await ctl.migrate("t0", "b/0", kv=True)
        return ctl, run, gen.calls

    for fail in (False, True):
        ctl, run, calls = asyncio.run(go(fail))
        assert calls == 1 and run.placement == "b/0" and run.home is None and not run.kv_move
        assert ctl.stats.kv_exports_failed == int(fail)


# -- perf, config ----------------------------------------------------------------------------------------------
def test_measured_perf_fits_profile_records() -> None:
    recs = [
        {"phase": "decode", "batch": b, "kv_tokens": 64, "seconds": 0.005 + 0.001 * b} for b in (1, 4, 16)
    ]
    recs += [{"phase": "prefill", "prompt_tokens": [n], "seconds": 0.002 + 1e-4 * n} for n in (10, 100)]
    recs += [{"phase": "engine_start", "seconds": s} for s in (30.0, 40.0, 50.0)]
    recs += [{"phase": "kv_transfer", "seconds": 0.01 + 1e-4 * n, "tokens": n} for n in (32, 64)]
    base = MeasuredPerfModel(gpu_kind("cpu"), model_spec("tiny"))
    m = from_profile_records(recs, base)
    assert m.decode_step_time(8, 64) == pytest.approx(0.013)
    assert m.prefill_time([50]) == pytest.approx(0.007)
    assert m.cold_start_time() == 40.0
    assert m.kv_transfer_time(100, False) == pytest.approx(0.02)
    assert m.kv_capacity_tokens() == (64 << 20) // model_spec("tiny").kv_bytes_per_token


def test_measured_step_time_has_the_protocol_special_cases() -> None:
    from rollplan.models import UserInputError

    m = MeasuredPerfModel(gpu_kind("cpu"), model_spec("tiny"))
    assert m.step_time(0, 0, 8, 8 * 100.0) == pytest.approx(m.decode_step_time(8, 100.0))
    assert m.step_time(64, 32, 0, 0) == pytest.approx(m.prefill_time([64], [32]))
    mixed = m.step_time(64, 0, 8, 800.0)
    assert m.decode_step_time(8, 100.0) < mixed < m.decode_step_time(8, 100.0) + m.prefill_time([64])
    with pytest.raises(UserInputError, match="decode_seqs"):
        m.step_time(0, 0, -1, 0)


def test_measured_provider_reads_a_profile_file(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"phase": "wake", "seconds": s}) for s in (0.1, 0.3, 0.2)) + "\n")
    perf = measured_provider("tiny", profile=f, engine_start=3.0)("cpu", 1)
    assert perf.wake_time() == pytest.approx(0.2) and perf.cold_start_time() == 3.0


def test_engine_settings_follow_the_cpu_notes(tmp_path: Path) -> None:
    cfg = EngineConfig(model="m", connector=KVConnectorConfig(storage_path=str(tmp_path)))
    kw = cfg.engine_kwargs(sleep_mode_available=False)
    assert kw["dtype"] == "float32" and kw["max_model_len"] == 512 and kw["enforce_eager"]
    assert kw["kv_cache_memory_bytes"] == 64 << 20 and not kw["enable_sleep_mode"]
    assert kw["kv_transfer_config"] == {
        "kv_connector": "AtomicFileConnector",
        "kv_connector_module_path": "rollplan.executor.kv_store",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    env = cfg.env_vars()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert "kv_transfer_config" not in EngineConfig(
        model="m", connector=KVConnectorConfig(kind="none")
    ).engine_kwargs(sleep_mode_available=True)


# -- tiny model, CLI ---------------------------------------------------------------------------------------------
def test_tiny_models_share_the_tokenizer_and_differ_in_weights(tiny_model: Path, tiny_model_v1: Path) -> None:
    assert (tiny_model / "tokenizer.json").read_bytes() == (tiny_model_v1 / "tokenizer.json").read_bytes()
    assert (tiny_model / "model.safetensors").read_bytes() != (
        tiny_model_v1 / "model.safetensors"
    ).read_bytes()
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        2,
        128,
        1,
        1024,
    )


def test_bench_executor_is_registered_without_importing_vllm() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from rollplan.solver.cli import main; rc = main(['bench', 'executor', '--help']);"
        "assert 'vllm' not in sys.modules and 'ray' not in sys.modules, 'heavy import'; sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--profile-out" in out.stdout


def test_unknown_executor_policy_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.models.errors import UnknownNameError
    from rollplan.solver.cli import main

    with pytest.raises(UnknownNameError, match="elastic-plus"):
        ExecutorConfig(engine=EngineConfig(model="unused"), policy="elastic")
    assert main(["bench", "executor", "--policy", "elastic"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "To fix:" in err and "rollplan" in err
