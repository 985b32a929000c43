"""The event simulator: event order, a hand-computed makespan, conservation, fold consistency.

Invariants checked with hypothesis (``test_conservation``), for every policy on random seeded scenarios
(synthetic workload, synthetic spot trace with and without notice, lending, sync and async, every tool-call KV
model, with and without shared prompts):
- every trajectory of every batch completes exactly once;
- decode tokens produced == the workload's decode tokens (all batches complete);
- GPU-seconds by category never exceed present-time x GPUs; no KV reservation left when a batch is done;
- each slot's running total of KV held by residents in tool calls equals a scan of its residents.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollplan.models.perf import perf_model
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj
from rollplan.sim.events import Event, EventQueue, EvKind, event_key
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy
from rollplan.sim.traces import synthetic_spot_trace


def test_event_kind_priorities_are_pinned() -> None:
    assert [k.name for k in sorted(EvKind)] == [
        "SEG_DONE", "JOIN", "TOOL_DONE", "ACTION_DONE", "AVAIL", "DEADLINE", "TRAIN_DONE", "BATCH_START", "PLAN_READY",
        "REPLAN",
    ]
    assert [int(k) for k in sorted(EvKind)] == list(range(10))


def test_heap_order_is_time_then_priority_then_seq() -> None:
    q = EventQueue()
    made = [q.make(t, k, i, 0) for i, (t, k) in enumerate(
        [(5.0, EvKind.REPLAN), (5.0, EvKind.SEG_DONE), (1.0, EvKind.AVAIL), (5.0, EvKind.SEG_DONE), (5.0, EvKind.AVAIL)]
    )]
    shuffled = made[:]
    random.Random(3).shuffle(shuffled)
    for e in shuffled:
        q.push(e)
    popped = [q.pop() for _ in range(len(made))]
    assert popped == sorted(made, key=event_key)
    assert [(e.time, EvKind(e.kind).name) for e in popped] == [
        (1.0, "AVAIL"), (5.0, "SEG_DONE"), (5.0, "SEG_DONE"), (5.0, "AVAIL"), (5.0, "REPLAN"),
    ]
    # Equal time and kind: first scheduled first (seq), whatever the payload.
    a, b = Event(2.0, 0, 7, 99, 0), Event(2.0, 0, 8, 1, 0)
    assert heapq.nsmallest(2, [b, a]) == [a, b]


def _one_slot_scenario(specs: list[SimTraj], *, fold: float = 0.0) -> Scenario:
    return Scenario("tiny", BatchSource(tuple(specs)), dedicated=1, max_batches=1, sim=SimConfig(fold_tool_s=fold))


def _chunked_prefill(perf, tokens: int, cached: int, chunk: int = 2048) -> float:
    done, total = 0, 0.0
    while done < tokens:
        n = min(chunk, tokens - done)
        total += perf.prefill_time([n], [cached + done])
        done += n
    return total


def test_tiny_static_case_matches_hand_computed_makespan() -> None:
    # One H800 running Qwen3-8B (the shipped calibration, as replays use), one trajectory: prompt 3000, turn 0 decodes 400 then a 2 s tool call,
    # turn 1 prefills 500 new tokens and decodes 150. Alone on its slot: batch 1, chunked prefill stalls it.
    spec = SimTraj("t0", "g0", 3000, (0, 500), (400, 150), (2.0, 0.0))
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    ctx0 = 3000
    seg0 = _chunked_prefill(p, 3000, 0) + 400 * p.decode_step_time(1, ctx0 + 200)
    ctx1 = ctx0 + 400 + 500
    seg1 = _chunked_prefill(p, 500, ctx0 + 400) + 150 * p.decode_step_time(1, ctx1 + 75)
    expected = seg0 + 2.0 + seg1
    run = run_policy(_one_slot_scenario([spec]), make_policy("static-colocated"))
    rollout = run.summary["batches"][0]["rollout_s"]
    assert rollout == pytest.approx(expected, rel=0.01)
    assert run.summary["decode_tokens"] == pytest.approx(550)
    assert run.summary["trajectories_completed"] == 1


@pytest.mark.parametrize("same_prompt", [False, True])
def test_two_trajectories_share_one_slot(same_prompt: bool) -> None:
    # Two single-turn trajectories start together: one batch of 2 for the whole decode. Two samples of one
    # prompt prefill it once (shared prompts, the default); two prompts of the same length twice.
    spec = [SimTraj(f"t{i}", "g0" if same_prompt else f"g{i}", 1000, (0,), (300,), (0.0,)) for i in range(2)]
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    prefills = 1 if same_prompt else 2
    expected = prefills * _chunked_prefill(p, 1000, 0) + 300 * p.decode_step_time(2, 1150)
    run = run_policy(_one_slot_scenario(spec), make_policy("static-colocated"))
    assert run.summary["batches"][0]["rollout_s"] == pytest.approx(expected, rel=0.005)
    assert run.summary["prefill_tokens"] == 1000 * prefills


def test_fast_perf_tables_stay_within_one_percent() -> None:
    p = perf_model("h800", "qwen3-8b")
    fp = FastPerf(p, 2048, 40960, 0.9)
    rng = random.Random(0)
    for _ in range(200):
        b = rng.randint(1, 64)
        kv = rng.uniform(100, 40000)
        assert fp.decode(b, kv) == pytest.approx(p.decode_step_time(b, kv), rel=0.01)
        n = rng.randint(1, 20000)
        c = rng.randint(0, 30000)
        assert fp.prefill(n, c) == pytest.approx(_chunked_prefill(p, n, c), rel=0.01)


def _random_scenario(seed: int, *, mode: str, notice: float, batches: int = 2, tool_kv: str = "pinned",
                     share: bool = False) -> Scenario:
    trace = synthetic_spot_trace(4 * 3600, max_gpus=6, seed=seed, mean_alloc_gap_s=200, mean_preempt_gap_s=150,
                                 notice_s=notice)
    src = BatchSource.dataset(builtin_bases(seed, prompts=12), groups=4, samples=4, seed=seed, max_context=40960)
    return Scenario(
        f"random{seed}", src, dedicated=2, trace=trace,
        lending=LendingConfig(gpus=2, train_step_s=60.0, mode=LendMode(mode), reclaim_notice_s=5.0),
        max_batches=batches, sim=SimConfig(fold_tool_s=5.0, tool_kv=tool_kv, share_prompt=share),
        replan_interval_s=90.0,
    )


class CountingPolicy:
    """Wraps a real policy and counts completions per (batch, trajectory) (an observer, not a fake)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.done: dict[tuple[int, str], int] = {}
        self.left_at_batch_end: list[tuple[int, int]] = []
        self.idle_mismatch = 0

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def on_traj_done(self, sim, j) -> None:
        t = sim.trajs[j]
        key = (t.batch, t.spec.id)
        self.done[key] = self.done.get(key, 0) + 1
        self.idle_mismatch += sum(s.idle != sim._idle_kv(s) for s in sim.live)  # incremental == scan
        if sim.batch_left == 1:  # the batch's last trajectory (its own KV already released)
            self.left_at_batch_end.append(
                (sum(s.reserved for s in sim.slots), sum(len(s.residents) + len(s.groups) for s in sim.slots)))
        self.inner.on_traj_done(sim, j)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["sync", "async"]), notice=st.sampled_from([0.0, 30.0]),
       tool_kv=st.sampled_from(["pinned", "evictable", "offload"]), share=st.booleans())
def test_conservation(seed: int, mode: str, notice: float, tool_kv: str, share: bool) -> None:
    sc = _random_scenario(seed, mode=mode, notice=notice, tool_kv=tool_kv, share=share)
    for name in POLICY_NAMES:
        pol = CountingPolicy(make_policy(name))
        run = run_policy(sc, pol)
        s = run.summary
        assert s["batches_completed"] == 2, (name, s["batches"])
        expected = [t for k in range(2) for t in sc.batches.batch(k)[0]]
        assert sorted(pol.done) == sorted((k, t.id) for k in range(2) for t in sc.batches.batch(k)[0])
        assert set(pol.done.values()) == {1}, name
        assert s["decode_tokens"] == pytest.approx(sum(t.decode_tokens for t in expected), rel=1e-9, abs=1e-3), name
        assert s["trajectories_completed"] == len(expected)
        assert pol.left_at_batch_end == [(0, 0), (0, 0)], name  # no KV reservation left after a batch
        assert pol.idle_mismatch == 0, name
        present = s["gpu_seconds_present"]
        assert present <= s["replay_s"] * (2 + 2 + 6) + 1e-6


def test_fold_changes_little() -> None:
    """Folding short tool waits into segments (fewer events) keeps throughput within a few percent."""
    src = BatchSource.dataset(builtin_bases(1, prompts=24), groups=8, samples=4, seed=1, max_context=40960)
    out = {}
    for fold in (0.0, 30.0):
        sc = Scenario("fold", src, dedicated=4, max_batches=2, sim=SimConfig(fold_tool_s=fold))
        out[fold] = run_policy(sc, make_policy("static-colocated")).summary
    a, b = out[0.0], out[30.0]
    assert b["events"] < a["events"]
    assert b["decode_tokens"] == pytest.approx(a["decode_tokens"])
    assert b["throughput_tokens_per_s"] == pytest.approx(a["throughput_tokens_per_s"], rel=0.05)
    assert math.isfinite(b["tail_share"]["mean"])


class DoneTimes:
    """Wraps a real policy and records when each trajectory completes (an observer, not a fake)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.at: dict[str, float] = {}

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def on_traj_done(self, sim, j) -> None:
        self.at[sim.trajs[j].spec.id] = sim.now
        self.inner.on_traj_done(sim, j)


def test_waiting_turn_evicts_a_resident_that_went_to_its_tool() -> None:
    # One slot with ~30k tokens of KV. B comes back from a 1 s tool call needing 8k more tokens: no room,
    # and A (still decoding) cannot be evicted, so B waits. When A starts its 60 s tool call, B evicts A at
    # once (an engine retries waiting requests every step) instead of waiting ~30 s for C to finish.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285, tool_kv="pinned")
    assert 28_000 < perf_model("h800", "qwen3-8b").kv_capacity_tokens(cfg.mem_util) < 32_000
    specs = [
        SimTraj("A", "gA", 8000, (0, 0), (300, 50), (60.0, 0.0)),
        SimTraj("B", "gB", 8000, (0, 8000), (50, 50), (1.0, 0.0)),
        SimTraj("C", "gC", 8000, (0,), (3000,), (0.0,)),
    ]
    sc = Scenario("evict", BatchSource(tuple(specs)), dedicated=1, max_batches=1, sim=cfg)
    pol = DoneTimes(make_policy("static-colocated"))
    run = run_policy(sc, pol)
    assert run.summary["counters"].get("evictions", 0) >= 1
    assert pol.at["B"] < 10.0 < pol.at["C"], pol.at


def test_disaggregated_turn_matches_hand_computed_time() -> None:
    # static-disagg 1:1 on two dedicated H800s (one node each): the single-turn trajectory prefills its
    # 3000-token prompt on the PREFILL slot, ships the KV across nodes, then decodes 400 tokens alone.
    spec = SimTraj("t0", "g0", 3000, (0,), (400,), (0.0,))
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    expected = (_chunked_prefill(p, 3000, 0) + p.kv_transfer_time(3000, same_node=False)
                + 400 * p.decode_step_time(1, 3000 + 200))
    sc = Scenario("pd", BatchSource((spec,)), dedicated=2, max_batches=1, sim=SimConfig(fold_tool_s=0.0))
    run = run_policy(sc, make_policy("static-disagg", pd=(1, 1)))
    s = run.summary
    assert s["gpu_seconds"].get("prefill", 0) > 0 and s["gpu_seconds"].get("decode", 0) > 0
    assert s["batches"][0]["rollout_s"] == pytest.approx(expected, rel=0.01)


def _tool_kv_run(mode: str) -> tuple[dict, dict[str, float]]:
    # One slot with ~30k tokens of KV. A (8.3k tokens) decodes, then waits 60 s on a tool; B needs 24.5k
    # tokens, which fit only without A's KV. FCFS: A is admitted first and B waits.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285, tool_kv=mode)
    specs = [
        SimTraj("A", "gA", 8000, (0, 0), (300, 50), (60.0, 0.0)),
        SimTraj("B", "gB", 24000, (0,), (500,), (0.0,)),
    ]
    sc = Scenario("tool-kv", BatchSource(tuple(specs)), dedicated=1, max_batches=1, sim=cfg)
    pol = DoneTimes(make_policy("static-colocated"))
    run = run_policy(sc, pol)
    return run.summary, pol.at


def test_tool_kv_modes_pinned_evictable_offload() -> None:
    prompts = 8000 + 24000
    pinned, at_p = _tool_kv_run("pinned")
    evict, at_e = _tool_kv_run("evictable")
    off, at_o = _tool_kv_run("offload")
    # pinned: B waits for A to finish (after A's 60 s tool call); A's KV is never touched.
    assert at_p["A"] > 60.0 and at_p["B"] > at_p["A"]
    assert pinned["counters"].get("evictions", 0) == 0 and pinned["prefill_tokens"] == prompts
    # evictable: B takes A's KV as soon as A goes to its tool; A re-prefills its 8,300-token context.
    assert at_e["B"] < 20.0 < 60.0 < at_e["A"]
    assert evict["counters"]["evictions"] == 1
    assert evict["prefill_tokens"] == prompts + 8000 + 300
    # offload: the same admission, but A's context comes back from the store, not re-prefilled.
    assert at_o["B"] == pytest.approx(at_e["B"])
    assert off["counters"]["evictions"] == 1 and off["counters"]["kv_reloads"] == 1
    assert off["prefill_tokens"] == prompts
    p = perf_model("h800", "qwen3-8b", calibrated=True)
    reload_s = p.kv_transfer_time(8300, same_node=False)
    assert at_o["A"] < at_e["A"]
    assert at_o["A"] >= 60.0 + reload_s
    # Every mode decodes the workload's tokens.
    assert pinned["decode_tokens"] == evict["decode_tokens"] == off["decode_tokens"] == 850


def test_offload_reload_skips_a_prompt_a_sibling_holds() -> None:
    # One slot with ~30k tokens of KV. A (prompt 8k + 4.3k of its own) goes to a 10 s tool call; B (18k) then
    # evicts A's own 4.3k, not the prompt, which A's sibling A2 (still decoding) holds. When A comes back, only
    # the 4.3k come from the store: the prompt is matched on the GPU.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285, tool_kv="offload")
    specs = [
        SimTraj("A", "g", 8000, (4000, 0), (300, 50), (10.0, 0.0)),
        SimTraj("A2", "g", 8000, (0,), (3000,), (0.0,)),
        SimTraj("B", "gB", 17500, (0,), (500,), (0.0,)),
    ]
    sc = Scenario("reload", BatchSource(tuple(specs)), dedicated=1, max_batches=1, sim=cfg)
    pol = DoneTimes(make_policy("static-colocated"))
    s = run_policy(sc, pol).summary
    assert s["counters"]["evictions"] == 1 and s["counters"]["kv_reloads"] == 1
    assert s["counters"]["kv_reload_tokens"] == 8000 + 4000 + 300 - 8000
    assert s["prefill_tokens"] == 8000 + 4000 + 17500  # nothing re-prefilled
    assert pol.at["B"] < pol.at["A"] < pol.at["A2"]


def test_unknown_tool_kv_mode_is_a_user_error() -> None:
    from rollplan.models.errors import UserInputError

    with pytest.raises(UserInputError, match="tool KV mode"):
        SimConfig(tool_kv="lru")
    with pytest.raises(UserInputError, match="evicted return"):
        SimConfig(evicted_return="engine")


def _evicted_return_run(mode: str, policy: str) -> tuple[dict, dict[str, float]]:
    # Two slots with ~30k tokens of KV each. A (8.3k tokens) on slot 0 goes to a 60 s tool call; C (24.5k) takes
    # slot 1 and is done in seconds; B (29k: 20k prompt, 9k decode) fits only without A's KV, so it evicts A on
    # slot 0 and decodes past A's return. Back from its tool, A finds slot 1 free and slot 0 full with B.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285, evicted_return=mode)
    specs = [
        SimTraj("A", "gA", 8000, (0, 0), (300, 50), (60.0, 0.0)),
        SimTraj("C", "gC", 24000, (0,), (500,), (0.0,)),
        SimTraj("B", "gB", 20000, (0,), (9000,), (0.0,)),
    ]
    sc = Scenario("evicted-return", BatchSource(tuple(specs)), dedicated=2, max_batches=1, sim=cfg)
    pol = DoneTimes(make_policy(policy))
    return run_policy(sc, pol).summary, pol.at


@pytest.mark.parametrize("policy", ["elastic-plus", "static-colocated"])
def test_evicted_trajectory_returns_to_the_policy_or_to_its_engine(policy: str) -> None:
    back_to_policy, at_p = _evicted_return_run("policy", policy)
    back_to_slot, at_s = _evicted_return_run("slot", policy)
    for summary in (back_to_policy, back_to_slot):
        assert summary["counters"]["evictions"] == 1
        assert summary["prefill_tokens"] == 8000 + 24000 + 20000 + 8000 + 300  # A re-prefilled, either way
        assert summary["decode_tokens"] == 350 + 500 + 9000
    # "policy": the policy places A again, on the free slot 1, as soon as its tool returns.
    assert at_p["A"] < at_p["B"]
    # "slot" (the executor's behaviour): A waits for its own engine, where B holds the KV until it is done.
    assert at_s["B"] == pytest.approx(at_p["B"]) and at_s["A"] > at_s["B"]


def _shared_prompt_run(share: bool) -> tuple[dict, dict[str, float]]:
    # One slot with ~30k tokens of KV; two samples of one prompt (16k tokens), 300 decode tokens each. Apart
    # they need 32.6k tokens, so B waits for A; sharing the prompt they need 16.6k and run together.
    cfg = SimConfig(fold_tool_s=0.0, mem_util=0.285, share_prompt=share)
    specs = [SimTraj("A", "g", 16000, (0,), (300,), (0.0,)), SimTraj("B", "g", 16000, (0,), (300,), (0.0,))]
    sc = Scenario("share", BatchSource(tuple(specs)), dedicated=1, max_batches=1, sim=cfg)
    pol = DoneTimes(make_policy("static-colocated"))
    return run_policy(sc, pol).summary, pol.at


def test_shared_prompt_is_held_and_prefilled_once_per_slot() -> None:
    alone, at_a = _shared_prompt_run(False)
    shared, at_s = _shared_prompt_run(True)
    assert alone["prefill_tokens"] == 32000 and shared["prefill_tokens"] == 16000
    assert at_a["B"] > at_a["A"] + 1.0  # B waited for A's KV
    assert at_s["B"] == pytest.approx(at_s["A"], abs=0.5)  # together
    assert shared["batches"][0]["rollout_s"] < alone["batches"][0]["rollout_s"]
    assert shared["decode_tokens"] == alone["decode_tokens"] == 600
