"""The executor against real vLLM CPU engines on a real multi-node Ray cluster (loopback).

One module-scoped cluster and executor are shared by the tests, which run in file order and build on
each other's state, to keep engine starts (the dominant cost here: two full vLLM imports each) to four.
Nodes: head, ``a`` and ``b`` (one slot each) and ``lend`` (a training node whose slot is lent at the
start, so its engine is one of the first three); ``e`` (one slot) joins mid-run. Every comparison is
against a single-engine greedy reference (vLLM in-process, no Ray).

The planner gets a measured-style perf model in which decode steps grow with the batch (engines sharing
two cores are batch-bound), so it spreads work over the warm engines; a cold start costs 35 s, as
measured here, except where a test says otherwise.

Order: 3 engines vs reference -> an env that raises -> P/D role switch with KV through the connector ->
weight update mid-run (later tests compare with the new weights' reference) -> node b removed
mid-rollout -> node e added (no engine while a start does not pay; one once it does) -> reclaim of the
lent slot -> preemption notice on a -> the last engine's vLLM core killed (a fresh engine takes over).
Stops every process it started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from executor_helpers import ReferenceEngine, env_factory, make_batch

from rollplan.executor.agent import TrajectoryResult
from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
from rollplan.executor.perf import measured_provider
from rollplan.models import ExecutorError

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"
BATCH_BOUND = measured_provider("tiny", decode_c=5e-3)
CHEAP_START = measured_provider("tiny", decode_c=5e-3, engine_start=0.5)


class Harness:
    """The shared cluster, executor and event loop (tests call ``run(coro)``)."""

    def __init__(self, model: Path, kv_dir: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.loop = asyncio.new_event_loop()
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
        self.nodes = {name: self.cluster.add_node(num_cpus=0, resources={SLOT: 1}) for name in ("a", "b")}
        self.nodes["lend"] = self.cluster.add_node(num_cpus=0, resources={LEND: 1})
        ray.init(address=self.cluster.address, log_to_driver=False)
        from rollplan.executor.executor import RolloutExecutor

        engine = EngineConfig(
            model=str(model), connector=KVConnectorConfig(kind="example", storage_path=str(kv_dir))
        )
        self.config = ExecutorConfig(
            engine=engine,
            slot_resource=SLOT,
            lend_resource=LEND,
            replan_interval=2.0,
            perf=BATCH_BOUND,
            planner_time_limit=0.5,
        )
        self.executor = RolloutExecutor(self.config)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 300.0) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def slot_of(self, name: str) -> str:
        return self.executor.slots_on_node(self.nodes[name].node_id)[0]

    def close(self) -> None:
        import ray

        try:
            self.run(self.executor.shutdown(), timeout=120)
        finally:
            self.loop.close()
            ray.shutdown()
            self.cluster.shutdown()


@pytest.fixture(scope="module")
def h(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    t0 = time.monotonic()
    harness = Harness(tiny_model, tmp_path_factory.mktemp("kv"))
    t1 = time.monotonic()
    try:
        ex = harness.executor
        harness.run(ex.start())
        # Training lends its slot for the whole module; engines start on it and on a and b. Planning is
        # held meanwhile: with no work yet, the planner would (rightly) hand an idle lent slot back.
        ex.ctl.autoplan = False
        lent = ex.lendable_slots()[0]
        harness.run(ex.lend([lent], until=ex.now() + 3600))
        starts = harness.run(ex.warm_up([harness.slot_of("a"), harness.slot_of("b"), lent]), timeout=900)
        ex.ctl.autoplan = True
        print(
            f"\n[executor tests] cluster {t1 - t0:.1f}s, engines {time.monotonic() - t1:.1f}s {starts}",
            flush=True,
        )
        yield harness
    finally:
        harness.close()


BATCH = make_batch(32, max_tokens=16)


@pytest.fixture(scope="module")
def reference(reference_engine: ReferenceEngine) -> dict[str, tuple[int, ...]]:
    return reference_engine.rollout(BATCH)


def assert_matches(results: list[TrajectoryResult], reference: dict[str, tuple[int, ...]]) -> None:
    bad = [r.id for r in results if r.token_ids != reference[r.id]]
    assert not bad, f"{len(bad)} trajectories differ from the single-engine reference, e.g. {bad[:3]}"


def test_rollout_across_three_engines_matches_reference(h: Harness, reference) -> None:
    results = h.run(h.executor.rollout(BATCH, env_factory))
    assert len(results) == 32 and all(r.status == "done" for r in results), [
        r.error for r in results if r.error
    ]
    assert all(len(r.turns) >= 2 for r in results)
    used = {e for r in results for e in r.engines}
    assert len(used) == 3, used
    assert_matches(results, reference)


@pytest.fixture(scope="module")
def reference_v1(reference_engine_v1: ReferenceEngine) -> dict[str, tuple[int, ...]]:
    return reference_engine_v1.rollout(BATCH)


async def until(cond, timeout: float = 60.0, step: float = 0.02, *, soft: bool = False) -> bool:
    """Wait for ``cond()``; on timeout raise (or return False when ``soft``)."""
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > timeout:
            if soft:
                return False
            raise TimeoutError("condition not reached")
        await asyncio.sleep(step)
    return True


def current_runs(h: Harness) -> frozenset[int]:
    """The run objects the controller holds now (``id``s). Call it just before starting a rollout and pass it
    to ``turns_done`` / ``own_runs``: an earlier rollout of the same batch (the same ids) leaves its finished
    runs in ``ctl.runs`` until the new rollout registers its own, all at once (``Executor.rollout`` builds
    them while the old ones are still held, so no id is reused)."""
    return frozenset(id(r) for r in h.executor.ctl.runs.values())


def own_runs(h: Harness, stale: frozenset[int]) -> bool:
    """The rollout started after ``current_runs`` returned ``stale`` has registered its runs."""
    runs = h.executor.ctl.runs
    return bool(runs) and not any(id(r) in stale for r in runs.values())


def turns_done(h: Harness, batch: list | None = None, *, stale: frozenset[int] = frozenset()) -> int:
    """Turns finished so far by the current rollout of ``batch`` (0 until that rollout registered; ``stale``:
    ``current_runs`` before it started, whose runs do not count)."""
    runs = h.executor.ctl.runs
    ids = {it.id for it in (batch if batch is not None else BATCH)}
    if set(runs) != ids or (stale and not own_runs(h, stale)):
        return 0
    return sum(len(r.turns) for r in runs.values())


def test_streaming_generate_equals_final_and_abort_keeps_partial_tokens(h: Harness) -> None:
    eng = next(s.engine for s in h.executor.ctl.slots.values() if s.serving)
    prompt = list(range(40, 100))

    async def go() -> tuple[list[int], list[int], dict, dict]:
        final = await eng.actor.generate.remote("stream-ref", prompt, {"max_tokens": 24, "ignore_eos": True})
        streamed: list[int] = []
        gen = eng.actor.generate_stream.options(num_returns="streaming").remote(
            "stream-1", prompt, {"max_tokens": 24, "ignore_eos": True}
        )
        last: dict = {}
        async for ref in gen:
            last = await ref
            streamed.extend(last["token_ids"])
        long = asyncio.ensure_future(
            eng.actor.generate.remote("stream-abort", prompt, {"max_tokens": 440, "ignore_eos": True})
        )
        # 2.5 ms per token on an idle machine, ~7 ms at load 2-3: inside the 440 either way (1 s was not).
        await asyncio.sleep(0.3)
        await eng.actor.abort.remote(["stream-abort"])
        return final["token_ids"], streamed, last, await long

    final, streamed, last, aborted = h.run(go())
    assert streamed == final and last["finish_reason"] == "length"
    assert aborted["finish_reason"] == "abort" and 0 < len(aborted["token_ids"]) < 440


def test_env_that_raises_fails_only_its_trajectory(h: Harness) -> None:
    batch = make_batch(8, max_tokens=8, prefix="x")
    batch[3] = replace(batch[3], data={**batch[3].data, "raise_at": 1})
    results = h.run(h.executor.rollout(batch, env_factory))
    failed = [r for r in results if r.status == "failed"]
    assert [r.id for r in failed] == [batch[3].id]
    assert "tool crashed on turn 1" in (failed[0].error or "")
    assert len(failed[0].turns) == 1
    assert all(r.status == "done" for r in results if r.id != batch[3].id)


def connector_turns(turns_by_run: Iterable[Sequence[Any]], prefill: str, decode: set[str], block: int) -> list[Any]:
    """Turns prefilled on the PREFILL slot ``prefill`` and decoded on a DECODE slot that never held that
    trajectory's context before: their cached tokens can only have come through the KV connector (which
    moves whole KV blocks of the prompt minus its last token, so the context is at least a block and two)."""
    out = []
    for turns in turns_by_run:
        seen: set[str] = set()
        for t in turns:
            d = t.engines[-1] if t.engines else None
            first_on_d = d in decode and d not in seen and d not in t.engines[:-1]
            if t.prefill_slot == prefill and first_on_d and t.context_tokens >= block + 2:
                out.append(t)
            seen.update(t.engines)
    return out


def test_pd_role_switch_moves_kv_through_connector(h: Harness, reference) -> None:
    ex, ctl = h.executor, h.executor.ctl
    switched: dict[str, Any] = {}
    block = h.config.engine.block_size or 128

    async def scenario() -> list[TrajectoryResult]:
        # An earlier test's rollout of the same batch leaves its finished runs (the same ids) until this
        # rollout registers its own: count this rollout's turns only (session 32's CI flake switched the
        # roles at once, on the old runs' placements, before anything of this rollout was placed).
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(BATCH, env_factory))
        await until(lambda: turns_done(h, stale=stale) >= 12)
        # The test sets roles by hand; the planner would undo them. A plan already being solved lands before
        # the switch (switch_roles waits for it): one landing after it put the moved trajectories back on the
        # PREFILL slot, which then decoded them itself, so no turn crossed the connector (the flake of
        # session 25; test_executor_units.py::test_manual_role_switch_is_not_undone_by_a_plan_solved_before_it).
        ctl.autoplan = False
        # PREFILL: the slot holding the most trajectories with a turn still to start after the current one.
        # Only a trajectory moved off it and starting a turn on its new slot crosses the connector; a slot whose
        # trajectories are all on their last turn gives none.
        load = {s: 0 for s in ex.slot_ids()}
        for r in ctl.runs.values():
            if r.placement in load and r.item.data["turns"] - r.turn >= 2:
                load[r.placement] += 1
        busiest = max(load, key=lambda s: (load[s], s))
        assert load[busiest] > 0, load
        # DECODE: every other slot that can take moved work (``empty_slot`` moves a slot's trajectories to the
        # least loaded decoding slot without a return deadline, so the lent slot is never a destination, and
        # a MIXED slot left among the destinations could take them all: nothing would cross the connector).
        decode = sorted(s for s in load if s != busiest and ctl.slots[s].return_by is None)
        switched.update(prefill=busiest, decode=decode, at=time.time())
        await ex.switch_roles({busiest: "prefill", **dict.fromkeys(decode, "decode")})
        # Until a moved trajectory started a turn on its DECODE slot (or the batch is far along).
        await until(lambda: bool(connector_turns((r.turns for r in ctl.runs.values()), busiest, set(decode), block))
                    or turns_done(h, stale=stale) >= 70 or task.done(), timeout=120)
        await ex.switch_roles(dict.fromkeys([busiest, *decode], "mixed"))
        return await task

    try:
        results = h.run(scenario())
    finally:
        ctl.autoplan = True
    assert_matches(results, reference)
    via_connector = connector_turns((r.turns for r in results), switched["prefill"], set(switched["decode"]), block)
    assert via_connector, "no trajectory moved to the decode slot"
    assert all(t.num_cached_tokens > 0 for t in via_connector), [t.num_cached_tokens for t in via_connector]


def test_update_weights_mid_run(
    h: Harness, tiny_model_v1: Path, reference_engine_v1: ReferenceEngine
) -> None:
    from safetensors.torch import load_file

    ex = h.executor
    state = load_file(str(tiny_model_v1 / "model.safetensors"))
    batch = make_batch(16, max_tokens=16, prefix="w")
    marks: dict[str, float] = {}

    async def scenario() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(batch, env_factory))
        await until(lambda: turns_done(h, batch, stale=stale) >= 8)
        seconds = await ex.update_weights(state, version=1)
        marks["done"] = ex.now()
        marks["sync"] = max(seconds)
        return await task

    results = h.run(scenario())
    assert all(r.status == "done" for r in results)
    later = [(r, t) for r in results for t in r.turns if t.started > marks["done"]]
    assert later, "no turn started after the update"
    assert all(t.weights_version == 1 for _, t in later)
    expected = reference_engine_v1.generate(
        [r.token_ids[: t.context_tokens] for r, t in later], max_tokens=16
    )
    got = [list(t.token_ids) for _, t in later]
    assert got == expected
    assert all(s.engine.version == 1 for s in ex.ctl.slots.values() if s.serving)


def test_node_removed_mid_rollout(h: Harness, reference_v1) -> None:
    victim = h.slot_of("b")
    ctl = h.executor.ctl

    async def scenario() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(h.executor.rollout(BATCH, env_factory))
        # Remove the node once it is busy: some of its trajectories are mid-turn.
        await until(
            lambda: turns_done(h, stale=stale) >= 4 and any(r.request_slot == victim for r in ctl.runs.values()),
            30,
            soft=True,
        )
        await asyncio.to_thread(h.cluster.remove_node, h.nodes.pop("b"))
        # Let the membership poll see the node gone while there is still work (a re-plan with no work
        # would hand the idle lent slot back to training, which the later tests still use).
        await until(lambda: ctl.slots[victim].lost, timeout=30)
        return await task

    results = h.run(scenario())
    assert all(r.finished_count == 1 for r in ctl.runs.values())
    assert len({r.id for r in results}) == 32 and all(r.status == "done" for r in results)
    assert_matches(results, reference_v1)
    assert ctl.slots[victim].lost


def test_added_node_gets_an_engine_only_when_it_pays(h: Harness, reference_v1) -> None:
    ex, ctl = h.executor, h.executor.ctl

    async def with_new_node() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(BATCH, env_factory))
        await until(lambda: turns_done(h, stale=stale) >= 4)
        # add_node registers signal handlers: main thread only (it blocks the loop for a moment).
        h.nodes["e"] = h.cluster.add_node(num_cpus=0, resources={SLOT: 1})
        await until(lambda: any(s.node == h.nodes["e"].node_id for s in ctl.slots.values()), timeout=30)
        return await task

    replans = ctl.stats.replans
    results = h.run(with_new_node())
    assert_matches(results, reference_v1)
    new = h.slot_of("e")
    assert ctl.stats.replans > replans
    # Measured costs: a cold start (tens of seconds here) does not pay for a rollout of a few seconds.
    assert ctl.slots[new].engine is None
    assert not any(a.kind == "start_engine" and a.slot == new for a in ctl.stats.actions)

    # Cheap starts (the planner's belief): now the new node pays for an engine. Its trajectories wait
    # for the real start, or move elsewhere at a later re-plan.
    measured = ctl._planner_config
    ctl._planner_config = replace(measured, perf=CHEAP_START)
    try:
        results = h.run(ex.rollout(BATCH, env_factory), timeout=600)
    finally:
        ctl._planner_config = measured
    assert_matches(results, reference_v1)
    assert any(a.kind == "start_engine" and a.slot == new for a in ctl.stats.actions)

    # The next test reclaims the lent slot. The planner hands an idle lent slot back (e.g. in a rollout's
    # tail): if it did, lend it again and start its engine (planning held) while e finishes starting.
    lent = ex.lendable_slots()[0]
    ctl.autoplan = False
    try:

        async def engines_ready() -> None:
            waits = [ctl.slots[new].engine.ready.wait()]
            if lent not in ctl.slots or not ctl.slots[lent].serving:
                await ex.lend([lent], until=ex.now() + 3600)
                waits.append(ex.warm_up([lent]))
            await asyncio.gather(*waits)

        h.run(engines_ready(), timeout=600)
    finally:
        ctl.autoplan = True
    assert ctl.slots[new].serving and ctl.slots[lent].serving


def test_reclaim_returns_lent_slot_by_deadline(h: Harness, reference_v1) -> None:
    ex, ctl = h.executor, h.executor.ctl
    lent = ex.lendable_slots()[0]
    if not ctl.slots[lent].serving:
        # Handed back since the previous test (an idle lent slot goes back): lend it again with an engine
        # started before the rollout, planning held meanwhile, as at the module start.
        ctl.autoplan = False
        try:
            h.run(ex.lend([lent], until=ex.now() + 3600))
            h.run(ex.warm_up([lent]), timeout=600)
        finally:
            ctl.autoplan = True
    assert ctl.slots[lent].serving
    marks: dict[str, Any] = {}

    async def scenario() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(BATCH, env_factory))
        await until(
            lambda: turns_done(h, stale=stale) > 0 and any(r.request_slot == lent for r in ctl.runs.values()), timeout=60
        )
        marks["on_lent"] = {r.id for r in ctl.runs.values() if lent in (r.placement, r.request_slot)}
        marks["deadline"] = ex.now() + 3.0
        marks["early"] = await ex.reclaim([lent], deadline=marks["deadline"])
        marks["returned"] = ex.now()
        return await task

    results = h.run(scenario())
    assert marks["returned"] <= marks["deadline"]
    assert marks["early"][lent] >= 0
    assert ctl.slots[lent].returned and not ctl.slots[lent].engine.alive
    assert all(r.status == "done" for r in results)
    assert_matches(results, reference_v1)
    by_id = {r.id: r for r in results}
    moved = [by_id[i] for i in marks["on_lent"] if by_id[i].turns[-1].started > marks["returned"]]
    assert all(lent not in t.engines for r in moved for t in r.turns if t.started > marks["returned"])


def test_preemption_notice_drains_before_deadline(h: Harness, reference_v1) -> None:
    ex, ctl = h.executor, h.executor.ctl
    victim = h.slot_of("a")
    marks: dict[str, float] = {}

    async def scenario() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(BATCH, env_factory))
        await until(lambda: turns_done(h, stale=stale) > 0 and any(r.request_slot == victim for r in ctl.runs.values()))
        marks["deadline"] = ex.now() + 4.0
        await ex.notify_preemption([h.nodes["a"].node_id], deadline=marks["deadline"])
        await ctl.slots[victim].returned_event.wait()
        marks["returned"] = ex.now()
        return await task

    results = h.run(scenario())
    assert marks["returned"] <= marks["deadline"]
    assert ctl.slots[victim].returned and not (ctl.slots[victim].engine and ctl.slots[victim].engine.alive)
    assert all(r.status == "done" for r in results)
    assert_matches(results, reference_v1)
    # The node can now go away without losing anything.
    h.cluster.remove_node(h.nodes.pop("a"))


def test_dead_engine_core_is_replaced(h: Harness, reference_v1) -> None:
    """vLLM's core dies under a live actor (a crash, an out-of-memory kill): the executor treats the
    engine as lost, ends its actor, and the batch finishes on a fresh engine with the same tokens."""
    import psutil

    ex, ctl = h.executor, h.executor.ctl

    def core_of(pid: int) -> list[psutil.Process]:
        """vLLM's engine core under an engine actor: a spawned child that titles itself ``VLLM::EngineCore``
        (setproctitle) once it runs; before that, or where the title cannot be set, it is still the
        multiprocessing spawn child (the resource tracker, the actor's other child, is neither)."""
        found = []
        for c in psutil.Process(pid).children(recursive=True):
            try:
                name, cmd = c.name(), " ".join(c.cmdline())
            except psutil.Error:
                continue
            if "EngineCore" in name or "EngineCore" in cmd or "spawn_main" in cmd:
                found.append(c)
        return found

    # An engine that serves, with its core up. The previous tests leave e's engine serving, but a re-plan
    # may have stopped it or a replacement may still be starting (on a loaded 2-core machine a start has
    # taken over 2 minutes): wait for the one that is starting, or start one, with planning held (as at
    # the module start), rather than poll for a core that may never come.
    ctl.autoplan = False
    try:
        # vLLM gives up on a core that is not ready in VLLM_ENGINE_READY_TIMEOUT_S (600 s): a failed start
        # ends its engine, so start another until one serves.
        deadline = time.monotonic() + 1200.0
        while not any(s.usable and s.serving for s in ctl.slots.values()):
            usable = [s for s in ctl.slots.values() if s.usable]
            left = deadline - time.monotonic()
            assert usable, f"no usable slot left: {sorted(ctl.slots)}"
            if left <= 0:
                states = {s.id: (s.engine.state.value, s.engine.alive) for s in usable if s.engine is not None}
                pytest.fail(f"no engine served within 1200 s; engines (state, alive): {states}; "
                            f"actions: {ctl.stats.actions[-6:]}")
            starting = [s.engine for s in usable if s.engine is not None and s.engine.alive and not s.engine.ready.is_set()]
            try:
                if starting:
                    h.run(starting[0].ready.wait(), timeout=left)
                else:
                    h.run(ex.warm_up([usable[0].id], timeout=left), timeout=left + 5.0)
            except (TimeoutError, ExecutorError):
                time.sleep(1.0)  # the deadline check above reports it
        pid, slot = 0, ""
        pids: dict[str, int] = {}
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            live = [s for s in ctl.slots.values() if s.serving and s.engine is not None]
            pids = {s.id: h.run(s.engine.actor.info.remote())["pid"] for s in live if s.engine is not None}
            ready = [sid for sid, p in pids.items() if core_of(p)]
            if ready:
                slot, pid = ready[0], pids[ready[0]]
                break
            time.sleep(0.5)
    finally:
        ctl.autoplan = True
    seen = {
        sid: [(c.name(), " ".join(c.cmdline())[:80]) for c in psutil.Process(p).children(recursive=True)]
        for sid, p in pids.items()
    }
    assert slot, f"no serving engine with a vLLM core process; serving engines' child processes: {seen}"
    old = ctl.slots[slot].engine
    assert old is not None
    killed: list[int] = []

    async def scenario() -> list[TrajectoryResult]:
        stale = current_runs(h)
        task = asyncio.create_task(ex.rollout(BATCH, env_factory))
        await until(lambda: turns_done(h, stale=stale) >= 4)
        for child in core_of(pid):
            child.kill()
            killed.append(child.pid)
        return await task

    results = h.run(scenario(), timeout=600)
    assert killed, "found no EngineCore process under the engine actor"
    assert all(r.status == "done" for r in results), [r.error for r in results if r.error][:3]
    assert_matches(results, reference_v1)
    assert not old.alive and old is not ctl.slots[slot].engine
    assert any(kind == "engine-lost" and slots == (slot,) for _, kind, slots in ctl.stats.events)
