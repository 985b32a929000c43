"""The controller: a live ``ClusterSnapshot``, ``plan()`` on every availability event, actions applied.

It owns the slots (``SlotRuntime``) and the running trajectories (``TrajectoryRun``) and is the agent
loop's ``Router``. On every event (slots arriving or leaving, a preemption notice, training lending or
reclaiming slots, an engine failure) and every ``replan_interval`` seconds while trajectories run, it
builds a snapshot, calls the planner (``rollplan.solver.plan``, in a worker thread so the event loop
keeps serving), and applies the plan's actions kind by kind in ``ACTION_ORDER``; actions of one kind run
concurrently and every failure is collected into one ``ActionFailures``, which triggers a re-plan (a
bounded number of times) instead of a crash.

Action semantics here (all engines are ``kv_both``, so roles are routing):
- start_engine: spawn an ``EngineActor`` on the slot's node and start it in the background (it loads the
  newest weights); trajectories placed there wait until it serves.
- wake / sleep: the engine's sleep mode (vLLM sleep where available; on CPU "not routed").
- sync_weights: bring the slot's engine to the newest weights version.
- switch_role: routing only: PREFILL slots serve other slots' prefills, DECODE slots take prefilled KV
  through the connector, MIXED slots do both.
- migrate_kv / migrate_reprefill: abort the trajectory's request on the source; it resumes on the target
  with its context plus the tokens made so far. KV mode first re-stores the context's KV from the source
  through the connector, so the target loads instead of recomputing.
- stop_engine / return_slot: stop the engine; a returned slot is never used again. Every slot with a
  deadline also has a watchdog that empties and returns it by ``deadline - drain_margin`` whatever the
  plans say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollplan.executor.agent import Route, TrajectoryResult, TrajectoryRun, TurnRecord
from rollplan.executor.config import ExecutorConfig
from rollplan.executor.pool import EngineHandle, SlotRuntime
from rollplan.models import (
    ACTION_ORDER,
    Action,
    ActionFailures,
    ActionKind,
    ClusterSnapshot,
    EngineState,
    Phase,
    Plan,
    Role,
    Slot,
    SlotSource,
    SolveStatus,
    Trajectory,
)
from rollplan.policy.dispatch import (
    INFORMED_SOURCES,
    DispatchQueue,
    Headrooms,
    SlotLoad,
    bulk_regime_pays,
    carries_out_move,
    choose_slot,
    critical_set,
    is_bulk_bound,
    pessimistic_parts,
    reference_step,
)
from rollplan.policy.predict import Predictor, Remaining, Totals, group_floors
from rollplan.solver.core.bounds import BOUND_WORK

log = logging.getLogger(__name__)

PlanFn = Callable[..., Plan]


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One applied action: its kind, slot, how long applying it took, and its error if it failed."""

    kind: str
    slot: str
    seconds: float
    ok: bool
    error: str | None = None
    trajectory: str | None = None
    at: float = 0.0


@dataclass(slots=True)
class ControllerStats:
    replans: int = 0
    plan_seconds: list[float] = field(default_factory=list)
    plan_status: Counter = field(default_factory=Counter)
    planner_errors: list[str] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    events: list[tuple[float, str, tuple[str, ...]]] = field(default_factory=list)
    engine_starts: list[float] = field(default_factory=list)
    returns: dict[str, float] = field(default_factory=dict)  # slot -> seconds before (+) / after (-) deadline
    moves_not_carried_out: int = 0  # a plan's migrations its source slot did not force (ExecutorConfig.moves)
    moves_failed: int = 0  # moves off an emptied slot that raised (e.g. the target went away meanwhile)
    moves_late: int = 0  # moves whose trajectory had not left its source within the wait (it still moves later)
    kv_exports_failed: int = 0  # KV a move could not re-store from its source: the target recomputed it

    def actions_by_kind(self) -> dict[str, dict[str, float]]:
        by: dict[str, list[ActionRecord]] = defaultdict(list)
        for a in self.actions:
            by[a.kind].append(a)
        return {
            k: {
                "count": len(v),
                "failed": sum(1 for a in v if not a.ok),
                "mean_seconds": sum(a.seconds for a in v) / len(v),
            }
            for k, v in sorted(by.items())
        }


def default_plan_fn() -> PlanFn | None:
    """``rollplan.solver.plan`` when the planner is installed, else None (the fallback policy runs)."""
    try:
        from rollplan.solver import plan
    except ImportError:
        return None
    return plan


class Controller:
    """See the module docstring. Runs inside the caller's event loop; ``start()`` launches its tasks."""

    def __init__(
        self,
        config: ExecutorConfig,
        *,
        plan_fn: PlanFn | None = None,
        planner_config: Any = None,
        weights_source: Callable[[], tuple[Any, str | None, int]] | None = None,
    ) -> None:
        self.config = config
        self.clock = config.clock
        self.slots: dict[str, SlotRuntime] = {}
        self.runs: dict[str, TrajectoryRun] = {}
        # The decision core's predictor (the simulator's too): history by prompt across batches, Seer-style
        # group update within one, each item's budget as its prior until something finishes.
        self.predictor = Predictor()
        self.batch = -1
        self._first_prediction: dict[str, tuple[float, float]] = {}
        # Group survival (``group_floors``): per group of the batch, what its most advanced unfinished run had
        # done at the latest snapshot; the simulator's policy refreshes its floors at the same points.
        self._floors: dict[str, Totals] = {}
        # Dispatch keys (pessimistic path, informed prediction) per unfinished run, as of the latest snapshot
        # (``refresh_keys``) or, for a run queued since, of its queueing: the simulator's policy keeps the same
        # cache (its ``_cp``), so both adapters order and guard with the same keys.
        self._keys: dict[str, tuple[float, bool, float]] = {}
        self.previous: Plan | None = None
        self.stats = ControllerStats()
        self.autoplan = True
        # elastic-plus runs no planner: the fallback policy (every slot MIXED, least-loaded placement).
        self._plan_fn = None if config.policy == "elastic-plus" else (plan_fn if plan_fn is not None else default_plan_fn())
        # The decision core's dispatch (rollplan.policy.dispatch): new trajectories wait, longest pessimistic
        # path first, until a slot's KV admits them; rollplan's headrooms, or vLLM's default for elastic-plus.
        self.headrooms = Headrooms() if config.policy == "rollplan" else Headrooms(0.0)
        self.waiting: DispatchQueue[str] = DispatchQueue()
        self._admitted: dict[str, asyncio.Event] = {}
        self.admissions: list[tuple[str, str]] = []  # (trajectory, slot), in admission order
        self.kv_capacity: dict[str, int] = {}  # slot -> KV tokens its engine reported
        self._reserved: dict[str, int] = {}  # trajectory -> KV its turn was admitted with
        self._admission_pending = False
        self._bulk_bound = False
        self._planner_config = planner_config
        self._weights_source = weights_source or (lambda: (None, None, 0))
        self._wake = asyncio.Event()
        self._reasons: list[str] = []
        self._route_changed = asyncio.Event()
        self._plan_lock = asyncio.Lock()
        self._gate = asyncio.Event()
        self._gate.set()
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self._weights_version = 0
        self._migrations: dict[str, asyncio.Future] = {}

    # == lifecycle ==========================================================================================
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._planning_loop(), name="rollplan-planning"))

    async def close(self) -> None:
        """Stop planning and every engine this controller started."""
        self._closed = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks.clear()
        for s in self.slots.values():
            if s.watchdog is not None:
                s.watchdog.cancel()
        await asyncio.gather(
            *(s.engine.stop() for s in self.slots.values() if s.engine is not None and s.engine.alive),
            return_exceptions=True,
        )

    # == router (agent loop side) ===========================================================================
    def weights_gate(self) -> asyncio.Event:
        return self._gate

    def _notify_routing(self) -> None:
        ev, self._route_changed = self._route_changed, asyncio.Event()
        ev.set()
        self._schedule_admission()

    def _schedule_admission(self) -> None:
        """Run ``admit_waiting`` once on the loop's next turn, however many trajectories queue or events
        arrive before it: a batch's trajectories all queue first, then go in dispatch order (as the
        simulator dispatches a batch), not in the order their loops happened to start."""
        if self._admission_pending or not len(self.waiting):
            return
        self._admission_pending = True

        def run() -> None:
            self._admission_pending = False
            self.admit_waiting()

        asyncio.get_running_loop().call_soon(run)

    # == dispatch and admission (rollplan.policy.dispatch) ====================================================
    def path(self, run: TrajectoryRun) -> float:
        """``run``'s pessimistic remaining critical path (its dispatch key), at the reference decode step of
        the perf model of the slots' kind, as of the latest snapshot (``refresh_keys``) or its queueing."""
        return self._key(run)[0]

    def _key(self, run: TrajectoryRun) -> tuple[float, bool, float]:
        """(``path``, whether ``run``'s prediction is informed: ``INFORMED_SOURCES``, the decode seconds of
        ``path``: ``pessimistic_parts``), cached in ``_keys``."""
        key = self._keys.get(run.id)
        if key is None:
            rem = self.predict(run)
            dec_s, tool_s = pessimistic_parts(rem.decode.mean, rem.decode.spread, rem.tool.mean, rem.tool.spread,
                                              self._step_s())
            key = self._keys[run.id] = (dec_s + tool_s, rem.source in INFORMED_SOURCES, dec_s)
        return key

    def refresh_keys(self) -> None:
        """Recompute the group floors (``group_floors``) and every unfinished run's dispatch key from the
        predictor now, and re-key the waiting queue. Called when a snapshot is taken (``snapshot``: each plan
        is solved on fresh predictions); between snapshots the keys stay as they were, so an admission does
        not re-predict every trajectory. New keys can change who is admitted (the order, the
        predicted-critical set): admission runs again."""
        self._keys = {}
        self._floors = group_floors((self._group_key(r), float(r.generated), r.tool_seconds, float(r.turn))
                                    for r in self.runs.values() if r.phase is not Phase.DONE)
        for r in self.runs.values():
            if r.phase is not Phase.DONE:
                path = self._key(r)[0]
                if r.id in self.waiting:
                    self.waiting.push(r.id, path)
        self._schedule_admission()

    def _perf_model(self) -> Any:
        """The perf model of the slots' kind: ``ExecutorConfig.perf``, else the planner's (``PlannerConfig.perf``,
        the executor's default provider), or None without either."""
        perf = self.config.perf or getattr(self._planner_config, "perf", None)
        try:
            return perf(self.config.gpu_kind, 1) if perf is not None else None
        except Exception:  # a provider that does not know the kind
            return None

    def _step_s(self) -> float:
        model = self._perf_model()
        try:
            return reference_step(model) if model is not None else 0.02
        except Exception:  # a model that cannot price the step: any positive step keeps the order
            return 0.02

    def _need(self, run: TrajectoryRun) -> int:
        """KV tokens ``run``'s next turn takes: its context and this turn's predicted decode tokens (at most
        the turn's budget)."""
        rem = self.predict(run)
        per_turn = rem.decode.mean / max(rem.turns.mean, 1.0)
        return len(run.context) + len(run.partial) + int(min(run.item.sampling.max_tokens, max(per_turn, 1.0)))

    def slot_loads(self, run: TrajectoryRun, critical: set[str]) -> tuple[list[SlotLoad], SlotLoad | None]:
        """The admission view of every slot that takes new work now (serving, decoding, not about to be returned), and of
        ``run``'s placement if it is one (rollplan: the plan's slot): capacity the engine reported (unknown: no
        limit), KV held by the trajectories admitted there (each at least what its turn was admitted with;
        rollplan counts those in tool calls as held, elastic-plus as vLLM does: evictable), residents, the
        prompt a resident sibling holds, whether a predicted-critical trajectory is there. The simulator's
        policies see the same quantities (``SlotState.kv_free``, ``Simulator.free_for_new``)."""
        evictable = self.config.policy == "elastic-plus"
        held: Counter = Counter()
        count: Counter = Counter()
        # slot -> group -> prompt tokens held there for the group: a prompt's KV is held once per engine while
        # a sample of it resides there (siblings share it by prefix caching; the simulator's ``KvMemory``
        # reserves it once per slot). Evictable (elastic-plus) once every resident sibling is in a tool call.
        groups: dict[str, dict[str, int]] = defaultdict(dict)
        crit_slots: set[str] = set()
        for r in self.runs.values():
            ev = self._admitted.get(r.id)
            if r.phase is Phase.DONE or ev is None or not ev.is_set() or r.placement is None:
                continue
            count[r.placement] += 1
            prompt = len(r.prompt_ids)
            here = groups[r.placement]
            if not (evictable and r.phase is Phase.IN_TOOL):
                held[r.placement] += max(len(r.context) + len(r.partial), self._reserved.get(r.id, 0)) - prompt
                here[r.group] = max(here.get(r.group, 0), prompt)
            else:
                here.setdefault(r.group, 0)
            if r.id in critical:
                crit_slots.add(r.placement)
        for sid, here in groups.items():
            held[sid] += sum(here.values())
        loads: list[SlotLoad] = []
        pref: SlotLoad | None = None
        for s in self.slots.values():
            # A slot whose return is imminent takes no new work (as ``route`` decides; the simulator's slots
            # learn their return at the notice, the executor's lent slots from ``lend(until=...)``).
            if self._decode_slot_ok(s.id) is None or not s.role.decodes:
                continue
            cap = self.kv_capacity.get(s.id, 1 << 40)
            bonus = len(run.prompt_ids) if run.group in groups[s.id] else 0
            load = SlotLoad(s.id, cap, cap - held[s.id], int(0.01 * cap) if s.id in self.kv_capacity else 0,
                            count[s.id], bonus, s.id in crit_slots)
            loads.append(load)
            if s.id == run.placement and self._plan_fn is not None:
                pref = load
        return loads, pref

    def admit_waiting(self) -> list[tuple[str, str]]:
        """Admit waiting trajectories in dispatch order, each on the slot the core's ``choose_slot`` picks,
        until one finds none (the head blocks). Returns the admissions made; each sets the trajectory's
        placement. Called on every change of what could start (a trajectory queued or finished, a plan
        applied, an engine serving)."""
        if not len(self.waiting):
            return []
        live = [r for r in self.runs.values() if r.phase is not Phase.DONE]
        keys = {r.id: self._key(r) for r in live}
        paths = {k: v[0] for k, v in keys.items()}
        informed = {k for k, v in keys.items() if v[1]}
        critical = critical_set(paths, informed=informed) if self.headrooms.default > 0 else set()
        made: list[tuple[str, str]] = []
        for rid in list(self.waiting.order()):
            run = self.runs.get(rid)
            if run is None:
                self.waiting.discard(rid)
                continue
            loads, pref = self.slot_loads(run, critical)
            slot = choose_slot(self._need(run), loads, preferred=pref, critical=rid in critical,
                               bulk_bound=self._bulk_bound, headrooms=self.headrooms, informed=rid in informed)
            if slot is None and loads and all(ld.residents == 0 for ld in loads):
                slot = loads[0].key  # larger than any empty slot: the engine decides (truncates), never a hang
            if slot is None:
                break
            self.waiting.discard(rid)
            self._reserved[rid] = self._need(run)
            run.placement = str(slot)
            made.append((rid, str(slot)))
            self.admissions.append((rid, str(slot)))
            self._admitted[rid].set()
        return made

    def request_replan(self, reason: str) -> None:
        self._reasons.append(reason)
        self._wake.set()

    def _decode_slot_ok(self, slot_id: str | None) -> SlotRuntime | None:
        s = self.slots.get(slot_id) if slot_id is not None else None
        if s is None or not s.serving:
            return None
        if s.return_by is not None and self.clock() >= s.return_by - self.config.drain_margin:
            return None  # about to be returned: its watchdog is emptying it
        return s

    def _prefill_slot(self) -> SlotRuntime | None:
        cands = [s for s in self.slots.values() if s.role is Role.PREFILL and s.serving]
        if not cands:
            return None
        load = Counter(r.request_slot for r in self.runs.values() if r.request_slot)
        return min(cands, key=lambda s: (load[s.id], s.id))

    async def route(self, run: TrajectoryRun) -> Route:
        """Where ``run`` generates next: its placement once that slot serves in a decoding role. A new
        trajectory first waits in the dispatch queue until a slot admits it (``admit_waiting``). Waits (and
        asks for a re-plan) while it has no usable placement."""
        if self.config.admission and run.id not in self._admitted:
            ev = self._admitted[run.id] = asyncio.Event()
            self.waiting.push(run.id, self.path(run))
            self._schedule_admission()
            await ev.wait()
        waited = 0.0
        while True:
            s = self._decode_slot_ok(run.placement)
            if s is not None and (s.role.decodes or s.role is Role.PREFILL):
                pre = self._prefill_slot() if s.role is Role.DECODE else None
                exp = None
                if run.kv_move and run.home not in (None, s.id) and self.config.engine.connector.enabled:
                    src = self.slots.get(run.home)
                    if src is not None and src.engine is not None and src.engine.serving:
                        exp = src
                return Route(
                    slot=s.id,
                    engine=s.engine.actor,  # type: ignore[union-attr]
                    prefill_slot=pre.id if pre else None,
                    prefill_engine=pre.engine.actor if pre and pre.engine else None,
                    export_from=exp.id if exp else None,
                    export_engine=exp.engine.actor if exp and exp.engine else None,
                )
            ev = self._route_changed
            target = self.slots.get(run.placement) if run.placement is not None else None
            if target is None or not target.usable:
                self.request_replan(f"unplaced {run.id}")
            t0 = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout=max(self.config.replan_interval, 0.5))
            waited += time.monotonic() - t0
            if waited > self.config.replan_interval and not (target is not None and target.starting):
                # Placed on a slot that cannot serve and is not about to (sleeping, stopped, role OFF).
                waited = 0.0
                self.request_replan(f"waiting {run.id}")

    def engine_failed(self, slot: str, exc: BaseException, engine: Any = None) -> None:
        """A request to ``slot``'s engine (actor handle ``engine``, when known) found it gone. A failure of
        an engine the slot has since replaced is ignored (the new one is fine)."""
        s = self.slots.get(slot)
        if s is not None and s.engine is not None and engine is not None and s.engine.actor is not engine:
            return
        if s is not None and s.engine is not None and s.engine.alive:
            log.warning("engine on slot %s lost: %s", slot, type(exc).__name__)
            s.engine.kill(exc)  # a dead vLLM core leaves a live actor holding the slot: end it
            self._engine_gone(s)
            self.stats.events.append((self.clock(), "engine-lost", (slot,)))
        self.request_replan(f"engine lost {slot}")

    def _engine_gone(self, s: SlotRuntime) -> None:
        s.role = Role.OFF
        for r in self.runs.values():
            if r.home == s.id:
                r.home = None  # its KV is gone
        self._notify_routing()

    def attempt_started(self, run: TrajectoryRun, slot: str) -> None:
        """The loop is about to generate on ``slot`` (after any KV export): a pending migration is done."""
        fut = self._migrations.pop(run.id, None)
        if fut is not None and not fut.done():
            fut.set_result(slot)

    def kv_export_failed(self, run: TrajectoryRun, slot: str | None, exc: BaseException) -> None:
        """A move's KV export from ``slot`` failed (its engine went away, or the connector refused): the
        target recomputes the context, the same tokens at more cost. Counted and logged, never raised."""
        self.stats.kv_exports_failed += 1
        log.warning("KV export of %s from slot %s failed (%s): recomputed on its target",
                    run.id, slot, type(exc).__name__)

    def turn_finished(self, run: TrajectoryRun, record: TurnRecord) -> None:
        pass

    def trajectory_finished(self, run: TrajectoryRun, result: TrajectoryResult) -> None:
        if result.status != "failed":
            decode = float(result.generated_tokens)
            self.predictor.observe(
                run.group, self._group_key(run),
                Totals(decode=decode, prefill=float(run.observation_tokens), tool=run.tool_seconds,
                       turns=float(len(result.turns))),
            )
            first = self._first_prediction.pop(run.id, None)
            if first is not None:
                self.predictor.spreads.add(first[0], first[1], decode)
        self._keys.pop(run.id, None)
        fut = self._migrations.pop(run.id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
        self._notify_routing()

    # == prediction (rollplan.policy.predict) =================================================================
    def start_batch(self) -> int:
        """A new rollout batch: group statistics restart, the history by prompt carries over; the dispatch
        queue and the admissions restart."""
        self.batch += 1
        self.predictor.start_batch(self.batch)
        self._first_prediction = {}
        self._floors = {}
        self._keys = {}
        self.waiting = DispatchQueue()
        self._admitted = {}
        self._reserved = {}
        return self.batch

    def _group_key(self, run: TrajectoryRun) -> str:
        return f"b{self.batch}:{run.group}"

    def predict(self, run: TrajectoryRun) -> Remaining:
        """``run``'s remaining work (a ``rollplan.policy.predict.Remaining``): the shared predictor, with the
        item's budget as its prior and its cap, and its group's floor as of the latest snapshot (group
        survival). The first prediction of each run is kept for ``SpreadCheck``."""
        item = run.item
        budget = Totals(float(item.max_turns * item.sampling.max_tokens), 0.0, 0.0, float(item.max_turns))
        done = Totals(float(run.generated), float(run.observation_tokens), run.tool_seconds, float(run.turn))
        prior = Predictor.budget_prior(item.max_turns, item.sampling.max_tokens)
        group = self._group_key(run)
        rem = Predictor.capped(self.predictor.remaining(run.group, group, done, floor=self._floors.get(group),
                                                        prior=prior), done, budget)
        if run.id not in self._first_prediction:
            self._first_prediction[run.id] = (float(run.generated) + rem.decode.mean, rem.decode.spread)
        return rem

    # == snapshot ===========================================================================================
    def snapshot(self) -> ClusterSnapshot:
        """The planner's view now: usable slots and every trajectory of the current batch. Refreshes the
        dispatch keys (``refresh_keys``) from the same predictions."""
        self.refresh_keys()
        now = self.clock()
        slots = []
        for s in self.slots.values():
            if not s.usable or (s.return_by is not None and s.return_by < now):
                continue  # gone, or past its return (its watchdog is returning it): not the planner's any more
            state = s.engine_state
            slots.append(
                Slot(
                    id=s.id,
                    gpu=s.gpu,
                    node=s.node,
                    tp=s.tp,
                    source=s.source,
                    return_by=s.return_by,
                    role=s.role if state.value != "none" else Role.OFF,
                    engine=state,
                    weights_version=s.weights_version,
                )
            )
        usable = {s.id for s in slots}
        trajs = []
        for r in self.runs.values():
            home = r.home if r.home in usable else None
            if r.phase is Phase.DONE:
                trajs.append(Trajectory(r.id, r.group, Phase.DONE, len(r.context), slot=home))
                continue
            p = self.predict(r)
            trajs.append(
                Trajectory(
                    id=r.id,
                    group=r.group,
                    phase=r.phase,
                    context_tokens=len(r.context) + len(r.partial),
                    slot=home,
                    remaining_decode_tokens=p.decode,
                    remaining_prefill_tokens=p.prefill,
                    remaining_tool_seconds=p.tool,
                    remaining_turns=p.turns,
                    tool_until=r.tool_until,
                )
            )
        return ClusterSnapshot(
            time=now,
            model=self.config.model_name,
            slots=tuple(slots),
            trajectories=tuple(trajs),
            weights_version=self._weights_version,
        )

    # == planning ===========================================================================================
    async def _planning_loop(self) -> None:
        while not self._closed:
            active = any(r.phase is not Phase.DONE for r in self.runs.values())
            timeout = self.config.replan_interval if active else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            except TimeoutError:
                self._reasons.append("interval")
            self._wake.clear()
            reasons, self._reasons = self._reasons, []
            if not self.autoplan:
                continue
            try:
                await self.replan(", ".join(dict.fromkeys(reasons)) or "event")
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the loop die: log and wait for the next event
                log.exception("re-plan failed")

    async def replan(self, reason: str = "manual") -> Plan:
        """Snapshot -> plan -> apply, under the plan lock; failed actions trigger up to
        ``max_replans_per_event`` re-plans while ``autoplan`` is on."""
        plan = None
        for attempt in range(self.config.max_replans_per_event + 1):
            async with self._plan_lock:
                snap = self.snapshot()
                plan = await self._plan(snap)
                try:
                    await self.apply(plan)
                    return plan
                except ActionFailures as exc:
                    if not self.autoplan:  # planning was turned off meanwhile (roles are set by hand)
                        log.warning("failed actions (%s), no re-plan (autoplan off): %s", reason, exc)
                        return plan
                    log.warning("re-plan %d after failed actions (%s): %s", attempt + 1, reason, exc)
                    reason = "failed actions"
        assert plan is not None
        return plan

    async def _plan(self, snap: ClusterSnapshot) -> Plan:
        t = time.perf_counter()
        plan = None
        if self._plan_fn is not None:
            try:
                plan = await asyncio.to_thread(
                    self._plan_fn, snap, previous=self.previous, config=self._planner_config
                )
            except Exception as exc:
                log.warning("planner failed, using the fallback policy: %s", exc)
                self.stats.planner_errors.append(f"{type(exc).__name__}: {exc}")
        if plan is None:
            plan = fallback_plan(snap, self.slots)
        self.adopt(plan, time.perf_counter() - t)
        return plan

    def adopt(self, plan: Plan, seconds: float = 0.0) -> None:
        """Make ``plan`` (solved in ``seconds``) the current one: counted, the previous plan of the next solve,
        and the regime the admission headrooms follow (``_regime``: ``rollplan.policy.dispatch.bulk_regime_pays``
        of its work bound and decoding slots and the longest pessimistic path). Called by ``_plan`` after
        each solve, before the plan is applied; synchronous (no await), so no admission runs in between."""
        self.stats.replans += 1
        self.stats.plan_seconds.append(seconds)
        if self.headrooms.default > 0:  # the regime the admission headrooms follow (rollplan.policy.dispatch)
            self._bulk_bound = self._regime(plan)
        self.stats.plan_status[plan.status.value] += 1
        self.previous = plan
        if log.isEnabledFor(logging.INFO):
            log.info(
                "plan %s (%s, %.2fs): roles %s, placement %s, actions %s",
                self.stats.replans,
                plan.status.value,
                seconds,
                {k: v.value for k, v in plan.roles.items()},
                dict(Counter(plan.placement.values())),
                [f"{a.kind.value}:{a.slot}" for a in plan.actions],
            )

    def _regime(self, plan: Plan) -> bool:
        """Whether the batch is bound by its bulk (``rollplan.policy.dispatch.bulk_regime_pays``, as the
        simulator's policy decides it): the plan's work bound and decoding slots, the longest pessimistic path
        of the unfinished trajectories, the predicted-critical count. Without a perf model (no step model to
        compare the regimes on) the share rule, ``is_bulk_bound``."""
        work_bound = plan.bounds.get(BOUND_WORK, 0.0)
        keys = {r.id: self._key(r) for r in self.runs.values() if r.phase is not Phase.DONE}
        if not keys:
            return False
        top = max(keys.values(), key=lambda k: k[0])
        model = self._perf_model()
        if model is None:
            return is_bulk_bound(work_bound, top[0])
        critical = critical_set({k: v[0] for k, v in keys.items()}, informed={k for k, v in keys.items() if v[1]})
        serving = sum(1 for r in plan.roles.values() if r.decodes)
        try:
            return bulk_regime_pays(work_bound, top[2], top[0] - top[2], perf=model, slots=serving,
                                    critical=len(critical), headrooms=self.headrooms)
        except Exception:  # a model that cannot price the steps: the share rule
            return is_bulk_bound(work_bound, top[0])

    # == applying ===========================================================================================
    async def apply(self, plan: Plan) -> None:
        """Apply ``plan``: placements of trajectories without KV, then actions kind by kind."""
        for tid, slot in plan.placement.items():
            r = self.runs.get(tid)
            if r is None or r.phase is Phase.DONE:
                continue
            if r.home is None or r.home == slot or r.home not in self.slots or not self.slots[r.home].usable:
                r.placement = slot
        self._notify_routing()
        await self.apply_actions([a for a in plan.actions if self._carries_out(a, plan)])

    async def set_roles(self, roles: Mapping[str, Role]) -> None:
        """Set slot roles outside a plan (``RolloutExecutor.switch_roles``: tests, benchmarks, an operator);
        trajectories placed on a slot that no longer decodes move (KV through the connector) to the least
        loaded decoding slot. Holds the plan lock, as ``replan`` does from snapshot to apply: a plan solved on
        the state before the switch lands before it, never after it (where its placements would put the moved
        trajectories back on the slot they left, and its role switches would undo these). Returns once the
        roles are set and the moves left their source."""
        async with self._plan_lock:
            await self.apply_actions([Action(ActionKind.SWITCH_ROLE, s, role=r) for s, r in roles.items()])
            for sid in roles:
                slot = self.slots[sid]
                if not slot.role.decodes:
                    await self.empty_slot(slot)

    def _carries_out(self, a: Action, plan: Plan) -> bool:
        """Whether ``a`` is carried out: every action but a migration off a slot that neither leaves (a
        deadline, or gone) nor stops decoding under ``plan``, when ``ExecutorConfig.moves`` is "forced"
        (``rollplan.policy.dispatch.carries_out_move``, as the simulator's rollplan policy decides)."""
        if a.kind not in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL) or self.config.moves == "all":
            return True
        src = self.slots.get(a.slot)
        if src is None:
            return True  # the source is gone: its trajectory has to move
        role = plan.roles.get(src.id, src.role)
        keep = carries_out_move(self.config.moves, source_leaving=src.return_by is not None or not src.usable,
                                source_decodes=role.decodes)
        if not keep:
            self.stats.moves_not_carried_out += 1
        return keep

    async def apply_actions(self, actions: Sequence[Action]) -> None:
        """Apply ``actions`` in ``ACTION_ORDER`` (concurrently within a kind). Raises ``ActionFailures``
        listing every failed action after all were tried."""
        by_kind: dict[ActionKind, list[Action]] = defaultdict(list)
        for a in actions:
            by_kind[a.kind].append(a)
        failures: list[tuple[str, BaseException]] = []
        for kind in ACTION_ORDER:
            batch = by_kind.get(kind, [])
            if not batch:
                continue
            results = await asyncio.gather(*(self._timed(a) for a in batch), return_exceptions=True)
            for a, res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    failures.append(
                        (f"{a.kind.value}({a.slot}{'/' + a.trajectory if a.trajectory else ''})", res)
                    )
        self._notify_routing()
        if failures:
            raise ActionFailures(failures)

    async def _timed(self, a: Action) -> None:
        t = time.perf_counter()
        try:
            noop = await self._apply_one(a)
        except BaseException as exc:
            self.stats.actions.append(
                ActionRecord(
                    a.kind.value,
                    a.slot,
                    time.perf_counter() - t,
                    False,
                    f"{type(exc).__name__}: {exc}",
                    a.trajectory,
                    self.clock(),
                )
            )
            raise
        if noop is not True:
            self.stats.actions.append(
                ActionRecord(
                    a.kind.value, a.slot, time.perf_counter() - t, True, None, a.trajectory, self.clock()
                )
            )

    async def _apply_one(self, a: Action) -> bool | None:
        """Apply one action; True when it was a no-op (e.g. starting an engine that is already starting)."""
        s = self.slots.get(a.slot)
        if s is None or not s.usable:
            if a.kind in (ActionKind.STOP_ENGINE, ActionKind.RETURN_SLOT, ActionKind.SLEEP_ENGINE):
                return  # already gone: nothing to release
            if a.kind in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL) and a.trajectory and a.target:
                await self.migrate(a.trajectory, a.target, kv=False)
                return
            raise KeyError(f"slot {a.slot!r} is not available")
        k = a.kind
        if k is ActionKind.START_ENGINE:
            if s.engine is not None and s.engine.alive and s.engine.state.value != "sleeping":
                return True
            self.start_engine(s)
        elif k is ActionKind.WAKE_ENGINE:
            if s.engine is not None and s.engine.state.value == "sleeping":
                await self._wake_engine(s)
        elif k is ActionKind.SLEEP_ENGINE:
            if s.engine is not None and s.engine.serving and not self._has_work(s.id):
                await s.engine.sleep()
                s.role = Role.OFF
        elif k is ActionKind.SYNC_WEIGHTS:
            await self.sync_slot(s)
        elif k is ActionKind.SWITCH_ROLE:
            s.role = a.role or Role.MIXED
            self._notify_routing()
        elif k in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL):
            assert a.trajectory is not None and a.target is not None
            await self.migrate(a.trajectory, a.target, kv=k is ActionKind.MIGRATE_KV)
        elif k is ActionKind.STOP_ENGINE:
            await self.empty_slot(s, deadline=a.deadline if a.deadline is not None else s.return_by)
            await self._release_engine(s)
            s.role = Role.OFF
        elif k is ActionKind.RETURN_SLOT:
            await self.return_slot(s)

    # -- engines -----------------------------------------------------------------------------------------
    def start_engine(self, s: SlotRuntime) -> EngineHandle:
        """Spawn and start an engine on ``s`` in the background (idempotent while one is alive)."""
        if s.engine is not None and s.engine.alive:
            if s.engine.state.value == "sleeping":
                s.engine.task = asyncio.create_task(self._wake_engine(s))
            return s.engine
        handle = EngineHandle.spawn(s.id, s.node, s.resource, self.config.engine)
        s.engine = handle
        handle.task = asyncio.create_task(self._start(s, handle), name=f"start-{s.id}")
        return handle

    async def _start(self, s: SlotRuntime, handle: EngineHandle) -> None:
        weights, path, version = self._weights_source()
        try:
            seconds = await handle.start(weights, path, version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("engine start on %s failed: %s", s.id, exc)
            self.stats.actions.append(
                ActionRecord(
                    "engine_ready",
                    s.id,
                    time.perf_counter() - handle.created,
                    False,
                    str(exc),
                    None,
                    self.clock(),
                )
            )
            if _node_gone(exc):
                # Ray refused the actor because the slot's node no longer exists: the slot is lost (the
                # membership poll would say so too, later; starting again meanwhile fails the same way).
                self.lose_slot(s.id)
            elif s.engine is handle:
                self._engine_gone(s)
            self.request_replan(f"start failed {s.id}")
            return
        self.stats.engine_starts.append(seconds)
        self.stats.actions.append(ActionRecord("engine_ready", s.id, seconds, True, None, None, self.clock()))
        try:
            info = await handle.actor.info.remote()
            if info.get("kv_capacity_tokens"):
                self.kv_capacity[s.id] = int(info["kv_capacity_tokens"])
        except Exception as exc:  # admission then treats the slot as unbounded (the engine still queues)
            log.debug("no KV capacity from %s: %s", s.id, exc)
        if s.role is Role.OFF:
            s.role = Role.MIXED
        if handle.version < self._weights_version:  # an update arrived while it was loading
            await self.sync_slot(s)
        self._notify_routing()

    async def _wake_engine(self, s: SlotRuntime) -> None:
        """Wake ``s``'s sleeping engine and bring it to the newest weights (a parked lent engine slept
        through updates) before the plan routes anything to it (roles switch after wakes and syncs)."""
        assert s.engine is not None
        await s.engine.wake()
        await self.sync_slot(s)

    async def _release_engine(self, s: SlotRuntime) -> None:
        """Free ``s``'s engine: stop it, or with ``config.keep_lent_engines`` put a lent slot's serving
        engine to sleep (parked on the returned slot; the next ``lend`` of the slot takes it back)."""
        e = s.engine
        if e is None or not e.alive:
            return
        if self.config.keep_lent_engines and s.source is SlotSource.LENT_BY_TRAINING and e.ready.is_set():
            if e.serving:
                try:
                    await e.sleep()
                    self.stats.events.append((self.clock(), "parked", (s.id,)))
                except Exception as exc:  # a failed sleep must not keep the slot: stop it instead
                    log.warning("sleep of the engine on lent slot %s failed (%s): stopping it", s.id, exc)
            if e.state.value == "sleeping":
                return
        await e.stop()

    async def sync_slot(self, s: SlotRuntime) -> None:
        """Bring ``s``'s engine to the newest weights (no-op when current or not started)."""
        e = s.engine
        if e is None or not e.alive or e.version >= self._weights_version:
            return
        if not e.ready.is_set():
            return  # still loading: the start task syncs it when ready
        weights, path, version = self._weights_source()
        await e.actor.update_weights.remote(weights, path, version)
        e.version = version

    def _has_work(self, slot: str) -> bool:
        return any(
            r.phase is not Phase.DONE and (r.placement == slot or r.request_slot == slot)
            for r in self.runs.values()
        )

    # -- migration ---------------------------------------------------------------------------------------
    async def migrate(self, traj: str, target: str, *, kv: bool, timeout: float = 10.0) -> None:
        """Move ``traj`` to ``target``: abort its request on the source (it resumes on the target with its
        context plus the tokens so far), carrying KV through the connector when ``kv``. Returns when it
        left the source (its next request was routed to the target, or it finished)."""
        r = self.runs.get(traj)
        if r is None or r.phase is Phase.DONE:
            return
        tgt = self.slots.get(target)
        if tgt is None or not tgt.usable:
            raise KeyError(f"migration target {target!r} is not available")
        source = r.request_slot or r.home
        r.placement = target
        r.kv_move = kv
        if source == target:
            return
        src = self.slots.get(source) if source else None
        if r.request_slot is not None and src is not None and src.engine is not None and src.engine.alive:
            fut: asyncio.Future = asyncio.get_running_loop().create_future()
            self._migrations[traj] = fut
            rid = r.request_id
            self._notify_routing()
            with contextlib.suppress(Exception):
                await src.engine.actor.abort.remote([rid])
            if tgt.serving:  # otherwise it waits for the target's engine: the move itself is done
                try:
                    await asyncio.wait_for(asyncio.shield(fut), timeout=timeout)
                except TimeoutError:
                    self.stats.moves_late += 1
                    log.info("%s had not left slot %s for %s after %.1fs", traj, source, target, timeout)
            return
        # Not generating right now (in a tool call, or waiting): move its KV now if asked, so the source can go.
        if (
            kv
            and src is not None
            and src.engine is not None
            and src.engine.serving
            and self.config.engine.connector.enabled
        ):
            ctx = r.context + r.partial
            try:
                await src.engine.actor.generate.remote(
                    f"{traj}:export:{time.monotonic_ns()}", ctx, {"max_tokens": 1}
                )
            except Exception as exc:
                self.kv_export_failed(r, src.id, exc)
            r.kv_move = False
        r.home = None if r.home == source else r.home
        self._notify_routing()

    async def empty_slot(self, s: SlotRuntime, *, deadline: float | None = None) -> None:
        """Move every trajectory placed or running on ``s`` to other slots (KV when its engine serves).
        With a ``deadline``, waits for the moves at most until shortly before it."""
        movers = [
            r
            for r in self.runs.values()
            if r.phase is not Phase.DONE and s.id in (r.placement, r.request_slot, r.home)
        ]
        if not movers:
            return
        others = [
            o
            for o in self.slots.values()
            if o.id != s.id and o.usable and o.role.decodes and o.return_by is None
        ]
        if not others:
            others = [
                o
                for o in self.slots.values()
                if o.id != s.id and o.usable and o.engine is not None and o.engine.alive
            ]
        if not others:
            log.warning(
                "slot %s must be emptied but no other slot can take its %d trajectories", s.id, len(movers)
            )
            for r in movers:
                if r.placement == s.id:
                    r.placement = None
            return
        load = Counter(r.placement for r in self.runs.values() if r.phase is not Phase.DONE)
        kv = s.engine is not None and s.engine.serving
        wait = 5.0 if deadline is None else max(0.05, min(5.0, (deadline - self.clock()) / 2))
        jobs = []
        for r in movers:
            dest = min(others, key=lambda o: (not o.serving, load[o.id], o.id))
            load[dest.id] += 1
            jobs.append(self.migrate(r.id, dest.id, kv=kv, timeout=wait))
        # One failed move must not stop the others (the slot is being emptied): count and log each.
        for r, res in zip(movers, await asyncio.gather(*jobs, return_exceptions=True), strict=True):
            if isinstance(res, Exception):
                self.stats.moves_failed += 1
                log.warning("moving %s off slot %s failed: %s", r.id, s.id, res)
            elif isinstance(res, BaseException):
                raise res

    # -- slots -------------------------------------------------------------------------------------------
    async def return_slot(self, s: SlotRuntime) -> None:
        """Empty ``s``, stop its engine and mark it returned (never used again)."""
        if s.returned:
            return
        await self.empty_slot(s, deadline=s.return_by)
        await self._release_engine(s)
        s.returned = True
        s.role = Role.OFF
        if s.return_by is not None:
            self.stats.returns[s.id] = s.return_by - self.clock()
        s.returned_event.set()
        if s.watchdog is not None and s.watchdog is not asyncio.current_task():
            s.watchdog.cancel()
        self.stats.events.append((self.clock(), "returned", (s.id,)))
        self._notify_routing()

    def set_deadline(self, s: SlotRuntime, deadline: float) -> None:
        """Give ``s`` a return deadline (the earliest wins) and arm its watchdog."""
        s.return_by = deadline if s.return_by is None else min(s.return_by, deadline)
        if s.watchdog is not None:
            s.watchdog.cancel()
        s.watchdog = asyncio.create_task(self._watchdog(s), name=f"deadline-{s.id}")

    async def _watchdog(self, s: SlotRuntime) -> None:
        assert s.return_by is not None
        delay = s.return_by - self.config.drain_margin - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if s.returned or s.lost:
            return
        log.info("deadline of slot %s: forcing it empty", s.id)
        self.stats.events.append((self.clock(), "forced-return", (s.id,)))
        await self.return_slot(s)
        self.request_replan(f"returned {s.id}")

    def add_slot(self, s: SlotRuntime) -> None:
        self.slots[s.id] = s
        self.stats.events.append((self.clock(), "arrive", (s.id,)))

    def lose_slot(self, slot_id: str) -> None:
        """The slot's node vanished (no notice): its engine and any KV on it are gone."""
        s = self.slots.get(slot_id)
        if s is None or s.lost:
            return
        s.lost = True
        if s.engine is not None:
            s.engine.mark_dead(None)
        self._engine_gone(s)
        for r in self.runs.values():
            if r.placement == slot_id:
                r.placement = None
        if s.watchdog is not None:
            s.watchdog.cancel()
        s.returned_event.set()
        self.stats.events.append((self.clock(), "leave", (slot_id,)))

    # -- weights -----------------------------------------------------------------------------------------
    async def update_weights(self, version: int) -> list[float]:
        """Install ``version`` (from ``weights_source``) on every started engine, in place: new requests
        wait at the gate, engines pause (in-flight requests keep their place), reload, the shared KV store
        is cleared (its KV is from the old weights), prefix caches reset (running requests recompute their
        KV with the new weights), engines resume. Returns each engine's reload seconds."""
        weights, path, _ = self._weights_source()
        self._weights_version = version
        engines = [
            s.engine
            for s in self.slots.values()
            if s.usable and s.engine is not None and s.engine.ready.is_set() and s.engine.alive
        ]
        self._gate.clear()
        try:
            await asyncio.gather(*(e.actor.pause.remote() for e in engines), return_exceptions=True)
            res = await asyncio.gather(
                *(e.actor.reload_weights.remote(weights, path, version) for e in engines),
                return_exceptions=True,
            )
            clear_kv_store(self.config.engine.connector)
            await asyncio.gather(*(e.actor.reset_cache.remote() for e in engines), return_exceptions=True)
            await asyncio.gather(*(e.actor.resume.remote() for e in engines), return_exceptions=True)
        finally:
            self._gate.set()
        out = []
        failures = []
        for e, r in zip(engines, res, strict=True):
            if isinstance(r, BaseException):
                failures.append((f"sync_weights({e.slot})", r))
            else:
                e.version = version
                out.append(float(r))
                self.stats.actions.append(
                    ActionRecord("sync_weights", e.slot, float(r), True, None, None, self.clock())
                )
        if failures:
            self.request_replan("weight sync failed")
            raise ActionFailures(failures)
        return out


def clear_kv_store(connector: Any) -> None:
    """Delete the file connector's stored KV (stale after a weight update)."""
    import shutil
    from pathlib import Path

    if connector.kind != "example":
        return
    root = Path(connector.storage_path)
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _node_gone(exc: BaseException) -> bool:
    """An engine start failed because Ray cannot place its actor: the node it was pinned to is gone."""
    import ray.exceptions

    return isinstance(exc, ray.exceptions.ActorUnschedulableError) or (
        isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, ray.exceptions.ActorUnschedulableError)
    )


def fallback_plan(snap: ClusterSnapshot, slots: dict[str, SlotRuntime] | None = None) -> Plan:
    """The executor's own policy when no planner is available (or it failed): every slot without a
    deadline serves MIXED (engines started / woken / synced as needed); trajectories keep their slot or
    go to the least loaded one that serves now (an engine still starting takes work once it serves, as the
    simulator's elastic-plus does: placing work on it would hold that work for the whole start); slots with a
    deadline are emptied (KV migration) and returned."""
    keep = [s for s in snap.slots if s.return_by is None]
    serving = [s for s in keep if s.engine is EngineState.WARM] or keep
    roles: dict[str, Role] = {}
    actions: list[Action] = []
    for s in snap.slots:
        if s.return_by is None:
            roles[s.id] = Role.MIXED
            if s.engine.value == "none":
                actions.append(Action(ActionKind.START_ENGINE, s.id))
            elif s.engine.value == "sleeping":
                actions.append(Action(ActionKind.WAKE_ENGINE, s.id))
            if s.weights_version < snap.weights_version and s.engine.value != "none":
                actions.append(Action(ActionKind.SYNC_WEIGHTS, s.id))
            if s.role is not Role.MIXED:
                actions.append(Action(ActionKind.SWITCH_ROLE, s.id, role=Role.MIXED))
        else:
            roles[s.id] = Role.OFF
    placement: dict[str, str] = {}
    load: Counter = Counter()
    keep_ids = {s.id for s in keep}
    unfinished = sorted(snap.unfinished, key=lambda t: -t.remaining_decode_tokens.mean)
    for t in unfinished:
        if t.slot in keep_ids:
            placement[t.id] = t.slot  # type: ignore[assignment]
            load[t.slot] += 1
    for t in unfinished:
        if t.id in placement or not serving:
            continue
        dest = min(serving, key=lambda s: (load[s.id], s.id)).id
        placement[t.id] = dest
        load[dest] += 1
        if t.slot is not None and t.slot != dest:
            actions.append(Action(ActionKind.MIGRATE_KV, t.slot, trajectory=t.id, target=dest))
    for s in snap.slots:
        if s.return_by is not None:
            if s.engine.value != "none":
                actions.append(Action(ActionKind.STOP_ENGINE, s.id, deadline=s.return_by))
            actions.append(Action(ActionKind.RETURN_SLOT, s.id, deadline=s.return_by))
    order = {k: i for i, k in enumerate(ACTION_ORDER)}
    actions.sort(key=lambda a: order[a.kind])
    return Plan(
        time=snap.time,
        roles=roles,
        placement=placement,
        actions=tuple(actions),
        makespan=0.0,
        switching_cost=0.0,
        lower_bound=0.0,
        objective=0.0,
        terms=(),
        status=SolveStatus.FALLBACK,
        backend="executor-fallback",
    )
