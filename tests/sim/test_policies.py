"""Policies on small scenarios: what each one may use, notice and deadline handling, rollplan's planner use,
elastic-plus (rollplan's predictor and longest-first dispatch, every GPU, no planner)."""

from __future__ import annotations

import pytest

from rollplan.models.errors import UnknownNameError, UserInputError
from rollplan.models.types import AvailabilityEvent, EventKind, Role, Slot, SlotSource
from rollplan.policy.dispatch import regime_makespan
from rollplan.sim.engine import DECODING, SimConfig, SimTraj
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import (
    BULK_HEADROOM,
    CRITICAL_HEADROOM,
    CRITICAL_SHARE,
    KV_HEADROOM,
    POLICY_NAMES,
    ElasticPlus,
    RollplanPolicy,
    make_policy,
    parse_pd,
    parse_policies,
)
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy
from rollplan.sim.traces import AvailabilityTrace


def _trace(events: list[AvailabilityEvent], duration: float) -> AvailabilityTrace:
    return AvailabilityTrace("handmade", tuple(events), duration, "h800")


def _spot(i: int) -> Slot:
    return Slot(id=f"spot{i}/g0", gpu="h800", node=f"spot{i}", source=SlotSource.PREEMPTIBLE)


def _long_batch(n: int = 8, turns: int = 20) -> BatchSource:
    specs = tuple(SimTraj(f"t{i}", f"g{i // 4}", 4000, (0,) + (800,) * (turns - 1), (900,) * turns,
                          (1.0,) * (turns - 1) + (0.0,)) for i in range(n))
    return BatchSource(specs)


def test_static_policies_use_dedicated_gpus_only() -> None:
    arrive = AvailabilityEvent(0.0, EventKind.ARRIVE, slots=(_spot(0), _spot(1)))
    sc = Scenario("s", _long_batch(), dedicated=2, trace=_trace([arrive], 3600), max_batches=1,
                  lending=LendingConfig(gpus=2, train_step_s=30.0))
    for name in ("static-colocated", "static-disagg"):
        s = run_policy(sc, make_policy(name)).summary
        used = sum(v for k, v in s["gpu_seconds"].items() if k in ("mixed", "decode", "prefill"))
        assert used == pytest.approx(2 * s["replay_s"], abs=0.5), name  # rollout + training step (rounded)
    el = run_policy(sc, make_policy("elastic-colocated")).summary
    assert el["gpu_seconds"]["mixed"] > 4 * el["batches"][0]["rollout_s"]  # it started the spot and lent GPUs
    assert el["switching_gpu_seconds"] > 2 * 60  # two cold starts (~61 s each) at least


def test_preemption_with_notice_rollplan_migrates_elastic_recomputes() -> None:
    # Two spot GPUs only (cold start ~61 s); one gets a 60 s notice at t=150 and leaves at t=210.
    ev = [
        AvailabilityEvent(0.0, EventKind.ARRIVE, slots=(_spot(0), _spot(1))),
        AvailabilityEvent(150.0, EventKind.NOTICE, slot_ids=("spot0/g0",), deadline=210.0),
        AvailabilityEvent(210.0, EventKind.LEAVE, slot_ids=("spot0/g0",)),
    ]
    sc = Scenario("notice", _long_batch(), dedicated=0, trace=_trace(ev, 3600), max_batches=1, replan_interval_s=30.0)
    el = run_policy(sc, make_policy("elastic-colocated")).summary
    rp = run_policy(sc, make_policy("rollplan")).summary
    assert el["counters"].get("kv_lost", 0) > 0  # recompute on preemption
    assert rp["counters"].get("kv_lost", 0) == 0  # moved off before the deadline
    assert rp["counters"].get("migrations_kv", 0) > 0
    for s in (el, rp):
        assert s["trajectories_completed"] == 8


def test_preemption_without_notice_loses_kv_for_every_policy() -> None:
    # spot0 leaves at t=150 with no notice: the KV on it is lost (token progress kept); every policy that used
    # it recomputes, and every trajectory still completes once, on spot1.
    ev = [
        AvailabilityEvent(0.0, EventKind.ARRIVE, slots=(_spot(0), _spot(1))),
        AvailabilityEvent(150.0, EventKind.LEAVE, slot_ids=("spot0/g0",)),
    ]
    sc = Scenario("no-notice", _long_batch(), dedicated=0, trace=_trace(ev, 3600), max_batches=1,
                  replan_interval_s=30.0)
    for name in ("elastic-colocated", "rollplan"):
        s = run_policy(sc, make_policy(name)).summary
        assert s["counters"].get("kv_lost", 0) > 0, name
        assert s["trajectories_completed"] == 8 and s["decode_tokens"] == pytest.approx(8 * 20 * 900), name


def test_reclaim_deadline_is_enforced_for_every_policy() -> None:
    # Lent slots reclaimed mid-rollout with a deadline: nothing runs on them after it.
    lent = tuple(Slot(id=f"train0/g{i}", gpu="h800", node="train0", source=SlotSource.LENT_BY_TRAINING) for i in range(2))
    ev = [
        AvailabilityEvent(0.0, EventKind.LEND, slot_ids=tuple(s.id for s in lent), slots=lent),
        AvailabilityEvent(50.0, EventKind.RECLAIM, slot_ids=tuple(s.id for s in lent), deadline=80.0),
    ]
    sc = Scenario("reclaim", _long_batch(), dedicated=1, trace=_trace(ev, 3600), max_batches=1, replan_interval_s=20.0)
    for name in POLICY_NAMES:
        s = run_policy(sc, make_policy(name)).summary
        assert s["trajectories_completed"] == 8, name
        lost = s["counters"].get("deadline_kv_lost", 0)
        if name == "rollplan":
            assert lost == 0, s["counters"]


def test_rollplan_plans_from_predictions_and_reports_gaps() -> None:
    src = BatchSource.dataset(builtin_bases(0, prompts=8), groups=4, samples=4, seed=0, max_context=40960)
    sc = Scenario("rp", src, dedicated=4, max_batches=3, sim=SimConfig(fold_tool_s=5.0), replan_interval_s=60.0)
    pol = RollplanPolicy(backend="greedy", time_limit=0.05)
    s = run_policy(sc, pol).summary
    assert s["batches_completed"] == 3
    assert s["replans"]["count"] >= 3
    assert s["replans"]["gap"]["n"] == s["replans"]["count"]
    assert all(k in ("heuristic", "optimal", "feasible", "fallback", "deadline_relaxed") for k in s["replans"]["status"])
    # Later batches draw prompts seen before: the history prior is used.
    assert pol.predictor.total(next(iter(pol.predictor._history)), "unseen-group")[2] == "history"


def test_formula_pd_splits_and_static_disagg_ratio() -> None:
    sc = Scenario("pd", _long_batch(16), dedicated=8, max_batches=1, replan_interval_s=30.0)
    s = run_policy(sc, make_policy("static-disagg", pd=(1, 3))).summary
    assert s["gpu_seconds"]["prefill"] == pytest.approx(s["gpu_seconds"]["decode"] / 3, abs=0.5)
    f = run_policy(sc, make_policy("formula-pd")).summary
    assert f["gpu_seconds"].get("prefill", 0) > 0 and f["gpu_seconds"].get("decode", 0) > 0
    assert f["trajectories_completed"] == 16


def test_names_and_parsing() -> None:
    assert parse_policies("all") == POLICY_NAMES
    assert "elastic-plus" in POLICY_NAMES and isinstance(make_policy("elastic-plus"), ElasticPlus)
    assert parse_policies("rollplan, formula-pd,rollplan") == ("rollplan", "formula-pd")
    with pytest.raises(UnknownNameError):
        parse_policies("rollplan,magic")
    with pytest.raises(UserInputError):
        parse_pd("3")
    assert parse_pd("1:7") == (1, 7)
    with pytest.raises(UnknownNameError):
        make_policy("nope")
    assert Role.MIXED.decodes
    assert LendMode("async") is LendMode.ASYNC


def _tool_kv_admission(policy: str) -> dict:
    # One slot with ~30k tokens of KV (evictable tool-call KV, the default). A (8.3k tokens) decodes, then
    # waits 60 s on a tool; B needs 24.5k tokens, which fit only if A's KV is evicted.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285)
    specs = (SimTraj("A", "gA", 8000, (0, 0), (300, 50), (60.0, 0.0)), SimTraj("B", "gB", 24000, (0,), (500,), (0.0,)))
    sc = Scenario("admit", BatchSource(specs), dedicated=1, max_batches=1, sim=cfg)
    pol = make_policy(policy, kv_headroom=0.0) if policy == "rollplan" else make_policy(policy)
    return run_policy(sc, pol).summary


def test_rollplan_admission_keeps_tool_call_kv() -> None:
    # The engine lets B evict A's KV (static-colocated admits B as soon as A is in its tool call); rollplan does
    # not count that KV as free, so B waits and A never re-prefills its context. (The planner finds no plan
    # here: the prior predicts B longer than the slot's KV. The policy then starts the slot MIXED itself.)
    base = _tool_kv_admission("static-colocated")
    rp = _tool_kv_admission("rollplan")
    assert base["counters"].get("evictions", 0) == 1
    assert rp["counters"].get("evictions", 0) == 0
    assert rp["prefill_tokens"] == 8000 + 24000 < base["prefill_tokens"]
    assert rp["decode_tokens"] == base["decode_tokens"] == 850


class _AuditedRollplan(RollplanPolicy):
    """The rollplan policy, recording for every admission the chosen slot's room after it (share of its KV),
    the headroom the rule names and the one that applies (capped at what an empty slot would leave), computed
    afresh from the predictions (not from the policy's cache); and for every plan, whether the batch is bound
    by its bulk, recomputed from the plan's bounds."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.audit: list[tuple[float, float, float]] = []
        self.modes: list[tuple[bool, bool]] = []

    def _apply(self, sim, plan):
        # When a plan takes effect (its solve time after the state it was solved on: charge_solve).
        from rollplan.models.errors import RollplanError
        from rollplan.solver.core.bounds import BOUND_WORK

        super()._apply(sim, plan)
        if not isinstance(plan, RollplanError) and self._cp:
            # The regime whose predicted makespan is the shorter, from the longest pessimistic path's decode and
            # tool seconds, the plan's decoding slots and the predicted-critical count recomputed here.
            top = max(self._cp, key=self._cp.__getitem__)
            inf = {k: v for k, v in self._cp.items() if k in self._informed}
            n_crit = sum(v >= CRITICAL_SHARE * max(inf.values()) for v in inf.values()) if inf else 0
            kw = dict(perf=sim.live[0].perf.perf, slots=sum(r.decodes for r in plan.roles.values()),
                      critical=n_crit, headrooms=self.headrooms)
            args = (plan.bounds.get(BOUND_WORK, 0.0), self._cp_dec[top], self._cp[top] - self._cp_dec[top])
            self.modes.append((self._bulk_bound, regime_makespan(True, *args, **kw) <= regime_makespan(False, *args, **kw)))

    def choose_slot(self, sim, j):
        idx = super().choose_slot(sim, j)
        if idx is not None:
            s, t = sim.slots[idx], sim.trajs[j]
            # Predicted-critical: among the predictions made with information about the trajectory (its group's
            # or its prompt's history: rollplan.policy.dispatch.INFORMED_SOURCES), as they were made.
            inf = {k: v for k, v in self._cp.items() if k in self._informed}
            top = max(inf.values(), default=0.0)
            crit = {k for k, v in inf.items() if v >= CRITICAL_SHARE * top}
            guarded = j in crit or any(r in crit for r in s.residents if r != j)
            if self._bulk_bound:
                h = self.kv_headroom if guarded else self.bulk_headroom
            else:
                h = self.critical_headroom if guarded else self.kv_headroom
            need = sim.need_new(t)
            cap = max(0.0, (s.kv_cap - s.watermark - need) / s.kv_cap)
            room = (s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need) / s.kv_cap
            self.audit.append((room, h, min(h, cap)))
        return idx


def test_rollplan_headroom_guards_critical_slots_only() -> None:
    # Invariant: every admission leaves free, of the slot's KV, while the plan finds the batch bound by its
    # critical path: CRITICAL_HEADROOM where a predicted-critical trajectory is (or is admitted), KV_HEADROOM
    # elsewhere; while it is bound by its bulk (the bulk regime's headrooms predicted to end the batch no later:
    # rollplan.policy.dispatch.regime_makespan): KV_HEADROOM there, BULK_HEADROOM elsewhere; never more than an empty slot would leave. Each level
    # and both regimes are exercised (not vacuous): critical slots are guarded, bulk slots packed past
    # KV_HEADROOM.
    # Which regimes a small replay visits depends on its physics, so the levels are required over three seeds;
    # 8 GPUs, so that the critical trajectories take a few of them (on 3, the critical headroom on every GPU
    # the critical trajectories spread over would leave the bulk too little: the bulk regime then pays).
    audit: list[tuple[float, float, float]] = []
    modes: list[tuple[bool, bool]] = []
    for seed in (5, 7, 11):
        src = BatchSource.dataset(builtin_bases(seed, prompts=24), groups=12, samples=8, seed=seed, max_context=40960)
        sc = Scenario("headroom", src, dedicated=8, max_batches=2, warmup_batches=2, sim=SimConfig(mem_util=0.5),
                      replan_interval_s=60.0, seed=seed)
        pol = _AuditedRollplan()
        run = run_policy(sc, pol)
        assert run.summary["trajectories_completed"] == 2 * 96
        assert pol.audit and all(room >= h_eff - 1e-9 for room, _h, h_eff in pol.audit)
        assert pol.modes and all(got == want for got, want in pol.modes)
        # The recorder keeps each plan's regime by batch (``bench replay --per-batch``'s ``regime`` column): the
        # same decisions, in order, and each batch's first plan with its predicted-critical count.
        recorded = [r for b in run.recorder.batches for r in b.regimes]
        assert [bulk for bulk, _n in recorded] == [got for got, _want in pol.modes]
        for row, b in zip(run.summary["batches"], run.recorder.batches, strict=True):
            first = row["regime"]
            assert first is not None and first["plans"] == len(b.regimes) >= 1
            assert first["first"] == ("bulk" if b.regimes[0][0] else "path")
            assert first["bulk_plans"] == sum(bulk for bulk, _n in b.regimes)
        audit += pol.audit
        modes += pol.modes
    assert any(room < KV_HEADROOM for room, h, _e in audit if h == BULK_HEADROOM)
    assert any(h == CRITICAL_HEADROOM for _room, h, _e in audit)
    assert {got for got, _want in modes} == {True, False}
    assert CRITICAL_HEADROOM > KV_HEADROOM > BULK_HEADROOM


def test_rollplan_headroom_never_holds_back_what_an_empty_gpu_takes() -> None:
    # A headroom larger than an empty GPU could leave after a long trajectory would keep it pending forever
    # (the replay would stall). Capped, every trajectory runs; the cap is exercised (some admission's rule
    # asked for more than an empty GPU leaves).
    # Six prompts, all in the two warm-up batches' history: their predictions are informed, so critical ones exist;
    # 6 GPUs, so that the critical path's regime (the one with the critical headroom) is the one that pays.
    src = BatchSource.dataset(builtin_bases(7, prompts=6), groups=6, samples=4, seed=7, max_context=40960)
    sc = Scenario("cap", src, dedicated=6, max_batches=1, warmup_batches=2, sim=SimConfig(mem_util=0.5),
                  replan_interval_s=60.0, seed=7)
    pol = _AuditedRollplan(critical_headroom=0.97)
    run = run_policy(sc, pol)
    assert run.summary["trajectories_completed"] == 24
    assert all(room >= h_eff - 1e-9 for room, _h, h_eff in pol.audit)
    assert any(h_eff < h for _room, h, h_eff in pol.audit)


class _AuditedElasticPlus(ElasticPlus):
    """elastic-plus, recording for every dispatch the chosen trajectory's dispatch key (its pessimistic remaining
    critical path, from the predictor), the largest key of every pending trajectory then, and whether it is the
    FCFS head; and after every invocation whether each present GPU not being returned serves MIXED."""

    def __init__(self) -> None:
        super().__init__()
        self.dispatches: list[tuple[float, float, bool]] = []
        self.all_mixed: list[bool] = []

    def choose_slot(self, sim, j):
        pending = list(sim.iter_pending())
        self.dispatches.append((self._cp[j], max(self._cp[k] for k in pending), pending[0] == j))
        return super().choose_slot(sim, j)

    def decide(self, sim, reason):
        super().decide(sim, reason)
        self.all_mixed.append(all(s.role is Role.MIXED for s in sim.slots if s.present and s.return_by is None))


def test_elastic_plus_longest_first_every_gpu_no_planner() -> None:
    # Dedicated, lent and spot GPUs; a job 2 steps in (the predictor's history has seen them). Invariants:
    # every dispatch takes the pending trajectory with the largest predicted key (longest-first, not FCFS:
    # some dispatch skips the FCFS head, and the keys differ); every usable GPU serves MIXED; the planner is
    # never built or called; the predictor's cross-batch history is used.
    src = BatchSource.dataset(builtin_bases(7, prompts=24), groups=12, samples=8, seed=7, max_context=40960)
    arrive = AvailabilityEvent(30.0, EventKind.ARRIVE, slots=(_spot(0),))
    sc = Scenario("plus", src, dedicated=2, trace=_trace([arrive], 36000), max_batches=2, warmup_batches=2,
                  lending=LendingConfig(gpus=1, train_step_s=30.0), sim=SimConfig(mem_util=0.5),
                  replan_interval_s=60.0, seed=7)
    pol = _AuditedElasticPlus()
    s = run_policy(sc, pol).summary
    assert s["batches_completed"] == 2 and s["trajectories_completed"] == 2 * 96
    assert pol.dispatches and all(key >= top - 1e-9 for key, top, _head in pol.dispatches)
    assert not all(head for _k, _t, head in pol.dispatches)
    assert len({key for key, _t, _h in pol.dispatches}) > 10
    assert pol.all_mixed and all(pol.all_mixed)
    assert s["gpu_seconds"]["mixed"] > 3 * s["batches"][0]["rollout_s"]  # dedicated x2 + the lent and spot GPUs
    assert pol.planner is None and s["replans"]["gap"]["n"] == 0 and not s["replans"]["status"]
    assert pol.predictor.total(next(iter(pol.predictor._history)), "unseen-group")[2] == "history"


def test_policies_all_on_the_cli_and_best_other_include_elastic_plus(tmp_path, capsys) -> None:
    import json

    from rollplan.sim.bench_replay import trace_row
    from rollplan.sim.replay import run_replay
    from rollplan.solver.cli import main

    assert main(["replay", "--availability", "none", "--workload", "builtin", "--batches", "1", "--groups", "3",
                 "--samples", "2", "--dedicated", "2", "--lent", "0", "--policies", "all", "--out", str(tmp_path),
                 "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["policies"]) == list(POLICY_NAMES)
    # The bench's best other policy is the fastest of every policy but rollplan, elastic-plus among them.
    src = BatchSource.dataset(builtin_bases(1, prompts=8), groups=4, samples=4, seed=1, max_context=40960)
    sc = Scenario("best", src, dedicated=2, max_batches=1, warmup_batches=1, replan_interval_s=60.0, seed=1)
    res = run_replay(sc, [make_policy(n) for n in ("elastic-colocated", "elastic-plus", "rollplan")])
    row = trace_row("best", res)
    tps = row["tokens_per_s"]
    best = max(("elastic-colocated", "elastic-plus"), key=lambda k: tps[k])
    assert row["best_other"] == {"policy": best, "tokens_per_s": tps[best]}
    assert row["rollplan_vs_best_other"] == round(tps["rollplan"] / tps[best], 4)


class _OracleRollplan(RollplanPolicy):
    """The rollplan policy, asking the decision core's generic ``choose_slot`` (rollplan.policy.dispatch) the
    same question before every admission the simulator's inlined loop answers, on the same slot loads."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.compared = 0
        self.mismatches: list[tuple[int, int | None, object]] = []

    def choose_slot(self, sim, j):
        from rollplan.policy.dispatch import SlotLoad, choose_slot

        t = sim.trajs[j]
        crit = self._critical()
        crit_slots = self._critical_slots(sim, crit)

        def load(s) -> SlotLoad:
            return SlotLoad(s.idx, s.kv_cap, s.kv_free, s.watermark, s.n_res, sim.prefix_bonus(s, t),
                            s.idx in crit_slots)

        pref = None
        if t.preferred >= 0:
            s = sim.slots[t.preferred]
            if s.present and s.role in DECODING and s.ready_at <= sim.now:
                pref = load(s)
        want = choose_slot(sim.need_new(t), [load(s) for s in self.candidates(sim)], preferred=pref,
                           critical=j in crit, bulk_bound=self._bulk_bound, headrooms=self.headrooms)
        got = super().choose_slot(sim, j)
        self.compared += 1
        if got != want:
            self.mismatches.append((j, got, want))
        return got


class _OracleElasticPlus(ElasticPlus):
    """elastic-plus, asking the decision core's generic ``choose_slot`` with no headroom before every admission,
    on loads whose free KV is vLLM's (``free_for_new``: KV of residents in tool calls may be evicted)."""

    def __init__(self) -> None:
        super().__init__()
        self.compared = 0
        self.mismatches: list[tuple[int, int | None, object]] = []

    def choose_slot(self, sim, j):
        from rollplan.policy.dispatch import Headrooms, SlotLoad, choose_slot

        t = sim.trajs[j]
        loads = [SlotLoad(s.idx, s.kv_cap, sim.free_for_new(s) + s.watermark, s.watermark, s.n_res,
                          sim.prefix_bonus(s, t)) for s in self.candidates(sim)]
        want = choose_slot(sim.need_new(t), loads, headrooms=Headrooms(0.0))
        got = super().choose_slot(sim, j)
        self.compared += 1
        if got != want:
            self.mismatches.append((j, got, want))
        return got


def test_simulator_admission_is_the_decision_cores() -> None:
    # Oracle: on every admission of two small replays (both regimes), the simulator's inlined choice is what
    # the decision core's generic rule picks from the same loads.
    for seed in (5, 11):
        src = BatchSource.dataset(builtin_bases(seed, prompts=24), groups=12, samples=8, seed=seed, max_context=40960)
        sc = Scenario("oracle", src, dedicated=3, max_batches=2, warmup_batches=2, sim=SimConfig(mem_util=0.5),
                      replan_interval_s=60.0, seed=seed)
        for pol in (_OracleRollplan(), _OracleElasticPlus()):
            assert run_policy(sc, pol).summary["trajectories_completed"] == 2 * 96
            assert pol.compared > 100 and not pol.mismatches, (pol.name, pol.mismatches[:5])


def test_only_informed_predictions_make_a_trajectory_critical() -> None:
    # With no history, every trajectory starts with the same uninformed prediction (the prior, then the mean of
    # whatever finished): none is predicted-critical until its group's first sibling finishes; afterwards every
    # critical trajectory has a group- or history-based prediction (rollplan.policy.dispatch.INFORMED_SOURCES).
    class _Watch(RollplanPolicy):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[int, bool]] = []  # (critical count, all critical informed)

        def choose_slot(self, sim, j):
            crit = self._critical()
            ok = crit <= self._informed
            self.seen.append((len(crit), ok))
            return super().choose_slot(sim, j)

    src = BatchSource.dataset(builtin_bases(3, prompts=12), groups=6, samples=4, seed=3, max_context=40960)
    sc = Scenario("informed", src, dedicated=1, max_batches=1, sim=SimConfig(mem_util=0.35), seed=3)
    pol = _Watch()
    assert run_policy(sc, pol).summary["trajectories_completed"] == 24
    assert pol.seen[0][0] == 0  # batch start, nothing known: nobody critical
    assert any(n > 0 for n, _ok in pol.seen)  # once siblings finish, group predictions single some out
    assert all(ok for _n, ok in pol.seen)


class _MoveAudit(RollplanPolicy):
    """rollplan, recording every migration it carries out with what its source slot was then: leaving (a
    deadline, or gone) and whether the plan keeps it decoding."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.moves_done: list[tuple[bool, bool]] = []

    def _apply(self, sim, plan):
        inner = sim.migrate

        def migrate(j, target, *, by_kv):
            t = sim.trajs[j]
            if t.slot >= 0 and t.kv_ok:
                src = sim.slots[t.slot]
                self.moves_done.append((src.return_by is not None or not src.present,
                                        plan.roles.get(src.id, src.role).decodes))
            return inner(j, target, by_kv=by_kv)

        sim.migrate = migrate
        try:
            super()._apply(sim, plan)
        finally:
            sim.migrate = inner


@pytest.mark.parametrize("moves", ["all", "forced"])
def test_rollplan_carries_out_only_the_moves_its_rule_keeps(moves: str) -> None:
    # MOVES / rollplan.policy.dispatch.carries_out_move: under "forced" every migration the policy carries out
    # leaves a slot that is going (a preemption notice) or stops decoding, and the plans' other moves are
    # dropped (counted: moves_not_carried_out); under "all" the plans' rebalancing moves (between two slots
    # that keep decoding) are carried out too. Not vacuous: moves of both kinds are planned on this replay
    # (spot GPUs coming and going under 32 trajectories on 4 dedicated GPUs).
    from rollplan.sim.traces import synthetic_spot_trace

    trace = synthetic_spot_trace(2 * 3600, max_gpus=4, seed=3, mean_alloc_gap_s=300, mean_preempt_gap_s=300)
    src = BatchSource.dataset(builtin_bases(3, prompts=16), groups=4, samples=8, seed=3, max_context=40960)
    sc = Scenario("moves", src, dedicated=4, trace=trace, max_batches=2, warmup_batches=2,
                  sim=SimConfig(fold_tool_s=5.0), replan_interval_s=60.0, seed=3)
    pol = _MoveAudit(moves=moves)
    run = run_policy(sc, pol)
    assert run.summary["trajectories_completed"] == 2 * 32
    dropped = run.summary["counters"].get("moves_not_carried_out", 0)
    rebalancing = [m for m in pol.moves_done if not m[0] and m[1]]
    if moves == "forced":
        assert not rebalancing and dropped > 0
    else:
        assert rebalancing and dropped == 0
    with pytest.raises(UnknownNameError):
        make_policy("rollplan", moves="some")
