"""The bench's rollout floor (``bench_replay.batch_floors``): a lower bound on any policy's batch rollout.

Invariants checked:
- ``traj_floor`` by hand: decode tokens at batch 1 at the context each turn starts with, plus every tool wait
  (the one after the last turn too: a trajectory finishes after it); with folding, a fold group's tokens at
  the context the group starts with;
- ``traj_tokens_by`` (hypothesis, random courses): 0 at 0 s, every token from the floor on, never decreasing
  in time, never below the unfolded course's (folding only moves waits later and contexts earlier) and the
  floor never above it;
- on a small replay with churn and lending, every policy's rollout of every completed batch is >= its floor;
  the bench's ``--per-batch`` columns (``per_batch_rows``) carry those floors, rollouts and tail shares;
- ``throughput_ceiling``: batch k+1's earliest start is batch k's plus its floor plus the training step (sync)
  or the chain of training steps (async); the batch the window's end cuts counts what its courses decode by
  then, less than all its tokens; on windows that end mid-batch, in both modes, no policy's throughput (nor
  the oracle reference's) exceeds it;
- a window's throughput is measured over the whole window: every policy's replay ends at the window's end,
  not at its last event before it (which let a policy whose last event came early divide by less).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.sim.bench_replay import (
    batch_floors,
    per_batch_rows,
    throughput_ceiling,
    trace_row,
    traj_floor,
    traj_tokens_by,
)
from rollplan.sim.engine import SimConfig, SimTraj
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import ORACLE, POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_replay
from rollplan.sim.traces import synthetic_spot_trace


def test_traj_floor_by_hand() -> None:
    spec = SimTraj("t", "g", 100, prefill=(10, 20), decode=(5, 7), tool=(3.0, 9.0))

    def step(b: int, kv: float) -> float:
        assert b == 1
        return 0.001 * kv

    # turn 0 starts at 110 tokens, turn 1 at 110 + 5 + 20 = 135; tool 3 s between them, 9 s after the last.
    assert traj_floor(spec, step) == pytest.approx(5 * 0.110 + 3.0 + 7 * 0.135 + 9.0)
    # Folding waits <= 5 s: both turns are one group, decoded back to back at 110 tokens, then both waits.
    assert traj_floor(spec, step, 5.0) == pytest.approx(12 * 0.110 + 3.0 + 9.0)
    # Tokens by a time: turn 0 ends at 0.55 s, turn 1 starts at 3.55 s.
    assert traj_tokens_by(spec, step, 0.0) == 0.0
    assert traj_tokens_by(spec, step, 0.22) == pytest.approx(2.0)
    assert traj_tokens_by(spec, step, 2.0) == pytest.approx(5.0)
    assert traj_tokens_by(spec, step, 3.55 + 0.27) == pytest.approx(7.0)
    assert traj_tokens_by(spec, step, 1e6) == 12.0
    # Folded: the 12 tokens come first (1.32 s), the waits after them.
    assert traj_tokens_by(spec, step, 1.1, 5.0) == pytest.approx(10.0)


def _affine_step(b: int, kv: float) -> float:
    return 0.005 + 0.0001 * b + 1e-7 * b * kv


_turns = st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 800), st.floats(0.0, 60.0)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(prompt=st.integers(1, 5000), turns=_turns, fold=st.sampled_from([0.0, 5.0, 30.0, float("inf")]),
       times=st.lists(st.floats(0.0, 2000.0), min_size=1, max_size=8))
def test_tokens_by_is_a_course(prompt: int, turns: list[tuple[int, int, float]], fold: float,
                               times: list[float]) -> None:
    spec = SimTraj("t", "g", prompt, prefill=tuple(p for p, _, _ in turns), decode=tuple(d for _, d, _ in turns),
                   tool=tuple(w for _, _, w in turns))
    total = sum(spec.decode)
    floor = traj_floor(spec, _affine_step, fold)
    assert traj_tokens_by(spec, _affine_step, 0.0, fold) == 0.0
    assert traj_tokens_by(spec, _affine_step, floor, fold) == pytest.approx(total)
    # Folding only moves waits after tokens and prices tokens at an earlier context: never slower.
    assert floor <= traj_floor(spec, _affine_step) + 1e-9
    prev = 0.0
    for t in sorted(times):
        got = traj_tokens_by(spec, _affine_step, t, fold)
        assert prev - 1e-9 <= got <= total + 1e-9
        assert got >= traj_tokens_by(spec, _affine_step, t) - 1e-6
        prev = got


def test_no_policy_beats_the_floor() -> None:
    trace = synthetic_spot_trace(2 * 3600, max_gpus=4, seed=3, mean_alloc_gap_s=300, mean_preempt_gap_s=300)
    src = BatchSource.dataset(builtin_bases(3, prompts=16), groups=4, samples=4, seed=3, max_context=40960)
    sc = Scenario("floor", src, dedicated=2, trace=trace,
                  lending=LendingConfig(gpus=2, train_step_s=60.0, mode=LendMode.SYNC), max_batches=2,
                  sim=SimConfig(fold_tool_s=5.0), replan_interval_s=60.0, seed=3)
    res = run_replay(sc, [make_policy(n) for n in POLICY_NAMES])
    checked = 0
    for run in res.runs:
        done = {b["index"]: b["rollout_s"] for b in run.summary["batches"] if b["rollout_s"] is not None}
        floors = batch_floors(sc, sorted(done))
        for i, rollout in done.items():
            assert floors[i] > 0
            assert rollout >= floors[i] - 1e-6, (run.name, i, rollout, floors[i])
            checked += 1
    assert checked >= len(POLICY_NAMES)
    # The bench's --per-batch columns: the same floors, each policy's rollouts and tail shares by batch index.
    pb = trace_row("floor", res, per_batch=True)["per_batch"]
    assert pb == per_batch_rows(res)
    n = len(pb["floor_s"])
    assert pb["floor_s"] == [round(f, 1) for f in batch_floors(sc, range(n)).values()]
    for run in res.runs:
        rows = run.summary["batches"]
        assert pb["rollout_s"][run.name] == [b["rollout_s"] for b in rows]
        assert pb["tail_share"][run.name] == [b["tail_share"] for b in rows]
        assert len(rows) <= n
    # Only rollplan sets an admission regime; its column has one entry per batch it started.
    assert set(pb["regime"]) == {"rollplan"}
    rp = next(r for r in res.runs if r.name == "rollplan")
    assert pb["regime"]["rollplan"] == [b["regime"] for b in rp.summary["batches"]]
    assert all(r is not None and r["first"] in ("bulk", "path") for r in pb["regime"]["rollplan"])
    assert "per_batch" not in trace_row("floor", res)
    # The row carries what each replay counted (evictions, KV lost, migrations, moves not carried out).
    assert trace_row("floor", res)["counters"] == {r.name: r.summary["counters"] for r in res.runs}


def _ceiling_scenario(mode: LendMode, duration_s: float | None = None) -> Scenario:
    trace = synthetic_spot_trace(2 * 3600, max_gpus=4, seed=5, mean_alloc_gap_s=300, mean_preempt_gap_s=300)
    src = BatchSource.dataset(builtin_bases(5, prompts=16), groups=4, samples=4, seed=5, max_context=40960)
    return Scenario("ceiling", src, dedicated=2, trace=trace,
                    lending=LendingConfig(gpus=2, train_step_s=60.0, mode=mode), duration_s=duration_s,
                    sim=SimConfig(fold_tool_s=5.0), replan_interval_s=60.0, seed=5)


@pytest.mark.parametrize("mode", [LendMode.SYNC, LendMode.ASYNC])
def test_ceiling_chains_floors_through_training_steps(mode: LendMode) -> None:
    sc = _ceiling_scenario(mode)
    f = batch_floors(sc, [0, 1, 2])
    tokens = [sum(sum(sp.decode) for sp in sc.batches.batch(k)[0]) for k in range(3)]
    if mode is LendMode.SYNC:  # rollout k+1 starts when training step k ends
        starts = [0.0, f[0] + 60.0, f[0] + f[1] + 120.0]
    else:  # step k starts at max(rollout k done, step k-1 end); rollout k+1 starts with step k
        s1 = f[0]
        starts = [0.0, s1, max(s1 + f[1], s1 + 60.0)]
    end = (starts[1] + starts[2]) / 2  # the window ends while batch 1 may run: batches 0 and 1 count
    c = throughput_ceiling(_ceiling_scenario(mode, duration_s=end))
    assert c["batches"] == 2
    assert c["next_batch_earliest_start_s"] == pytest.approx(starts[2], abs=0.1)
    assert c["tokens_per_s"] == pytest.approx((tokens[0] + c["last_batch_share"] * tokens[1]) / end,
                                        abs=1e-4 * tokens[1] / end + 1e-3)  # the share is rounded to 1e-4
    # A window that ends within batch 1's floor counts only part of it; one that ends after counts it whole.
    cut = starts[1] + 0.25 * f[1]
    part = throughput_ceiling(_ceiling_scenario(mode, duration_s=cut))
    assert part["batches"] == 2 and 0.0 < part["last_batch_share"] < 1.0
    assert part["tokens_per_s"] * cut < tokens[0] + tokens[1]
    whole = throughput_ceiling(_ceiling_scenario(mode, duration_s=starts[1] + f[1] + 1.0))
    assert whole["last_batch_share"] == 1.0 or whole["batches"] == 3


@pytest.mark.parametrize("mode", [LendMode.SYNC, LendMode.ASYNC])
def test_no_policy_beats_the_throughput_ceiling(mode: LendMode) -> None:
    sc = _ceiling_scenario(mode, duration_s=1500.0)
    ceiling = throughput_ceiling(sc)
    assert ceiling["last_batch_share"] < 1.0  # the window cuts a batch: the partial count is what is checked
    res = run_replay(sc, [make_policy(n) for n in (*POLICY_NAMES, ORACLE)])
    best = max(run.summary["throughput_tokens_per_s"] for run in res.runs)
    assert 0 < best <= ceiling["tokens_per_s"] + 1e-6, (best, ceiling)
    row = trace_row("tiny", res)  # the bench's row carries the ceiling as a ratio to elastic-colocated
    assert row["throughput_ceiling"] == ceiling
    assert row["rollplan_vs_elastic"] <= row["rollplan_vs_elastic_ceiling"]
    assert row["vs_elastic_reachable"] is (row["rollplan_vs_elastic_ceiling"] >= 1.2)


@pytest.mark.parametrize("duration_s", [1234.5, 2000.0])
def test_throughput_is_over_the_whole_window(duration_s: float) -> None:
    sc = _ceiling_scenario(LendMode.SYNC, duration_s=duration_s)
    res = run_replay(sc, [make_policy(n) for n in POLICY_NAMES])
    for run in res.runs:
        s = run.summary
        assert s["replay_s"] == pytest.approx(duration_s), run.name
        assert s["throughput_tokens_per_s"] == pytest.approx(s["decode_tokens"] / duration_s, abs=1e-3), run.name
