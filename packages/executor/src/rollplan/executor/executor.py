"""``RolloutExecutor``: the training-job API over a Ray cluster of vLLM engines.

    executor = RolloutExecutor(ExecutorConfig(engine=EngineConfig(model=path)))
    await executor.start()                      # connects to Ray, discovers slots, starts planning
    results = await executor.rollout(batch, env_factory)
    await executor.update_weights(state_dict, version=1)
    await executor.lend(["lent:abcd1234/0"], until=time.time() + 60)
    await executor.reclaim(["lent:abcd1234/0"], deadline=time.time() + 5)
    await executor.shutdown()                   # stops every actor it started

Slots come from Ray: every alive node carrying ``config.slot_resource`` contributes that many slots
(membership is polled every ``poll_interval`` seconds: nodes joining are ARRIVE events, nodes gone are
LEAVE events). Nodes carrying ``config.lend_resource`` are training's: they are used only between
``lend`` and ``reclaim``. Each event triggers a re-plan (see ``rollplan.executor.controller``).

Times (``until``, ``deadline``) are absolute, on ``config.clock`` (``time.time`` by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollplan.executor.agent import (
    AgentLoop,
    EnvFactory,
    RolloutItem,
    TrajectoryResult,
    TrajectoryRun,
    prompt_ids,
)
from rollplan.executor.config import ExecutorConfig
from rollplan.executor.controller import Controller, PlanFn
from rollplan.executor.perf import measured_provider
from rollplan.executor.pool import SlotRuntime
from rollplan.executor.weights import (
    LendError,
    Shapes,
    WeightUpdateError,
    check_shapes,
    checkpoint_shapes,
    header_shapes,
    state_dict_shapes,
)
from rollplan.models import ExecutorError, Role, SlotSource, UserInputError

log = logging.getLogger(__name__)


def _planner_config(config: ExecutorConfig) -> Any:
    try:
        from rollplan.solver.config import PlannerConfig
    except ImportError:
        return None
    if config.perf is None and config.calibration is not None:
        from rollplan.models.perf import default_provider

        perf = default_provider(config.model_name, calibration=config.calibration)
    else:
        perf = config.perf or measured_provider(
            config.model_name,
            engine_start=config.engine_start_seconds,
            wake=config.wake_seconds,
            weight_sync=config.weight_sync_seconds,
            kv_cache_bytes=float(config.engine.kv_cache_memory_bytes or (64 << 20)),
        )
    return PlannerConfig(
        backend=config.planner_backend,
        time_limit=config.planner_time_limit,
        switch_weight=config.switch_weight,
        perf=perf,
        role_switch_seconds=config.role_switch_seconds,
    )


def weights_to_bytes(state_dict: Mapping[str, Any]) -> bytes:
    """safetensors bytes of a state dict (tensors made contiguous, on CPU)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()})


class RolloutExecutor:
    """See the module docstring. One instance per training job; not thread-safe (one event loop)."""

    def __init__(
        self, config: ExecutorConfig, *, plan_fn: PlanFn | None = None, ray_address: str | None = None
    ) -> None:
        self.config = config
        self._ray_address = ray_address
        self._plan_fn = plan_fn
        self.controller: Controller | None = None
        self.tokenizer: Any = None
        self._weights: tuple[Any, str | None, int] = (None, None, 0)
        self._lendable: dict[str, tuple[str, str]] = {}  # slot id -> (node id, resource)
        self._poll_task: asyncio.Task | None = None
        self._started = False
        self._own_store: str | None = None
        self._expected_shapes: Shapes | None = None  # the checkpoint's tensors ({}: not a local folder)
        self._rollout_lock = asyncio.Lock()
        self.rollouts = 0
        self.last_rollout: dict[str, Any] = {}

    # == set-up ==============================================================================================
    async def start(self) -> None:
        """Connect to Ray, load the tokenizer, discover slots and start the planning loop. Idempotent."""
        if self._started:
            return
        import ray

        if not ray.is_initialized():
            ray.init(address=self._ray_address, include_dashboard=False, log_to_driver=False)
        self.tokenizer = await asyncio.to_thread(_load_tokenizer, self.config.engine.model)
        conn = self.config.engine.connector
        if conn.kind == "example":
            if conn.storage_path is None:
                # A private KV store: entries are keyed by token ids only, so sharing one across models or
                # weight versions would load wrong KV.
                self._own_store = tempfile.mkdtemp(prefix="rollplan-kv-")
                conn = replace(conn, storage_path=self._own_store)
                self.config = replace(self.config, engine=replace(self.config.engine, connector=conn))
            Path(conn.storage_path or "").mkdir(parents=True, exist_ok=True)
        self.controller = Controller(
            self.config,
            plan_fn=self._plan_fn,
            planner_config=_planner_config(self.config),
            weights_source=lambda: self._weights,
        )
        await self._poll_membership()
        self.controller.start()
        self._poll_task = asyncio.create_task(self._membership_loop(), name="rollplan-membership")
        self._started = True

    @property
    def ctl(self) -> Controller:
        if self.controller is None:
            raise ExecutorError("the executor is not started", fix="await executor.start() first")
        return self.controller

    def now(self) -> float:
        return self.config.clock()

    async def warm_up(
        self, slots: Sequence[str] | None = None, *, count: int | None = None, timeout: float = 600.0
    ) -> dict[str, float]:
        """Start engines on ``slots`` (default: every dedicated slot, or the first ``count``) before a
        rollout, as a training job does at start-up, and wait until they serve. Returns start seconds."""
        await self.start()
        ctl = self.ctl
        chosen = (
            [ctl.slots[s] for s in slots]
            if slots is not None
            else [s for s in ctl.slots.values() if s.usable and s.source is not SlotSource.LENT_BY_TRAINING]
        )
        if count is not None:
            chosen = chosen[:count]
        handles = [ctl.start_engine(s) for s in chosen]
        await asyncio.wait_for(asyncio.gather(*(h.ready.wait() for h in handles)), timeout=timeout)
        failed = [h.slot for h in handles if not h.serving]
        if failed:
            raise ExecutorError(
                f"engines failed to start on {failed}", fix="check the Ray logs of the EngineActor"
            )
        for s in chosen:
            if s.role.value == "off":
                s.role = Role.MIXED
        return {h.slot: float(h.start_seconds or 0.0) for h in handles}

    # == membership ==========================================================================================
    def _discover(self) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
        import ray

        own: dict[str, tuple[str, str]] = {}
        lendable: dict[str, tuple[str, str]] = {}
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            node = n["NodeID"]
            res = n.get("Resources", {})
            for i in range(int(res.get(self.config.slot_resource, 0))):
                own[f"{node[:8]}/{i}"] = (node, self.config.slot_resource)
            for i in range(int(res.get(self.config.lend_resource, 0))):
                lendable[f"lent:{node[:8]}/{i}"] = (node, self.config.lend_resource)
        return own, lendable

    async def _poll_membership(self) -> None:
        own, lendable = await asyncio.to_thread(self._discover)
        ctl = self.ctl
        self._lendable = lendable
        arrived, left = [], []
        for sid, (node, res) in own.items():
            if sid not in ctl.slots:
                ctl.add_slot(SlotRuntime(sid, node, res, self.config.gpu_kind))
                arrived.append(sid)
        for sid, s in ctl.slots.items():
            if s.lost or s.returned:
                continue
            if sid not in own and sid not in lendable:
                ctl.lose_slot(sid)
                left.append(sid)
        if arrived:
            ctl.request_replan(f"arrive {','.join(arrived)}")
        if left:
            ctl.request_replan(f"leave {','.join(left)}")

    async def _membership_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            try:
                await self._poll_membership()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("membership poll failed")

    def lendable_slots(self) -> list[str]:
        """Slots training could lend (nodes carrying ``lend_resource``), as of the last poll."""
        return sorted(self._lendable)

    def slot_ids(self, *, usable: bool = True) -> list[str]:
        return sorted(s.id for s in self.ctl.slots.values() if s.usable or not usable)

    def slots_on_node(self, node_id: str) -> list[str]:
        return sorted(s.id for s in self.ctl.slots.values() if s.node == node_id)

    # == training-job API ===================================================================================
    async def rollout(self, batch: Sequence[RolloutItem], env_factory: EnvFactory) -> list[TrajectoryResult]:
        """Run every item of ``batch`` as a multi-turn trajectory; results in batch order. One rollout at a
        time. Env errors fail only their trajectory; engine losses are retried elsewhere."""
        await self.start()
        ids = [it.id for it in batch]
        if len(set(ids)) != len(ids):
            raise UserInputError(
                "rollout batch has duplicate item ids", fix="give every RolloutItem a unique id"
            )
        async with self._rollout_lock:
            ctl = self.ctl
            t0 = time.perf_counter()
            runs = []
            for it in batch:
                p = prompt_ids(it, self.tokenizer)
                runs.append(TrajectoryRun(item=it, prompt_ids=p, context=list(p)))
            ctl.runs = {r.id: r for r in runs}
            ctl.start_batch()
            loop = AgentLoop(ctl, self.tokenizer, max_model_len=self.config.engine.max_model_len)
            ctl.request_replan("rollout")
            envs = [env_factory(it) for it in batch]
            results = await asyncio.gather(*(loop.run(r, e) for r, e in zip(runs, envs, strict=True)))
            wall = time.perf_counter() - t0
            self.rollouts += 1
            tokens = sum(r.generated_tokens for r in results)
            self.last_rollout = {
                "trajectories": len(results),
                "done": sum(1 for r in results if r.ok),
                "failed": sum(1 for r in results if not r.ok),
                "duplicated": sum(1 for r in runs if r.finished_count > 1),
                "lost": sum(1 for r in runs if r.finished_count == 0),
                "tokens": tokens,
                "seconds": wall,
                "tokens_per_second": tokens / wall if wall > 0 else 0.0,
            }
            return list(results)

    async def lend(self, slots: Sequence[str], until: float) -> None:
        """Training lends ``slots`` (from ``lendable_slots()``) until ``until``: they join the plan with that
        return deadline. An ``until`` that is not in the future raises ``LendError`` (nothing is lent)."""
        now = self.now()
        if not until > now:
            raise LendError(
                f"lend until {until:.3f} is {now - until:.3f} s in the past",
                fix="pass an absolute end on the executor's clock (config.clock, time.time by default), "
                "e.g. executor.now() + seconds",
                until=until,
                now=now,
            )
        await self.start()
        ctl = self.ctl
        for sid in slots:
            if sid not in self._lendable:
                await self._poll_membership()
            if sid not in self._lendable:
                raise LendError(f"slot {sid!r} is not lendable", fix=f"use one of {self.lendable_slots()}")
            node, res = self._lendable[sid]
            s = ctl.slots.get(sid)
            if s is None or s.returned or s.lost:
                # An engine parked asleep on the returned slot (config.keep_lent_engines) comes back with it.
                parked = s.engine if s is not None and not s.lost and s.engine is not None else None
                s = SlotRuntime(sid, node, res, self.config.gpu_kind, source=SlotSource.LENT_BY_TRAINING)
                if parked is not None and parked.alive and parked.state.value == "sleeping":
                    s.engine = parked
                ctl.add_slot(s)
            ctl.set_deadline(s, until)
        ctl.stats.events.append((self.now(), "lend", tuple(slots)))
        ctl.request_replan(f"lend {','.join(slots)}")

    async def reclaim(self, slots: Sequence[str], deadline: float | None = None) -> dict[str, float]:
        """Training wants ``slots`` back by ``deadline`` (default: now + 2 x drain margin). Returns once
        every one is empty and returned; maps slot -> seconds it was returned before the deadline."""
        ctl = self.ctl
        deadline = deadline if deadline is not None else self.now() + 2 * self.config.drain_margin
        chosen = [ctl.slots[s] for s in slots if s in ctl.slots]
        for s in chosen:
            ctl.set_deadline(s, deadline)
        ctl.stats.events.append((self.now(), "reclaim", tuple(slots)))
        ctl.request_replan(f"reclaim {','.join(slots)}")
        await asyncio.gather(*(s.returned_event.wait() for s in chosen))
        return {s.id: ctl.stats.returns.get(s.id, 0.0) for s in chosen}

    async def notify_preemption(self, slots: Sequence[str], deadline: float) -> None:
        """A preemption notice: ``slots`` (or every slot of a node id given instead) leave at ``deadline``."""
        ctl = self.ctl
        ids: list[str] = []
        for x in slots:
            ids.extend([x] if x in ctl.slots else self.slots_on_node(x))
        for sid in ids:
            s = ctl.slots[sid]
            s.source = SlotSource.PREEMPTIBLE
            ctl.set_deadline(s, deadline)
        ctl.stats.events.append((self.now(), "notice", tuple(ids)))
        ctl.request_replan(f"notice {','.join(ids)}")

    async def update_weights(
        self, weights: Mapping[str, Any] | str | Path | bytes, version: int
    ) -> list[float]:
        """Install new weights on every engine in place (see ``Controller.update_weights``); engines
        started later load this version. ``weights``: a state dict, safetensors bytes, or a safetensors
        file / model folder path visible to every node.

        Lossless: requests in flight are paused (vLLM ``pause_generation(mode="keep")``), recompute their KV
        with the new weights and carry on to their full length; none is aborted. Each turn records the
        versions it was generated with (``TurnRecord.weights_versions``).

        Checked before any engine is touched (``WeightUpdateError``, the engines keep their weights): the
        version must be newer than the current one, and the tensors must be exactly the names and shapes
        of the model's checkpoint (when ``config.engine.model`` is a local folder)."""
        import ray

        current = self._weights[2]
        if version <= current:
            raise WeightUpdateError(
                f"weights version {version} goes backwards: the engines already have version {current}",
                fix=f"pass a version greater than {current} (e.g. the optimizer step count)",
                version=version,
                current=current,
            )
        data: bytes | None = None
        path: str | None = None
        if isinstance(weights, str | Path):
            p = Path(weights)
            if p.is_dir():
                files = sorted(p.glob("*.safetensors"))
                if len(files) != 1:
                    raise WeightUpdateError(
                        f"{p} must hold exactly one .safetensors file", fix="pass the file itself"
                    )
                p = files[0]
            if not p.is_file():
                raise WeightUpdateError(f"weights file {p} does not exist", fix="pass an existing path")
            got = header_shapes(p)
            path = str(p)
        elif isinstance(weights, bytes):
            got = header_shapes(weights)
            data = weights
        else:
            got = state_dict_shapes(weights)
        if self._expected_shapes is None:
            self._expected_shapes = await asyncio.to_thread(checkpoint_shapes, self.config.engine.model) or {}
        if self._expected_shapes:
            check_shapes(self._expected_shapes, got)
        else:
            log.info("model %s is no local folder: update shapes not checked", self.config.engine.model)
        await self.start()
        if data is None and path is None:
            data = weights_to_bytes(weights)  # type: ignore[arg-type]  # a state dict here
        self._weights = (ray.put(data) if data is not None else None, path, version)
        return await self.ctl.update_weights(version)

    async def switch_roles(self, roles: Mapping[str, Any]) -> None:
        """Set slot roles directly (outside a plan; for tests and benchmarks). Trajectories placed on a
        slot that no longer decodes move (KV through the connector) to the least loaded decoding slot. Never
        interleaves with a re-plan (``Controller.set_roles``); set ``ctl.autoplan = False`` first to keep the
        roles, or the next plan sets its own."""
        from rollplan.models import Role

        await self.ctl.set_roles({s: Role(r) for s, r in roles.items()})

    def stats(self) -> dict[str, Any]:
        """Counters for reports: re-plans, planner status, actions by kind (count, failures, mean seconds),
        engine start times, returns vs deadlines, moves (dropped, failed, late, KV exports failed:
        ``ControllerStats``), and the last rollout's totals."""
        ctl = self.ctl
        st = ctl.stats
        return {
            "replans": st.replans,
            "plan_status": dict(st.plan_status),
            "planner_errors": list(st.planner_errors[-5:]),
            "mean_plan_seconds": sum(st.plan_seconds) / len(st.plan_seconds) if st.plan_seconds else 0.0,
            "actions": st.actions_by_kind(),
            "engine_starts": list(st.engine_starts),
            "returns_before_deadline": dict(st.returns),
            "moves": {"not_carried_out": st.moves_not_carried_out, "failed": st.moves_failed,
                      "late": st.moves_late, "kv_exports_failed": st.kv_exports_failed},
            "last_rollout": dict(self.last_rollout),
        }

    async def shutdown(self) -> None:
        """Stop planning, polling and every engine actor this executor started."""
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(BaseException):
                await self._poll_task
        if self.controller is not None:
            await self.controller.close()
        if self._own_store is not None:
            shutil.rmtree(self._own_store, ignore_errors=True)
            self._own_store = None
        self._started = False


def _load_tokenizer(model: str) -> Any:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)
