"""The rollplan policy's solve time is charged in simulated time (``RollplanPolicy.charge_solve``).

Invariants checked:
- a plan takes effect exactly ``time_limit`` simulated seconds after the state it was solved on, while the
  slots keep running (the batch's first plan gates its start: the rollout is longer by exactly the charge);
- plans never overlap: no plan is solved while another is being solved; re-plans asked for meanwhile are
  made when it lands, as one;
- uncharged (``charge_solve=False``), a plan takes effect at the instant it was solved on;
- a batch that ends while its plan is solved drops that plan.
"""

from __future__ import annotations

import pytest

from rollplan.models.errors import RollplanError
from rollplan.sim.lending import LendingConfig
from rollplan.sim.policies import RollplanPolicy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy
from rollplan.sim.traces import synthetic_spot_trace


def _scenario(**kw) -> Scenario:
    src = BatchSource.dataset(builtin_bases(3, prompts=8), groups=4, samples=4, seed=3, max_context=40960)
    defaults = dict(name="charge", batches=src, dedicated=2, max_batches=1, replan_interval_s=60.0, seed=3)
    defaults.update(kw)
    return Scenario(**defaults)


class _Timed(RollplanPolicy):
    """The rollplan policy, recording when each plan is solved (on the state at that instant) and when it
    takes effect."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.solved: list[float] = []
        self.applied: list[float] = []
        self.coalesced = 0
        self.dropped: list[float] = []  # plans whose batch ended while they were solved: when they would land

    def decide(self, sim, reason):
        before = self._token
        super().decide(sim, reason)
        if self._token != before or not self.charge_solve:
            self.solved.append(sim.now)

    def on_replan(self, sim, reason):
        if self._solving is not None and self._solving[1] == sim.batch:
            self.coalesced += 1
        super().on_replan(sim, reason)

    def on_plan_ready(self, sim, token):
        if self._solving is not None and self._solving[0] == token and (
                self._solving[1] != sim.batch or not sim.batch_active):
            self.dropped.append(sim.now)
        super().on_plan_ready(sim, token)

    def _apply(self, sim, plan):
        self.applied.append(sim.now)
        super()._apply(sim, plan)


@pytest.mark.parametrize("limit", [0.5, 30.0])
def test_first_plan_gates_the_batch_by_exactly_its_charge(limit: float) -> None:
    # The dedicated slots start off; nothing runs until the first plan brings them up, so the rollout is
    # longer by the charge, to the microsecond (the physics after it is the same: the same one plan on the
    # same state; no interval re-plan, which would see the two runs at different points of their batch).
    sc = _scenario(replan_interval_s=1e9)
    free = run_policy(sc, RollplanPolicy(backend="greedy", time_limit=limit, charge_solve=False)).summary
    paid = run_policy(sc, RollplanPolicy(backend="greedy", time_limit=limit)).summary
    assert paid["batches"][0]["rollout_s"] == pytest.approx(free["batches"][0]["rollout_s"] + limit, abs=1e-6)
    assert paid["trajectories_completed"] == free["trajectories_completed"] == 16


def test_plans_land_their_time_limit_later_and_never_overlap() -> None:
    # Preemptible GPUs come and go (notices, arrivals): re-plans are asked for while a plan is being solved.
    limit = 7.0
    trace = synthetic_spot_trace(3000.0, 4, 1, mean_alloc_gap_s=40.0, mean_preempt_gap_s=40.0, notice_s=5.0)
    sc = _scenario(dedicated=1, trace=trace, max_batches=2, lending=LendingConfig(gpus=0))
    pol = _Timed(backend="greedy", time_limit=limit)
    s = run_policy(sc, pol).summary
    assert s["trajectories_completed"] == 32
    assert len(pol.solved) >= 5
    # Every solved plan lands exactly limit later, or is dropped then because its batch ended meanwhile.
    assert len(pol.applied) + len(pol.dropped) == len(pol.solved)
    assert sorted(pol.applied + pol.dropped) == pytest.approx([t + limit for t in pol.solved], abs=1e-9)
    # No overlap: the next solve starts no earlier than the previous plan landed.
    for t0, t1 in zip(pol.solved, pol.solved[1:], strict=False):
        assert t1 >= t0 + limit - 1e-9
    assert pol.coalesced > 0  # the re-plans asked for during a solve were exercised


def test_uncharged_plans_take_effect_when_solved() -> None:
    pol = _Timed(backend="greedy", time_limit=5.0, charge_solve=False)
    run_policy(_scenario(), pol)
    assert pol.solved and pol.applied == pol.solved


def test_a_failed_plan_is_charged_too_and_the_fallback_runs() -> None:
    # One trajectory the prior predicts longer than the slot's KV: every plan fails (InfeasiblePlanError) and
    # the policy starts the slots MIXED itself, once the solve's time has passed.
    class _Failing(_Timed):
        def _apply(self, sim, plan):
            self.errors = getattr(self, "errors", 0) + isinstance(plan, RollplanError)
            super()._apply(sim, plan)

    from rollplan.sim.engine import SimTraj

    big = SimTraj("big", "g0", 300_000, (0,), (10,), (0.0,))
    ok = SimTraj("ok", "g0", 1000, (0,), (10,), (0.0,))
    sc = Scenario("fail", BatchSource((ok, big)), dedicated=1, max_batches=1)
    pol = _Failing(backend="greedy", time_limit=3.0)
    s = run_policy(sc, pol).summary
    assert s["trajectories_completed"] == 2
    assert pol.applied and pol.applied[0] == pytest.approx(pol.solved[0] + 3.0)
