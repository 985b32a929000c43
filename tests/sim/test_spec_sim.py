"""Grouped speculative decoding in the simulator (SimConfig.spec_*, docs/seer.md).

Checked: with a fixed draft length, a lone trajectory decodes at (decode step + verify extra) / E(A0, k) per
token (hand-computed), and a group's acceptance rises when a sibling finishes (the survivor speeds up); under
every policy on a small random scenario, acceptance 0 with a fixed k is never faster than no speculation,
adaptive drafting at acceptance 0 equals no speculation, and full acceptance is faster; bad options are
one-line errors. The planner's perf (``SpeculativePerf``): decode priced per produced token, never slower than
plain, the step contracts kept, and the rollplan policy hands it to its planner when the slots speculate (at
the acceptance it measured), the plain model otherwise.
"""

from __future__ import annotations

import pytest

from rollplan.models.errors import SchemaError
from rollplan.models.perf import perf_model
from rollplan.models.perf.spec import SpeculativePerf, best_draft_length, expected_tokens_per_step
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj
from rollplan.sim.policies import POLICY_NAMES, RollplanPolicy, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy


def _prefill(p, tokens: int) -> float:
    done, total = 0, 0.0
    while done < tokens:
        n = min(2048, tokens - done)
        total += p.prefill_time([n], [done])
        done += n
    return total


def _one_slot(specs: list[SimTraj], **spec) -> Scenario:
    return Scenario("tiny", BatchSource(tuple(specs)), dedicated=1, max_batches=1,
                    sim=SimConfig(fold_tool_s=0.0, **spec))


def test_lone_trajectory_decodes_at_verify_step_over_expected_tokens() -> None:
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    fp = FastPerf(p, 2048, 40960, 0.9)
    spec = SimTraj("t0", "g0", 1000, (0,), (300,), (0.0,))
    per_token = (p.decode_step_time(1, 1150) + fp.verify_extra(1, 4)) / expected_tokens_per_step(0.5, 4)
    run = run_policy(_one_slot([spec], spec_tokens=4, spec_base_acceptance=0.5, spec_acceptance=0.9,
                               spec_adaptive=False),
                     make_policy("static-colocated"))
    assert run.summary["batches"][0]["rollout_s"] == pytest.approx(_prefill(p, 1000) + 300 * per_token, rel=0.01)


def test_acceptance_rises_when_a_sibling_finishes() -> None:
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    fp = FastPerf(p, 2048, 40960, 0.9)
    specs = [SimTraj("t0", "g0", 1000, (0,), (100,), (0.0,)), SimTraj("t1", "g0", 1000, (0,), (300,), (0.0,))]
    run = run_policy(_one_slot(specs, spec_tokens=4, spec_acceptance=1.0, spec_adaptive=False),
                     make_policy("static-colocated"))
    # Both at acceptance 0 (nothing finished) for 100 tokens, then the survivor at 1.0: 5 tokens per step.
    both = 100 * (p.decode_step_time(2, 1050) + fp.verify_extra(2, 4))
    alone = 200 * (p.decode_step_time(1, 1200) + fp.verify_extra(1, 4)) / 5
    assert run.summary["batches"][0]["rollout_s"] == pytest.approx(_prefill(p, 1000) + both + alone, rel=0.02)


def _random(**spec) -> Scenario:
    src = BatchSource.dataset(builtin_bases(3, prompts=8), groups=4, samples=4, seed=3, max_context=40960)
    return Scenario("r3", src, dedicated=2, max_batches=1, sim=SimConfig(**spec))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_acceptance_never_helps_and_full_acceptance_does(policy: str) -> None:
    def rollout(**spec) -> float:
        run = run_policy(_random(**spec), make_policy(policy))
        assert run.summary["trajectories_completed"] == 16
        return run.summary["batches"][0]["rollout_s"]

    off = rollout()
    assert rollout(spec_tokens=4, spec_acceptance=0.0, spec_adaptive=False) >= off * 0.999
    assert rollout(spec_tokens=4, spec_acceptance=0.0) == pytest.approx(off)  # adaptive: k = 0 at a = 0
    assert rollout(spec_tokens=4, spec_acceptance=1.0, spec_base_acceptance=1.0) < off


@pytest.mark.parametrize("kw", [{"spec_tokens": -1}, {"spec_acceptance": 1.2}, {"spec_base_acceptance": -0.1}])
def test_bad_spec_options_are_one_line_with_a_fix(kw: dict) -> None:
    with pytest.raises(SchemaError, match="To fix:"):
        SimConfig(**kw)


def test_speculative_perf_prices_decode_per_produced_token() -> None:
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    w = SpeculativePerf(p, 0.7, 4)
    for b, kv in ((1, 2000.0), (16, 9000.0), (256, 30000.0)):
        assert w.decode_step_time(b, kv) == best_draft_length(p, b, kv, 0.7, 4).seconds_per_token
        assert w.decode_step_time(b, kv) <= p.decode_step_time(b, kv)
        assert w.step_time(0, 0, b, b * kv) == pytest.approx(w.decode_step_time(b, kv))
        # what a prefill chunk adds to a step is the plain model's
        added = w.step_time(1024, 4000, b, b * kv) - w.decode_step_time(b, kv)
        assert added == pytest.approx(p.step_time(1024, 4000, b, b * kv) - p.decode_step_time(b, kv))
    assert w.step_time(512, 0, 0, 0.0) == p.prefill_time([512], [0])
    assert SpeculativePerf(p, 0.0, 4).decode_step_time(8, 4000.0) == p.decode_step_time(8, 4000.0)
    assert w.kv_capacity_tokens() == p.kv_capacity_tokens() and w.cold_start_time() == p.cold_start_time()
    with pytest.raises(SchemaError, match="To fix:"):
        SpeculativePerf(p, 1.5, 4)


def test_rollplan_planner_prices_speculation_when_slots_speculate() -> None:
    seen: dict[str, object] = {}

    for name, spec in (("off", {}), ("on", {"spec_tokens": 4, "spec_acceptance": 0.8})):
        pol = make_policy("rollplan")
        assert isinstance(pol, RollplanPolicy)
        run = run_policy(_random(**spec), pol)
        assert run.summary["trajectories_completed"] == 16
        seen[name] = pol.planner.config.perf("h800", 1)
    assert not isinstance(seen["off"], SpeculativePerf)
    on = seen["on"]
    assert isinstance(on, SpeculativePerf) and on.k == 4 and 0.0 < on.acceptance <= 0.8
