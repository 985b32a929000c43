"""Every replay ends promptly: with a result, or with a one-line user error when it could never progress.

Covers the three ways a replay used to hang: an unknown planner backend (rollplan logged "no plan" at every
tick forever), a policy with no GPU it may use and no end time (ticked forever), and a huge tool wait (one
policy call per re-plan interval all through the wait). Each test carries a timeout so a regression fails
instead of hanging.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollplan.models.errors import UnknownNameError, UserInputError
from rollplan.models.types import AvailabilityEvent, EventKind, Slot, SlotSource
from rollplan.sim.engine import IDLE_TICKS, NoProgressError, SimTraj
from rollplan.sim.lending import LendingConfig
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, run_policy, run_replay
from rollplan.sim.traces import AvailabilityTrace
from rollplan.solver import BACKENDS
from rollplan.solver.cli import main


def _batch(n: int = 4, turns: int = 3) -> BatchSource:
    specs = tuple(SimTraj(f"t{i}", f"g{i // 2}", 2000, (0,) + (300,) * (turns - 1), (200,) * turns,
                          (1.0,) * (turns - 1) + (0.0,)) for i in range(n))
    return BatchSource(specs)


def _spot(i: int) -> Slot:
    return Slot(id=f"spot{i}/g0", gpu="h800", node=f"spot{i}", source=SlotSource.PREEMPTIBLE)


# --- 1. unknown planner backend -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_unknown_backend_is_a_user_error_naming_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        make_policy("rollplan", backend="foo")
    text = str(err.value)
    assert "planner backend 'foo'" in text and "To fix:" in text
    assert all(b in text for b in BACKENDS)
    make_policy("rollplan", backend="greedy")  # a valid one still builds


@pytest.mark.timeout(60)
def test_replay_cli_unknown_backend_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["replay", "--availability", "none", "--workload", "builtin", "--batches", "1", "--groups", "2",
               "--samples", "2", "--policies", "rollplan", "--backend", "foo", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown planner backend 'foo'" in err and "greedy" in err


# --- 2. no capacity the policy may use ----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("dedicated", "lent"), [(0, 0), (0, 4)])
def test_replay_cli_static_policy_without_dedicated_gpus_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dedicated: int, lent: int
) -> None:
    rc = main(["replay", "--availability", "none", "--workload", "builtin", "--batches", "1", "--groups", "2",
               "--samples", "2", "--policies", "static-colocated", "--dedicated", str(dedicated), "--lent", str(lent),
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "static-colocated has no GPU it may use" in err and "--dedicated N >= 1" in err
    assert len(err.splitlines()) == 1


@pytest.mark.timeout(60)
def test_every_policy_without_any_gpu_is_refused_up_front() -> None:
    sc = Scenario("none", _batch(), dedicated=0, max_batches=1)
    for name in POLICY_NAMES:
        with pytest.raises(NoProgressError, match="To fix:"):
            run_policy(sc, make_policy(name))
    # Lent GPUs are enough for the elastic policies; the static ones use dedicated GPUs only.
    lent = Scenario("lent", _batch(), dedicated=0, lending=LendingConfig(gpus=2), max_batches=1)
    assert run_policy(lent, make_policy("elastic-colocated")).summary["trajectories_completed"] == 4
    with pytest.raises(NoProgressError, match="dedicated GPUs only"):
        run_replay(lent, [make_policy("elastic-colocated"), make_policy("static-disagg")])
    assert issubclass(NoProgressError, UserInputError)


@pytest.mark.timeout(60)
def test_scenario_without_any_end_is_refused() -> None:
    sc = Scenario("endless", _batch(), dedicated=1)  # no max_batches, no trace, no duration: batches forever
    with pytest.raises(UserInputError, match="has no end"):
        run_policy(sc, make_policy("static-colocated"))


def _leave_trace(duration: float) -> AvailabilityTrace:
    # Two spot GPUs arrive at 0 and leave for good at 100 s, long before the batch can finish.
    spots = (_spot(0), _spot(1))
    ev = (AvailabilityEvent(0.0, EventKind.ARRIVE, slots=spots),
          AvailabilityEvent(100.0, EventKind.LEAVE, slot_ids=tuple(s.id for s in spots)))
    return AvailabilityTrace("leave", ev, duration, "h800")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["elastic-colocated", "rollplan"])
def test_capacity_gone_for_good_without_end_time_raises(name: str) -> None:
    sc = Scenario("gone", _batch(8, turns=40), dedicated=0, trace=_leave_trace(math.inf), max_batches=1)
    with pytest.raises(NoProgressError) as err:
        run_policy(sc, make_policy(name))
    text = str(err.value)
    assert "batch 0 has 8 of 8 trajectories left" in text and "no GPU is present" in text and "To fix:" in text
    assert err.value.values["time"] <= 100.0 + (IDLE_TICKS + 2) * sc.replan_interval_s


@pytest.mark.timeout(60)
def test_capacity_gone_without_interval_ticks_raises_instead_of_returning_a_partial_batch() -> None:
    sc = Scenario("gone", _batch(8, turns=40), dedicated=0, trace=_leave_trace(math.inf), max_batches=1,
                  replan_interval_s=math.inf)
    with pytest.raises(NoProgressError, match="no GPU is present"):
        run_policy(sc, make_policy("elastic-colocated"))


@pytest.mark.timeout(60)
def test_capacity_gone_for_good_with_end_time_ends_there_with_a_result() -> None:
    # Same stall with a (far) end time: the replay covers the window to its end, without calling the policy
    # at each of the ~8300 ticks.
    sc = Scenario("gone", _batch(8, turns=40), dedicated=0, trace=_leave_trace(1e6), max_batches=1)
    s = run_policy(sc, make_policy("elastic-colocated")).summary
    assert s["trajectories_completed"] == 0
    assert s["replay_s"] == pytest.approx(1e6)
    assert s["replans"]["count"] < 20
    assert s["counters"]["idle_ticks_skipped"] > 8000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["static-colocated", "rollplan"])
def test_trajectory_larger_than_any_gpu_kv_raises(name: str) -> None:
    # 400k tokens of context cannot fit one H800's KV for Qwen3-8B (~360k): it stays pending forever.
    big = SimTraj("big", "g0", 400_000, (0,), (10,), (0.0,))
    ok = SimTraj("ok", "g0", 1000, (0,), (10,), (0.0,))
    sc = Scenario("big", BatchSource((ok, big)), dedicated=1, max_batches=1)
    with pytest.raises(NoProgressError, match="do not fit: the largest needs 400010 KV tokens"):
        run_policy(sc, make_policy(name))


# --- 3. huge tool waits -------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tool_s", [1e6, 1e7])
def test_huge_tool_wait_does_not_tick_densely(tool_s: float) -> None:
    long = SimTraj("long", "g0", 1000, (0, 100), (50, 50), (tool_s, 0.0))
    short = SimTraj("short", "g0", 1000, (0, 100), (300, 50), (2.0, 0.0))
    sc = Scenario("wait", BatchSource((long, short)), dedicated=2, max_batches=1)
    for name in ("rollplan", "static-colocated", "formula-pd"):
        s = run_policy(sc, make_policy(name)).summary
        assert s["trajectories_completed"] == 2, name
        assert tool_s < s["batches"][0]["rollout_s"] < tool_s + 10.0, name
        assert s["replans"]["count"] < 20, name
        assert s["counters"]["idle_ticks_skipped"] > tool_s / sc.replan_interval_s - 20, name


@pytest.mark.timeout(60)
def test_replay_cli_huge_tool_wait_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = tmp_path / "w.jsonl"
    w.write_text('{"id":"t0","group":"g0","prompt_tokens":1000,"turns":[{"prefill_tokens":0,"decode_tokens":50,'
                 '"tool_seconds":10000000.0},{"prefill_tokens":100,"decode_tokens":50,"tool_seconds":0.0}]}\n')
    rc = main(["replay", "--availability", "none", "--workload", str(w), "--batches", "1", "--policies", "rollplan",
               "--dedicated", "1", "--lent", "0", "--out", str(tmp_path / "out"), "--json"])
    assert rc == 0
    assert '"rollplan"' in capsys.readouterr().out
