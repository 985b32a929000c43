"""``rollplan bench fidelity``: does the simulator predict what the executor does on real vLLM engines?

One run (``run_fidelity``):

1. **Workload** (``build_workload``, seeded): ``groups`` prompts x ``group_size`` greedy samples; a group draws
   its number of turns and a per-turn decode budget (every sample of it decodes exactly that many tokens per
   turn: ``ignore_eos``), each sample its own observation sizes; tool seconds are real tool-call durations
   from the SWE-bench agent traces (``agent_swebench_tool_calls.csv``) times ``tool_scale``. The same
   trajectories are the executor's ``RolloutItem``s (with ``WorkloadEnv``) and the simulator's ``SimTraj``s.
2. **Availability script** (``script``, seconds from the rollout's start): the training node's slot is lent
   (its colocated engine parked asleep, as ROLL/PEARL keep one: a wake, no cold start), a node is lost without
   notice, a node arrives (a cold engine start), the lent slot is reclaimed with a deadline.
3. **Real**: per policy, a fresh local Ray cluster on loopback (head + 3 slot nodes + a training node), 3
   engines warm, the script replayed against the cluster while ``RolloutExecutor.rollout`` runs the batch.
4. **Profile** (first real run, before its rollout): decode steps over batch sizes with every engine decoding
   at once (the engines share this machine's cores, as in the rollout), prefill requests, the engine starts
   and the KV capacity, as ``rollplan bench executor --profile-out`` records; fitted by
   ``rollplan.executor.perf.from_profile_records`` (the planner's model in the real runs too).
5. **Simulated**: the same workload, script and policy through ``rollplan.sim`` on that fitted model.

Reported per policy: real and simulated rollout seconds and their error, the per-trajectory completion-time
error (median, p90 of |sim - real| / real), and whether the simulated ranking of the policies equals the real
one. What the simulator leaves out is listed in docs/simulator.md ("Fidelity") with its measured size.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rollplan.models import AvailabilityEvent, EngineState, EventKind, Role, Slot, SlotSource
from rollplan.models.errors import SchemaError

SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"
FIDELITY_POLICIES = ("rollplan", "elastic-plus")
DEFAULT_TOOL_SCALE = 0.25
"""Seconds of tool wait here per second in the SWE-bench traces. The traces' agent turns produce a few hundred
tokens on a GPU at ~50-100 tokens/s (a few seconds per turn beside a median 0.04 s, p90 9 s tool call); the
tiny model's turns here are ~40 tokens at ~100-200 tokens/s per sequence under load (a fraction of a second),
so a quarter keeps tool waits a comparable share of a trajectory's time without letting them dominate it."""
START_NICE = 19
"""Engines start at the lowest CPU priority (``EngineConfig.start_nice``): the engines share this machine's
cores, and a start at normal priority slows the serving engines (docs/simulator.md, "Fidelity"), which engines
on separate GPU nodes, the system the simulator models, do not do to each other."""
PLANNER = ("greedy", 0.05)
"""The rollplan policy's planner on both sides: the simulator's replays run greedy (``RollplanPolicy``'s
default), and the simulator does not charge a plan's solve time yet (issue 18), so an exact backend's
wall-clock solves (CPU the engines share here, actions after the solve) are a difference the bench would
measure instead of the simulator's physics; docs/simulator.md ("Fidelity") gives its measured size."""
KV_CACHE_BYTES = 64 << 20
"""Each engine's KV cache by default (``EngineConfig``'s default): 65,536 tokens of the tiny model (1 KiB a
token: 2 layers x K and V x 1 head x 64 x fp32), ~4x what the 96 trajectories ever hold at once, so the
default bench has no KV pressure. ``--kv-cache-mib`` shrinks it to test the simulator's KV physics (eviction
of a finished turn's prefix-cached KV during its tool call, re-prefill, admission) against vLLM's."""
TOOL_CAP_S = 6.0
"""Longest scaled tool wait (s): the traces' tail (up to 362 s) would make one trajectory the whole rollout."""


# -- the workload ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FidelityTrajectory:
    """One trajectory's true course: ``turns`` turns of ``decode`` tokens each; after turn k < turns - 1 a tool
    wait of ``tools[k]`` seconds and an observation of ``observations[k]`` tokens."""

    id: str
    group: str
    prompt: tuple[int, ...]
    decode: int
    observations: tuple[int, ...]
    tools: tuple[float, ...]

    @property
    def turns(self) -> int:
        return len(self.observations) + 1

    def item(self) -> Any:
        from rollplan.executor.agent import RolloutItem, SamplingConfig

        return RolloutItem(id=self.id, prompt=self.prompt, group=self.group, max_turns=self.turns,
                           sampling=SamplingConfig(max_tokens=self.decode, ignore_eos=True), chat=False,
                           data=self)

    def sim(self, turn_overhead_s: float = 0.0) -> Any:
        """The simulator's course. ``turn_overhead_s``: the executor's per-request latency outside the engine
        (a turn's request to the engine actor and its result back, through Ray), added to each tool wait:
        like a tool call, it keeps the trajectory off the engine's batch while its KV stays."""
        from rollplan.sim.engine import SimTraj

        return SimTraj(self.id, self.group, len(self.prompt), (0, *self.observations),
                       (self.decode,) * self.turns, (*(t + turn_overhead_s for t in self.tools), 0.0),
                       source=self.group)


def tool_durations(data_dir: str | Path) -> list[float]:
    """Tool-call durations (s) of the SWE-bench agent traces (``agent_swebench_tool_calls.csv``)."""
    path = Path(data_dir) / "agent_swebench_tool_calls.csv"
    if not path.is_file():
        raise SchemaError(str(path), "not found", fix="pass --data the shared data folder (../shared/data)")
    with path.open(newline="") as f:
        return [float(r["duration_s"]) for r in csv.DictReader(f) if r.get("duration_s")]


def build_workload(
    seed: int, *, groups: int = 24, group_size: int = 4, durations: Sequence[float], tool_scale: float,
    max_context: int = 512,
) -> tuple[FidelityTrajectory, ...]:
    """The seeded workload (see the module docstring); every trajectory fits ``max_context`` tokens."""
    rng = random.Random(f"fidelity:{seed}")
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(16, 1000) for _ in range(rng.randint(40, 72)))
        turns = rng.randint(3, 6)
        decode = int(min(96, max(8, round(rng.lognormvariate(math.log(36), 0.5)))))
        for k in range(group_size):
            obs = [rng.randint(6, 24) for _ in range(turns - 1)]
            while len(prompt) + turns * decode + sum(obs) > max_context - 8 and obs:
                obs.pop()  # fewer turns until it fits
            tools = tuple(min(TOOL_CAP_S, rng.choice(durations) * tool_scale) for _ in obs)
            out.append(FidelityTrajectory(f"f{g:02d}-{k}", f"fg{g:02d}", prompt, decode, tuple(obs), tools))
    return tuple(out)


@dataclass
class WorkloadEnv:
    """The tool environment of a ``FidelityTrajectory`` (``item.data``): waits its tool seconds, answers with
    its observation tokens (seeded ids), says done after its last turn."""

    item: Any

    async def step(self, turn: Any) -> Any:
        from rollplan.executor.agent import Observation

        spec: FidelityTrajectory = self.item.data
        if turn.turn + 1 >= spec.turns:
            return Observation(done=True, reward=0.0)
        await asyncio.sleep(spec.tools[turn.turn])
        rng = random.Random(f"{spec.id}:{turn.turn}")
        return Observation(token_ids=tuple(rng.randrange(16, 1000) for _ in range(spec.observations[turn.turn])))


# -- the availability script -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Script:
    """Seconds from the rollout's start: lend the training slot (until ``lend_until``), lose node b, add node d,
    reclaim the lent slot (deadline ``reclaim_deadline``)."""

    lend_at: float = 1.0
    lend_until: float = 600.0
    lose_at: float = 3.0
    arrive_at: float = 4.0
    reclaim_at: float = 10.0
    reclaim_deadline: float = 13.0

    def events(self) -> tuple[AvailabilityEvent, ...]:
        lent = Slot("train/g0", "cpu", "train", source=SlotSource.LENT_BY_TRAINING)
        return (
            AvailabilityEvent(self.lend_at, EventKind.LEND, slot_ids=(lent.id,), slots=(lent,),
                              deadline=self.lend_until),
            AvailabilityEvent(self.lose_at, EventKind.LEAVE, slot_ids=("b/g0",)),
            AvailabilityEvent(self.arrive_at, EventKind.ARRIVE, slot_ids=("d/g0",),
                              slots=(Slot("d/g0", "cpu", "d", engine=EngineState.NONE),)),
            AvailabilityEvent(self.reclaim_at, EventKind.RECLAIM, slot_ids=(lent.id,),
                              deadline=self.reclaim_deadline),
        )


# -- the real run ------------------------------------------------------------------------------------------
def _config(model: Path, kv_dir: Path, policy: str, perf: Any = None, start_nice: int | None = START_NICE,
            kv_cache_bytes: int = KV_CACHE_BYTES) -> Any:
    from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig

    return ExecutorConfig(
        engine=EngineConfig(model=str(model), connector=KVConnectorConfig(kind="example", storage_path=str(kv_dir)),
                            start_nice=start_nice, kv_cache_memory_bytes=kv_cache_bytes),
        slot_resource=SLOT, lend_resource=LEND, replan_interval=2.0, planner_backend=PLANNER[0],
        planner_time_limit=PLANNER[1], keep_lent_engines=True, policy=policy, perf=perf,
    )


async def _profile(ex: Any, batches: Sequence[int], n_dec: int = 32) -> list[dict]:
    """Step timings with every serving engine busy at once (they share this machine's cores, as in the
    rollout): decode steps over ``batches`` (a batch's ``n_dec`` tokens over its duration, past its prefill),
    and prefill steps (``EngineActor.time_mixed_steps``: groups of 48-token prompts beside one running decode,
    one step each, as ``rollplan bench executor`` times them; a request's latency would add the Ray round
    trip and the request's own handling, which the engines do not spend per step), and that per-request
    overhead itself (``request`` records: a call's latency at the driver minus its seconds in the actor)."""
    from rollplan.executor.bench import probe_steps, step_records

    engines = [s.engine for s in ex.ctl.slots.values() if s.engine is not None and s.engine.serving]
    recs: list[dict] = []
    info = await engines[0].actor.info.remote()
    cap = int(info.get("kv_capacity_tokens") or 0)
    block = ex.config.engine.block_size or 32
    per_seq = -(-(48 + n_dec + 1) // block) * block
    # A batch whose KV does not fit would be preempted mid-profile (``--kv-cache-mib``): its step is not one step.
    batches = [b for b in batches if not cap or b * per_seq <= cap] or list(batches[:1])
    for bsz in batches:
        per: list[float] = []
        for trial in range(3):
            prompts = [[(trial * 131 + bsz * 31 + j * 17 + k) % 990 + 8 for k in range(48)] for j in range(bsz)]
            calls = [e.actor.generate_many.remote([[p[0] + 1 + i, *p[1:]] for p in prompts], {"max_tokens": 1})
                     for i, e in enumerate(engines)]
            first = await asyncio.gather(*calls)
            calls = [e.actor.generate_many.remote([[p[0] + 1 + i + len(engines), *p[1:]] for p in prompts],
                                                  {"max_tokens": n_dec + 1, "ignore_eos": True})
                     for i, e in enumerate(engines)]
            res = await asyncio.gather(*calls)
            per += [max((r["seconds"] - f["seconds"]) / n_dec, 0.0) for r, f in zip(res, first, strict=True)]
        recs.append({"phase": "decode", "batch": bsz, "kv_tokens": 48 + n_dec // 2, "seconds": statistics.median(per)})
    rng = random.Random("fidelity-prefill-steps")
    groups = [[[rng.randrange(8, 1000) for _ in range(48)] for _ in range(n)] for _ in range(3) for n in (1, 4, 16)]
    clocks = [[[rng.randrange(8, 1000) for _ in range(48)]] for _ in engines]
    res = await asyncio.gather(*(e.actor.time_mixed_steps.remote(c, groups) for e, c in zip(engines, clocks, strict=True)))
    rows = [row for r in res for row in probe_steps(r, 48, phase="prefill") if row["phase"] == "prefill"]
    recs += [r for r in step_records(rows)[0] if r["phase"] == "prefill"]
    async def overheads(e: Any, tag: int) -> list[float]:
        out = []
        for i in range(8):
            t = time.perf_counter()
            r = await e.actor.generate.remote(f"fid-req-{tag}-{i}", [rng.randrange(8, 1000) for _ in range(8)],
                                              {"max_tokens": 1})
            out.append(max(0.0, time.perf_counter() - t - r["seconds"]))
        return out

    for xs in await asyncio.gather(*(overheads(e, i) for i, e in enumerate(engines))):
        recs += [{"phase": "request", "seconds": x} for x in xs]
    if cap:
        recs.append({"phase": "kv_capacity", "tokens": cap})
    return recs


async def _steps_until(engine: Any, ready: asyncio.Event | None, *, rounds: int = 0, batch: int = 16,
                       tokens: int = 24) -> list[float]:
    """Decode step times (s) of ``engine``: ``batch`` greedy sequences of ``tokens`` tokens per round, the step
    = the round's time over its tokens; rounds until ``ready`` is set (or ``rounds`` of them)."""
    out: list[float] = []
    i = 0
    while (ready is not None and not ready.is_set()) or (ready is None and i < rounds):
        prompts = [[(i * 53 + j * 29 + k) % 990 + 8 for k in range(32)] for j in range(batch)]
        r = await engine.actor.generate_many.remote(prompts, {"max_tokens": tokens, "ignore_eos": True})
        out.append(r["seconds"] / tokens)
        i += 1
    return out


async def _real(policy: str, work: Sequence[FidelityTrajectory], script: Script, model: Path, tmp: Path,
                perf: Any, profile_batches: Sequence[int] | None, log: Callable[[str], None],
                kv_cache_bytes: int = KV_CACHE_BYTES) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from rollplan.executor.executor import RolloutExecutor
    from rollplan.executor.replay import ClusterNodes, replay_availability

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ex = None
    try:
        nodes = {n: cluster.add_node(num_cpus=0, resources={SLOT: 1}) for n in ("a", "b", "c")}
        cluster.add_node(num_cpus=0, resources={LEND: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        ex = RolloutExecutor(_config(model, Path(tempfile.mkdtemp(prefix=f"kv-{policy}-", dir=tmp)), policy, perf,
                                     kv_cache_bytes=kv_cache_bytes))
        await ex.start()
        control = ClusterNodes(cluster, {SLOT: 1})
        node_map = {n: control.adopt(node) for n, node in nodes.items()}
        # The training node's colocated engine: started, then parked asleep when the slot goes back.
        lendable = ex.lendable_slots()
        await ex.lend(lendable, until=ex.now() + 3600.0)
        ex.ctl.autoplan = False
        ordered = [sid for sid, s in ex.ctl.slots.items() if s.source is not SlotSource.LENT_BY_TRAINING]
        trace_of = {}
        for n, rid in node_map.items():
            trace_of.update({sid: f"{n}/g0" for sid in ex.slots_on_node(rid)})
        starts = await ex.warm_up(ordered)
        # The lent slot's engine starts alone, while one serving engine decodes: its steps during the start
        # against its steps after it measure what a start costs the engines beside it (start_interference).
        handle = ex.ctl.start_engine(ex.ctl.slots[lendable[0]])
        probe = next(s.engine for s in ex.ctl.slots.values() if s.engine is not None and s.engine.serving)
        during = await _steps_until(probe, handle.ready)
        starts.update({handle.slot: float(handle.start_seconds or 0.0)})
        after = await _steps_until(probe, None, rounds=len(during) // 2 + 3)
        ex.ctl.slots[lendable[0]].role = Role.MIXED
        records: list[dict] = [{"phase": "engine_start", "seconds": v} for v in starts.values()]
        if during and after:
            records.append({"phase": "start_interference", "during_s": statistics.median(during),
                            "after_s": statistics.median(after), "samples": len(during)})
        if profile_batches:
            log("profiling the engines")
            records += await _profile(ex, profile_batches)
        await ex.reclaim(lendable)
        ex.ctl.autoplan = True
        t0 = ex.now()
        replay = asyncio.create_task(replay_availability(ex, script.events(), nodes=control, node_map=node_map))
        results = await ex.rollout([w.item() for w in work], WorkloadEnv)
        wall = ex.now() - t0
        if replay.done():
            applied = replay.result()
        else:  # events after the rollout's end change nothing it measured
            replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replay
            applied = ["(the script's events after the rollout's end were not applied)"]
        stats = ex.stats()
        return {
            "prefix_lost": prefix_lost(results, block_size=ex.config.engine.block_size or 32),
            "rollout_s": wall,
            "completion_s": {r.id: r.finished - t0 for r in results},
            "start_s": {r.id: r.started - t0 for r in results},
            "generate_s": {r.id: sum(t.generate_seconds for t in r.turns) for r in results},
            "tool_s": {r.id: sum(t.tool_seconds for t in r.turns) for r in results},
            "done": sum(1 for r in results if r.ok),
            "tokens": sum(r.generated_tokens for r in results),
            "replans": stats["replans"], "mean_plan_s": stats["mean_plan_seconds"],
            "actions": stats["actions"],
            "events": applied,
            "engine_start_s": sorted(starts.values()),
            "profile": records,
            "slots": trace_of,
            "slowest": [{"id": r.id, "turns": [{"started_s": round(t.started - t0, 3),
                                                "generate_s": round(t.generate_seconds, 3),
                                                "tool_s": round(t.tool_seconds, 3), "engines": list(t.engines),
                                                "interruptions": t.interruptions} for t in r.turns]}
                        for r in sorted(results, key=lambda r: r.finished)[-3:]],
            "controller_events": [(round(t - t0, 3), what, list(ids)) for t, what, ids in ex.ctl.stats.events
                                  if t >= t0],
        }
    finally:
        if ex is not None:
            await ex.shutdown()
        ray.shutdown()
        cluster.shutdown()


def prefix_lost(results: Sequence[Any], *, block_size: int) -> dict[str, int]:
    """How often a turn found less of its trajectory's KV than the previous turn left on its engine: the real
    counterpart of the simulator's ``evictions`` (a finished turn's KV evicted from the prefix cache during its
    tool call, or its running request preempted, so the context is prefilled again). A turn k > 0 on the engine
    of turn k - 1 should find at least the previous turn's context in whole blocks cached; ``turns`` counts
    those that found less and ``tokens`` the blocks' tokens they prefilled again. Turns that moved to another
    engine (a migration or a route elsewhere) are counted apart (``moved_turns``): their KV is a transfer or a
    re-prefill by the policy's choice, not memory pressure."""
    lost = tokens = moved = 0
    for r in results:
        for prev, turn in zip(r.turns, r.turns[1:], strict=False):
            if not prev.engines or not turn.engines or turn.engines[0] != prev.engines[-1]:
                moved += 1
                continue
            expect = prev.context_tokens // block_size * block_size
            if turn.num_cached_tokens < expect:
                lost += 1
                tokens += expect - turn.num_cached_tokens
    return {"turns": lost, "tokens": tokens, "moved_turns": moved}


# -- the simulated run -------------------------------------------------------------------------------------
class _OneBatch:
    """The simulator's driver for one rollout batch at time 0 (no training steps, no lending schedule)."""

    def __init__(self, specs: Sequence[Any]) -> None:
        self.specs = tuple(specs)

    def start(self, sim: Any) -> list[Any]:
        from rollplan.sim.events import EvKind

        return [sim.q.make(0.0, EvKind.BATCH_START, 0, 0)]

    def on_event(self, sim: Any, ev: Any) -> list[Any]:
        from rollplan.sim.events import EvKind

        if ev.kind == EvKind.BATCH_START:
            return sim.start_batch(0, self.specs, [s.group for s in self.specs], weights_version=0)
        return []

    def on_batch_done(self, sim: Any) -> list[Any]:
        sim.stop()
        return []

    def lending_event(self, index: int) -> AvailabilityEvent:
        raise IndexError(index)


def simulate(policy: str, work: Sequence[FidelityTrajectory], script: Script, provider: Any,
             config: Any, *, turn_overhead_s: float = 0.0, start_interference: float = 0.0,
             fold_tool_s: float | None = None) -> dict[str, Any]:
    """The simulator's run of ``work`` under ``policy`` and ``script`` on ``provider``'s model, with the
    executor ``config``'s planner settings, re-plan interval and engine limits (``turn_overhead_s``: see
    ``FidelityTrajectory.sim``; ``fold_tool_s``: the simulator's segment folding, None: its default)."""
    from rollplan.sim.engine import FastPerf, SimConfig, Simulator
    from rollplan.sim.policies import make_policy

    sim_cfg = SimConfig(max_num_seqs=config.engine.max_num_seqs, role_switch_s=config.role_switch_seconds,
                        start_interference=start_interference)
    if fold_tool_s is not None:
        sim_cfg = replace(sim_cfg, fold_tool_s=fold_tool_s)
    cache: dict[tuple[str, int], Any] = {}

    def perf_for(gpu: str, tp: int) -> Any:
        if (gpu, tp) not in cache:
            cache[gpu, tp] = FastPerf(provider(gpu, tp), sim_cfg.prefill_chunk, config.engine.max_model_len,
                                      sim_cfg.mem_util)
        return cache[gpu, tp]

    pol = make_policy(policy, backend=config.planner_backend, time_limit=config.planner_time_limit,
                      deterministic=True)
    done_at: dict[str, float] = {}
    inner = pol.on_traj_done

    def on_traj_done(sim: Any, j: int) -> None:  # the bench's per-trajectory record; the policy carries on
        done_at[sim.trajs[j].spec.id] = sim.now
        inner(sim, j)

    pol.on_traj_done = on_traj_done  # type: ignore[method-assign]
    dedicated = tuple(Slot(f"{n}/g0", "cpu", n, source=SlotSource.DEDICATED, engine=EngineState.WARM)
                      for n in ("a", "b", "c"))
    sim = Simulator(model=config.model_name, perf_for=perf_for, policy=pol,
                    driver=_OneBatch([w.sim(turn_overhead_s) for w in work]), availability=script.events(),
                    dedicated=dedicated, config=sim_cfg, replan_interval_s=config.replan_interval)
    t = time.perf_counter()
    sim.run()
    return {"rollout_s": max(done_at.values()) if done_at else math.inf, "completion_s": done_at,
            "wall_s": time.perf_counter() - t, "evictions": int(sim.recorder.counters.get("evictions", 0))}


# -- the bench ---------------------------------------------------------------------------------------------
def _errors(real: dict[str, float], sim: dict[str, float]) -> dict[str, float | None]:
    errs = sorted(abs(sim[k] - v) / v for k, v in real.items() if k in sim and v > 0)
    if not errs:
        return {"median": None, "p90": None}
    return {"median": statistics.median(errs), "p90": errs[min(len(errs) - 1, int(0.9 * len(errs)))]}


def calibrate(records: Sequence[dict], path: Path) -> tuple[Any, float, dict[str, float]]:
    """The simulator's CPU model from one run's profile (``_profile``): ``(provider, turn overhead, summary)``.

    Decode steps, engine starts and the KV capacity as ``rollplan.executor.perf.from_profile_records`` fits
    them. Prefill: the profiled prefill steps ran beside one decode, so each is a mixed step; its cost over
    that decode step is the prompts' per-token cost (least squares through the origin), and the calibration's
    per-prompt intercept is 0: in the rollout a prompt is prefilled inside a step whose fixed cost its decodes
    already pay (``MeasuredPerfModel.step_time``), and the simulator prices each prompt's prefill on its own,
    so an intercept would be charged once per prompt instead of once per step. The turn overhead is the median
    ``request`` record (``FidelityTrajectory.sim``)."""
    from rollplan.executor.perf import MeasuredPerfModel, from_profile_records, measured_provider
    from rollplan.models import gpu_kind, model_spec

    base = from_profile_records(records, MeasuredPerfModel(gpu_kind("cpu"), model_spec("tiny")))
    pts = [(float(sum(r["prompt_tokens"])), float(r["seconds"]) - base.decode_step_time(1, 48.0))
           for r in records if r.get("phase") == "prefill"]
    sxx = sum(x * x for x, _ in pts)
    per_token = max(0.0, sum(x * y for x, y in pts) / sxx) if sxx > 0 else base.prefill_per_token
    provider = measured_provider("tiny", profile=_write(path, records), prefill_fixed=0.0,
                                 prefill_per_token=per_token)
    req = [float(r["seconds"]) for r in records if r.get("phase") == "request"]
    overhead = statistics.median(req) if req else 0.0
    inter = [max(0.0, r["during_s"] / r["after_s"] - 1.0) for r in records
             if r.get("phase") == "start_interference" and r.get("after_s")]
    fitted = provider("cpu", 1)
    summary = {k: getattr(fitted, k) for k in ("decode_a", "decode_c", "prefill_fixed", "prefill_per_token",
                                                "engine_start", "kv_cache_bytes")}
    summary |= {"turn_overhead_s": overhead, "start_interference": inter[0] if inter else 0.0}
    return provider, overhead, summary


def _same_order(real: dict[str, float], sim: dict[str, float], tie: float) -> bool:
    """Real and simulated rollout times order every pair of policies the same way, a pair whose real times
    differ by less than ``tie`` (relative) counting as a tie either way can take."""
    names = list(real)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            if abs(real[p] - real[q]) < tie * min(real[p], real[q]):
                continue
            if (real[p] < real[q]) != (sim[p] < sim[q]):
                return False
    return True


RANK_TIE = 0.03
"""Real rollout times within 3% of each other rank as a tie: the same seed and policy repeated on this machine
gave rollout times 2-3% apart (docs/simulator.md, "Fidelity"), so a smaller real difference is not an order."""


def run_fidelity(
    *, seeds: Sequence[int] = (0,), policies: Sequence[str] = FIDELITY_POLICIES, data_dir: str | Path,
    groups: int = 24, group_size: int = 4, tool_scale: float = DEFAULT_TOOL_SCALE, script: Script = Script(),
    profile_batches: Sequence[int] = (1, 4, 16, 32, 64), log: Callable[[str], None] = lambda m: None,
    also_folds: Sequence[float] = (), kv_cache_bytes: int = KV_CACHE_BYTES,
) -> dict[str, Any]:
    """The bench (module docstring). Every real run profiles its own engines before its rollout and its
    simulation runs on that calibration (``calibrate``); the real run's planner uses the previous run's
    calibration (the first one: ``MeasuredPerfModel``'s defaults, measured on this kind of machine).
    ``also_folds``: the simulator also replays each real run with these segment foldings
    (``SimConfig.fold_tool_s``; 0: turn by turn), reported per run and policy under ``sim_by_fold`` and in
    ``policies[p]["by_fold"]``; the ranking and the figures above stay the default folding's.
    ``kv_cache_bytes``: each engine's KV cache (``KV_CACHE_BYTES``); the simulator gets the capacity the
    engines report. Each run reports the real turns that lost their cached prefix (``real_prefix_lost``,
    ``prefix_lost``) beside the simulator's ``sim_evictions``. Returns one JSON-ready dict."""
    for p in policies:
        if p not in FIDELITY_POLICIES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("fidelity policy", p, FIDELITY_POLICIES)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rollplan.executor.tiny_model import build_tiny_model

    durations = tool_durations(data_dir)
    t_bench = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollplan-fidelity-") as tmpd:
        tmp = Path(tmpd)
        model = build_tiny_model(tmp / "model", seed=0)
        planner_perf: Any = None
        for seed in seeds:
            work = build_workload(seed, groups=groups, group_size=group_size, durations=durations,
                                  tool_scale=tool_scale)
            row: dict[str, Any] = {"seed": seed, "trajectories": len(work),
                                   "decode_tokens": sum(w.decode * w.turns for w in work), "policies": {}}
            for policy in policies:
                log(f"seed {seed}: {policy} on the real engines")
                real = await_run(_real(policy, work, script, model, tmp, planner_perf, profile_batches, log,
                                       kv_cache_bytes=kv_cache_bytes))
                provider, overhead, cal = calibrate(real["profile"], tmp / f"profile-{seed}-{policy}.jsonl")
                planner_perf = provider
                sim = simulate(policy, work, script, provider, _config(model, tmp, policy, kv_cache_bytes=kv_cache_bytes),
                               turn_overhead_s=overhead, start_interference=cal["start_interference"])
                err = (sim["rollout_s"] - real["rollout_s"]) / real["rollout_s"]
                by_fold = {}
                for fold in also_folds:
                    other = simulate(policy, work, script, provider, _config(model, tmp, policy, kv_cache_bytes=kv_cache_bytes),
                                     turn_overhead_s=overhead, start_interference=cal["start_interference"],
                                     fold_tool_s=fold)
                    by_fold[str(fold)] = {
                        "sim_rollout_s": other["rollout_s"],
                        "error": (other["rollout_s"] - real["rollout_s"]) / real["rollout_s"],
                        "sim_evictions": other["evictions"],
                        "completion_error": _errors(real["completion_s"], other["completion_s"])}
                row["policies"][policy] = {
                    "real_rollout_s": real["rollout_s"], "sim_rollout_s": sim["rollout_s"], "error": err,
                    "completion_error": _errors(real["completion_s"], sim["completion_s"]),
                    "calibration": cal, "real_prefix_lost": real["prefix_lost"],
                    "sim_evictions": sim["evictions"],
                    "real_done": real["done"], "real_tokens": real["tokens"], "replans": real["replans"],
                    "mean_plan_s": real["mean_plan_s"],
                    "actions": {k: v["count"] for k, v in real["actions"].items()}, "events": real["events"],
                    "sim_wall_s": sim["wall_s"], "slowest": real["slowest"], "sim_by_fold": by_fold,
                    "controller_events": real["controller_events"], "slot_names": real["slots"],
                    "profile": real["profile"],
                    "trajectories": {k: {"real_s": round(v, 3), "sim_s": round(sim["completion_s"].get(k, math.nan), 3),
                                         "real_start_s": round(real["start_s"][k], 3),
                                         "real_generate_s": round(real["generate_s"][k], 3),
                                         "real_tool_s": round(real["tool_s"][k], 3)}
                                     for k, v in real["completion_s"].items()},
                }
            ps = row["policies"]
            real_t = {p: ps[p]["real_rollout_s"] for p in ps}
            sim_t = {p: ps[p]["sim_rollout_s"] for p in ps}
            row["ranking"] = {"real": sorted(ps, key=real_t.__getitem__), "sim": sorted(ps, key=sim_t.__getitem__),
                              "same": _same_order(real_t, sim_t, 0.0), "same_within_ties": _same_order(real_t, sim_t, RANK_TIE)}
            runs.append(row)
    per_policy: dict[str, Any] = {}
    for p in policies:
        errs = [abs(r["policies"][p]["error"]) for r in runs]
        per_policy[p] = {"error_max": max(errs), "error_median": statistics.median(errs),
                         "real_rollout_s": [r["policies"][p]["real_rollout_s"] for r in runs],
                         "sim_rollout_s": [r["policies"][p]["sim_rollout_s"] for r in runs],
                         "completion_error_median": [r["policies"][p]["completion_error"]["median"] for r in runs],
                         "by_fold": {str(f): {"error_max": max(abs(r["policies"][p]["sim_by_fold"][str(f)]["error"])
                                                               for r in runs),
                                              "sim_rollout_s": [r["policies"][p]["sim_by_fold"][str(f)]["sim_rollout_s"]
                                                                for r in runs]}
                                     for f in also_folds}}
    return {
        "seeds": list(seeds), "policies": per_policy, "runs": runs,
        "ranking_preserved": all(r["ranking"]["same"] for r in runs),
        "ranking_preserved_within_ties": all(r["ranking"]["same_within_ties"] for r in runs), "rank_tie": RANK_TIE,
        "within_15pct": all(v["error_max"] <= 0.15 for v in per_policy.values()),
        "tool_scale": tool_scale, "kv_cache_bytes": kv_cache_bytes, "script": {k: getattr(script, k) for k in script.__slots__},
        "start_nice": START_NICE, "planner": {"backend": PLANNER[0], "time_limit": PLANNER[1]},
        "bench_seconds": time.perf_counter() - t_bench,
    }


def _write(path: Path, records: Sequence[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def await_run(coro: Any) -> Any:
    return asyncio.run(coro)


__all__ = ["FIDELITY_POLICIES", "FidelityTrajectory", "Script", "WorkloadEnv", "build_workload", "run_fidelity",
           "simulate"]
