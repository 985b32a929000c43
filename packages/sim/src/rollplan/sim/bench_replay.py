"""``rollplan bench replay``: the replay benchmark on every shared availability trace.

Scenario (the README quotes it): 16 dedicated H800s; 8 training GPUs lent between training steps (sync RL,
120 s steps); preemptible H800s from the trace, the trace's nodes mapped onto at most 16 GPUs (one GPU per
node, 30 s preemption notice); Qwen3-8B; batches of 128 prompts x 16 samples drawn from the SWE-bench agent
traces (``../shared/data``), each prompt's samples varied around one recorded run (``--dispersion``: how much),
prompts recurring across epochs (``--first-epoch``: never seen before, ``FirstEpochSource``); re-plans on every
availability change and every 300 s. Each trace is replayed to its end with all six policies (same trace,
workload, performance model and seed), as a window of a longer job: the window starts at RL step 4, and the
history prior of rollplan and elastic-plus has seen steps 1-3 (``WARMUP_BATCHES``). ``mode="async"``
(``--mode async``) runs the same scenario one-step off-policy, PEARL's setting.

Per trace it reports the throughput ratios rollplan / elastic-colocated, rollplan / formula-pd,
rollplan / static-colocated, the best other policy (``best_other``: the highest tokens/s of the policies other
than rollplan, elastic-plus included) and rollplan / it, and every policy's last-10% share, on the batches all
six completed (the target's comparison: ``metrics.common_tail_shares``) and on each policy's own batches; and, on those common
batches, each policy's summed rollout time over a lower bound no policy can beat (``batch_floors``: the
longest trajectory decoding at batch 1 plus its tool waits), which shows how much any policy could still gain; and for the 11-hour Bamboo p3 trace the wall
time of the whole six-policy replay and simulator events per second. ``--per-batch`` adds, per batch, its
floor and every policy's rollout seconds and last-10% share (``per_batch_rows``). ``--matrix``
(``run_matrix``): every trace x {sync, async} x ``MATRIX_WORKLOADS``, each cell with the share of what is left
over the best other policy and whether issue 18's targets hold.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rollplan.models.errors import UserInputError
from rollplan.sim import cut_bound
from rollplan.sim.engine import SimConfig, SimTraj
from rollplan.sim.lending import LendingConfig, LendingSchedule, LendMode
from rollplan.sim.metrics import common_tail_shares
from rollplan.sim.policies import MOVES, ORACLE, ORACLE_STARTED, ORACLES, POLICY_NAMES, REGIME, make_policy
from rollplan.sim.replay import (
    SWEBENCH_FILES,
    BatchSource,
    ReplayResult,
    Scenario,
    perf_factory,
    run_replay,
    swebench_bases,
)
from rollplan.sim.traces import load_trace
from rollplan.sim.workload import DEFAULT_DISPERSION

BENCH_TRACES: tuple[tuple[str, str, str | None], ...] = (
    ("bamboo-p3", "bamboo_aws_p3_trace.csv", None),
    ("bamboo-g4dn", "bamboo_aws_g4dn_trace.csv", None),
    ("parcae-hh", "parcae_aws_p3_32node_1h_segments.csv", "hh_55_65"),
    ("parcae-hl", "parcae_aws_p3_32node_1h_segments.csv", "hl_15_25"),
    ("parcae-lh", "parcae_aws_p3_32node_1h_segments.csv", "lh_80_90"),
    ("parcae-ll", "parcae_aws_p3_32node_1h_segments.csv", "ll_10_11"),
)
TIMED_TRACE = "bamboo-p3"
GROUPS, SAMPLES = 128, 16
REPLAN_INTERVAL_S = 300.0
FOLD_TOOL_S = SimConfig().fold_tool_s
"""The bench's segment folding (``SimConfig.fold_tool_s``): the simulator's default; ``bench replay
--fold-tool-s`` replays the same scenarios with another (0: every turn its own segment, exact turn-level
events; docs/simulator.md, "How much the folding moves the bench")."""
EVICTED_RETURN = SimConfig().evicted_return
"""Where a trajectory whose KV an engine evicted in its tool call goes back to (``SimConfig.evicted_return``):
the simulator's default, the policy's queue; ``bench replay --evicted-return slot`` replays the bench with the
executor's behaviour, the engine that evicted it (docs/simulator.md, "Evicted trajectories: back to the policy
or to their engine")."""
WARMUP_BATCHES = 3
"""Each trace is a window of a longer RL job: the replay starts at step W+1 and history-keeping policies
(the predictor of rollplan and elastic-plus) have seen steps 1..W (the other baselines keep no history, so this
changes nothing for them)."""
TARGETS = {"vs_elastic": 1.2, "vs_formula_pd": 1.1}
LONGEST_FIRST = ("rollplan", "elastic-plus", "formula-pd", "elastic-colocated", "static-colocated", "static-disagg")
"""Policies by their replay time on the bench (``timing.per_policy_cpu_s``): the order they go to workers."""


@dataclass(frozen=True)
class FirstEpochSource(BatchSource):
    """A ``BatchSource`` whose prompts are never seen before (``--first-epoch``): batch k's history keys are
    its prompts' keys tagged with k, so no batch's prompt is in any length history (the warm-up steps' or an
    earlier batch's). Same trajectories as the plain source. Why keys and not a draw of unseen prompts: see
    the module docstring of ``rollplan.sim.workload``."""

    def batch(self, k: int) -> tuple[tuple[SimTraj, ...], tuple[str, ...]]:
        specs, keys = super().batch(k)
        return specs, tuple(f"{key}@batch{k}" for key in keys)


def workload_options(src: BatchSource, *, dispersion: float | None = None, first_epoch: bool = False) -> BatchSource:
    """``src`` with the workload options of ``rollplan replay`` / ``bench replay``: ``dispersion`` (the
    within-group sigma, ``rollplan.sim.workload.with_dispersion``; None: unchanged) applies to every varied
    sample (a workload file's batches from 1 on; batch 0 is the file as written); ``first_epoch``: a
    ``FirstEpochSource``. Raises ``UserInputError`` for a bad dispersion."""
    from rollplan.sim.workload import with_dispersion

    if dispersion is None and not first_epoch:
        return src
    args = {f.name: getattr(src, f.name) for f in fields(src) if f.name != "_cache"}
    if dispersion is not None:
        args["variation"] = with_dispersion(dispersion, src.variation)
    return (FirstEpochSource if first_epoch else BatchSource)(**args)


def prompt_keys(src: BatchSource) -> set[str]:
    """Every history key (prompt) ``src`` may draw, as ``BatchSource.batch`` keys them: a base's group for a
    fixed source (a workload file), its ``source`` (or id) for a dataset; what a history file may name."""
    if src.groups <= 0:
        return {b.group for b in src.bases}
    return {b.source or b.id for b in src.bases}


def default_jobs() -> int:
    """Worker processes the bench uses by default: one per CPU core this process may run on, at most one per
    policy (the replays of a trace are independent; the rows do not depend on it)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, len(POLICY_NAMES)))


def bench_scenario(data_dir: Path, trace_name: str, *, bases: Any = None, seed: int = 0,
                   tool_kv: str = "evictable", share_prompt: bool = True, mode: str = "sync",
                   dispersion: float | None = None, first_epoch: bool = False,
                   fold_tool_s: float = FOLD_TOOL_S, evicted_return: str = EVICTED_RETURN) -> Scenario:
    """The benchmark scenario on one of ``BENCH_TRACES``; ``tool_kv``, ``share_prompt``, ``fold_tool_s`` and
    ``evicted_return``: the
    ``SimConfig`` fields (every policy); ``mode``: ``LendMode`` (sync: the bench's; async: one-step off-policy, PEARL's);
    ``dispersion`` and ``first_epoch``: ``workload_options`` (None / False: the bench's workload)."""
    entry = next((t for t in BENCH_TRACES if t[0] == trace_name), None)
    if entry is None:
        raise UserInputError(f"unknown bench trace {trace_name!r}", fix=f"use one of {[t[0] for t in BENCH_TRACES]}")
    _name, file, segment = entry
    trace = load_trace(data_dir / file, segment=segment, gpu="h800", gpus_per_node=1, max_gpus=16, notice_s=30.0)
    bases = bases if bases is not None else swebench_bases(data_dir)
    return Scenario(
        name=f"bench:{trace_name}",
        batches=workload_options(BatchSource.dataset(bases, groups=GROUPS, samples=SAMPLES, seed=seed, max_context=40960),
                                 dispersion=dispersion, first_epoch=first_epoch),
        model="qwen3-8b",
        gpu="h800",
        dedicated=16,
        trace=trace,
        lending=LendingConfig(gpus=8, gpu="h800", train_step_s=120.0, mode=LendMode(mode)),
        seed=seed,
        sim=SimConfig(tool_kv=tool_kv, share_prompt=share_prompt, fold_tool_s=fold_tool_s,
                      evicted_return=evicted_return),
        replan_interval_s=REPLAN_INTERVAL_S,
        warmup_batches=WARMUP_BATCHES,
    )


def fastest_course(spec: SimTraj, decode_step: Callable[[int, float], float],
                   fold_s: float = 0.0) -> tuple[tuple[tuple[float, int, float], ...], float]:
    """The fastest course any policy can give ``spec`` in the simulator, from the moment its batch starts:
    ``(stretches, end)``, each stretch ``(start second, decode tokens, seconds per token)`` and ``end`` the second
    the trajectory is done.

    The simulator runs a trajectory in segments that fold consecutive turns whose tool waits are
    <= ``fold_s`` (``SimConfig.fold_tool_s``; ``rollplan.sim.engine``): a segment decodes its turns' tokens
    back to back and waits their tool seconds after its last turn; a segment cut short (KV room) only splits
    that. So each fold group (the turns from one to the first whose tool wait exceeds ``fold_s``, or the last
    turn) is one stretch of its decode tokens followed by all its tool waits, the last group's included (a
    trajectory finishes when its trailing environment time, e.g. a final test run, is over; see
    ``rollplan.sim.workload``). A segment's step is never shorter than the batch-1 step at the context the
    segment starts with (its members' mean context is at least that, and a larger batch only adds), so every
    token of a group is priced at ``decode_step(1, c0)`` with ``c0`` the group's context when its first turn
    starts decoding (prompt, every earlier token, that turn's new prefill). Prefill, queueing and engine
    starts are left out, so the course is optimistic: no policy's trajectory is ever ahead of it."""
    t = 0.0
    out: list[tuple[float, int, float]] = []
    for g in cut_bound.course_groups(spec, fold_s):
        spt = decode_step(1, g.ctx0)
        out.append((t, g.tokens, spt))
        t += g.tokens * spt + g.tool_s
    return tuple(out), t


def traj_floor(spec: SimTraj, decode_step: Callable[[int, float], float], fold_s: float = 0.0) -> float:
    """A lower bound on ``spec``'s rollout time under any policy: the end of its ``fastest_course``
    (every decode token at batch 1, at the context its fold group starts with, plus all its tool waits).
    Prefill and queueing are left out, so the bound is loose."""
    return fastest_course(spec, decode_step, fold_s)[1]


def traj_tokens_by(spec: SimTraj, decode_step: Callable[[int, float], float], seconds: float,
                   fold_s: float = 0.0) -> float:
    """An upper bound on the decode tokens any policy gets from ``spec`` in the first ``seconds`` of its
    batch: how far its ``fastest_course`` gets by then (all of them once ``seconds`` reaches its end)."""
    got = 0.0
    for start, tokens, spt in fastest_course(spec, decode_step, fold_s)[0]:
        if start >= seconds:
            break
        got += min(float(tokens), (seconds - start) / spt) if spt > 0 else float(tokens)
    return got


def _course_fold(scenario: Scenario) -> tuple[float, float]:
    """(fold for floors, fold for tokens by a time) in ``scenario``'s simulator. With divided rollout
    (``SimConfig.divide_tokens``) a chunk's folded tool seconds are owed to the end of its next whole segment,
    so a trajectory may decode part of its next fold group before waiting them: tokens by a time are then
    bounded as if every wait could come after every token (fold = inf); its total time is unchanged."""
    fold = scenario.sim.fold_tool_s
    return fold, (math.inf if scenario.sim.divide_tokens else fold)


def batch_floors(scenario: Scenario, indices: Sequence[int]) -> dict[int, float]:
    """Replay batch index -> the longest ``traj_floor`` of its trajectories: no policy's rollout of that batch
    can be shorter (the bench's slots are all one GPU kind at tp 1)."""
    step = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)(scenario.gpu, 1).decode
    fold = _course_fold(scenario)[0]
    out = {}
    for i in indices:
        specs, _keys = scenario.batches.batch(i + scenario.warmup_batches)
        out[i] = max((traj_floor(sp, step, fold) for sp in specs), default=0.0)
    return out


def window_gpu_seconds(scenario: Scenario, t0: float, t1: float, *, busy_s: float = 0.0) -> float:
    """GPU-seconds any policy can have over ``[t0, t1)``: the dedicated GPUs, the trace's live ones (a GPU under
    notice counts until it leaves) and the lent ones, less ``busy_s`` seconds at the window's start when they
    train (an async rollout overlaps the step on the batch before it)."""
    span = max(0.0, t1 - t0)
    total = scenario.dedicated * span
    if scenario.trace is not None:
        pts = scenario.trace.gpu_count_series()
        for (a, n), (b, _) in zip(pts, (*pts[1:], (math.inf, 0)), strict=True):
            lo, hi = max(a, t0), min(b, t1)
            if hi > lo:
                total += n * (hi - lo)
    return total + scenario.lending.gpus * max(0.0, span - busy_s)


def coupled_cut_bound_applies(scenario: Scenario) -> bool:
    """Whether ``cut_bound``'s physics are the scenario's: one GPU kind at tp 1 throughout, one token per
    sequence per decode step (no speculative decoding) and no divided rollout."""
    sim = scenario.sim
    if sim.spec_tokens or sim.divide_tokens:
        return False
    if scenario.lending.gpus and scenario.lending.gpu != scenario.gpu:
        return False
    if scenario.trace is not None:
        if scenario.trace.gpu != scenario.gpu:
            return False
        if any(sl.tp != 1 for ev in scenario.trace.events for sl in ev.slots):
            return False
    return True


_ENVELOPES: dict[tuple[Any, ...], tuple[cut_bound.StepEnvelope, cut_bound.PrefillEnvelope]] = {}
"""The envelopes of each step table the ceilings used (a pure function of the key; ~1 s to build)."""


def cut_batch_bound(scenario: Scenario, specs: Sequence[SimTraj], start: float, per_traj: Sequence[float], *,
                    first: bool = False) -> cut_bound.CutBatchBound | None:
    """The decode tokens of the batch the window's end cuts that any policy can have by the end, the batch
    starting no earlier than ``start``: the least of the per-trajectory bound (``per_traj``, each
    trajectory's ``traj_tokens_by``) and, where it applies (``coupled_cut_bound_applies``), the coupled bound
    of ``rollplan.sim.cut_bound`` over the GPU-seconds left (``window_gpu_seconds``), returned with what its
    GPU' row charges (``cut_bound.CutBatchBound``); None where only the per-trajectory bound applies.
    ``first``: the replay's first batch, which no training step overlaps (async: every later rollout starts
    with the step on the batch before it, and the lent GPUs train meanwhile)."""
    if not specs or not coupled_cut_bound_applies(scenario):
        return None
    fp = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)(scenario.gpu, 1)
    share = max(Counter(sp.group for sp in specs).values()) if scenario.sim.share_prompt else 1
    most = cut_bound.max_batch(specs, fp.kv_cap, share)
    if most > cut_bound.ENVELOPE_MAX_BATCH:
        return None
    end = scenario.end_time
    busy = scenario.lending.train_step_s if scenario.lending.mode is LendMode.ASYNC and not first else 0.0
    key = (scenario.model, scenario.calibrated, scenario.gpu, scenario.sim.prefill_chunk, scenario.sim.mem_util, most)
    envelopes = _ENVELOPES.get(key)
    if envelopes is None:
        envelopes = _ENVELOPES[key] = (
            cut_bound.step_envelope(fp.decode, fp.max_context, fp.KV_STEP, most),
            cut_bound.prefill_envelope(fp.prefill, fp.overlap, fp.chunk, fp.max_context, most, fp.P_STEP, fp.C_STEP))
    env, pre = envelopes
    return cut_bound.cut_batch_bound(
        specs, per_traj, env, window_s=end - start, gpu_seconds=window_gpu_seconds(scenario, start, end, busy_s=busy),
        kv_capacity=float(fp.kv_cap), share=share, prefill=pre, fold_s=_course_fold(scenario)[1])


def cut_batch_tokens_at(scenario: Scenario, index: int, start: float, *,
                        specs: Sequence[SimTraj] | None = None) -> tuple[float, float, cut_bound.CutBatchBound | None]:
    """The most decode tokens any policy can have by the window's end from replay batch ``index`` if it starts
    at ``start``: the least of the per-trajectory bound (each trajectory's ``traj_tokens_by`` the window's end)
    and, where it applies, ``cut_batch_bound``'s coupled bound. Returns (that bound, the per-trajectory sum,
    the coupled bound or None). ``throughput_ceiling``'s term for the batch the window's end cuts (at its
    earliest start); callers may also price a replay's own start of that batch (``examples/policy_trials.py
    --per-batch``). ``specs``: the batch's trajectories when the caller has them."""
    if specs is None:
        specs, _keys = scenario.batches.batch(index + scenario.warmup_batches)
    step = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)(scenario.gpu, 1).decode
    fold_by = _course_fold(scenario)[1]
    per_traj = [traj_tokens_by(sp, step, scenario.end_time - start, fold_by) for sp in specs]
    alone = float(sum(per_traj))
    cb = cut_batch_bound(scenario, specs, start, per_traj, first=index == 0)
    return (min(alone, cb.tokens) if cb is not None else alone), alone, cb


def throughput_ceiling(scenario: Scenario, *, max_batches: int = 10_000) -> dict[str, Any]:
    """An upper bound on any policy's throughput over ``scenario``'s window (decode tokens/s).

    Batch k cannot start before ``start_k`` = the previous batches' ``batch_floors`` chained through the
    training steps (sync: rollout k+1 starts when step k ends; async: when step k starts, step k waiting for
    step k-1). A batch whose floor ends within the window contributes at most all its decode tokens; the
    batch the window's end cuts (it starts before the end, its floor ends after) at most ``cut_batch_bound``:
    what each of its trajectories' ``fastest_course`` decodes by the end (``traj_tokens_by``: a batch that
    starts later gets less), and no more than the GPUs left in the window can decode
    (``rollplan.sim.cut_bound``). So no policy's decode tokens in the window exceed the sum. On windows a few
    batches long (the 1-hour Parcae segments) this bound caps every ratio a policy can reach.
    Returns the bound, the batches it counts (the cut one included), the share of the last counted batch's
    tokens it counts (1: whole), that share under the per-trajectory bound alone (``last_batch_share_alone``),
    the earliest start of the first batch it leaves out, and ``cut_batch`` where the coupled bound applied to a
    cut batch (else None): its index and earliest start, the window's GPU-seconds from there, and what
    decoding every token its per-trajectory bound allows would cost under ``cut_bound``'s GPU' row (work,
    prefill and co-runner cost; fixed step time by KV occupancy; ``cut_bound.CutBatchBound``). The bound is rounded up to 1e-3 tokens/s (the
    throughputs are rounded to the nearest 1e-3), so the figure printed stays a bound."""
    end = scenario.end_time
    sched = LendingSchedule(scenario.lending)
    step = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)(scenario.gpu, 1).decode
    fold = _course_fold(scenario)[0]
    start, prev_end, tokens, k, last_share, alone = 0.0, None, 0.0, 0, 1.0, 1.0
    cut: dict[str, Any] | None = None
    while start < end and k < max_batches and (scenario.max_batches is None or k < scenario.max_batches):
        specs, _keys = scenario.batches.batch(k + scenario.warmup_batches)
        whole = sum(sum(sp.decode) for sp in specs)
        done = start + max((traj_floor(sp, step, fold) for sp in specs), default=0.0)
        if done > end:
            got, per_traj_sum, cb = cut_batch_tokens_at(scenario, k, start, specs=specs)
            if cb is not None:
                cut = {"index": k, "start_s": round(start, 1), "gpu_seconds": round(cb.gpu_seconds, 1),
                       "work_gpu_s": round(cb.work_gpu_s, 1), "fixed_gpu_s": round(cb.fixed_gpu_s, 1)}
            last_share = got / whole if whole else 1.0
            alone = per_traj_sum / whole if whole else 1.0
            tokens += got
        else:
            tokens += whole
            last_share = alone = 1.0
        if scenario.lending.mode is LendMode.SYNC:
            ts = sched.next_train_step(done)
            start = ts.end
        else:
            ts = sched.next_train_step(done, prev_end=prev_end)
            start = ts.start
        prev_end = ts.end
        k += 1
    # Rounded up, not to the nearest: a schedule can reach the bound exactly (the started oracle does in one
    # async Parcae cell), and the bound printed must not fall below that schedule's rounded throughput.
    return {"tokens_per_s": math.ceil(tokens / end * 1000.0) / 1000.0 if end > 0 else None, "batches": k,
            "last_batch_share": round(last_share, 4), "last_batch_share_alone": round(alone, 4),
            "next_batch_earliest_start_s": round(start, 1), "cut_batch": cut}


def per_batch_rows(result: ReplayResult) -> dict[str, Any]:
    """Per batch of the replay (``--per-batch``): its ``batch_floors`` and every policy's rollout seconds and
    last-10% share, each a list by batch index (a policy's list ends with the last batch it started; an
    unfinished batch reads None), and ``regime``: for the policies that set an admission regime (rollplan),
    per batch the first adopted plan's regime and predicted-critical count and how many plans found the batch
    bound by its bulk (``metrics.regime_row``). Shows where the throughput ratios come from: batches bound by
    their longest trajectory run close to the floor under a policy that starts it early, batches bound by their
    bulk do not (the floor leaves the bulk's work out)."""
    s = {r.name: {b["index"]: b for b in r.summary["batches"]} for r in result.runs}
    n = max((i + 1 for v in s.values() for i in v), default=0)
    floors = batch_floors(result.scenario, range(n))

    def column(field: str) -> dict[str, list[Any]]:
        return {k: [v[i][field] if i in v else None for i in range(max(v, default=-1) + 1)] for k, v in s.items()}

    regimes = {k: v for k, v in column("regime").items() if any(x is not None for x in v)}
    return {"floor_s": [round(floors[i], 1) for i in range(n)], "rollout_s": column("rollout_s"),
            "tail_share": column("tail_share"), "regime": regimes}


def role_shares(summary: dict[str, Any]) -> dict[str, float]:
    """Share of a run's present GPU-seconds by role (mixed, prefill, decode) and switching; "off" left out."""
    gs = {k: v for k, v in summary.get("gpu_seconds", {}).items() if k != "off"}
    total = sum(gs.values())
    return {k: round(v / total, 4) for k, v in sorted(gs.items())} if total > 0 else {}


def trace_row(name: str, result: ReplayResult, *, per_batch: bool = False) -> dict[str, Any]:
    """The bench's row for one trace (see the module docstring); ``per_batch``: add ``per_batch_rows``. A run of
    the ``ORACLES`` references (``--oracle``) are left out of every other figure and reported under ``oracle``."""
    oracle_run = next((r for r in result.runs if r.name == ORACLE), None)
    started_run = next((r for r in result.runs if r.name == ORACLE_STARTED), None)
    s = {r.name: r.summary for r in result.runs if r.name not in ORACLES}

    def ratio(a: str, b: str) -> float | None:
        x, y = s.get(a, {}).get("throughput_tokens_per_s"), s.get(b, {}).get("throughput_tokens_per_s")
        return round(x / y, 4) if x and y else None

    common = common_tail_shares(s)
    tails = common["mean"]
    floors = batch_floors(result.scenario, common["batches"])
    floor_sum = sum(floors.values())
    over_floor = {}
    for k, v in s.items():
        rollout = {b["index"]: b["rollout_s"] for b in v["batches"] if b["rollout_s"] is not None}
        over_floor[k] = round(sum(rollout[i] for i in floors) / floor_sum, 4) if floor_sum > 0 else None
    ceiling = throughput_ceiling(result.scenario) if math.isfinite(result.scenario.end_time) else None
    el = s.get("elastic-colocated", {}).get("throughput_tokens_per_s")
    # The strongest policy other than rollplan on this window (elastic-plus included): the one to beat.
    other_tps = {k: v["throughput_tokens_per_s"] for k, v in s.items()
                 if k != "rollplan" and v.get("throughput_tokens_per_s")}
    best = max(other_tps, key=lambda k: other_tps[k]) if other_tps else None
    rp_tail = tails.get("rollplan")
    others = [v for k, v in tails.items() if k != "rollplan" and v is not None]
    row = {
        "trace": name,
        "duration_h": round(result.scenario.end_time / 3600.0, 3),
        "rollplan_vs_elastic": ratio("rollplan", "elastic-colocated"),
        "rollplan_vs_formula_pd": ratio("rollplan", "formula-pd"),
        "rollplan_vs_static": ratio("rollplan", "static-colocated"),
        "best_other": {"policy": best, "tokens_per_s": other_tps.get(best) if best else None},
        "rollplan_vs_best_other": ratio("rollplan", best) if best else None,
        # What no policy can exceed: the ceiling's tokens/s over elastic-colocated's (None without an end).
        "rollplan_vs_elastic_ceiling": round(ceiling["tokens_per_s"] / el, 4) if ceiling and el else None,
        "throughput_ceiling": ceiling,
        "tail_share_common": tails,
        "tail_share_common_batches": len(common["batches"]),
        "tail_share_all": {k: v["tail_share"]["mean"] for k, v in s.items()},
        "rollout_over_floor": over_floor,
        "tokens_per_s": {k: v["throughput_tokens_per_s"] for k, v in s.items()},
        # Share of each policy's serving GPU-seconds in each role (and switching): where PREFILL/DECODE pay.
        "gpu_seconds_by_role": {k: role_shares(v) for k, v in s.items()},
        "batches": {k: v["batches_completed"] for k, v in s.items()},
        "replans_rollplan": s.get("rollplan", {}).get("replans", {}).get("count"),
        # What each policy's replay counted: evictions, KV lost with a slot, migrations carried out (and, for
        # rollplan under MOVES "forced", the plans' moves it did not carry out).
        "counters": {k: v.get("counters", {}) for k, v in s.items()},
        "gap_rollplan_mean": s.get("rollplan", {}).get("replans", {}).get("gap", {}).get("mean"),
        "wall_s": round(result.wall_s, 2),
        "events": sum(v["events"] for v in s.values()),
    }
    row["targets_met"] = {
        "vs_elastic": row["rollplan_vs_elastic"] is not None and row["rollplan_vs_elastic"] >= TARGETS["vs_elastic"],
        "vs_formula_pd": row["rollplan_vs_formula_pd"] is not None
        and row["rollplan_vs_formula_pd"] >= TARGETS["vs_formula_pd"],
        "lowest_tail": rp_tail is not None and all(rp_tail < v for v in others),
    }
    # False: no policy could meet the elastic target on this window (the ceiling is below it).
    row["vs_elastic_reachable"] = (row["rollplan_vs_elastic_ceiling"] is None
                                   or row["rollplan_vs_elastic_ceiling"] >= TARGETS["vs_elastic"])
    if oracle_run is not None:
        row["oracle"] = oracle_row(oracle_run.summary, s.get("rollplan", {}).get("throughput_tokens_per_s"),
                                   row["best_other"]["tokens_per_s"], (ceiling or {}).get("tokens_per_s"),
                                   started_run.summary if started_run is not None else None)
    if per_batch:
        row["per_batch"] = per_batch_rows(result)
    return row


def oracle_row(summary: dict[str, Any], rollplan: float | None, best_other: float | None,
               ceiling: float | None, started: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the ``ORACLE`` reference (rollplan with every trajectory's true lengths) reached on a replay: its
    tokens/s, over rollplan's, and its share of what is left over the best other policy
    (``share_of_what_is_left``), beside the batches it completed and the sum of their rollout seconds.
    ``started``: the ``ORACLE_STARTED`` reference's summary (rollplan told a trajectory's truth once it has
    started), reported under ``started`` with its share of what is left and ``of_oracle_gain``
    (``share_of_gain``): how much of the oracle's gain over rollplan perfect in-flight knowledge reaches."""
    tps = summary.get("throughput_tokens_per_s")
    st_tps = started.get("throughput_tokens_per_s") if started is not None else None
    return {
        "policy": ORACLE,
        "tokens_per_s": tps,
        "vs_rollplan": round(tps / rollplan, 4) if tps and rollplan else None,
        "share_of_what_is_left": share_of_what_is_left(tps, best_other, ceiling),
        "rollplan_share_at_most": share_any_ceiling_allows(rollplan, best_other, tps),
        "batches": summary.get("batches_completed"),
        "rollout_s": round(sum(b["rollout_s"] for b in summary.get("batches", []) if b["rollout_s"] is not None), 1),
        "started": None if started is None else {
            "policy": ORACLE_STARTED,
            "tokens_per_s": st_tps,
            "share_of_what_is_left": share_of_what_is_left(st_tps, best_other, ceiling),
            "of_oracle_gain": share_of_gain(st_tps, rollplan, tps),
        },
    }


def share_of_gain(partial: float | None, base: float | None, full: float | None) -> float | None:
    """(partial - base) / (full - base): how much of the way from ``base`` to ``full`` ``partial`` goes (e.g.
    the started oracle's part of the oracle's gain over rollplan). None when a figure is missing or ``full``
    is not above ``base`` (no gain to split)."""
    if partial is None or base is None or full is None or full <= base:
        return None
    return round((partial - base) / (full - base), 4)


def replay_policies(jobs: int, oracle: bool) -> list[str]:
    """The policies one replay runs, in the order they go to workers (``jobs`` > 1: the longest first, as
    measured on p3, so the short ones fill in at the end), with the ``ORACLES`` references first when ``oracle``
    (they run as long as rollplan)."""
    order: list[str] = list(POLICY_NAMES) if jobs == 1 else sorted(POLICY_NAMES, key=LONGEST_FIRST.index)
    return [*ORACLES, *order] if oracle else order


def report_order(name: str) -> int:
    """Sort key of a run in a replay's results: ``POLICY_NAMES`` order, the ``ORACLES`` references last."""
    if name in POLICY_NAMES:
        return POLICY_NAMES.index(name)
    return len(POLICY_NAMES) + (ORACLES.index(name) if name in ORACLES else len(ORACLES))


def planner_setting() -> dict[str, Any]:
    """The rollplan policy's planner as the bench runs it (``make_policy`` defaults), for the report."""
    p = make_policy("rollplan")
    return {"rollplan_backend": getattr(p, "backend", None), "rollplan_time_limit_s": getattr(p, "time_limit", None),
            "rollplan_deterministic": getattr(p, "deterministic", None),
            "rollplan_solve_charged": getattr(p, "charge_solve", None)}


def check_bench_data(d: Path) -> None:
    """A one-line error naming the bench's data files missing from the data folder ``d``."""
    missing = [f for f in SWEBENCH_FILES if not (d / f).is_file()]
    if missing:
        raise UserInputError(f"the benchmark needs {', '.join(missing)} in {d}",
                             fix="pass --data DIR (the shared data folder, ../shared/data)")


def bench_bases(d: Path) -> tuple[Any, ...]:
    """The bench's prompt set (``swebench_bases``) from the data folder ``d`` (``check_bench_data`` first)."""
    check_bench_data(d)
    return swebench_bases(d)


def run_bench(
    data_dir: str | Path,
    *,
    traces: tuple[str, ...] | None = None,
    seed: int = 0,
    on_trace: Callable[[str], None] | None = None,
    jobs: int = 1,
    tool_kv: str = "evictable",
    share_prompt: bool = True,
    fold_tool_s: float = FOLD_TOOL_S,
    evicted_return: str = EVICTED_RETURN,
    mode: str = "sync",
    per_batch: bool = False,
    dispersion: float | None = None,
    first_epoch: bool = False,
    regime: str = REGIME,
    moves: str = MOVES,
    oracle: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON document (rows per trace + timing of the p3 replay). ``jobs``: worker
    processes per trace (``run_replay``); the rows do not depend on it, the timing does. ``per_batch``: each
    row also carries ``per_batch_rows``. ``dispersion``, ``first_epoch``: the workload (``workload_options``).
    ``regime``: the rollplan policy's admission regime rule (``rollplan.sim.policies.REGIME``; "share" replays
    the rule it replaced); ``moves``: which of its plans' migrations it carries out (``MOVES``); ``oracle``: also
    replay the ``ORACLES`` references (each row's ``oracle``; the other figures leave them out, and ``timing``
    stays empty: the p3 replay's wall time is measured on the six policies alone)."""
    d = Path(data_dir)
    bases = bench_bases(d)
    names = traces or tuple(t[0] for t in BENCH_TRACES)
    rows = []
    timing: dict[str, Any] = {}
    t_all = time.perf_counter()
    for name in names:
        if on_trace is not None:
            on_trace(name)
        sc = bench_scenario(d, name, bases=bases, seed=seed, tool_kv=tool_kv, share_prompt=share_prompt, mode=mode,
                            dispersion=dispersion, first_epoch=first_epoch, fold_tool_s=fold_tool_s,
                            evicted_return=evicted_return)
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_replay(sc, [make_policy(p, regime=regime, moves=moves) for p in replay_policies(jobs, oracle)],
                         jobs=jobs)
        res.runs.sort(key=lambda r: report_order(r.name))
        wall = time.perf_counter() - t0
        cpu = res.cpu_s if jobs > 1 else time.process_time() - c0
        rows.append(trace_row(name, res, per_batch=per_batch))
        if name == TIMED_TRACE and not oracle:  # the timing is of the six policies' replays
            events = sum(r.summary["events"] for r in res.runs)
            timing = {
                "trace": name,
                "trace_hours": round(sc.end_time / 3600.0, 3),
                "policies": len(res.runs),
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "events": events,
                "events_per_s": round(events / wall, 1) if wall > 0 else None,
                "events_per_cpu_s": round(events / cpu, 1) if cpu > 0 else None,
                "per_policy_wall_s": {r.name: r.summary["wall_s"] for r in res.runs},
                "per_policy_cpu_s": {r.name: r.summary["cpu_s"] for r in res.runs},
                "target_wall_s": 60.0,
                "target_met": wall <= 60.0,
                "jobs": jobs,
                "note": "wall time depends on other load on the machine; cpu_s is the CPU time of the process(es) "
                        "that ran the policies (with jobs > 1: the workers' sum)",
            }
    return {
        "benchmark": "replay",
        "scenario": {
            "dedicated_gpus": 16, "lent_gpus": 8, "preemptible_max_gpus": 16, "gpu": "h800", "model": "qwen3-8b",
            "workload": f"swebench {GROUPS} prompts x {SAMPLES} samples per batch", "mode": mode,
            "train_step_s": 120.0, "notice_s": 30.0, "replan_interval_s": REPLAN_INTERVAL_S,
            "fold_tool_s": fold_tool_s, "evicted_return": evicted_return, "tool_kv": tool_kv, "share_prompt": share_prompt, **planner_setting(), "rollplan_regime": regime, "rollplan_moves": moves,
            "warmup_batches": WARMUP_BATCHES, "seed": seed,
            "dispersion": dispersion if dispersion is not None else DEFAULT_DISPERSION, "first_epoch": first_epoch,
            "oracle": oracle,
        },
        "targets": TARGETS,
        "traces": rows,
        "timing": timing,
        "wall_s": round(time.perf_counter() - t_all, 2),
    }


# --- the matrix (``rollplan bench replay --matrix``, issue 18) -------------------------------------------------

MATRIX_MODES: tuple[str, ...] = ("sync", "async")


@dataclass(frozen=True, slots=True)
class MatrixWorkload:
    """One workload column of the matrix: ``groups`` prompts x ``samples`` per batch, ``warmup_batches`` RL
    steps of history before the window (0: the history-keeping policies start with an empty length history,
    no prior observation at all), ``dispersion`` (None: the bench's 0.15). ``half_target``: whether the cell
    must take at least half of what is left over the best other policy (the issue's 128 x 16 cells)."""

    name: str
    groups: int
    samples: int
    warmup_batches: int
    dispersion: float | None
    half_target: bool


MATRIX_WORKLOADS: tuple[MatrixWorkload, ...] = (
    MatrixWorkload("128x16-history", GROUPS, SAMPLES, WARMUP_BATCHES, None, True),
    MatrixWorkload("32x8-no-history", 32, 8, 0, None, False),
    MatrixWorkload("dispersion-0.6", GROUPS, SAMPLES, WARMUP_BATCHES, 0.6, False),
)
HALF_TARGET = 0.5
"""The issue's target in the ``half_target`` cells: share of what is left >= 0.5."""


def matrix_workload(name: str) -> MatrixWorkload:
    """The ``MATRIX_WORKLOADS`` entry called ``name``; ``UserInputError`` for another name."""
    w = next((w for w in MATRIX_WORKLOADS if w.name == name), None)
    if w is None:
        raise UserInputError(f"unknown matrix workload {name!r}", fix=f"use one of {[w.name for w in MATRIX_WORKLOADS]}")
    return w


def check_window_h(window_h: float | None) -> None:
    """A window cut must be a positive, finite number of hours (None: no cut); else ``UserInputError``."""
    if window_h is not None and not (math.isfinite(window_h) and window_h > 0):
        raise UserInputError(f"--window-h must be a positive number of hours, got {window_h}",
                             fix="pass e.g. --window-h 4 (each trace's first 4 hours), or leave it out")


def matrix_scenario(data_dir: Path, trace_name: str, mode: str, workload: MatrixWorkload, *, bases: Any = None,
                    seed: int = 0, tool_kv: str = "evictable", share_prompt: bool = True,
                    window_h: float | None = None, fold_tool_s: float = FOLD_TOOL_S,
                    evicted_return: str = EVICTED_RETURN) -> Scenario:
    """The bench scenario (``bench_scenario``) for one matrix cell: ``workload``'s batch shape, history and
    dispersion; ``window_h``: the window cut to the trace's first ``window_h`` hours (a trace shorter than that
    is replayed whole; the throughput and the ceiling are over the cut window)."""
    check_window_h(window_h)
    bases = bases if bases is not None else swebench_bases(data_dir)
    sc = bench_scenario(data_dir, trace_name, bases=bases, seed=seed, tool_kv=tool_kv, share_prompt=share_prompt,
                        mode=mode, dispersion=workload.dispersion, fold_tool_s=fold_tool_s,
                        evicted_return=evicted_return)
    if (workload.groups, workload.samples) != (GROUPS, SAMPLES):
        src = BatchSource.dataset(bases, groups=workload.groups, samples=workload.samples, seed=seed, max_context=40960)
        sc = replace(sc, batches=workload_options(src, dispersion=workload.dispersion))
    duration = None
    if window_h is not None and sc.trace is not None and window_h * 3600.0 < sc.trace.duration_s:
        duration = window_h * 3600.0
    return replace(sc, name=f"bench:{trace_name}:{mode}:{workload.name}", warmup_batches=workload.warmup_batches,
                   duration_s=duration)


def share_of_what_is_left(rollplan: float | None, best_other: float | None, ceiling: float | None) -> float | None:
    """(rollplan - best other) / (ceiling - best other): the part of what any policy could still gain over the
    best other policy that rollplan takes (1: at the ceiling; negative: below the best other). None when a
    figure is missing or the ceiling is not above the best other (nothing is left to take)."""
    if rollplan is None or best_other is None or ceiling is None or ceiling <= best_other:
        return None
    return round((rollplan - best_other) / (ceiling - best_other), 4)


def share_any_ceiling_allows(rollplan: float | None, best_other: float | None,
                             reference: float | None) -> float | None:
    """The largest share of what is left (``share_of_what_is_left``) that any valid ceiling can give rollplan:
    (rollplan - best other) / (max(reference, rollplan) - best other). A valid ceiling is at least the
    throughput of every schedule the simulator ran, so with ``reference`` = the oracle's (``ORACLE``, a schedule
    no system can run but the simulator does) no tighter ceiling could lift rollplan's share above this; only
    a policy nearer the reference can. 0.0 when rollplan is below the best other (its share is negative under
    every ceiling); 1.0 when neither is above the best other (nothing left: the half target holds, as in
    ``matrix_cell``); None when a figure is missing."""
    if rollplan is None or best_other is None or reference is None:
        return None
    if rollplan < best_other:
        return 0.0
    top = max(reference, rollplan)
    if top <= best_other:
        return 1.0
    return round((rollplan - best_other) / (top - best_other), 4)


def matrix_cell(trace: str, mode: str, workload: MatrixWorkload, result: ReplayResult, *,
                per_batch: bool = False) -> dict[str, Any]:
    """One matrix cell from its replay: every policy's tokens/s, the ceiling, the best other policy, rollplan /
    it, the share of what is left (``share_of_what_is_left``) and what it divides by (``left_tokens_per_s``: the
    ceiling less the best other's tokens/s), the last-10% shares on the batches every policy completed, whether
    the targets hold, and the whole bench row (``trace_row``) under ``row``.

    Targets: ``not_below_best_other`` (rollplan's tokens/s >= the best other's, every cell); ``half_of_what_is_left``
    (share >= 0.5, or nothing left to take and rollplan not below; None in a cell without the target)."""
    row = trace_row(trace, result, per_batch=per_batch)
    tps = row["tokens_per_s"]
    rp = tps.get("rollplan")
    best = row["best_other"]
    bo = best["tokens_per_s"]
    ceiling = (row["throughput_ceiling"] or {}).get("tokens_per_s")
    share = share_of_what_is_left(rp, bo, ceiling)
    not_below = rp is not None and bo is not None and rp >= bo
    half: bool | None = None
    if workload.half_target:
        half = (share >= HALF_TARGET) if share is not None else not_below
    tails = row["tail_share_common"]
    return {
        "trace": trace,
        "mode": mode,
        "workload": workload.name,
        "groups": workload.groups,
        "samples": workload.samples,
        "warmup_batches": workload.warmup_batches,
        "dispersion": workload.dispersion if workload.dispersion is not None else DEFAULT_DISPERSION,
        "window_s": round(result.scenario.end_time, 1),
        "tokens_per_s": tps,
        "throughput_ceiling": ceiling,
        "best_other": best,
        "rollplan_vs_best_other": row["rollplan_vs_best_other"],
        "share_of_what_is_left": share,
        # What the share divides by: a share of 1.00 over a gap of a few tokens/s says only that rollplan and
        # the best other both ended at (or within a hair of) the ceiling.
        "left_tokens_per_s": round(ceiling - bo, 3) if ceiling is not None and bo is not None else None,
        "tail_share_common": tails,
        "tail_share_common_batches": row["tail_share_common_batches"],
        "lowest_tail": row["targets_met"]["lowest_tail"],
        "batches": row["batches"],
        "targets": {"not_below_best_other": not_below, "half_of_what_is_left": half},
        "oracle": row.get("oracle"),
        "wall_s": row["wall_s"],
        "row": row,
    }


def below_best_other(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matrix cells (``matrix_cell``) where rollplan is below the best other policy: each cell's key, the
    policy ahead, and by how much in tokens/s and as a share of its tokens/s (so a tie within a hair reads as
    one). Empty when the ``not_below_best_other`` target holds in every cell."""
    out = []
    for c in cells:
        rp, bo = c["tokens_per_s"].get("rollplan"), c["best_other"]["tokens_per_s"]
        if rp is None or bo is None or c["targets"]["not_below_best_other"]:
            continue
        out.append({"trace": c["trace"], "mode": c["mode"], "workload": c["workload"],
                    "ahead": c["best_other"]["policy"], "by_tokens_per_s": round(bo - rp, 3),
                    "by_share": round((bo - rp) / bo, 6) if bo else None})
    return out


def run_matrix(
    data_dir: str | Path,
    *,
    traces: tuple[str, ...] | None = None,
    modes: tuple[str, ...] = MATRIX_MODES,
    workloads: tuple[str, ...] | None = None,
    window_h: float | None = None,
    seed: int = 0,
    jobs: int = 1,
    tool_kv: str = "evictable",
    share_prompt: bool = True,
    fold_tool_s: float = FOLD_TOOL_S,
    evicted_return: str = EVICTED_RETURN,
    per_batch: bool = False,
    regime: str = REGIME,
    moves: str = MOVES,
    oracle: bool = False,
    on_cell: Callable[[str, str, str], None] | None = None,
) -> dict[str, Any]:
    """The bench's matrix: every trace (``BENCH_TRACES``, or ``traces``) x ``modes`` x ``workloads``
    (``MATRIX_WORKLOADS`` names; None: all), all six policies per cell (``matrix_cell``), each window cut to its
    first ``window_h`` hours where given. Returns the JSON document: ``matrix`` (cells, a summary of the
    targets, how windows were cut) and ``traces`` (the bench rows of the sync 128x16-history cells, the
    default bench's rows when no window is cut). ``regime``, ``moves``, ``oracle``: as in ``run_bench`` (with
    ``oracle``, each cell's ``oracle`` and the summary's ``oracle_half_of_what_is_left``,
    ``half_reachable_by_any_ceiling``: the target cells where ``share_any_ceiling_allows`` is >= 0.5, and
    ``started_oracle_half_of_what_is_left``: those where the ``ORACLE_STARTED`` reference's share is)."""
    check_window_h(window_h)
    d = Path(data_dir)
    check_bench_data(d)
    for m in modes:
        if m not in MATRIX_MODES:
            raise UserInputError(f"unknown mode {m!r}", fix="use sync or async")
    ws = tuple(matrix_workload(n) for n in (workloads or tuple(w.name for w in MATRIX_WORKLOADS)))
    bases = swebench_bases(d)
    names = traces or tuple(t[0] for t in BENCH_TRACES)
    cells: list[dict[str, Any]] = []
    t_all, c_all = time.perf_counter(), time.process_time()
    workers_cpu = 0.0  # with jobs > 1: the worker processes' CPU time (this process's is added at the end)
    for name in names:
        for mode in modes:
            for w in ws:
                if on_cell is not None:
                    on_cell(name, mode, w.name)
                sc = matrix_scenario(d, name, mode, w, bases=bases, seed=seed, tool_kv=tool_kv,
                                     share_prompt=share_prompt, window_h=window_h, fold_tool_s=fold_tool_s,
                                     evicted_return=evicted_return)
                res = run_replay(sc, [make_policy(p, regime=regime, moves=moves)
                                      for p in replay_policies(jobs, oracle)], jobs=jobs)
                res.runs.sort(key=lambda r: report_order(r.name))
                workers_cpu += res.cpu_s if jobs > 1 else 0.0
                cells.append(matrix_cell(name, mode, w, res, per_batch=per_batch))
    half = [c["targets"]["half_of_what_is_left"] for c in cells if c["targets"]["half_of_what_is_left"] is not None]
    vs = [c["rollplan_vs_best_other"] for c in cells if c["rollplan_vs_best_other"] is not None]
    targets = [c for c in cells if c["targets"]["half_of_what_is_left"] is not None]

    def at_half(share: Callable[[dict[str, Any]], float | None]) -> str | None:
        """The target cells where a reference's ``share`` is >= 0.5 ("k/n"); None without ``--oracle``."""
        if not oracle:
            return None
        xs = [share(c["oracle"]) for c in targets if c["oracle"] is not None]
        return f"{sum(x is not None and x >= HALF_TARGET for x in xs)}/{len(xs)}"

    # How many target cells perfect prediction would meet; where some valid ceiling could still give rollplan
    # half (share_any_ceiling_allows); how many perfect in-flight knowledge (the started oracle) would meet.
    oracle_half = at_half(lambda o: o["share_of_what_is_left"])
    reachable = at_half(lambda o: o["rollplan_share_at_most"])
    started_half = at_half(lambda o: (o.get("started") or {}).get("share_of_what_is_left"))
    return {
        "benchmark": "replay",
        "scenario": {
            "dedicated_gpus": 16, "lent_gpus": 8, "preemptible_max_gpus": 16, "gpu": "h800", "model": "qwen3-8b",
            "train_step_s": 120.0, "notice_s": 30.0, "replan_interval_s": REPLAN_INTERVAL_S,
            "fold_tool_s": fold_tool_s, "evicted_return": evicted_return, "tool_kv": tool_kv,
            "share_prompt": share_prompt, **planner_setting(), "rollplan_regime": regime, "rollplan_moves": moves, "seed": seed, "oracle": oracle,
        },
        "matrix": {
            "traces": list(names),
            "modes": list(modes),
            "workloads": {w.name: {"groups": w.groups, "samples": w.samples, "warmup_batches": w.warmup_batches,
                                   "dispersion": w.dispersion if w.dispersion is not None else DEFAULT_DISPERSION,
                                   "half_target": w.half_target} for w in ws},
            "window": {
                "window_h": window_h,
                "rule": "each trace replayed whole" if window_h is None else
                        f"each trace cut to its first {window_h:g} h (shorter traces whole); throughput and the "
                        "ceiling are over the cut window; window_s per cell",
            },
            "cells": cells,
            "summary": {
                "cells": len(cells),
                "not_below_best_other": sum(c["targets"]["not_below_best_other"] for c in cells),
                # Each cell where rollplan is below the best other, and by how much (tokens/s and share of it).
                "below_best_other": below_best_other(cells),
                "half_of_what_is_left": f"{sum(half)}/{len(half)}",
                "min_rollplan_vs_best_other": min(vs, default=None),
                "all_targets_met": all(c["targets"]["not_below_best_other"] for c in cells) and all(half),
                "oracle_half_of_what_is_left": oracle_half,
                "half_reachable_by_any_ceiling": reachable,
                "started_oracle_half_of_what_is_left": started_half,
            },
        },
        "traces": [c["row"] for c in cells if c["mode"] == "sync" and c["workload"] == "128x16-history"],
        "wall_s": round(time.perf_counter() - t_all, 2),
        "cpu_s": round(workers_cpu + time.process_time() - c_all, 2),
    }


# --- speculation on / off (``rollplan bench replay --spec-tokens K``, issue 17, docs/seer.md) ------------------


def run_spec_compare(
    data_dir: str | Path,
    *,
    spec_tokens: int,
    spec_acceptance: float,
    spec_base_acceptance: float = 0.0,
    traces: tuple[str, ...] | None = None,
    seed: int = 0,
    jobs: int = 1,
    window_h: float | None = None,
    on_trace: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every bench trace replayed twice per policy, without and with grouped speculative decoding on every
    slot (``SimConfig.spec_*``; the same workload, trace and seed): ``run_lever_compare``'s rows. The rollplan
    policy's planner then prices decode with speculation (docs/seer.md)."""
    SimConfig(spec_tokens=spec_tokens, spec_acceptance=spec_acceptance, spec_base_acceptance=spec_base_acceptance)
    doc = run_lever_compare(data_dir, {"spec_tokens": spec_tokens, "spec_acceptance": spec_acceptance,
                                       "spec_base_acceptance": spec_base_acceptance},
                            traces=traces, seed=seed, jobs=jobs, window_h=window_h, on_trace=on_trace)
    return {
        "benchmark": "replay-speculation",
        "speculation": {"tokens": spec_tokens, "acceptance": spec_acceptance, "base_acceptance": spec_base_acceptance,
                        "model": "per group: base + (acceptance - base) * finished siblings / (samples - 1)"},
        **doc,
    }


def run_divide_compare(
    data_dir: str | Path,
    *,
    divide_tokens: int,
    traces: tuple[str, ...] | None = None,
    seed: int = 0,
    jobs: int = 1,
    window_h: float | None = None,
    on_trace: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every bench trace replayed twice per policy, without and with divided rollout (``SimConfig.divide_tokens``:
    a segment runs at most ``divide_tokens`` decode tokens on a slot, then the policy's ``chunk_move`` keeps it
    there or moves it): ``run_lever_compare``'s rows, plus per policy the chunks and moves (by KV transfer, by
    re-prefill) of the run with division."""
    SimConfig(divide_tokens=divide_tokens)
    doc = run_lever_compare(data_dir, {"divide_tokens": divide_tokens}, traces=traces, seed=seed, jobs=jobs,
                            window_h=window_h, on_trace=on_trace,
                            extra=("chunks", "chunk_moves_kv", "chunk_moves_reprefill"))
    return {"benchmark": "replay-divided-rollout", "divided_rollout": {"divide_tokens": divide_tokens}, **doc}


def common_rollout_s(summaries: dict[str, dict[str, Any]]) -> tuple[list[int], dict[str, float | None]]:
    """The batches every run in ``summaries`` (name -> ``summarize`` output) completed, and each run's mean
    rollout seconds over them (None when there are none). Runs of one scenario compared by their own means are
    judged on different batches whenever one completes more of them in the window."""
    per = {name: {b["index"]: b["rollout_s"] for b in s.get("batches", ()) if b.get("rollout_s") is not None}
           for name, s in summaries.items()}
    common = sorted(set.intersection(*(set(v) for v in per.values()))) if per else []
    return common, {name: (round(sum(v[i] for i in common) / len(common), 3) if common else None)
                    for name, v in per.items()}


def run_lever_compare(
    data_dir: str | Path,
    on: dict[str, Any],
    *,
    traces: tuple[str, ...] | None = None,
    seed: int = 0,
    jobs: int = 1,
    window_h: float | None = None,
    on_trace: Callable[[str], None] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every bench trace (``bench_scenario``) replayed by every policy twice: as the bench does and with the
    ``SimConfig`` fields ``on`` (the same workload, trace and seed). ``window_h``: each trace cut to its first
    ``window_h`` hours (shorter traces whole; as ``--matrix --window-h``). Per trace and policy: throughput
    (decode tokens/s over the window), mean rollout seconds per batch, the last-10% share (mean over that
    policy's completed batches) and batches completed, off / on, and the on/off ratios of throughput and rollout
    time; ``extra``: those recorder counters of the run with ``on``. Also the mean rollout seconds and last-10%
    shares on the batches both runs of a policy completed (``rollout_s_common_off`` / ``_on``,
    ``tail_share_common_off`` / ``_on``); ``rollout_ratio`` is the ratio of those common means
    (``common_rollout_s``)."""
    check_window_h(window_h)
    d = Path(data_dir)
    bases = bench_bases(d)
    names = traces or tuple(t[0] for t in BENCH_TRACES)
    rows = []
    t_all = time.perf_counter()
    for name in names:
        if on_trace is not None:
            on_trace(name)
        off = bench_scenario(d, name, bases=bases, seed=seed)
        if window_h is not None and off.trace is not None and window_h * 3600.0 < off.trace.duration_s:
            off = replace(off, duration_s=window_h * 3600.0)
        with_on = replace(off, sim=replace(off.sim, **on))
        order = list(POLICY_NAMES) if jobs == 1 else sorted(POLICY_NAMES, key=LONGEST_FIRST.index)
        t0 = time.perf_counter()
        res = {k: run_replay(sc, [make_policy(p) for p in order], jobs=jobs) for k, sc in (("off", off), ("on", with_on))}
        policies: dict[str, Any] = {}
        for p in POLICY_NAMES:
            row: dict[str, Any] = {}
            summ = {k: next(x.summary for x in r.runs if x.name == p) for k, r in res.items()}
            for k, sm in summ.items():
                row[f"throughput_{k}"] = sm.get("throughput_tokens_per_s")
                row[f"tail_share_{k}"] = (sm.get("tail_share") or {}).get("mean")
                row[f"rollout_s_{k}"] = (sm.get("rollout_s") or {}).get("mean")
                row[f"batches_{k}"] = sm.get("batches_completed")
            common = common_tail_shares(summ)
            for k in summ:
                row[f"tail_share_common_{k}"] = common["mean"].get(k)
            row["tail_share_common_batches"] = len(common["batches"])
            a, b = row["throughput_off"], row["throughput_on"]
            row["throughput_ratio"] = round(b / a, 4) if a and b else None
            # The ratio on the batches both runs completed: a run that completes one more batch in the window
            # would otherwise be judged on a different set (its extra batch may be long or short).
            idx, means = common_rollout_s(summ)
            for k in summ:
                row[f"rollout_s_common_{k}"] = means.get(k)
            row["rollout_common_batches"] = len(idx)
            a, b = means.get("off"), means.get("on")
            row["rollout_ratio"] = round(b / a, 4) if a and b else None  # < 1: the lever shortened batches
            for c in extra:
                row[c] = summ["on"].get("counters", {}).get(c, 0)
            policies[p] = row
        rows.append({"trace": name, "window_s": round(off.end_time, 1), "policies": policies,
                     "wall_s": round(time.perf_counter() - t0, 2)})
    return {
        "window": {"window_h": window_h,
                   "rule": "each trace replayed whole" if window_h is None else
                           f"each trace cut to its first {window_h:g} h (shorter traces whole)"},
        "traces": rows,
        "wall_s": round(time.perf_counter() - t_all, 2),
    }
