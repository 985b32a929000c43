"""The coupled bound on the cut batch's tokens (``rollplan.sim.cut_bound``, ``bench_replay.cut_batch_bound``).

Invariants checked:
- ``step_envelope`` (hypothesis, the bench's H800 / Qwen3-8B step table): below every decode step the simulator
  prices, between the KV edges too, for every batch size the envelope is built for;
- ``prefill_envelope`` (hypothesis): below every prefill the simulator prices, multi-chunk ones included; a
  mixed step saves at most ``overlap`` per prefill token;
- ``course_groups`` by hand, and ``fastest_course`` is the same groups priced at batch 1;
- closed-form oracle: N identical one-turn trajectories on one GPU whose step is exactly affine (also with a
  KV term: a segment's steps are priced at its mean context). Running
  them all together is feasible and is what the relaxation allows, so the bound is those tokens (to the
  grid's resolution), never below them; with less KV than they need at once it is exactly what running as
  many as fit gives (the GPU' row: a step's fixed part split by KV occupancy);
- (hypothesis, random small batches) the bound never exceeds the per-trajectory sum and is reached when the
  GPUs are plentiful;
- ``window_gpu_seconds`` by hand over a trace's changes, with the lent GPUs' training step;
- on a crowded scenario (128 trajectories on 3 GPUs) the coupled bound binds (below the per-trajectory
  bound) and no policy, nor either oracle reference, exceeds the ceiling it gives, in both modes; with half
  the KV per GPU the ceiling is lower and still above every policy and reference, and its ``cut_batch``
  report has the GPU' row's cost above the window's GPU-seconds (below it with all the KV); with
  speculative decoding or divided rollout the ceiling falls back to the per-trajectory bound;
- ``cut_batch_tokens_at`` at the cut batch's earliest start is the share the ceiling counts, and a later
  start allows no more.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.sim.bench_replay import (
    coupled_cut_bound_applies,
    cut_batch_tokens_at,
    fastest_course,
    throughput_ceiling,
    window_gpu_seconds,
)
from rollplan.sim.cut_bound import (
    CourseGroup,
    StepEnvelope,
    course_groups,
    cut_batch_tokens_bound,
    max_batch,
    prefill_envelope,
    step_envelope,
)
from rollplan.sim.engine import SimConfig, SimTraj
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import ORACLE, ORACLE_STARTED, POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, perf_factory, run_replay
from rollplan.sim.traces import synthetic_spot_trace

FP = perf_factory("qwen3-8b", calibrated=True, config=SimConfig())("h800", 1)
MOST = 400
ENV = step_envelope(FP.decode, FP.max_context, FP.KV_STEP, MOST)
PRE = prefill_envelope(FP.prefill, FP.overlap, FP.chunk, FP.max_context, MOST, FP.P_STEP, FP.C_STEP)


@settings(max_examples=300, deadline=None)
@given(b=st.integers(1, MOST), kv=st.floats(0.0, float(FP.max_context)))
def test_step_envelope_is_below_every_step(b: int, kv: float) -> None:
    assert ENV.fixed + b * ENV.per_seq + ENV.per_kv * b * kv <= FP.decode(b, kv) + 1e-12
    assert ENV.alone(kv) <= FP.decode(1, kv) + 1e-12


def test_step_envelope_is_not_vacuous() -> None:
    # Within a few percent of the step at the bench's contexts: the fixed part and the KV slope are the table's.
    for b, kv in ((1, 0.0), (8, 16384.0), (64, 30000.0)):
        assert ENV.fixed + b * ENV.per_seq + ENV.per_kv * b * kv >= 0.97 * FP.decode(b, kv)


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(1, 20_000), cached=st.floats(0.0, float(FP.max_context)))
def test_prefill_envelope_is_below_every_prefill(tokens: int, cached: float) -> None:
    assert tokens * (PRE.per_token + PRE.per_ctx * cached) <= FP.prefill(tokens, cached) + 1e-12


def test_prefill_overlap_is_the_most_a_mixed_step_saves_per_token() -> None:
    for b in (1, 16, 256, MOST):
        assert FP.overlap(b) <= PRE.overlap * (FP.chunk - b) + 1e-15
    assert 0.0 < PRE.overlap < PRE.per_token  # every prefill token still costs GPU time


def test_course_groups_by_hand() -> None:
    spec = SimTraj("t", "g", 100, prefill=(10, 20, 5), decode=(5, 7, 3), tool=(3.0, 40.0, 9.0))
    # fold 5 s: turn 0's wait (3 s) folds it with turn 1; turn 1's (40 s) ends the group.
    assert course_groups(spec, 5.0) == (
        CourseGroup(110.0, 12, 43.0, ((10, 100.0), (20, 115.0))),
        CourseGroup(100 + 10 + 5 + 20 + 7 + 5, 3, 9.0, ((5, 142.0),)),
    )
    assert [g.tokens for g in course_groups(spec, 0.0)] == [5, 7, 3]

    def step(b: int, kv: float) -> float:
        return 0.001 * kv

    stretches, end = fastest_course(spec, step, 5.0)
    assert stretches == ((0.0, 12, 0.110), (12 * 0.110 + 43.0, 3, pytest.approx(0.147)))
    assert end == pytest.approx(12 * 0.110 + 43.0 + 3 * 0.147 + 9.0)


def _one_turn(i: int, prompt: int, tokens: int) -> SimTraj:
    return SimTraj(f"t{i}", f"g{i}", prompt, prefill=(0,), decode=(tokens,), tool=(0.0,))


AFFINE = StepEnvelope(fixed=0.010, per_seq=0.0005, per_kv=0.0)


@pytest.mark.parametrize("n_traj", [1, 4, 16, 64])
def test_identical_trajectories_on_one_gpu_closed_form(n_traj: int) -> None:
    window = 100.0
    alone = AFFINE.alone(1000.0)
    specs = [_one_turn(i, 1000, 1_000_000) for i in range(n_traj)]
    caps = [window / alone] * n_traj  # each alone at batch 1 for the whole window
    got = cut_batch_tokens_bound(specs, caps, AFFINE, window_s=window, gpu_seconds=window, kv_capacity=1e12,
                                 share=1)
    together = n_traj * window / (AFFINE.fixed + n_traj * AFFINE.co_runner(1000.0))
    # All of them in every step is feasible, and the relaxation allows exactly that (module docstring).
    assert together <= got + 1e-6
    assert got <= together * 1.03
    assert got <= sum(caps) + 1e-9


def test_a_segment_adds_its_mean_context_to_every_step() -> None:
    """16 identical one-turn trajectories decoding together on one GPU, the step's KV term not negligible: the
    simulator prices each segment's steps at the mean of its start and end contexts
    (``Batching.add``), whatever the segment has decoded so far, so the bound is what running them all together
    gives (the GPU row priced each token at the context its turn starts with, and the time row let each wait on
    more co-runners than there are: 1.8x that here)."""
    env = StepEnvelope(fixed=0.010, per_seq=0.0005, per_kv=1e-7)
    window, n_traj, prompt, turn = 100.0, 16, 1000, 20_000
    specs = [_one_turn(i, prompt, turn) for i in range(n_traj)]
    caps = [window / env.alone(prompt)] * n_traj
    got = cut_batch_tokens_bound(specs, caps, env, window_s=window, gpu_seconds=window, kv_capacity=1e12, share=1)
    together = n_traj * window / (env.fixed + n_traj * env.co_runner(prompt + turn / 2))
    assert together / n_traj < turn  # none of them finishes: the window binds
    assert together <= got + 1e-6
    assert got <= together * 1.03


@pytest.mark.parametrize("fit", [2, 4, 8])
def test_kv_capacity_binds_and_stays_above_a_feasible_schedule(fit: int) -> None:
    window, n_traj, ctx, turn = 100.0, 16, 1000, 1_000_000
    specs = [_one_turn(i, ctx, turn) for i in range(n_traj)]
    caps = [window / AFFINE.alone(ctx)] * n_traj
    roomy = cut_batch_tokens_bound(specs, caps, AFFINE, window_s=window, gpu_seconds=window, kv_capacity=1e12,
                                   share=1)
    # KV for ``fit`` of them at once: a segment reserves its turn's end context when it starts (the simulator's
    # ``Lifecycle.start_segment``), so each holds ctx + turn while it decodes, however little it has decoded.
    tight = cut_batch_tokens_bound(specs, caps, AFFINE, window_s=window, gpu_seconds=window,
                                   kv_capacity=fit * (ctx + turn), share=1)
    feasible = fit * window / (AFFINE.fixed + fit * AFFINE.co_runner(ctx))  # the same ``fit`` all along
    assert feasible <= tight + 1e-6
    # Exact: the reservation, not the context decoded so far, fills the KV, and a full GPU's step is shared by
    # the ``fit`` sequences its KV holds (the GPU' row; the GPU and KV rows alone allowed up to 1.2x).
    assert tight <= feasible * (1 + 1e-9)
    assert tight < 0.9 * roomy


@settings(max_examples=40, deadline=None)
@given(
    courses=st.lists(st.tuples(st.integers(100, 20_000), st.lists(st.tuples(st.integers(0, 3000),
                     st.integers(1, 3000), st.floats(0.0, 60.0)), min_size=1, max_size=4)), min_size=1, max_size=12),
    window=st.floats(5.0, 600.0),
    gpus=st.floats(0.1, 8.0),
)
def test_bound_is_at_most_the_per_trajectory_sum(courses: list, window: float, gpus: float) -> None:
    specs = [SimTraj(f"t{i}", "g", p, prefill=tuple(t[0] for t in turns), decode=tuple(t[1] for t in turns),
                     tool=tuple(t[2] for t in turns)) for i, (p, turns) in enumerate(courses)]
    caps = [sum(min(float(n), max(0.0, window) / ENV.alone(p)) for _, n, _ in turns) for p, turns in courses]
    caps = [min(c, float(sum(sp.decode))) for c, sp in zip(caps, specs, strict=True)]
    got = cut_batch_tokens_bound(specs, caps, ENV, window_s=window, gpu_seconds=gpus * window,
                                 kv_capacity=float(FP.kv_cap), share=1, prefill=PRE)
    assert 0.0 <= got <= sum(caps) + 1e-9
    plenty = cut_batch_tokens_bound(specs, caps, ENV, window_s=window, gpu_seconds=1e9 * window,
                                    kv_capacity=1e12, share=1, prefill=PRE)
    assert plenty == pytest.approx(sum(caps))


def test_max_batch_from_kv() -> None:
    specs = [SimTraj("a", "g", 1600, prefill=(100,), decode=(1,), tool=(0.0,)),
             SimTraj("b", "g", 3200, prefill=(50,), decode=(1,), tool=(0.0,))]
    assert max_batch(specs, 10_000.0, 16) == 50  # least hold: 1600 / 16 + 100 = 200 tokens
    assert max_batch(specs, 10_000.0, 1) == 5  # no sharing: 1700 tokens


def test_window_gpu_seconds_by_hand() -> None:
    trace = synthetic_spot_trace(3600, max_gpus=4, seed=3, mean_alloc_gap_s=200, mean_preempt_gap_s=200)
    sc = Scenario("w", BatchSource.dataset(builtin_bases(5, prompts=4), groups=2, samples=2, seed=1),
                  dedicated=3, trace=trace, lending=LendingConfig(gpus=2), seed=1)
    t0, t1 = 500.0, 1700.0
    live = 0.0
    step = 0.5
    t = t0 + step / 2
    while t < t1:  # midpoint rule over the trace's live count
        live += trace.gpus_at(t) * step
        t += step
    assert window_gpu_seconds(sc, t0, t1) == pytest.approx(3 * 1200 + live + 2 * 1200, abs=2 * step * 4)
    assert window_gpu_seconds(sc, t0, t1, busy_s=300.0) == pytest.approx(3 * 1200 + live + 2 * 900, abs=4.0)
    assert window_gpu_seconds(sc, t0, t1, busy_s=5000.0) == pytest.approx(3 * 1200 + live, abs=4.0)


def _crowded(mode: LendMode, duration_s: float, sim: SimConfig | None = None) -> Scenario:
    src = BatchSource.dataset(builtin_bases(5, prompts=16), groups=8, samples=8, seed=5, max_context=40960)
    return Scenario("crowded", src, dedicated=2, lending=LendingConfig(gpus=1, train_step_s=60.0, mode=mode),
                    duration_s=duration_s, sim=sim or SimConfig(fold_tool_s=5.0), replan_interval_s=60.0, seed=5)


@pytest.mark.parametrize("mode", [LendMode.SYNC, LendMode.ASYNC])
def test_no_policy_beats_the_coupled_ceiling(mode: LendMode) -> None:
    sc = _crowded(mode, 90.0)
    c = throughput_ceiling(sc)
    assert c["last_batch_share"] < c["last_batch_share_alone"] - 0.02  # the coupled bound binds here
    res = run_replay(sc, [make_policy(n) for n in (*POLICY_NAMES, ORACLE, ORACLE_STARTED)])
    best = max(run.summary["throughput_tokens_per_s"] for run in res.runs)
    assert 0.0 < best <= c["tokens_per_s"] + 1e-6


def test_cut_batch_tokens_at_is_the_ceilings_term_and_falls_with_a_later_start() -> None:
    """``cut_batch_tokens_at`` at the cut batch's earliest start is the share of it ``throughput_ceiling``
    counts; a later start never allows more, and the per-trajectory sum bounds it."""
    sc = _crowded(LendMode.SYNC, 90.0)
    c = throughput_ceiling(sc)
    k, start = c["cut_batch"]["index"], c["cut_batch"]["start_s"]
    specs, _keys = sc.batches.batch(k + sc.warmup_batches)
    whole = float(sum(sum(sp.decode) for sp in specs))
    got, alone, cb = cut_batch_tokens_at(sc, k, start)
    assert cb is not None and got <= alone
    assert got / whole == pytest.approx(c["last_batch_share"], abs=1e-4)
    assert alone / whole == pytest.approx(c["last_batch_share_alone"], abs=1e-4)
    later = [cut_batch_tokens_at(sc, k, start + dt)[0] for dt in (10.0, 30.0, 60.0)]
    assert got >= later[0] >= later[1] >= later[2] > 0.0


def test_less_kv_lowers_the_ceiling_and_no_policy_beats_it() -> None:
    """Half the KV per GPU (mem_util 0.45, a few of the longest contexts at once): the GPU' row (a step's
    fixed part split by KV occupancy) lowers the cut batch's bound, which the GPU and KV rows alone left
    where it was with the default KV, and every policy and reference stays below it."""
    roomy = throughput_ceiling(_crowded(LendMode.SYNC, 90.0))
    sc = _crowded(LendMode.SYNC, 90.0, SimConfig(fold_tool_s=5.0, mem_util=0.45))
    c = throughput_ceiling(sc)
    assert c["last_batch_share_alone"] == roomy["last_batch_share_alone"]
    assert c["last_batch_share"] < roomy["last_batch_share"] - 0.01
    # The report says why: decoding all the per-trajectory bound allows costs more GPU-seconds than the window
    # has with half the KV (the fixed part is split among fewer sequences), not with all of it.
    cut, cut_roomy = c["cut_batch"], roomy["cut_batch"]
    assert cut["index"] == 0 and cut["gpu_seconds"] == pytest.approx(window_gpu_seconds(sc, 0.0, sc.end_time))
    assert cut["work_gpu_s"] == cut_roomy["work_gpu_s"] and cut["fixed_gpu_s"] > cut_roomy["fixed_gpu_s"]
    assert cut_roomy["work_gpu_s"] + cut_roomy["fixed_gpu_s"] < cut_roomy["gpu_seconds"]
    assert cut["work_gpu_s"] + cut["fixed_gpu_s"] > cut["gpu_seconds"]
    res = run_replay(sc, [make_policy(n) for n in (*POLICY_NAMES, ORACLE, ORACLE_STARTED)])
    best = max(run.summary["throughput_tokens_per_s"] for run in res.runs)
    assert 0.0 < best <= c["tokens_per_s"] + 1e-6


@pytest.mark.parametrize("sim", [SimConfig(fold_tool_s=5.0, spec_tokens=2, spec_acceptance=0.6),
                                 SimConfig(fold_tool_s=5.0, divide_tokens=256)])
def test_other_physics_fall_back_to_the_per_trajectory_bound(sim: SimConfig) -> None:
    sc = _crowded(LendMode.SYNC, 90.0, sim)
    assert not coupled_cut_bound_applies(sc)
    c = throughput_ceiling(sc)
    assert c["last_batch_share"] == c["last_batch_share_alone"]
    assert c["cut_batch"] is None
    assert coupled_cut_bound_applies(replace(sc, sim=SimConfig(fold_tool_s=5.0)))


def test_bound_is_finite_and_zero_without_window() -> None:
    specs = [_one_turn(0, 1000, 100)]
    assert cut_batch_tokens_bound(specs, [0.0], AFFINE, window_s=0.0, gpu_seconds=0.0, kv_capacity=1.0,
                                  share=1) == 0.0
    assert math.isfinite(cut_batch_tokens_bound(specs, [50.0], AFFINE, window_s=10.0, gpu_seconds=10.0,
                                                kv_capacity=1e6, share=1))
