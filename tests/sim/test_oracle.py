"""The ``rollplan-oracle`` reference (``OracleRollplan``, ``rollplan bench replay --oracle``).

Checked:
- its predictions are each trajectory's true remaining course: at queueing, the dispatch key is the true path
  at the reference step (no spread); in every planner snapshot, each trajectory's remaining decode tokens,
  tool seconds and turns are its true totals less what it has done, with spreads of 0, and siblings of one
  prompt get their own (different) lengths, not a shared prediction;
- it is a reference, not a policy: not in ``POLICY_NAMES``, never the best other policy, left out of the
  other figures of a bench cell, and reported apart with its share of what is left (by hand from the cell)
  and, with ``--per-batch``, its batches beside the policies';
- ``share_any_ceiling_allows`` by hand, and (hypothesis) no ceiling at least every schedule's throughput gives
  rollplan a larger share; on a real cell, rollplan's share is within it;
- the CLI flag adds it; with a lever comparison it is a one-line error;
- the ``rollplan-oracle-started`` reference (``StartedOracleRollplan``): a trajectory that has not started gets
  exactly the rollplan policy's prediction (the same predictor state: no true length leaks before a sample
  runs), one that has started gets its true remaining course; it is reported under the cell's
  ``oracle.started`` (share and part of the oracle's gain by hand, ``share_of_gain`` by hand) and counted in
  the summary;
- a schedule that decodes exactly the ceiling's tokens (the started oracle in one async Parcae hour) is not
  printed above it (the ceiling is rounded up).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollplan.policy.dispatch import pessimistic_path
from rollplan.sim.bench_replay import (
    matrix_scenario,
    matrix_workload,
    run_matrix,
    share_any_ceiling_allows,
    share_of_gain,
    share_of_what_is_left,
    throughput_ceiling,
)
from rollplan.sim.policies import (
    ORACLE,
    ORACLE_STARTED,
    ORACLES,
    POLICY_NAMES,
    OracleRollplan,
    RollplanPolicy,
    StartedOracleRollplan,
    make_policy,
)
from rollplan.sim.replay import run_policy, swebench_bases
from rollplan.solver.cli import main


def _assert_true_course(tr: Any, t: Any, sim: Any) -> None:
    """The snapshot's trajectory ``tr`` predicts the replay's trajectory ``t``'s true remaining course."""
    dec, turns, tool, _ctx = sim.progress(t)
    assert tr.remaining_decode_tokens.mean == pytest.approx(max(0.0, sum(t.spec.decode) - dec))
    assert tr.remaining_tool_seconds.mean == pytest.approx(max(0.0, sum(t.spec.tool) - tool))
    assert tr.remaining_turns.mean == max(1, t.n - turns)
    assert tr.remaining_decode_tokens.spread == tr.remaining_tool_seconds.spread == 0.0


def _audited_run(shared_data: Path, mode: str, audit: Any) -> Any:
    """``audit`` replayed on a 6-minute parcae-hh window of the 32x8-no-history workload."""
    sc = matrix_scenario(shared_data, "parcae-hh", mode, matrix_workload("32x8-no-history"),
                         bases=swebench_bases(shared_data), window_h=0.1)
    return run_policy(sc, audit)


class _Audit(OracleRollplan):
    """The oracle, checking its own predictions against the replay's true courses as it makes them."""

    def __init__(self) -> None:
        super().__init__()
        self.keys_checked = 0
        self.snapshots_checked = 0
        self.group_keys: dict[str, set[float]] = {}

    def enqueued(self, sim: Any, j: int) -> None:
        super().enqueued(sim, j)
        t = sim.trajs[j]
        if t.decoded == 0 and t.turn == 0:  # queued at its start: nothing done yet
            want = pessimistic_path(float(sum(t.spec.decode)), 0.0, float(sum(t.spec.tool)), 0.0, self._a_ref)
            assert self._cp[j] == pytest.approx(want, rel=1e-9)
            self.group_keys.setdefault(t.group, set()).add(round(self._cp[j], 6))
            self.keys_checked += 1

    def snapshot(self, sim: Any) -> Any:
        snap = super().snapshot(sim)
        by_id = {t.spec.id: t for t in sim.trajs}
        for tr in snap.trajectories:
            _assert_true_course(tr, by_id[tr.id], sim)
        self.snapshots_checked += 1
        return snap


def test_oracle_predicts_each_trajectorys_true_course(shared_data: Path) -> None:
    audit = _Audit()
    run = _audited_run(shared_data, "sync", audit)
    assert run.name == ORACLE
    assert audit.keys_checked >= 32 * 8 and audit.snapshots_checked >= 2
    # Samples of one prompt differ (the workload's within-group spread): the oracle tells them apart, where
    # a predictor gives every sibling the same prediction until they run.
    assert any(len(keys) > 1 for keys in audit.group_keys.values())


class _StartedAudit(StartedOracleRollplan):
    """The started oracle, checking at every snapshot that a trajectory not yet started gets the rollplan
    policy's own prediction (the same predictor state) and a started one its true remaining course."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_checked = 0
        self.started_checked = 0

    def snapshot(self, sim: Any) -> Any:
        snap = super().snapshot(sim)
        by_id = {t.spec.id: t for t in sim.trajs}
        for tr in snap.trajectories:
            t = by_id[tr.id]
            prog = sim.progress(t)
            if prog[0] > 0 or prog[1] > 0:
                _assert_true_course(tr, t, sim)
                self.started_checked += 1
            else:
                own = RollplanPolicy._predict(self, sim, t.idx, prog)
                assert (tr.remaining_decode_tokens.mean, tr.remaining_tool_seconds.mean) == (own[0], own[2])
                assert (tr.remaining_decode_tokens.spread, tr.remaining_tool_seconds.spread) == (own[4][0], own[4][2])
                self.pending_checked += 1
        return snap


def test_started_oracle_knows_a_trajectory_only_once_it_has_started(shared_data: Path) -> None:
    audit = _StartedAudit()
    run = _audited_run(shared_data, "async", audit)
    assert run.name == ORACLE_STARTED
    assert audit.pending_checked > 0 and audit.started_checked > 0
    assert ORACLE_STARTED not in POLICY_NAMES
    assert isinstance(make_policy(ORACLE_STARTED, backend="greedy"), StartedOracleRollplan)


def test_share_of_gain_by_hand() -> None:
    assert share_of_gain(105.0, 100.0, 120.0) == 0.25  # a quarter of the way from rollplan to the oracle
    assert share_of_gain(95.0, 100.0, 120.0) == -0.25  # below rollplan
    assert share_of_gain(105.0, 100.0, 100.0) is None  # the oracle not above rollplan: no gain to split
    assert share_of_gain(None, 100.0, 120.0) is None


def test_oracle_is_a_reference_not_a_policy() -> None:
    assert ORACLE not in POLICY_NAMES
    p = make_policy(ORACLE, backend="greedy", time_limit=0.2)
    assert isinstance(p, OracleRollplan) and p.backend == "greedy" and p.time_limit == 0.2


def test_matrix_cell_reports_the_oracle_apart(shared_data: Path) -> None:
    doc = run_matrix(shared_data, traces=("parcae-hh",), modes=("sync",), workloads=("128x16-history",),
                     window_h=0.05, jobs=1, oracle=True, per_batch=True)
    (cell,) = doc["matrix"]["cells"]
    # --per-batch lists the reference's batches beside the policies'
    assert set(cell["row"]["per_batch"]["rollout_s"]) == {*POLICY_NAMES, *ORACLES}
    assert set(cell["tokens_per_s"]) == set(POLICY_NAMES)  # the references are in none of the other figures
    for name in ORACLES:
        assert name not in cell["tail_share_common"] and name not in cell["row"]["rollout_over_floor"]
    assert cell["best_other"]["policy"] in POLICY_NAMES and cell["best_other"]["policy"] != "rollplan"
    o = cell["oracle"]
    assert o["policy"] == ORACLE and o["tokens_per_s"] > 0
    assert o["tokens_per_s"] <= cell["throughput_ceiling"] + 1e-6
    bo, ceiling, rp = cell["best_other"]["tokens_per_s"], cell["throughput_ceiling"], cell["tokens_per_s"]["rollplan"]
    assert o["vs_rollplan"] == pytest.approx(o["tokens_per_s"] / rp, abs=1e-4)
    if ceiling > bo:
        assert o["share_of_what_is_left"] == pytest.approx((o["tokens_per_s"] - bo) / (ceiling - bo), abs=1e-4)
    share = o["share_of_what_is_left"]
    assert doc["matrix"]["summary"]["oracle_half_of_what_is_left"] == f"{int(share is not None and share >= 0.5)}/1"
    # No valid ceiling (one at least every schedule the simulator ran, the reference's included) gives rollplan
    # more than rollplan_share_at_most; the cell's own ceiling is one of them.
    most = o["rollplan_share_at_most"]
    assert most is not None
    if cell["share_of_what_is_left"] is not None:
        assert cell["share_of_what_is_left"] <= most + 1e-4
    reachable = doc["matrix"]["summary"]["half_reachable_by_any_ceiling"]
    assert reachable == f"{int(most >= 0.5)}/1"
    assert doc["scenario"]["oracle"] is True
    started = o["started"]
    assert started["policy"] == ORACLE_STARTED and 0 < started["tokens_per_s"] <= ceiling + 1e-6
    if ceiling > bo:
        assert started["share_of_what_is_left"] == pytest.approx((started["tokens_per_s"] - bo) / (ceiling - bo),
                                                                  abs=1e-4)
    if o["tokens_per_s"] > rp:
        assert started["of_oracle_gain"] == pytest.approx(
            (started["tokens_per_s"] - rp) / (o["tokens_per_s"] - rp), abs=1e-4)
    st_share = started["share_of_what_is_left"]
    assert doc["matrix"]["summary"]["started_oracle_half_of_what_is_left"] == \
        f"{int(st_share is not None and st_share >= 0.5)}/1"
    # Without the flag: no oracle anywhere, and the six policies' figures are the same.
    plain = run_matrix(shared_data, traces=("parcae-hh",), modes=("sync",), workloads=("128x16-history",),
                       window_h=0.05, jobs=1)
    (pc,) = plain["matrix"]["cells"]
    assert pc["oracle"] is None and plain["matrix"]["summary"]["oracle_half_of_what_is_left"] is None
    assert plain["matrix"]["summary"]["started_oracle_half_of_what_is_left"] is None
    assert pc["tokens_per_s"] == cell["tokens_per_s"] and pc["best_other"] == cell["best_other"]


def test_cli_oracle(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", "--matrix", "--oracle", "--json", "--data", str(shared_data), "--traces",
                 "parcae-hh", "--window-h", "0.02", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(c["oracle"]["policy"] == ORACLE for c in out["matrix"]["cells"])


@pytest.mark.parametrize("lever", [["--spec-tokens", "4"], ["--divide-tokens", "256"]])
def test_cli_oracle_with_a_lever_comparison_is_refused(lever: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", "--oracle", *lever]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--oracle" in err and "To fix" in err, err


def test_share_any_ceiling_allows_by_hand() -> None:
    assert share_any_ceiling_allows(110.0, 100.0, 120.0) == 0.5  # the oracle 20 above, rollplan 10
    assert share_any_ceiling_allows(110.0, 100.0, 105.0) == 1.0  # rollplan above the reference: all of it
    assert share_any_ceiling_allows(99.0, 100.0, 120.0) == 0.0  # below the best other: negative under any
    assert share_any_ceiling_allows(100.0, 100.0, 100.0) == 1.0  # nothing left: the target holds
    assert share_any_ceiling_allows(None, 100.0, 120.0) is None


_tps = st.floats(1.0, 1e4, allow_nan=False)


@given(rp=_tps, bo=_tps, ref=_tps, extra=st.floats(0.0, 1e4))
def test_no_valid_ceiling_gives_more(rp: float, bo: float, ref: float, extra: float) -> None:
    most = share_any_ceiling_allows(rp, bo, ref)
    assert most is not None and 0.0 <= most <= 1.0
    share = share_of_what_is_left(rp, bo, max(rp, ref, bo) + extra)
    if share is not None:
        assert share <= most + 1e-4


def test_a_schedule_that_reaches_the_ceiling_is_not_printed_above_it(shared_data: Path) -> None:
    """Seed 2's async parcae-lh hour: the started oracle decodes exactly the ceiling's tokens (30,970,431 over
    3,600 s, 8,602.8975 tokens/s). Rounded to the nearest, the ceiling printed 8,602.897 against the run's
    8,602.898; rounded up, the printed bound stays at least every printed throughput."""
    sc = matrix_scenario(shared_data, "parcae-lh", "async", matrix_workload("128x16-history"),
                         bases=swebench_bases(shared_data), seed=2)
    ceiling = throughput_ceiling(sc)["tokens_per_s"]
    tps = {name: run_policy(sc, make_policy(name)).summary["throughput_tokens_per_s"]
           for name in (ORACLE_STARTED, "rollplan")}
    assert all(v <= ceiling for v in tps.values()), (tps, ceiling)
    assert ceiling - tps[ORACLE_STARTED] < 0.01, (tps, ceiling)  # the edge this test is about: a run at the bound
