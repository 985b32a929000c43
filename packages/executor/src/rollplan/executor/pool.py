"""Driver-side view of the slots and their engines.

``SlotRuntime``: one slot the executor may use (a unit of the slot resource on one Ray node): where it
is, who owns it (dedicated / preemptible / lent by training), its deadline, its current role and engine.
``EngineHandle``: the driver's proxy for one ``EngineActor``: the actor handle plus a mirror of its
lifecycle, so illegal transitions are refused in the driver (``IllegalTransitionError``) before any
remote call, and the controller can read states without a round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from rollplan.executor.config import EngineConfig
from rollplan.executor.lifecycle import EngineStatus, Lifecycle
from rollplan.models import EngineState, Role, SlotSource

log = logging.getLogger(__name__)


class EngineHandle:
    """Proxy for one remote engine. Create with ``spawn``; ``start`` runs in the background."""

    def __init__(self, slot: str, actor: Any) -> None:
        self.slot = slot
        self.actor = actor
        self.life = Lifecycle(slot)
        self.version = 0
        self.created = time.perf_counter()
        self.start_seconds: float | None = None
        self.start_timings: dict[str, float] = {}
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None

    @classmethod
    def spawn(cls, slot: str, node_id: str, resource: str, config: EngineConfig) -> EngineHandle:
        """Create the actor on ``node_id`` holding one unit of ``resource`` (no CPU reservation: several
        engines share a machine's cores)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from rollplan.executor.engine import EngineActor

        actor = (
            ray.remote(EngineActor)
            .options(
                num_cpus=0,
                resources={resource: 1},
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                max_restarts=0,
                max_concurrency=1000,
            )
            .remote(slot, config)
        )
        return cls(slot, actor)

    @property
    def state(self) -> EngineStatus:
        return self.life.state

    @property
    def serving(self) -> bool:
        return self.life.state is EngineStatus.SERVING

    @property
    def alive(self) -> bool:
        return self.life.state is not EngineStatus.STOPPED

    async def start(self, weights: Any = None, weights_path: str | None = None, version: int = 0) -> float:
        """CREATED -> LOADING -> SERVING; returns the wall seconds from spawn to serving."""
        self.life.fire("load")
        try:
            self.start_timings = await self.actor.start.remote(weights, weights_path, version)
        except BaseException as exc:
            self.error = exc
            self.life.fire("stop")
            self.ready.set()
            raise
        self.version = version
        self.life.fire("ready")
        self.start_seconds = time.perf_counter() - self.created
        self.ready.set()
        return self.start_seconds

    async def sleep(self) -> float:
        self.life.require(EngineStatus.SERVING, action="sleep")
        seconds = await self.actor.sleep.remote()
        self.life.fire("sleep")
        return seconds

    async def wake(self) -> float:
        self.life.require(EngineStatus.SLEEPING, action="wake")
        seconds = await self.actor.wake.remote()
        self.life.fire("wake")
        return seconds

    def mark_dead(self, exc: BaseException | None = None) -> None:
        """The actor is gone (node lost, crash): STOPPED without a remote call."""
        if self.error is None:
            self.error = exc
        if self.alive:
            self.life.fire("stop")
        self.ready.set()

    def kill(self, exc: BaseException | None = None) -> None:
        """The engine is unusable but its actor may live on (vLLM's core died): STOPPED, and the actor is
        killed so the slot's resource is free for a new engine. Safe on an actor that is already gone."""
        import ray

        self.mark_dead(exc)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as err:  # already gone with its node
            log.debug("kill of %s's actor: %s", self.slot, err)

    async def stop(self, *, graceful: bool = False) -> float:
        """Stop the engine and end its actor process (``ray.kill``); ``graceful`` first shuts vLLM down."""
        import ray

        t = time.perf_counter()
        if not self.alive:
            return 0.0
        self.life.fire("stop")
        self.ready.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if graceful:
            try:
                await asyncio.wait_for(self.actor.stop.remote(), timeout=10.0)
            except Exception as exc:  # already dead or stuck: kill below anyway
                log.debug("graceful stop of %s failed: %s", self.slot, exc)
        ray.kill(self.actor, no_restart=True)
        return time.perf_counter() - t


@dataclass(slots=True)
class SlotRuntime:
    """One slot the executor knows. ``returned``: given back (lent/noticed slot), never used again.
    ``lost``: its node vanished."""

    id: str
    node: str
    resource: str
    gpu: str
    tp: int = 1
    source: SlotSource = SlotSource.DEDICATED
    return_by: float | None = None
    role: Role = Role.OFF
    engine: EngineHandle | None = None
    returned: bool = False
    lost: bool = False
    returned_event: asyncio.Event = field(default_factory=asyncio.Event)
    watchdog: asyncio.Task | None = None

    @property
    def usable(self) -> bool:
        return not (self.returned or self.lost)

    @property
    def starting(self) -> bool:
        return self.engine is not None and self.engine.alive and not self.engine.ready.is_set()

    @property
    def engine_state(self) -> EngineState:
        """The planner's view: NONE (no engine, or one still starting: the planner prices a full start,
        which over-states what is left of it, and a repeated start_engine is a no-op), SLEEPING (wake)
        or WARM (serving)."""
        e = self.engine
        if e is None or not e.alive or not e.ready.is_set():
            return EngineState.NONE
        if e.state is EngineStatus.SLEEPING:
            return EngineState.SLEEPING
        return EngineState.WARM

    @property
    def serving(self) -> bool:
        return self.usable and self.engine is not None and self.engine.serving

    @property
    def weights_version(self) -> int:
        return self.engine.version if self.engine is not None and self.engine.alive else 0
