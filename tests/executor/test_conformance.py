"""Conformance: one recorded sequence of events through the simulator adapter and through the executor's
controller gives the same decisions.

The simulator replays one batch of single-turn trajectories (distinct prompts, each decoding exactly its
budget) on two slots whose KV holds only some of them at a time, under ``elastic-plus`` (the decision core's
longest-predicted-first order and its admission, no planner), and records what it decided (which trajectory
was admitted to which slot, in order) and when trajectories finished. The executor's controller is then given
the same world (the two slots with the simulator's KV capacities, the same history of earlier finished
trajectories, the same batch) and the recorded finishes, and must admit the same trajectories to the same
slots in the same order. Its engines are replaced at the routing boundary by stand-ins (``EngineHandle``s put
in SERVING whose actors are never called): nothing generates; the controller only queues, orders and admits.

The same holds for the rollplan policy's plan-dependent decisions: the simulator runs the rollplan policy
(greedy planner, its solve charged) re-planning every 2 s, and records, besides admissions and finishes, when
each plan was solved (with every unfinished trajectory's decode progress then) and when it took effect. The
controller replays that: at each solve it takes its snapshot (which refreshes its dispatch keys: pessimistic
paths and informed predictions) with the stand-in engines reporting the simulator's progress; at each landing
it adopts and applies the recorded plan (the planner replaced at the planning boundary by the recording). It
must admit the same trajectories to the same slots in the same order: plan placements preferred, the
predicted-critical set, the bulk/critical regime and its headrooms, as the simulator's policy decided them;
and it must find the same regime at every plan. The controller's regime alone: the core's
``bulk_regime_pays`` on its own keys and the plan's work bound and slots (both regimes reached by the work
bound), the share rule without a perf model.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rollplan.executor.agent import RolloutItem, SamplingConfig, TrajectoryResult, TrajectoryRun, TurnRecord
from rollplan.executor.config import EngineConfig, ExecutorConfig
from rollplan.executor.controller import Controller
from rollplan.executor.pool import EngineHandle, SlotRuntime
from rollplan.models.types import Phase, Plan, Role, SolveStatus
from rollplan.policy.predict import Totals
from rollplan.sim.engine import SimConfig, SimTraj
from rollplan.sim.policies import ElasticPlus, RollplanPolicy
from rollplan.sim.replay import BatchSource, Scenario, run_policy

PROMPTS = (5200, 3100, 4400, 2600, 6100, 3900, 2800, 4700, 3300, 5600, 3600, 4100)
DECODES = (900, 1700, 600, 1300, 400, 2000, 1100, 800, 1500, 700, 1900, 1000)


SIBLINGS = 3
"""In the sibling-group runs (``grouped``), trajectory i is a sample of prompt ``p{i // SIBLINGS}``."""


def _group(i: int, grouped: bool = False) -> str:
    return f"p{i // SIBLINGS}" if grouped else f"p{i}"


def _prompt(i: int, grouped: bool = False) -> int:
    """Trajectory i's prompt tokens (a group's samples share their prompt)."""
    return PROMPTS[i - i % SIBLINGS] if grouped else PROMPTS[i]


def _specs(grouped: bool = False) -> tuple[SimTraj, ...]:
    return tuple(SimTraj(f"t{i}", _group(i, grouped), _prompt(i, grouped), (0,), (d,), (0.0,))
                 for i, d in enumerate(DECODES))


class _Recording(ElasticPlus):
    """elastic-plus, recording its admissions (trajectory id, slot id) and the finishes, in order, and the
    simulated time of each finish (finishes at one instant are one event for the dispatcher)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, str]] = []
        self.finish_times: dict[str, float] = {}

    def choose_slot(self, sim, j):
        slot = super().choose_slot(sim, j)
        if slot is not None:
            self.log.append(("admit", sim.trajs[j].spec.id, sim.slots[slot].id))
        return slot

    def on_traj_done(self, sim, j) -> None:
        super().on_traj_done(sim, j)
        self.log.append(("done", sim.trajs[j].spec.id, ""))
        self.finish_times[sim.trajs[j].spec.id] = sim.now


def _simulate() -> tuple[list[tuple[str, str, str]], dict[str, int], dict[str, float]]:
    # mem_util 0.27: about 22k KV tokens a slot, so each holds three or four of the batch at once and admission
    # decides who waits.
    sc = Scenario("conformance", BatchSource(_specs()), dedicated=2, max_batches=1,
                  sim=SimConfig(fold_tool_s=0.0, mem_util=0.27, share_prompt=False))
    pol = _Recording()
    # History: the same prompts finished once before (the batch as written; a fixed source's later batches
    # are varied copies, so the replayed batch is batch 0 and the history is given to the policy directly).
    pol.warm_start([(sp, sp.group) for sp in _specs()])
    run = run_policy(sc, pol)
    assert run.summary["trajectories_completed"] == len(PROMPTS)
    caps = {s.id: s.kv_cap for s in pol.sim.slots}
    return pol.log, caps, pol.finish_times


def _stand_in_slot(slot_id: str) -> SlotRuntime:
    """A slot whose engine is a stand-in at the routing boundary: a handle in SERVING, no actor behind it."""
    s = SlotRuntime(slot_id, slot_id.split("/")[0], "rollplan_slot", "h800", role=Role.MIXED)
    h = EngineHandle(slot_id, actor=None)
    h.life.fire("load")
    h.life.fire("ready")
    h.ready.set()
    s.engine = h
    return s


def _controller(config: ExecutorConfig, caps: dict[str, int], *, plan_fn, grouped: bool = False) -> Controller:
    """A controller over stand-in slots with the simulator's KV capacities, no planning loop, the history the
    simulator's policy was warm-started with (the warm-up batch: the same prompts, ``_specs(grouped)``), and its
    batch started."""
    ctl = Controller(config, plan_fn=plan_fn)
    ctl.autoplan = False
    for sid in caps:
        ctl.add_slot(_stand_in_slot(sid))
        ctl.kv_capacity[sid] = caps[sid]
    for k, sp in enumerate(_specs(grouped)):
        ctl.predictor.observe(sp.group, f"warm:{k}", Totals(float(sp.decode[0]), 0.0, 0.0, 1.0))
    ctl.start_batch()
    return ctl


def _result(run: TrajectoryRun, tokens: int) -> TrajectoryResult:
    rec = TurnRecord(0, len(run.context), (7,) * tokens, None, "length", (run.placement or "",), None, 0, 0,
                     0.0, 0.0, 0.0)
    return TrajectoryResult(run.id, run.group, "max_turns", (*run.prompt_ids, *rec.token_ids), len(run.prompt_ids),
                            (rec,), 0.0, 1.0)


async def _execute(log: list[tuple[str, str, str]], caps: dict[str, int],
                   at: dict[str, float]) -> list[tuple[str, str, str]]:
    ctl = _controller(ExecutorConfig(engine=EngineConfig(model="unused"), policy="elastic-plus",
                                     clock=lambda: 0.0), caps, plan_fn=None)
    runs = []
    for i, (p, d) in enumerate(zip(PROMPTS, DECODES, strict=True)):
        item = RolloutItem(f"t{i}", (1,) * p, group=f"p{i}", max_turns=1, sampling=SamplingConfig(max_tokens=d))
        runs.append(TrajectoryRun(item=item, prompt_ids=[1] * p, context=[1] * p))
    ctl.runs = {r.id: r for r in runs}
    routes = [asyncio.create_task(ctl.route(r)) for r in runs]
    out: list[tuple[str, str, str]] = []

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        while len(out) < len(ctl.admissions) + sum(1 for e in out if e[0] == "done"):
            rid, sid = ctl.admissions[sum(1 for e in out if e[0] == "admit")]
            out.append(("admit", rid, sid))

    await settle()
    done = [tid for kind, tid, _slot in log if kind == "done"]
    for i, tid in enumerate(done):
        run = ctl.runs[tid]
        run.phase = Phase.DONE
        ctl.trajectory_finished(run, _result(run, DECODES[int(tid[1:])]))
        out.append(("done", tid, ""))
        if i + 1 == len(done) or at[done[i + 1]] > at[tid]:  # the last finish of this instant
            await settle()
    await asyncio.gather(*routes)
    return out


def test_simulator_and_executor_admit_the_same_trajectories_to_the_same_slots() -> None:
    log, caps, at = _simulate()
    admits = [e for e in log if e[0] == "admit"]
    assert len(admits) == len(PROMPTS)
    first_wave = [e for e in log[: log.index(next(e for e in log if e[0] == "done"))] if e[0] == "admit"]
    assert 2 <= len(first_wave) < len(PROMPTS)  # not vacuous: some wait for KV to free up
    order = [int(t[1:]) for _k, t, _s in first_wave]
    assert order != sorted(order)  # not vacuous: the order is the core's (longest predicted first), not FIFO
    got = asyncio.run(_execute(log, caps, at))
    assert got == log


@pytest.mark.parametrize("policy", ["rollplan", "elastic-plus"])
def test_executor_admission_respects_the_slots_kv(policy: str) -> None:
    # Without the simulator: six trajectories of 6k tokens on one stand-in slot of 20k: three fit under vLLM's
    # admission (elastic-plus); rollplan keeps its headroom free too, so fewer start; each finish admits more.
    async def go() -> tuple[list[int], int]:
        ctl = Controller(ExecutorConfig(engine=EngineConfig(model="unused"), policy=policy, clock=lambda: 0.0),
                         plan_fn=None)
        ctl.autoplan = False
        ctl.add_slot(_stand_in_slot("a/0"))
        ctl.kv_capacity["a/0"] = 20_000
        ctl.start_batch()
        runs = [TrajectoryRun(item=RolloutItem(f"r{i}", (1,) * 5000, group=f"g{i}", max_turns=1,
                                               sampling=SamplingConfig(max_tokens=1000)),
                              prompt_ids=[1] * 5000, context=[1] * 5000) for i in range(6)]
        ctl.runs = {r.id: r for r in runs}
        tasks = [asyncio.create_task(ctl.route(r)) for r in runs]
        for _ in range(5):
            await asyncio.sleep(0)
        waves = [len(ctl.admissions)]
        while len(ctl.admissions) < 6:
            done = next(r for r in runs if r.phase is not Phase.DONE and r.placement is not None)
            done.phase = Phase.DONE
            ctl.trajectory_finished(done, _result(done, 1000))
            for _ in range(5):
                await asyncio.sleep(0)
            waves.append(len(ctl.admissions))
        await asyncio.gather(*tasks)
        return waves, len({s for _r, s in ctl.admissions})

    waves, slots = asyncio.run(go())
    assert slots == 1 and waves[-1] == 6
    # rollplan: with no history nobody is predicted-critical (rollplan.policy.dispatch.INFORMED_SOURCES), so the
    # default headroom (30% of the slot) holds: two at a time.
    assert waves[0] == (3 if policy == "elastic-plus" else 2)


class _RecordingRollplan(RollplanPolicy):
    """The rollplan policy (greedy planner, its solve charged), recording its admissions, finishes and the
    plans it applied (each at the instant it took effect), in order, with each entry's simulated time."""

    def __init__(self) -> None:
        super().__init__(backend="greedy", time_limit=0.02)
        self.log: list[tuple[str, str, str]] = []
        self.times: list[float] = []
        self.plans: list[Plan] = []
        self.regimes: list[bool] = []  # per applied plan: whether the batch was found bound by its bulk
        self.progress: list[dict[str, float]] = []  # per solve: decode tokens done of each unfinished one

    def decide(self, sim, reason) -> None:
        from rollplan.sim.engine import DONE

        self.progress.append({t.spec.id: sim.progress(t)[0] for t in sim.trajs if t.state != DONE})
        self._note(sim, ("solve", str(len(self.progress) - 1), ""))
        super().decide(sim, reason)

    def _note(self, sim, entry: tuple[str, str, str]) -> None:
        self.log.append(entry)
        self.times.append(sim.now)

    def choose_slot(self, sim, j):
        slot = super().choose_slot(sim, j)
        if slot is not None:
            self._note(sim, ("admit", sim.trajs[j].spec.id, sim.slots[slot].id))
        return slot

    def on_traj_done(self, sim, j) -> None:
        super().on_traj_done(sim, j)
        self._note(sim, ("done", sim.trajs[j].spec.id, ""))

    def _apply(self, sim, plan) -> None:
        if isinstance(plan, Plan):
            self.plans.append(plan)
            self._note(sim, ("plan", str(len(self.plans) - 1), ""))
        super()._apply(sim, plan)
        if isinstance(plan, Plan):
            self.regimes.append(self._bulk_bound)


def _never_solved(*_args, **_kwargs) -> Plan:
    """The controller's planner in the rollplan conformance run: the recorded plans are adopted directly."""
    raise AssertionError("the recorded plans are adopted directly: the planner is never called")


async def _execute_rollplan(pol: _RecordingRollplan, caps: dict[str, int], regimes: list[bool] | None = None, *,
                            grouped: bool = False) -> list[tuple[str, str, str]]:
    # The planner is replaced at the planning boundary by the simulator's recorded plans: at each recorded solve
    # the controller takes its snapshot (which refreshes its dispatch keys), with the stand-in engines reporting
    # the simulator's decode progress; each plan is adopted and applied (``Controller.adopt`` / ``apply``, as
    # ``replan`` does after a solve) where the simulator applied it. Their actions are dropped: the stand-in
    # engines serve MIXED already, and the plans' migrations here are all rebalancing moves (no slot leaves),
    # which neither adapter carries out under the default rule (MOVES "forced"; the recording checks it).
    sim = pol.sim
    ctl = _controller(ExecutorConfig(engine=EngineConfig(model="unused"), policy="rollplan", clock=lambda: 0.0,
                                     gpu_kind="h800", perf=lambda gpu, tp: sim.perf_for(gpu, tp).perf),
                      caps, plan_fn=_never_solved, grouped=grouped)
    runs = []
    for i in range(len(PROMPTS)):
        p = _prompt(i, grouped)
        # A budget the predictions never reach: the simulator's policy knows none (its trajectories stop at their
        # recorded length), so the controller's cap at the budget must not bind either.
        item = RolloutItem(f"t{i}", (1,) * p, group=_group(i, grouped), max_turns=1,
                           sampling=SamplingConfig(max_tokens=8 * max(DECODES)))
        runs.append(TrajectoryRun(item=item, prompt_ids=[1] * p, context=[1] * p))
    ctl.runs = {r.id: r for r in runs}
    out: list[tuple[str, str, str]] = []
    routes: list[asyncio.Task] = []
    seen = 0

    async def settle() -> None:
        nonlocal seen
        for _ in range(5):
            await asyncio.sleep(0)
        for rid, sid in ctl.admissions[seen:]:
            out.append(("admit", rid, sid))
            # The stand-in engine holds the admitted trajectory's KV from now on, as a real one does once it
            # prefilled it (``TrajectoryRun.home``): a plan's placement no longer moves it, only a migration.
            ctl.runs[rid].home = sid
        seen = len(ctl.admissions)

    for kind, tid, _slot in pol.log:
        if kind == "solve":
            for rid, dec in pol.progress[int(tid)].items():
                ctl.runs[rid].generated = dec  # type: ignore[assignment]  # the stand-ins' progress (fluid)
            ctl.snapshot()
            out.append((kind, tid, ""))
        elif kind == "plan":
            plan = dataclasses.replace(pol.plans[int(tid)], actions=())
            ctl.adopt(plan)
            if regimes is not None:
                regimes.append(ctl._bulk_bound)
            await ctl.apply(plan)
            out.append((kind, tid, ""))
        elif kind == "done":
            run = ctl.runs[tid]
            run.phase = Phase.DONE
            ctl.trajectory_finished(run, _result(run, DECODES[int(tid[1:])]))
            out.append((kind, tid, ""))
        else:
            if not routes:  # the batch's trajectories queue once the slots serve (the first admission)
                routes = [asyncio.create_task(ctl.route(r)) for r in runs]
            if len(out) < len(pol.log) and out[-1:] != [("admit", tid, _slot)] and ("admit", tid, _slot) not in out:
                await settle()
    await settle()
    await asyncio.gather(*routes)
    return out


def test_rollplan_plans_steer_the_same_admissions_in_both_adapters() -> None:
    sc = Scenario("conformance-rollplan", BatchSource(_specs()), dedicated=2, max_batches=1, replan_interval_s=2.0,
                  sim=SimConfig(fold_tool_s=0.0, mem_util=0.27, share_prompt=False))
    pol = _RecordingRollplan()
    pol.warm_start([(sp, sp.group) for sp in _specs()])
    run = run_policy(sc, pol)
    assert run.summary["trajectories_completed"] == len(PROMPTS)
    caps = {s.id: s.kv_cap for s in pol.sim.slots}
    admits = {t: s for k, t, s in pol.log if k == "admit"}
    assert len(admits) == len(PROMPTS)
    # Not vacuous: plans were applied mid-batch and placed pending trajectories; some admissions follow them.
    assert len(pol.plans) >= 2
    placed = {t: s for p in pol.plans for t, s in p.placement.items()}
    assert sum(admits[t] == s for t, s in placed.items() if t in admits) >= 2
    assert run.summary["counters"].get("migrations_kv", 0) == 0  # the moves the controller's stand-ins skip
    regimes: list[bool] = []
    got = asyncio.run(_execute_rollplan(pol, caps, regimes))
    assert got == pol.log
    assert regimes == pol.regimes  # the admission regime (rollplan.policy.dispatch.bulk_regime_pays) at each plan


def test_sibling_groups_get_the_same_admissions_in_both_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sibling groups (``SIBLINGS`` samples of a prompt, which they share: prefix caching in the engines, one
    reservation per slot in the simulator) whose lengths differ; the history holds each prompt's mean. The
    longer siblings run past it, so at each solve a group's most advanced unfinished sample is its floor
    (``rollplan.policy.predict.group_floors``: group survival), which raises its pending siblings' dispatch
    keys, also after a sibling finished. Both adapters must admit the same trajectories to the same slots, each
    counting a group's prompt once per slot; without the controller's floors they do not (checked: the replay
    diverges)."""
    sc = Scenario("conformance-groups", BatchSource(_specs(grouped=True)), dedicated=2, max_batches=1,
                  replan_interval_s=2.0, sim=SimConfig(fold_tool_s=0.0, mem_util=0.27, share_prompt=True))
    pol = _RecordingRollplan()
    pol.warm_start([(sp, sp.group) for sp in _specs(grouped=True)])
    run = run_policy(sc, pol)
    assert run.summary["trajectories_completed"] == len(PROMPTS)
    caps = {s.id: s.kv_cap for s in pol.sim.slots}
    admits = [e for e in pol.log if e[0] == "admit"]
    # Not vacuous: siblings shared a slot (their prompt held once there).
    assert any(sum(1 for _k, t, s in admits if s == slot and int(t[1:]) // SIBLINGS == g) >= 2
               for slot in caps for g in range(len(PROMPTS) // SIBLINGS))
    assert asyncio.run(_execute_rollplan(pol, caps, grouped=True)) == pol.log
    import rollplan.executor.controller as controller

    monkeypatch.setattr(controller, "group_floors", lambda _progress: {})
    assert asyncio.run(_execute_rollplan(pol, caps, grouped=True)) != pol.log


def test_the_controllers_regime_is_the_cores() -> None:
    # The executor decides the regime as the simulator's policy does (bulk_regime_pays on the plan's work bound
    # and decoding slots, the longest pessimistic path, the predicted-critical count); both regimes are reached
    # by moving the plan's work bound alone; without a perf model the share rule (is_bulk_bound) decides.
    from rollplan.models.perf import perf_model
    from rollplan.policy.dispatch import bulk_regime_pays, critical_set, is_bulk_bound
    from rollplan.solver.core.bounds import BOUND_WORK

    perf = perf_model("h800", "qwen3-8b", calibrated=True)
    caps = {"s0": 200_000, "s1": 200_000}
    for provider in (lambda gpu, tp: perf, None):
        ctl = _controller(ExecutorConfig(engine=EngineConfig(model="unused"), policy="rollplan", clock=lambda: 0.0,
                                         gpu_kind="h800", perf=provider), caps, plan_fn=_never_solved)
        for i, p in enumerate(PROMPTS):
            item = RolloutItem(f"t{i}", (1,) * p, group=f"p{i}", max_turns=1, sampling=SamplingConfig(max_tokens=4096))
            run = TrajectoryRun(item=item, prompt_ids=[1] * p, context=[1] * p)
            ctl.runs[run.id] = run
        keys = {r.id: ctl._key(r) for r in ctl.runs.values()}
        top = max(keys.values(), key=lambda k: k[0])
        crit = critical_set({k: v[0] for k, v in keys.items()}, informed={k for k, v in keys.items() if v[1]})
        seen = set()
        for work in (0.0, 0.5 * top[0], top[0], 3.0 * top[0], 30.0 * top[0]):
            plan = Plan(time=0.0, roles={"s0": Role.MIXED, "s1": Role.MIXED}, placement={}, actions=(),
                        makespan=work, switching_cost=0.0, lower_bound=0.0, objective=0.0, terms=(),
                        status=SolveStatus.FEASIBLE, backend="recorded", bounds={BOUND_WORK: work})
            ctl.adopt(plan)
            model = ctl._perf_model()
            assert (model is perf) == (provider is not None)
            want = (bulk_regime_pays(work, top[2], top[0] - top[2], perf=model, slots=2, critical=len(crit),
                                     headrooms=ctl.headrooms) if model is not None else is_bulk_bound(work, top[0]))
            assert ctl._bulk_bound == want
            seen.add(want)
        assert seen == {True, False}


@pytest.mark.parametrize("moves", ["all", "forced"])
def test_the_controller_carries_out_the_moves_the_core_rule_keeps(moves: str) -> None:
    # ExecutorConfig.moves: the controller applies a plan's migrations as the core's carries_out_move decides,
    # the simulator's rollplan policy's rule: under "forced" a move between two slots that keep decoding is
    # dropped (and counted); moves off a slot with a deadline, off one the plan turns OFF, and every other
    # action are kept; under "all" everything is.
    from rollplan.models.types import Action, ActionKind
    from rollplan.policy.dispatch import carries_out_move

    caps = {"s0": 200_000, "s1": 200_000, "s2": 200_000, "s3": 200_000}
    ctl = _controller(ExecutorConfig(engine=EngineConfig(model="unused"), policy="rollplan", clock=lambda: 0.0,
                                     moves=moves), caps, plan_fn=_never_solved)
    ctl.slots["s1"].return_by = 30.0  # a preemption notice: s1 is leaving
    roles = {"s0": Role.MIXED, "s1": Role.MIXED, "s2": Role.OFF, "s3": Role.DECODE}
    actions = (
        Action(ActionKind.MIGRATE_KV, "s0", trajectory="t0", target="s3"),  # rebalancing: s0 keeps decoding
        Action(ActionKind.MIGRATE_REPREFILL, "s3", trajectory="t1", target="s0"),  # rebalancing too
        Action(ActionKind.MIGRATE_KV, "s1", trajectory="t2", target="s0"),  # off a leaving slot
        Action(ActionKind.MIGRATE_KV, "s2", trajectory="t3", target="s0"),  # off a slot the plan turns OFF
        Action(ActionKind.SWITCH_ROLE, "s2", role=Role.OFF),
    )
    plan = Plan(time=0.0, roles=roles, placement={}, actions=actions, makespan=1.0, switching_cost=0.0,
                lower_bound=0.0, objective=0.0, terms=(), status=SolveStatus.FEASIBLE, backend="recorded")
    kept = [a.trajectory or a.kind.value for a in actions if ctl._carries_out(a, plan)]
    want = [a.trajectory or a.kind.value for a in actions
            if a.kind not in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL)
            or carries_out_move(moves, source_leaving=a.slot == "s1", source_decodes=roles[a.slot].decodes)]
    assert kept == want
    assert kept == (["t0", "t1", "t2", "t3", "switch_role"] if moves == "all" else ["t2", "t3", "switch_role"])
    assert ctl.stats.moves_not_carried_out == (0 if moves == "all" else 2)
