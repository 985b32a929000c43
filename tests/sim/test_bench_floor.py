"""The bench's rollout floor (``bench_replay.batch_floors``): a lower bound on any policy's batch rollout.

Invariants checked:
- ``traj_floor`` by hand: decode tokens at batch 1 at the context each turn starts with, plus every tool wait
  (the one after the last turn too: a trajectory finishes after it);
- on a small replay with churn and lending, every policy's rollout of every completed batch is >= its floor.
"""

from __future__ import annotations

import pytest

from rollplan.sim.bench_replay import batch_floors, traj_floor
from rollplan.sim.engine import SimConfig, SimTraj
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_replay
from rollplan.sim.traces import synthetic_spot_trace


def test_traj_floor_by_hand() -> None:
    spec = SimTraj("t", "g", 100, prefill=(10, 20), decode=(5, 7), tool=(3.0, 9.0))

    def step(b: int, kv: float) -> float:
        assert b == 1
        return 0.001 * kv

    # turn 0 starts at 110 tokens, turn 1 at 110 + 5 + 20 = 135; tool 3 s between them, 9 s after the last.
    assert traj_floor(spec, step) == pytest.approx(5 * 0.110 + 3.0 + 7 * 0.135 + 9.0)


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
