"""A replay: one scenario (availability trace, lending, workload, model, GPUs) run under several policies.

The RL loop (``RLDriver``) rolls out batch k, then runs training step k (``LendingSchedule`` decides when),
until ``max_batches`` rollouts are done or the trace ends:

- ``sync``: rollout k, then step k; the next rollout starts when the step ends. Lent training GPUs are lent
  when a step ends and reclaimed when the next step starts (= when the rollout is done: they are empty then).
- ``async`` (one-step off-policy, as PEARL): step k starts when rollout k is done and step k-1 has ended;
  rollout k+1 starts at the same time with the weights of step k-1. Training GPUs are lent only while the
  trainer is idle: from the end of step k-1 until step k starts.

Every policy replays the same scenario with the same seed: the same batches (``BatchSource``), the same
availability events, the same performance model. Nothing here reads a clock except the wall time of a
whole replay (reported, never used for decisions).
"""

from __future__ import annotations

import gc
import logging
import math
import random
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from rollplan.models.errors import UserInputError
from rollplan.models.perf import default_provider
from rollplan.models.perf.calibrated import SHIPPED_GPUS
from rollplan.models.specs import gpu_kind, model_spec
from rollplan.models.types import AvailabilityEvent, EngineState, EventKind, Slot, SlotSource
from rollplan.sim.engine import FastPerf, NoProgressError, SimConfig, SimTraj, Simulator
from rollplan.sim.events import Event, EvKind
from rollplan.sim.lending import LendingConfig, LendingSchedule, LendMode, TrainStep
from rollplan.sim.metrics import Recorder, summarize
from rollplan.sim.traces import AvailabilityTrace
from rollplan.sim.workload import GroupVariation, TrajectorySpec, Workload

log = logging.getLogger(__name__)


# --- batches ------------------------------------------------------------------------------------------------


def truncate_sim(t: SimTraj, max_context: int) -> SimTraj:
    """``t`` cut to fit ``max_context`` tokens, by the rules of ``rollplan.sim.workload.truncate_to_context``
    (a prompt that leaves no room is cut to half the context; a turn whose new tokens leave no room is dropped
    with the rest; a turn whose decode overflows is cut to the room left and ends the trajectory, without a
    tool call). A test checks both agree."""
    pf, dec, tool = t.prefill, t.decode, t.tool
    if t.prompt_tokens + sum(pf) + sum(dec) <= max_context:
        return t
    prompt = t.prompt_tokens if t.prompt_tokens < max_context else max_context // 2
    n = len(dec)
    if not n:
        return SimTraj(t.id, t.group, prompt, pf, dec, tool, t.source)
    # Turn 0's new tokens are cut (not dropped) when they leave no room.
    p_first = pf[0] if prompt + pf[0] < max_context else max_context - prompt - 1
    # The context after each prefill and after each decode, in turn order: x_0 <= y_0 <= x_1 <= y_1 ... (token
    # counts are >= 0). The first x_k >= max_context (k >= 1) drops turn k on; the first y_k > max_context cuts
    # turn k's decode; whichever comes first, found by bisection instead of a walk over the turns.
    steps = [0] * (2 * n)
    steps[0::2] = pf
    steps[1::2] = dec
    steps[0] = prompt + p_first
    cum = list(accumulate(steps))
    i = bisect_left(cum, max_context)
    if i < 2 * n and i % 2 and cum[i] == max_context:
        i += 1  # turn i // 2 fills the context exactly: whole, and the next turn (if any) is dropped
    k = i // 2
    kept_pf = (p_first, *pf[1:k]) if k else ()
    if i >= 2 * n:
        return SimTraj(t.id, t.group, prompt, (p_first, *pf[1:]), dec, tool, t.source)
    if i % 2 == 0:  # x_k: turn k's new tokens leave no room
        return SimTraj(t.id, t.group, prompt, kept_pf, dec[:k], tool[:k], t.source)
    room = max_context - cum[i - 1]  # y_k: turn k's decode overflows, cut to the room left, no tool call
    return SimTraj(t.id, t.group, prompt, (*kept_pf, p_first if k == 0 else pf[k]), (*dec[:k], room),
                   (*tool[:k], 0.0), t.source)


def vary_fast(
    base: SimTraj, rng: np.random.Generator, variation: GroupVariation, *, traj_id: str, group: str
) -> SimTraj:
    """One varied sample of ``base`` by the rules of ``rollplan.sim.workload.vary`` (a turn-count factor with
    middle turns dropped or copied, one decode scale per sample, per-turn jitter on decode, new prefill tokens
    and tool seconds; all lognormal with median 1), drawn with numpy in one go."""
    v = variation
    n = len(base.decode)
    idx = list(range(n))
    if n > 1 and v.turns_sigma > 0:
        target = max(1, round(n * float(rng.lognormal(0.0, v.turns_sigma))))
        if target < n:
            idx = [*idx[: target - 1], idx[-1]]
        elif target > n:
            pool = idx[1:-1] or idx[:-1]
            for _ in range(target - n):
                idx.insert(int(rng.integers(1, len(idx))), pool[int(rng.integers(len(pool)))])
    m = len(idx)
    ii = np.asarray(idx)
    p = np.asarray(base.prefill, dtype=float)[ii]
    d = np.asarray(base.decode, dtype=float)[ii]
    w = np.asarray(base.tool, dtype=float)[ii]
    scale = float(rng.lognormal(0.0, v.sample_sigma)) if v.sample_sigma > 0 else 1.0
    if v.turn_sigma > 0:
        jd, jp = rng.lognormal(0.0, v.turn_sigma, (2, m))
    else:
        jd = jp = np.ones(m)
    jt = rng.lognormal(0.0, v.tool_sigma, m) if v.tool_sigma > 0 else np.ones(m)
    pv = np.rint(p * jp).astype(int)
    pv[0] = base.prefill[idx[0]]
    dv = np.maximum(1, np.rint(d * scale * jd)).astype(int)
    wv = np.round(w * jt, 3)
    return SimTraj(traj_id, group, base.prompt_tokens, tuple(pv.tolist()), tuple(dv.tolist()), tuple(wv.tolist()),
                   base.source)


def vary_group(
    base: SimTraj, n: int, rng: np.random.Generator, variation: GroupVariation, *, ids: Sequence[str], group: str,
    max_context: int | None = None,
) -> list[SimTraj]:
    """``n`` samples of one prompt, as ``vary_fast`` draws them but with one numpy draw for the whole group
    (batches hold thousands of trajectories); each cut to ``max_context`` when given."""
    v = variation
    m0 = len(base.decode)
    flat: list[int] = []  # every sample's turn indices, one after the other
    lens: list[int] = []
    if m0 > 1 and v.turns_sigma > 0:
        targets = [max(1, round(m0 * x)) for x in rng.lognormal(0.0, v.turns_sigma, n).tolist()]
    else:
        targets = [m0] * n
    # The inserted turns of every sample in one draw: the stream is the same as one draw per sample of
    # (target - m0, 2) integers in sample order (bounds 2^30 never reject, pairs use whole 64-bit words).
    extra = sum(x - m0 for x in targets if x > m0)
    picks = rng.integers(0, 1 << 30, (extra, 2)).tolist() if extra else []
    used = 0
    for target in targets:
        idx = list(range(m0))
        if target < m0:
            idx = [*idx[: target - 1], idx[-1]]
        elif target > m0:
            pool = idx[1:-1] or idx[:-1]
            for a, b in picks[used:used + target - m0]:
                idx.insert(1 + a % (len(idx) - 1), pool[b % len(pool)])
            used += target - m0
        flat.extend(idx)
        lens.append(len(idx))
    total = len(flat)
    ii = np.array(flat, dtype=int)
    p = np.asarray(base.prefill, dtype=float)[ii]
    d = np.asarray(base.decode, dtype=float)[ii]
    w = np.asarray(base.tool, dtype=float)[ii]
    scale = rng.lognormal(0.0, v.sample_sigma, n) if v.sample_sigma > 0 else np.ones(n)
    jd, jp = rng.lognormal(0.0, v.turn_sigma, (2, total)) if v.turn_sigma > 0 else (np.ones(total), np.ones(total))
    jt = rng.lognormal(0.0, v.tool_sigma, total) if v.tool_sigma > 0 else np.ones(total)
    pv = np.rint(p * jp).astype(int)
    lens_a = np.asarray(lens, dtype=np.intp)
    starts = np.cumsum(lens_a) - lens_a
    pv[starts] = base.prefill[0]
    dv_a = np.maximum(1, np.rint(d * np.repeat(scale, lens) * jd)).astype(int)
    # Samples that fit max_context come back from truncate_sim unchanged: find them with one exact integer sum
    # per sample instead of a Python sum each.
    fits = ([True] * n if max_context is None
            else (base.prompt_tokens + np.add.reduceat(pv + dv_a, starts) <= max_context).tolist())
    dv = dv_a.tolist()
    wv = np.round(w * jt, 3).tolist()
    pl = pv.tolist()
    out = []
    for s, a in enumerate(starts.tolist()):
        b = a + lens[s]
        t = SimTraj(ids[s], group, base.prompt_tokens, tuple(pl[a:b]), tuple(dv[a:b]), tuple(wv[a:b]), base.source)
        out.append(t if fits[s] or max_context is None else truncate_sim(t, max_context))
    return out


@dataclass(frozen=True)
class BatchSource:
    """The rollout batches of a replay, deterministic in ``seed``.

    Two modes. ``dataset`` (``groups`` > 0): ``bases`` is a prompt set (one base trajectory per prompt); batch
    k takes the next ``groups`` prompts of a seeded per-epoch permutation (prompts recur across epochs, as in
    RL over a dataset) and draws ``samples`` varied samples of each (``vary_fast``). ``fixed`` (``groups`` ==
    0): every batch is ``bases`` itself (a workload file): batch 0 as written, batch k >= 1 with every
    trajectory re-varied. ``max_context`` cuts every sample to fit the model.

    History keys (what the predictor's prior is keyed on: the prompt): the base's ``source`` (or id) in
    dataset mode, the group in fixed mode.
    """

    bases: tuple[SimTraj, ...]
    groups: int = 0
    samples: int = 1
    seed: int = 0
    variation: GroupVariation = field(default_factory=GroupVariation)
    max_context: int | None = None
    _cache: dict[int, tuple[tuple[SimTraj, ...], tuple[str, ...]]] = field(default_factory=dict, compare=False)

    @classmethod
    def dataset(
        cls, specs: Sequence[TrajectorySpec | SimTraj], *, groups: int, samples: int, seed: int = 0,
        max_context: int | None = None, variation: GroupVariation | None = None,
    ) -> BatchSource:
        bases = tuple(s if isinstance(s, SimTraj) else SimTraj.from_spec(s) for s in specs)
        if max_context is not None:
            bases = tuple(truncate_sim(b, max_context) for b in bases)
        return cls(bases, groups, samples, seed, variation or GroupVariation(), max_context)

    @classmethod
    def fixed(cls, workload: Workload, *, seed: int = 0, max_context: int | None = None) -> BatchSource:
        bases = tuple(SimTraj.from_spec(s) for s in workload.trajectories)
        return cls(bases, 0, 1, seed, GroupVariation(), max_context)

    @property
    def batch_size(self) -> int:
        return len(self.bases) if self.groups <= 0 else self.groups * self.samples

    def batch(self, k: int) -> tuple[tuple[SimTraj, ...], tuple[str, ...]]:
        """(trajectories, history keys) of batch ``k``."""
        hit = self._cache.get(k)
        if hit is not None:
            return hit
        if self.groups <= 0:
            specs = list(self.bases)
            if k > 0:
                specs = [vary_fast(sp, np.random.default_rng([self.seed, k, i]), self.variation,
                                   traj_id=sp.id, group=sp.group) for i, sp in enumerate(specs)]
            keys = [sp.group for sp in specs]
        else:
            per_epoch = len(self.bases)
            picks: list[SimTraj] = []
            perms: dict[int, list[int]] = {}
            for pos in range(k * self.groups, (k + 1) * self.groups):
                epoch, i = divmod(pos, per_epoch)
                if epoch not in perms:
                    perm = list(range(per_epoch))
                    random.Random(f"{self.seed}:epoch:{epoch}").shuffle(perm)
                    perms[epoch] = perm
                picks.append(self.bases[perms[epoch][i]])
            specs, keys = [], []
            width = max(2, len(str(self.groups - 1)))
            for gi, base in enumerate(picks):
                g = f"b{k}g{gi:0{width}d}"
                rng = np.random.default_rng([self.seed, k, gi])
                ids = [f"{g}/s{s}" for s in range(self.samples)]
                specs.extend(vary_group(base, self.samples, rng, self.variation, ids=ids, group=g,
                                        max_context=self.max_context))
                keys.extend([base.source or base.id] * self.samples)
        if self.max_context is not None and self.groups <= 0:
            specs = [truncate_sim(sp, self.max_context) for sp in specs]
        out = (tuple(specs), tuple(keys))
        self._cache[k] = out
        return out


# --- scenario -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Everything a replay needs except the policy.

    ``dedicated``: rollout GPUs owned by the job (H800 slots ``ded{node}/g{i}``, 8 per node, tp=1).
    ``trace``: preemptible GPUs (None: none). ``lending``: training GPUs lent between steps.
    ``max_batches``: stop after this many rollouts (None: until the trace ends). ``duration_s``: hard end
    (default: the trace's duration; required when there is no trace and no ``max_batches``).
    ``calibrated``: step times from the measured kernel fits where the GPU kind has one (``perf_factory``;
    the default: the physics comes from measured data), else from the roofline.
    """

    name: str
    batches: BatchSource
    model: str = "qwen3-8b"
    gpu: str = "h800"
    dedicated: int = 16
    trace: AvailabilityTrace | None = None
    lending: LendingConfig = field(default_factory=lambda: LendingConfig(gpus=0))
    max_batches: int | None = None
    duration_s: float | None = None
    seed: int = 0
    sim: SimConfig = field(default_factory=SimConfig)
    replan_interval_s: float = 120.0
    calibrated: bool = True
    warmup_batches: int = 0

    def history(self) -> list[tuple[SimTraj, str]]:
        """The finished trajectories of the ``warmup_batches`` RL steps before the replay window (what a
        policy that keeps history has seen by then); the window's batch k is the source's batch k + W."""
        out: list[tuple[SimTraj, str]] = []
        for k in range(self.warmup_batches):
            specs, keys = self.batches.batch(k)
            out.extend(zip(specs, keys, strict=True))
        return out

    @property
    def end_time(self) -> float:
        if self.duration_s is not None:
            return self.duration_s
        if self.trace is not None:
            return self.trace.duration_s
        return math.inf

    def dedicated_slots(self) -> tuple[Slot, ...]:
        kind = gpu_kind(self.gpu).name
        return tuple(
            Slot(id=f"ded{i // 8}/g{i % 8}", gpu=kind, node=f"ded{i // 8}", tp=1, source=SlotSource.DEDICATED,
                 engine=EngineState.WARM)
            for i in range(self.dedicated)
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "gpu": self.gpu,
            "dedicated_gpus": self.dedicated,
            "lent_gpus": self.lending.gpus,
            "train_step_s": self.lending.train_step_s,
            "mode": self.lending.mode.value,
            "trace": self.trace.summary() if self.trace is not None else None,
            "max_batches": self.max_batches,
            "end_time_s": None if math.isinf(self.end_time) else self.end_time,
            "batch_size": self.batches.batch_size,
            "seed": self.seed,
            "fold_tool_s": self.sim.fold_tool_s,
            "tool_kv": self.sim.tool_kv,
            "share_prompt": self.sim.share_prompt,
            "speculation": ({"tokens": self.sim.spec_tokens, "acceptance": self.sim.spec_acceptance,
                             "base_acceptance": self.sim.spec_base_acceptance} if self.sim.spec_tokens else None),
            # Only when on, so a replay without division describes itself as before.
            **({"divide_tokens": self.sim.divide_tokens} if self.sim.divide_tokens else {}),
            "replan_interval_s": self.replan_interval_s,
            "warmup_batches": self.warmup_batches,
        }


# --- the RL loop --------------------------------------------------------------------------------------------


class RLDriver:
    """Batches, training steps and lending around one simulator (see the module docstring)."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.schedule = LendingSchedule(scenario.lending)
        self.mode = scenario.lending.mode
        self.steps: list[TrainStep] = []
        self.rollouts_done = 0
        self.lend_events: list[AvailabilityEvent] = []
        self.lent = False
        self.train_done = 0
        self.on_batch_callback: Callable[[int, float], None] | None = None

    def _more(self, k: int) -> bool:
        return self.sc.max_batches is None or k < self.sc.max_batches

    def _lending(self, sim: Simulator, ev: AvailabilityEvent) -> Event:
        self.lend_events.append(ev)
        return sim.q.make(ev.time, EvKind.AVAIL, -1, len(self.lend_events) - 1)

    def lending_event(self, index: int) -> AvailabilityEvent:
        return self.lend_events[index]

    def start(self, sim: Simulator) -> list[Event]:
        out = [sim.q.make(0.0, EvKind.BATCH_START, 0, 0)]
        if self.sc.lending.gpus > 0:
            out.append(self._lending(sim, self.schedule.lend_event(0.0 + self.sc.lending.lend_delay_s)))
            self.lent = True
        return out

    def on_event(self, sim: Simulator, ev: Event) -> list[Event]:
        if ev.kind == EvKind.BATCH_START:
            specs, keys = self.sc.batches.batch(ev.a + self.sc.warmup_batches)
            return sim.start_batch(ev.a, specs, keys, weights_version=self.train_done)
        if ev.kind == EvKind.TRAIN_DONE:
            self.train_done += 1
            out: list[Event] = []
            step = self.steps[ev.a]
            if self.sc.lending.gpus > 0 and not self.lent:
                out.append(self._lending(sim, self.schedule.lend_event(step.end + self.sc.lending.lend_delay_s)))
                self.lent = True
            if self.mode is LendMode.SYNC:
                if self._more(self.rollouts_done):
                    out.append(sim.q.make(sim.now, EvKind.BATCH_START, self.rollouts_done, 0))
                else:
                    sim.stop()
            elif not self._more(self.rollouts_done) and ev.a == len(self.steps) - 1:
                sim.stop()
            return out
        return []

    def on_batch_done(self, sim: Simulator) -> list[Event]:
        now = sim.now
        self.rollouts_done += 1
        if self.on_batch_callback is not None:
            self.on_batch_callback(self.rollouts_done, now)
        prev_end = self.steps[-1].end if self.steps else None
        if self.mode is LendMode.SYNC:
            step = self.schedule.next_train_step(now)
        else:
            step = self.schedule.next_train_step(now, prev_end=prev_end)
        self.steps.append(step)
        out: list[Event] = []
        if self.lent:
            # The lent GPUs go back for the step (empty now: the rollout is done, the next one starts with it).
            out += sim.apply_availability(self.schedule.reclaim_event(now, step.start))
            self.lent = False
        out.append(sim.q.make(step.end, EvKind.TRAIN_DONE, len(self.steps) - 1, 0))
        if self.mode is LendMode.ASYNC and self._more(self.rollouts_done):
            out.append(sim.q.make(step.start, EvKind.BATCH_START, self.rollouts_done, 0))
        return out


# --- running --------------------------------------------------------------------------------------------------


def perf_factory(model: str, *, calibrated: bool, config: SimConfig) -> Callable[[str, int], FastPerf]:
    """(gpu kind, tp) -> FastPerf, cached: shared by every policy of a replay (same model, same tables).
    ``calibrated``: the shipped measured fits for the GPU kinds that have one (``SHIPPED_GPUS``: H100, H200,
    H800 derived from H100), the roofline for the others; else the roofline everywhere."""
    fitted = default_provider(model, calibrated=True)
    roofline = default_provider(model)
    spec = model_spec(model)
    cache: dict[tuple[str, int], FastPerf] = {}

    def get(gpu: str, tp: int) -> FastPerf:
        key = (gpu, tp)
        if key not in cache:
            provider = fitted if calibrated and gpu_kind(gpu).name in SHIPPED_GPUS else roofline
            cache[key] = FastPerf(provider(gpu, tp), config.prefill_chunk, spec.max_context, config.mem_util)
        return cache[key]

    return get


@dataclass
class PolicyRun:
    """One policy's replay: its recorder and summary."""

    name: str
    recorder: Recorder
    summary: dict[str, Any]


def check_can_progress(scenario: Scenario, policy: Any) -> None:
    """Raise ``NoProgressError`` when ``policy`` can never get a GPU in ``scenario``: none of the dedicated,
    lent or trace GPUs is of a source the policy may use (``policy.sources``; None: any). Such a replay would
    never progress (without an end time: never end); the simulator detects that too, this says why up front.
    Raises ``UserInputError`` when the scenario has no end at all (no ``max_batches`` and no end time)."""
    offered: dict[SlotSource, str] = {}
    if scenario.dedicated > 0:
        offered[SlotSource.DEDICATED] = "dedicated"
    if scenario.lending.gpus > 0:
        offered[SlotSource.LENT_BY_TRAINING] = "lent"
    for ev in scenario.trace.events if scenario.trace is not None else ():
        for sl in ev.slots:
            offered.setdefault(sl.source, "trace")
    if scenario.max_batches is None and math.isinf(scenario.end_time):
        raise UserInputError(f"scenario {scenario.name!r} has no end: no max_batches, no trace, no duration_s",
                             fix="set max_batches (--batches N), duration_s, or replay an availability trace")
    sources = getattr(policy, "sources", None)
    if any(sources is None or src in sources for src in offered):
        return
    name = getattr(policy, "name", "?")
    have = (f"dedicated={scenario.dedicated}, lent={scenario.lending.gpus}, trace "
            + ("none" if scenario.trace is None else "adds " + ("/".join(sorted(
                x.value for x, w in offered.items() if w == "trace")) or "no") + " GPUs"))
    if sources is None:
        raise NoProgressError(f"policy {name} has no GPU to run on ({have})",
                              fix="give --dedicated N >= 1, --lent N >= 1 or an availability trace that adds GPUs",
                              policy=name)
    only = "/".join(sorted(x.value for x in sources))
    raise NoProgressError(
        f"policy {name} has no GPU it may use: it uses {only} GPUs only and the scenario has none ({have})",
        fix="give --dedicated N >= 1, or leave the static policies out of --policies", policy=name)


def run_policy(
    scenario: Scenario,
    policy: Any,
    *,
    perf_for: Callable[[str, int], FastPerf] | None = None,
    on_batch: Callable[[int, float], None] | None = None,
) -> PolicyRun:
    """Replay ``scenario`` under ``policy`` (a fresh policy object per replay). Raises ``NoProgressError``
    when the policy can never run anything (``check_can_progress``) or the replay stops progressing with no end
    time (see ``rollplan.sim.engine``)."""
    check_can_progress(scenario, policy)
    perf_for = perf_for or perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)
    driver = RLDriver(scenario)
    driver.on_batch_callback = on_batch
    if scenario.warmup_batches:
        policy.warm_start(scenario.history())
    sim = Simulator(
        model=scenario.model,
        perf_for=perf_for,
        policy=policy,
        driver=driver,
        availability=scenario.trace.events if scenario.trace is not None else (),
        dedicated=scenario.dedicated_slots(),
        config=scenario.sim,
        replan_interval_s=scenario.replan_interval_s,
        end_time=scenario.end_time,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    rec = sim.run()
    rec.wall_seconds = time.perf_counter() - t0
    rec.cpu_seconds = time.process_time() - c0
    return PolicyRun(policy.name, rec, summarize(rec))


@dataclass
class ReplayResult:
    """Every policy's run on one scenario."""

    scenario: Scenario
    runs: list[PolicyRun]
    wall_s: float
    cpu_s: float = 0.0

    def by_name(self) -> dict[str, PolicyRun]:
        return {r.name: r for r in self.runs}


def _batch_callback(on_batch: Callable[[str, int, float], None], name: str) -> Callable[[int, float], None]:
    def cb(k: int, t: float) -> None:
        on_batch(name, k, t)

    return cb


def _run_one(scenario: Scenario, policy: Any) -> PolicyRun:
    """One policy's replay in a worker process of ``run_replay(jobs > 1)`` (the cyclic collector paused, as in
    the serial loop)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run_policy(scenario, policy)
    finally:
        if was_enabled:
            gc.enable()


def run_replay(
    scenario: Scenario,
    policies: Sequence[Any],
    *,
    on_policy_start: Callable[[str], None] | None = None,
    on_batch: Callable[[str, int, float], None] | None = None,
    jobs: int = 1,
) -> ReplayResult:
    """Replay ``scenario`` under each of ``policies`` (fresh policy objects), sharing the performance tables.

    ``jobs`` > 1: the policies run in that many worker processes (spawned; each builds its own performance
    tables). The runs are independent and deterministic, so the result is the same as the serial one but for
    the wall and CPU times; ``on_batch`` is not called and ``on_policy_start`` is called when a policy's run is
    handed to a worker. ``cpu_s`` is then the sum of the workers' CPU times.
    """
    if jobs < 1:
        raise UserInputError(f"jobs must be >= 1, got {jobs}", fix="use 1 (serial) or the number of cores")
    for pol in policies:  # every policy checked before the first replay runs
        check_can_progress(scenario, pol)
    t0, c0 = time.perf_counter(), time.process_time()
    if jobs > 1 and len(policies) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold solver threads
        with ProcessPoolExecutor(max_workers=min(jobs, len(policies)), mp_context=ctx) as pool:
            futures = []
            for pol in policies:
                if on_policy_start is not None:
                    on_policy_start(pol.name)
                futures.append(pool.submit(_run_one, scenario, pol))
            runs = [f.result() for f in futures]
        cpu = sum(float(r.summary.get("cpu_s") or 0.0) for r in runs)
        return ReplayResult(scenario, runs, time.perf_counter() - t0, cpu)
    perf_for = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)
    runs = []
    # The hot loop creates no reference cycles; full collections over tens of thousands of live trajectory
    # objects would cost ~15% of a replay, so the cyclic collector is paused (and restored) around it.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for pol in policies:
            if on_policy_start is not None:
                on_policy_start(pol.name)
            cb = None if on_batch is None else _batch_callback(on_batch, pol.name)
            runs.append(run_policy(scenario, pol, perf_for=perf_for, on_batch=cb))
    finally:
        if was_enabled:
            gc.enable()
    return ReplayResult(scenario, runs, time.perf_counter() - t0, time.process_time() - c0)


# --- scenario building (CLI, demo, bench) -------------------------------------------------------------------

SWEBENCH_FILES = ("agent_swebench_llm_calls.csv", "agent_swebench_tool_calls.csv")


def builtin_bases(seed: int, *, prompts: int = 96) -> tuple[SimTraj, ...]:
    """The built-in prompt set (no files): seeded synthetic agentic-coding trajectories shaped like the
    SWE-bench traces (about 20 turns, 8k-token prompts, 600 new tokens and 250 generated per turn, a few
    seconds of tool time per turn, heavy-tailed across prompts)."""
    from rollplan.sim.workload import synthetic_workload

    w = synthetic_workload(prompts, 1, seed, turns_median=20.0, max_turns=60, prompt_median=8000.0,
                           observation_median=600.0, decode_median=250.0, tool_median_s=2.0, length_sigma=0.7)
    return tuple(SimTraj.from_spec(t) for t in w.trajectories)


def swebench_bases(data_dir: str | Path) -> tuple[SimTraj, ...]:
    """One base trajectory per recorded SWE-bench agent run in ``data_dir`` (the shared data folder)."""
    from rollplan.sim.workload import swebench_runs

    d = Path(data_dir)
    return tuple(SimTraj.from_spec(t) for t in swebench_runs(d / SWEBENCH_FILES[0], d / SWEBENCH_FILES[1]))


def batch_source(
    workload: str, *, model: str, groups: int, samples: int, seed: int, data_dir: str | Path | None = None
) -> BatchSource:
    """``builtin`` (synthetic prompt set), ``swebench`` (the shared SWE-bench traces in ``data_dir``), or a
    workload JSONL file (every batch is that file, re-varied from batch 1 on). Contexts cut to the model's."""
    from rollplan.sim.workload import load_workload

    max_ctx = model_spec(model).max_context
    if workload == "builtin":
        return BatchSource.dataset(builtin_bases(seed), groups=groups, samples=samples, seed=seed, max_context=max_ctx)
    if workload == "swebench":
        if data_dir is None or not all((Path(data_dir) / f).is_file() for f in SWEBENCH_FILES):
            raise UserInputError(f"--workload swebench needs {', '.join(SWEBENCH_FILES)} in --data {data_dir}",
                                 fix="pass --data DIR (the shared data folder, ../shared/data)")
        return BatchSource.dataset(swebench_bases(data_dir), groups=groups, samples=samples, seed=seed,
                                   max_context=max_ctx)
    return BatchSource.fixed(load_workload(workload), seed=seed, max_context=max_ctx)


def lending_from(gpus: int, *, gpu: str, mode: str, train_step_s: float, reclaim_notice_s: float = 10.0) -> LendingConfig:
    return LendingConfig(gpus=gpus, gpu=gpu, train_step_s=train_step_s, mode=LendMode(mode),
                         reclaim_notice_s=reclaim_notice_s)


def availability_events(trace: AvailabilityTrace | None) -> Sequence[AvailabilityEvent]:
    return trace.events if trace is not None else ()


__all__ = [
    "BatchSource",
    "EventKind",
    "PolicyRun",
    "RLDriver",
    "ReplayResult",
    "Scenario",
    "availability_events",
    "batch_source",
    "builtin_bases",
    "check_can_progress",
    "lending_from",
    "perf_factory",
    "run_policy",
    "run_replay",
    "swebench_bases",
]
