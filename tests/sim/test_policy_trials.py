"""``examples/policy_trials.py``: the trial variants of the rollplan policy behind docs/simulator.md's
"Sessions 22 and 23's trials" and "Session 24's trials and diagnostics".

Checked: every method a variant overrides exists on the policy it extends (a renamed hook would turn the
variant silently into the plain policy); every variant replays a cut window of a bench cell, and the plain
``rollplan`` / ``elastic-plus`` rows are those policies' own replays; the ``resume`` variant dispatches a
started sample ahead of unstarted ones; ``affinity`` picks the admitting slot holding the most of the
sample's prompt; ``--hold-h`` leaves every batch before the trace's end as it was and finishes the cut one;
``--timeline`` samples at the interval asked, its critical split only for the rollplan admission, the KV in
tool calls within what the slots hold; ``--last`` lists each batch's last finishers, the first ending the batch,
none faster than its floor, and ``--per-batch`` no batch faster than its floor and the cut batch's tokens
within its whole and within the ceiling's term from the replay's start of it; ``rollplan-window`` leaves the
batches before the cut one as they were and gets more tokens of the cut one; ``regime-keys``
ranks a decode-heavy sample above a tool-heavy one of the same path, and ``model-headroom`` changes the
headroom of some plans of a replay within its grid; ``critical-moves`` carries out a rebalancing move of a
predicted-critical sample only (a move its slot forces, every policy carries out); ``pooled`` predicts a
group from its prompt's whole history (its finished siblings included) where the plain predictor takes the
finished siblings alone; ``isolate`` / ``isolate-fit`` move only residents that are not predicted-critical,
off a slot hosting a predicted-critical sample, to one hosting none; ``regime-by-slots`` decides
the regime with fewer critical slots than critical samples at some plan (never more); ``regime-drain``'s model
never has the path end later than ``regime_makespan``'s, runs it alone with no bulk left and agrees with it when
the bulk outlasts the path; ``regime-lend``'s model (``lend_makespan``) is ``regime_makespan`` with no
slot lent back or one lent back after the bulk's end and never later with one lent back sooner, and the
trial measures how long training held the GPUs it lent and counts them back within that time;
``regime-occupancy``'s model (``occupancy_makespan``) is ``regime_makespan`` when each critical sample sits
alone on a slot below the headroom, and never has a fuller path slot run faster; ``lend_share`` (hypothesis:
capacity that joins never ends work later, changes nothing before it joins, and shares exactly what is left
then); ``express`` (over rollplan
and over the started oracle) starts no sample on its express slot and moves there only started predicted-critical
samples, two at most at once; ``--fold-tool-s`` / ``--tool-kv`` / ``--evicted-return`` replay the cells under
those physics; ``z-siblings``' z is the expected largest of n standard normals (the closed forms at n = 2, 3
and a seeded Monte Carlo estimate at 16) and falls as a group's samples finish; bad ``--cells`` / ``--trials`` / ``--hold-h`` / ``--timeline`` / ``--last`` and bad physics give a
one-line error and exit 2.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollplan.models.perf import perf_model
from rollplan.policy.dispatch import Headrooms, regime_makespan
from rollplan.sim.bench_replay import matrix_scenario, matrix_workload
from rollplan.sim.policies import ElasticPlus, RollplanPolicy, StartedOracleRollplan, make_policy
from rollplan.sim.replay import run_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy_trials.py"


@pytest.fixture(scope="module")
def trials() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_trials", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["policy_trials"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_every_override_has_a_base_method(trials: ModuleType) -> None:
    classes = [trials.GrowthReserve, trials.FlatBulkHeadrooms, trials.ExpectedCritical,
               trials.started_first(RollplanPolicy), trials.started_first(ElasticPlus), trials.Affinity,
               trials.ElasticPlusAffinity, trials.BulkAffinity, trials.BulkEvictable, trials.RegimeKeys,
               trials.ModelHeadroom, trials.CriticalApart, trials.RegimeByGroups,
               trials.critical_moves(RollplanPolicy), trials.critical_moves(StartedOracleRollplan),
               trials.PooledPredictor, trials.ExpectedRegime, trials.SampleFactor, trials.CriticalPack]
    for cls in classes:
        base = cls.__mro__[1]
        own = [k for k, v in vars(cls).items() if callable(v) and not k.startswith("__")]
        assert own, cls  # each replaces at least one of its base's methods
        for name in own:
            assert hasattr(base, name), (cls.__name__, name)
    # The attributes the variants read or replace exist on a fresh policy.
    p = RollplanPolicy()
    for attr in ("_heap", "_cp", "_cp_dec", "_crit", "_informed", "_a_ref", "headrooms", "critical_share",
                 "_bulk_bound", "regime"):
        assert hasattr(p, attr), attr


def test_affinity_picks_the_admitting_slot_holding_most_of_the_prompt(trials: ModuleType) -> None:
    def slot(i: int, held: int, n_res: int, kv_free: int) -> SimpleNamespace:
        return SimpleNamespace(idx=i, held=held, n_res=n_res, kv_free=kv_free)

    sim = SimpleNamespace(prefix_bonus=lambda s, t: min(s.held, t.share))
    t = SimpleNamespace(share=1000)
    slots = [slot(0, 0, 0, 900), slot(1, 400, 5, 100), slot(2, 1000, 9, 50), slot(3, 1000, 3, 60),
             slot(4, 1000, 3, 70), slot(5, 2000, 1, 500)]
    pick = trials.shared_prefix_slot
    # The most shared prompt (capped at the sample's own), then the fewest residents, then the most free KV;
    # slot 5 holds more than the sample's prompt but does not admit it.
    assert pick(slots, sim, t, lambda s: s.idx != 5).idx == 4
    assert pick(slots, sim, t, lambda s: s.idx in (0, 1)).idx == 1
    assert pick(slots, sim, t, lambda s: s.idx == 0) is None  # no sibling there: the policy's own choice


def test_every_trial_replays_a_cut_window(shared_data: Path, trials: ModuleType) -> None:
    rows = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], list(trials.TRIALS), jobs=2, window_h=0.1)
    assert [r["trial"] for r in rows] == list(trials.TRIALS)
    assert all(r["tokens_per_s"] > 0 for r in rows)
    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.1)
    by = {r["trial"]: r["tokens_per_s"] for r in rows}
    for name in ("rollplan", "elastic-plus"):
        assert by[name] == run_policy(sc, make_policy(name)).summary["throughput_tokens_per_s"]


def test_physics_reach_the_replay(shared_data: Path, trials: ModuleType) -> None:
    """``--fold-tool-s`` / ``--tool-kv`` / ``--evicted-return``: the rows are the plain policies' replays of the
    cell under those physics (as ``bench replay``'s flags of the same names build it), and they differ from the
    bench's physics' rows."""
    phys = trials.Physics(fold_tool_s=0.0, tool_kv="evictable", evicted_return="slot")
    rows = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], ["rollplan", "elastic-plus"], jobs=1,
                             window_h=0.1, physics=phys)
    plain = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], ["rollplan", "elastic-plus"], jobs=1,
                              window_h=0.1)
    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.1,
                         fold_tool_s=0.0, evicted_return="slot")
    for row, base in zip(rows, plain, strict=True):
        assert row["tokens_per_s"] == run_policy(sc, make_policy(row["trial"])).summary["throughput_tokens_per_s"]
        assert row["tokens_per_s"] != base["tokens_per_s"]


def test_resume_dispatches_started_samples_first(shared_data: Path, trials: ModuleType) -> None:
    seen: list[tuple[bool, bool]] = []  # (the first yielded is started, some pending sample is started)

    class Probe(trials.started_first(RollplanPolicy)):  # type: ignore[misc]
        def order(self, sim):  # type: ignore[no-untyped-def]
            it = super().order(sim)
            first = next(iter(it), None)
            if first is not None:
                pend = list(sim.iter_pending())
                seen.append((sim.trajs[first].t_start >= 0, any(sim.trajs[k].t_start >= 0 for k in pend)))
            return super().order(sim)

    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.2)
    run_policy(sc, Probe())
    with_started = [first for first, any_started in seen if any_started]
    assert with_started, "no sample was re-queued after starting in this window"
    assert all(with_started)


def test_hold_keeps_the_window_and_finishes_the_cut_batch(shared_data: Path, trials: ModuleType) -> None:
    cell = [("parcae-hh", "async", 0)]
    plain, held = (trials.run_trials(shared_data, cell, ["rollplan"], jobs=1, diagnostics=trials.Diagnostics(
        per_batch=True, hold_h=h))[0]["rollout_s"] for h in (None, 0.5))
    assert plain[-1] is None  # the hour's end cuts a batch
    assert held[:len(plain) - 1] == plain[:-1]  # the policy does not see where the trace ends
    assert held[len(plain) - 1] is not None


def test_timeline_samples_at_the_interval(shared_data: Path, trials: ModuleType) -> None:
    rows = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], ["rollplan", "elastic-plus"], jobs=1,
                             window_h=0.2, diagnostics=trials.Diagnostics(timeline_s=60.0))
    for r in rows:
        tl = r["timeline"]
        assert len(tl) >= 5
        assert all(b["t"] - a["t"] >= 60.0 - 0.1 for a, b in itertools.pairwise(tl))
        assert all(0.0 <= x["kv_slots"] <= 1.0 for x in tl if x["kv_slots"] is not None)
        assert any(x["running"] > 0 for x in tl) and any(x["pending"] > 0 for x in tl)
        # the KV in tool calls is part of what the slots hold; a running trajectory's context is at least a prompt
        assert all(0.0 <= x["kv_idle"] <= x["kv_slots"] + 1e-3 for x in tl if x["kv_slots"] is not None)
        assert all(x["step_ctx"] > 0 and x["kv_per_running"] > 0 for x in tl if x["running"] > 0)
    rp, ep = (r["timeline"] for r in rows)
    assert all("regime" not in x for x in ep)  # elastic-plus has no critical split
    assert {x["regime"] for x in rp} <= {"bulk", "critical path"}
    assert any(x["critical_slots"] > 0 and x["kv_critical_slots"] is not None for x in rp)


def test_last_finishers_end_their_batches_and_respect_their_floors(shared_data: Path, trials: ModuleType) -> None:
    row = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], ["rollplan"], jobs=1, window_h=0.5,
                            diagnostics=trials.Diagnostics(per_batch=True, last=2))[0]
    complete = [(b, r) for b, r in enumerate(row["rollout_s"]) if r is not None]
    assert complete
    for b, rollout in complete:
        last = row["last"][str(b)]
        assert len(last) == 2 and last[0]["end_s"] >= last[1]["end_s"]
        assert last[0]["end_s"] == pytest.approx(rollout, abs=0.1)  # the last sample ends its batch
    for rows in row["last"].values():
        for x in rows:
            assert x["end_s"] >= x["start_s"] >= 0.0
            assert x["ran_over_floor"] >= 1.0 - 1e-6  # the floor bounds every sample's run
    # each batch's floor (the ceiling's) is under its rollout, and the total over the floors adds them up
    assert len(row["floor_s"]) == len(row["rollout_s"])
    assert all(r >= row["floor_s"][b] - 0.1 for b, r in complete)
    assert row["over_floors_s"] == pytest.approx(sum(r - row["floor_s"][b] for b, r in complete), abs=0.1 * len(complete))
    # the batch the window's end cuts: what the replay got from it is within its whole tokens and within the
    # ceiling's cut-batch term from the replay's own start of it (a schedule the ceiling must bound)
    cut = row["cut_batch"]
    assert cut["index"] == len(complete) and row["rollout_s"][cut["index"]] is None
    assert 0 < cut["tokens"] <= cut["whole"] and cut["tokens"] <= cut["bound_at_start"] <= cut["whole"]


def test_window_aware_trials_pack_only_the_cut_batch(shared_data: Path, trials: ModuleType) -> None:
    """``rollplan-window`` / ``oracle-window``: the batches before the cut one run as without the window's end
    (their rollouts within a second), and the cut batch gets more tokens than the plain policy gets from it."""
    rows = trials.run_trials(shared_data, [("parcae-hh", "async", 0)], ["rollplan", "rollplan-window"], jobs=2,
                             window_h=0.5, diagnostics=trials.Diagnostics(per_batch=True))
    plain, aware = rows
    assert plain["rollout_s"][:-1] and aware["rollout_s"][:-1] == pytest.approx(plain["rollout_s"][:-1], abs=1.0)
    assert aware["cut_batch"]["tokens"] > plain["cut_batch"]["tokens"]


def test_regime_keys_rank_decode_heavy_samples_higher(trials: ModuleType) -> None:
    p = trials.RegimeKeys()
    p._cp = {1: 300.0, 2: 300.0}  # equal pessimistic paths at the reference step
    p._cp_dec = {1: 250.0, 2: 20.0}  # 1 is decode-heavy, 2 tool-heavy
    key = trials.regime_key
    assert key(p, 1, 2.0) == pytest.approx(550.0) and key(p, 2, 2.0) == pytest.approx(320.0)
    assert key(p, 1, 1.0) == key(p, 2, 1.0) == pytest.approx(300.0)  # at the reference step: as the policy


def test_pooled_predicts_a_group_from_its_prompts_history_with_the_finished_siblings(trials: ModuleType) -> None:
    from rollplan.policy.predict import Predictor, Totals

    nothing = Totals(0.0, 0.0, 0.0, 0.0)
    preds = (Predictor(), trials.PooledPredictor())
    for p in preds:
        p.start_batch(0)
        p.observe("k", "b0:g", Totals(3000.0, 0.0, 0.0, 10.0))
        p.observe("k", "b0:g", Totals(2000.0, 0.0, 0.0, 10.0))
        p.start_batch(1)
        p.observe("k", "b1:g", Totals(500.0, 0.0, 0.0, 10.0))  # this batch's first finisher, a short one
    plain, pooled = (p.remaining("k", "b1:g", nothing) for p in preds)
    assert plain.source == "group" and plain.decode.mean == pytest.approx(500.0)
    assert pooled.source == "history" and pooled.decode.mean == pytest.approx(5500.0 / 3)
    assert trials.Pooled().predictor.__class__ is trials.PooledPredictor


def test_critical_moves_carries_out_a_rebalancing_move_of_a_critical_sample_only(trials: ModuleType) -> None:
    from rollplan.models.types import Role

    slot = SimpleNamespace(id="s0", role=Role.MIXED, return_by=None, present=True)
    sim = SimpleNamespace(slots=[slot])
    plan = SimpleNamespace(roles={"s0": Role.MIXED})  # the source keeps decoding: a rebalancing move
    crit, bulk = SimpleNamespace(idx=1, slot=0), SimpleNamespace(idx=2, slot=0)
    # The plain policy drops both (MOVES "forced"); critical-moves carries out the critical sample's only.
    for p, expected in ((RollplanPolicy(), False), (trials.critical_moves(RollplanPolicy)(), True)):
        p._crit = {1}  # sample 1 is predicted-critical
        assert p._carries_out(sim, crit, plan) is expected
        assert p._carries_out(sim, bulk, plan) is False
    leaving = SimpleNamespace(slots=[SimpleNamespace(id="s0", role=Role.MIXED, return_by=5.0, present=True)])
    assert RollplanPolicy()._carries_out(leaving, bulk, plan) is True  # a move the slot forces, always


def test_model_headroom_sets_the_bulk_headroom_from_the_step_model(shared_data: Path, trials: ModuleType) -> None:
    seen: list[tuple[bool, float]] = []

    class Probe(trials.ModelHeadroom):  # type: ignore[misc]
        def _apply(self, sim, plan):  # type: ignore[no-untyped-def]
            super()._apply(sim, plan)
            seen.append((self._bulk_bound, self.headrooms.default))

    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.3)
    run_policy(sc, Probe())
    assert {h for _bulk, h in seen} <= set(trials.MODEL_HEADROOMS)
    assert all(h == trials.Headrooms().default for bulk, h in seen if bulk)  # the bulk regime: as the policy
    assert any(h > trials.Headrooms().default for bulk, h in seen if not bulk)  # a critical-path plan widened it


def test_regime_by_slots_counts_the_slots_the_critical_samples_share(shared_data: Path, trials: ModuleType,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    real = trials.bulk_regime_pays

    def probe(work, **kw):  # type: ignore[no-untyped-def]
        seen.append((kw["critical"], len(policy._critical())))
        return real(work, **kw)

    monkeypatch.setattr(trials, "bulk_regime_pays", probe)
    sc = matrix_scenario(shared_data, "bamboo-p3", "async", matrix_workload("128x16-history"), window_h=0.3)
    policy = trials.RegimeBySlots()
    run_policy(sc, policy)
    assert seen and all(1 <= slots <= crit for slots, crit in seen)
    assert any(slots < crit for slots, crit in seen)  # the plans place several critical samples on one slot


def test_drain_makespan_drains_the_path_once_the_bulk_is_done(trials: ModuleType) -> None:
    kw = dict(perf=perf_model("h800", "qwen3-8b"), slots=16, critical=4, headrooms=Headrooms())
    ref = trials.reference_step(kw["perf"])
    for bulk in (True, False):
        for work in (0.0, 200.0, 600.0, 100_000.0):
            drained, held = (f(bulk, work, 600.0, 60.0, **kw) for f in (trials.drain_makespan, regime_makespan))
            assert drained <= held + 1e-9  # a slot that drains never slows the path
        # no bulk left: the path runs alone at once; bulk outlasting the path: the two models agree
        alone = 600.0 * kw["perf"].decode_step_time(1, trials.REF_STEP_KV) / ref + 60.0
        assert trials.drain_makespan(bulk, 0.0, 600.0, 60.0, **kw) == pytest.approx(alone)
        assert trials.drain_makespan(bulk, 100_000.0, 600.0, 60.0, **kw) == pytest.approx(
            regime_makespan(bulk, 100_000.0, 600.0, 60.0, **kw))


def test_lend_makespan_shares_the_bulk_left_with_the_slots_lent_back(trials: ModuleType) -> None:
    kw = dict(perf=perf_model("h800", "qwen3-8b"), slots=32, critical=4, headrooms=Headrooms())
    for bulk in (True, False):
        for work in (0.0, 300.0, 1500.0):
            held = regime_makespan(bulk, work, 600.0, 60.0, **kw)
            assert trials.lend_makespan(bulk, work, 600.0, 60.0, later=0, later_in=0.0, **kw) == pytest.approx(held)
            # slots joining after the bulk's end change nothing; joining earlier never end it later
            assert trials.lend_makespan(bulk, work, 600.0, 60.0, later=8, later_in=1e6, **kw) == pytest.approx(held)
            assert trials.lend_makespan(bulk, work, 600.0, 60.0, later=8, later_in=120.0, **kw) <= held + 1e-9
        # no path: the bulk left at the lend is shared by 40 slots instead of 32
        alone = regime_makespan(bulk, 1500.0, 0.0, 0.0, **kw)
        assert trials.lend_makespan(bulk, 1500.0, 0.0, 0.0, later=8, later_in=120.0, **kw) == pytest.approx(
            120.0 + (alone - 120.0) * 32 / 40)


@given(end=st.floats(0.0, 1e4), later_in=st.floats(0.0, 1e4), now=st.floats(0.1, 1e3), more=st.floats(0.0, 1e3))
def test_lend_share_ends_no_later_and_only_shares_what_is_left(trials: ModuleType, end: float, later_in: float,
                                                              now: float, more: float) -> None:
    got = trials.lend_share(end, later_in, now, more)
    assert got <= end + 1e-9  # more capacity never ends the work later
    assert got >= min(end, later_in) - 1e-9  # nothing changes before it joins
    if more > 0 and end > later_in:  # the work left at later_in, (end - later_in) * now, at now + more
        assert (got - later_in) * (now + more) == pytest.approx((end - later_in) * now, rel=1e-9, abs=1e-6)


def test_occupancy_makespan_is_regime_makespan_for_one_light_critical_sample_a_slot(trials: ModuleType) -> None:
    perf = perf_model("h800", "qwen3-8b")
    cap = float(perf.kv_capacity_tokens())
    kw = dict(perf=perf, slots=16, headrooms=Headrooms())
    for bulk in (True, False):
        for work in (0.0, 300.0, 1500.0):
            for n_c in (0, 1, 4, 16, 20):
                light = [0.01 * cap] * n_c  # below either regime's headroom: the slot sits at the headroom
                got = trials.occupancy_makespan(bulk, work, 600.0, 60.0, loads=light,
                                                path_load=light[0] if light else None, cap=cap, **kw)
                assert got == pytest.approx(regime_makespan(bulk, work, 600.0, 60.0, critical=n_c, **kw))
            # a path slot its critical samples fill is never faster than one at the headroom
            at = [trials.occupancy_makespan(bulk, 0.0, 600.0, 60.0, loads=[x * cap], path_load=x * cap, cap=cap,
                                            **kw) for x in (0.01, 0.5, 0.95)]
            assert at == sorted(at)


def test_regime_lend_expects_the_lent_gpus_back_after_the_training_it_saw(shared_data: Path, trials: ModuleType,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, float]] = []
    real = trials.lend_makespan

    def probe(bulk, work, **kw):  # type: ignore[no-untyped-def]
        seen.append((kw["later"], kw["later_in"]))
        return real(bulk, work, **kw)

    monkeypatch.setattr(trials, "lend_makespan", probe)
    sc = matrix_scenario(shared_data, "bamboo-p3", "async", matrix_workload("128x16-history"), window_h=0.5)
    policy = trials.LendRegime()
    run_policy(sc, policy)
    step = sc.lending.train_step_s
    # it measured how long training held the GPUs (the step, plus the reclaim notice at most) ...
    assert policy._held_s is not None and step <= policy._held_s <= step + sc.lending.reclaim_notice_s + 1e-6
    # ... and, once it had, counted the GPUs training holds as coming back within that time
    assert seen and all(later == sc.lending.gpus and 0.0 <= at <= policy._held_s + sc.lending.reclaim_notice_s
                        for later, at in seen)


@pytest.mark.parametrize(("args", "needle"), [
    (["--cells", "parcae-hh:weekly:0"], "--cells: bad cell"),
    (["--cells", "nope:async:0"], "--cells: bad cell"),
    (["--trials", "rollplan,magic"], "unknown trial 'magic'"),
    (["--hold-h", "-1"], "--hold-h must be a positive number"),
    (["--timeline", "0"], "--timeline must be a positive number"),
    (["--hold-h", "1", "--window-h", "0.5"], "--hold-h and --window-h both given"),
    (["--last", "0"], "--last must be at least 1"),
    (["--fold-tool-s", "-1"], "--fold-tool-s must be a number >= 0"),
    (["--tool-kv", "kept"], "--tool-kv must be one of"),
    (["--evicted-return", "home"], "--evicted-return must be one of"),
])
def test_bad_input_is_one_line(trials: ModuleType, capsys: pytest.CaptureFixture[str], args: list[str],
                               needle: str) -> None:
    assert trials.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


@pytest.mark.parametrize("variant", ["Isolate", "IsolateFit"])
def test_isolate_moves_only_non_critical_residents_off_critical_slots(shared_data: Path, trials: ModuleType,
                                                                      variant: str) -> None:
    moves: list[tuple[bool, bool, bool]] = []

    class Probe(getattr(trials, variant)):  # type: ignore[misc]
        def _isolate(self, sim):  # type: ignore[no-untyped-def]
            real = sim.migrate

            def spy(j, target, *, by_kv):  # type: ignore[no-untyped-def]
                crit = self._critical()
                slots = {sim.trajs[c].slot for c in crit}
                moves.append((j in crit, sim.trajs[j].slot in slots, target in slots))
                return real(j, target, by_kv=by_kv)

            sim.migrate = spy
            try:
                super()._isolate(sim)
            finally:
                sim.migrate = real

    sc = matrix_scenario(shared_data, "bamboo-g4dn", "async", matrix_workload("128x16-history"), window_h=0.3)
    run_policy(sc, Probe())
    # isolate-fit moves some in this window; isolate none (every other slot is at its headroom while critical
    # samples have co-residents)
    assert bool(moves) is (variant == "IsolateFit")
    assert all(not critical and from_critical and not to_critical for critical, from_critical, to_critical in moves)


@pytest.mark.parametrize("base", [RollplanPolicy, StartedOracleRollplan])
def test_express_slot_takes_no_new_sample_and_only_started_critical_moves(shared_data: Path, trials: ModuleType,
                                                                          base: type) -> None:
    admitted: list[bool] = []
    moves: list[tuple[bool, bool, int]] = []

    class Probe(trials.express(base)):  # type: ignore[misc]
        def _admit(self, j, slot, crit):  # type: ignore[no-untyped-def]
            admitted.append(slot == self._lane(self._sim))
            return super()._admit(j, slot, crit)

        def _apply(self, sim, plan):  # type: ignore[no-untyped-def]
            self._sim = sim
            real = sim.migrate

            def spy(j, target, *, by_kv):  # type: ignore[no-untyped-def]
                if self._own and target == self._lane(sim):
                    crit = self._critical()
                    moves.append((j in crit, sim.trajs[j].t_start >= 0,
                                  sum(1 for r in sim.slots[target].residents if r in crit)))
                return real(j, target, by_kv=by_kv)

            sim.migrate = spy
            self._own = False
            try:
                super()._apply(sim, plan)
            finally:
                sim.migrate = real

        def _pick(self, sim):  # type: ignore[no-untyped-def]
            self._own = True  # the plan's own moves are carried out; the express moves follow
            return super()._pick(sim)

        def _new_batch(self, sim):  # type: ignore[no-untyped-def]
            self._sim = sim
            super()._new_batch(sim)

    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.3)
    run_policy(sc, Probe())
    assert admitted and not any(admitted)  # no sample starts on the express slot
    assert moves  # started predicted-critical samples move there, never beyond two at once
    assert all(critical and started and n < Probe.EXPRESS_MAX for critical, started, n in moves)


def test_expected_max_normal_is_the_expected_largest_of_n(trials: ModuleType) -> None:
    import math
    import random

    emax = trials.expected_max_normal
    assert emax(1) == 0.0 and emax(0) == 0.0
    assert abs(emax(2) - 1.0 / math.sqrt(math.pi)) < 1e-6  # E[max(X1, X2)] = 1 / sqrt(pi)
    assert abs(emax(3) - 1.5 / math.sqrt(math.pi)) < 1e-6  # = 3 / (2 sqrt(pi))
    rng = random.Random(0)
    mc = sum(max(rng.gauss(0.0, 1.0) for _ in range(16)) for _ in range(20_000)) / 20_000
    assert abs(emax(16) - mc) < 0.02, (emax(16), mc)
    assert all(emax(n) < emax(n + 1) for n in range(1, 40))


def test_siblings_z_falls_as_a_groups_samples_finish(shared_data: Path, trials: ModuleType) -> None:
    seen: dict[str, set[float]] = {}

    class Probe(trials.SiblingsZ):  # type: ignore[misc]
        def _predict(self, sim, j, progress=None, pf_done=None):  # type: ignore[no-untyped-def]
            out = super()._predict(sim, j, progress, pf_done)
            n = self._live_n.get(sim.trajs[j].group, 1)
            seen.setdefault(sim.trajs[j].group, set()).add(round(self._z[n], 6))
            return out

    sc = matrix_scenario(shared_data, "parcae-hh", "async", matrix_workload("128x16-history"), window_h=0.2)
    run_policy(sc, Probe())
    zs = {z for v in seen.values() for z in v}
    assert round(trials.expected_max_normal(16), 6) in zs  # a whole group of 16 unfinished samples
    assert any(len(v) > 1 for v in seen.values())  # some group's z moved as its samples finished
    assert min(zs) < trials.expected_max_normal(16)
