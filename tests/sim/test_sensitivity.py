"""`rollplan bench sensitivity`: the rollplan policy's constants moved one at a time on held-out scenarios.

Invariants checked:
- each constant's option reaches the policy's decisions (``dispatch_z``: the dispatch key is the predicted
  mean at 0 and grows with z; ``critical_share``: the predicted-critical set shrinks as the share rises;
  ``path_z``: the planner prices the same first state's critical paths longer at 3 spreads than at 0;
  ``regime``: "share" is the work bound against ``BULK_SHARE`` of the longest path at every plan, "model"
  decides otherwise at some plan; an unknown regime is a one-line error);
- a variant at the default's value reproduces the default exactly (the ratio is 1: the runs are
  deterministic and the option is the only difference).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollplan.policy.dispatch import CRITICAL_SHARE, KV_HEADROOM
from rollplan.sim.bench_sensitivity import HeldOut, run_sensitivity
from rollplan.sim.policies import RollplanPolicy, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy


class _Paths:
    """Records the policy's dispatch keys (pessimistic paths) and predicted-critical sets at each plan."""

    @staticmethod
    def run(**options) -> tuple[list[dict[int, float]], list[int]]:
        pol = make_policy("rollplan", backend="greedy", time_limit=0.02, **options)
        assert isinstance(pol, RollplanPolicy)
        keys: list[dict[int, float]] = []
        crit: list[int] = []
        decide = pol.decide

        def spy(sim, reason):
            decide(sim, reason)
            keys.append(dict(pol._cp))
            pol._crit = None
            crit.append(len(pol._critical()))

        pol.decide = spy  # type: ignore[method-assign]
        src = BatchSource.dataset(builtin_bases(2, prompts=8), groups=4, samples=4, seed=2, max_context=40960)
        run_policy(Scenario("s", src, dedicated=2, max_batches=2, warmup_batches=2, seed=2), pol)
        return keys, crit


def test_dispatch_z_and_critical_share_reach_the_decisions() -> None:
    # The first plan of the first batch sees the same state whatever z is (later ones follow what it did).
    k0 = _Paths.run(dispatch_z=0.0)[0][0]
    k3 = _Paths.run(dispatch_z=3.0)[0][0]
    assert k0.keys() == k3.keys() and k0
    assert all(k3[j] >= k0[j] for j in k0)  # spreads added: every key at least the mean
    assert sum(k3.values()) > sum(k0.values())
    _, c_low = _Paths.run(critical_share=0.3)
    _, c_high = _Paths.run(critical_share=0.99)
    assert sum(c_low) > sum(c_high) > 0


@pytest.mark.slow
def test_a_variant_at_the_default_value_reproduces_the_default(shared_data: Path) -> None:
    doc = run_sensitivity(shared_data, scenarios=(HeldOut("t", 21, 9),), hours=0.5, jobs=1,
                          variants=(("kv_headroom", "KV_HEADROOM", KV_HEADROOM),
                                    ("critical_share", "CRITICAL_SHARE", CRITICAL_SHARE),
                                    ("kv_headroom", "KV_HEADROOM", 0.0)))
    rows = doc["rows"]
    assert rows[0]["over_default"]["t"] == rows[1]["over_default"]["t"] == 1.0
    assert doc["scenarios"]["t"]["default_tokens_per_s"] > 0
    assert set(doc["best_other_over_default"]) == {"t"}


def test_path_z_reaches_the_plans() -> None:
    """``path_z`` is the rollplan policy's planner option: the first plan of the same state reports a longer
    makespan with the critical paths at 3 spreads than at the means (the snapshots carry the spreads)."""
    spans: dict[float, float] = {}
    for z in (0.0, 3.0):
        pol = make_policy("rollplan", backend="greedy", time_limit=0.02, path_z=z)
        assert isinstance(pol, RollplanPolicy)
        first: list[float] = []
        decide = pol.decide

        def spy(sim, reason, decide=decide, pol=pol, first=first):
            decide(sim, reason)
            if not first and pol.planner.previous is not None:
                first.append(pol.planner.previous.makespan)

        pol.decide = spy  # type: ignore[method-assign]
        src = BatchSource.dataset(builtin_bases(2, prompts=8), groups=4, samples=4, seed=2, max_context=40960)
        run_policy(Scenario("s", src, dedicated=2, max_batches=1, warmup_batches=2, seed=2), pol)
        assert pol.planner.config.path_z == z
        spans[z] = first[0]
    assert spans[3.0] > spans[0.0]


def test_regime_reaches_the_decisions() -> None:
    from rollplan.models.errors import UnknownNameError
    from rollplan.policy.dispatch import BULK_SHARE
    from rollplan.solver.core.bounds import BOUND_WORK

    seen: dict[str, list[tuple[bool, bool]]] = {}
    for regime in ("model", "share"):
        pol = make_policy("rollplan", backend="greedy", time_limit=0.02, regime=regime)
        assert isinstance(pol, RollplanPolicy)
        got: list[tuple[bool, bool]] = []
        apply = pol._apply

        def spy(sim, plan, apply=apply, pol=pol, got=got):
            apply(sim, plan)
            if pol._cp and hasattr(plan, "bounds"):
                got.append((pol._bulk_bound, plan.bounds.get(BOUND_WORK, 0.0) >= BULK_SHARE * max(pol._cp.values())))

        pol._apply = spy  # type: ignore[method-assign]
        src = BatchSource.dataset(builtin_bases(5, prompts=24), groups=12, samples=8, seed=5, max_context=40960)
        run_policy(Scenario("s", src, dedicated=3, max_batches=2, warmup_batches=2, seed=5), pol)
        seen[regime] = got
    assert seen["share"] and all(a == b for a, b in seen["share"])
    assert any(a != b for a, b in seen["model"])
    with pytest.raises(UnknownNameError, match="regime"):
        make_policy("rollplan", regime="shares")
