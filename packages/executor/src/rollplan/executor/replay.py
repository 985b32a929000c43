"""Replay an availability trace, time-scaled, against real engines.

``replay_availability(executor, events, nodes=..., time_scale=...)`` turns each ``AvailabilityEvent`` (as
``rollplan.sim.traces`` produces them; times in seconds from the trace start) into what it means on the
Ray cluster the executor runs on, at ``start + event.time * time_scale``:

- ARRIVE: ``nodes.add_node()`` once per trace node of the arriving slots (slot ids ``"<node>/g<i>"``);
  the executor's membership poll then sees the new slots.
- LEAVE: ``nodes.remove_node(ray_node_id)`` for the mapped nodes (no notice: engines and KV are lost).
- NOTICE: ``executor.notify_preemption(ray node ids, deadline)`` with the deadline scaled the same way.
- LEND / RECLAIM: the executor's lendable slots, taken in order for the trace's slot ids, are lent until /
  reclaimed by the scaled deadline.

``NodeControl`` is whatever adds and removes Ray nodes: ``ray.cluster_utils.Cluster`` on one machine
(``ClusterNodes``), a cloud API elsewhere. Returns one line per applied event, once every reclaim it
started has completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from rollplan.models import AvailabilityEvent, EventKind


class NodeControl(Protocol):
    def add_node(self) -> str:
        """Start a node carrying one slot; return its Ray node id (hex)."""
        ...

    def remove_node(self, node_id: str) -> None: ...


class ClusterNodes:
    """``NodeControl`` over ``ray.cluster_utils.Cluster`` (one machine, loopback)."""

    def __init__(self, cluster: Any, resources: dict[str, float]) -> None:
        self.cluster = cluster
        self.resources = resources
        self._nodes: dict[str, Any] = {}

    def add_node(self) -> str:
        node = self.cluster.add_node(num_cpus=0, resources=dict(self.resources))
        self._nodes[node.node_id] = node
        return node.node_id

    def adopt(self, node: Any) -> str:
        """Let the replay remove a node created elsewhere."""
        self._nodes[node.node_id] = node
        return node.node_id

    def remove_node(self, node_id: str) -> None:
        self.cluster.remove_node(self._nodes.pop(node_id))


def _trace_node(slot_id: str) -> str:
    return slot_id.rsplit("/", 1)[0]


async def replay_availability(
    executor: Any,
    events: Sequence[AvailabilityEvent],
    *,
    nodes: NodeControl,
    time_scale: float = 1.0,
    node_map: dict[str, str] | None = None,
) -> list[str]:
    """Apply ``events`` in time order (see the module docstring). ``node_map``: trace node -> Ray node id
    for nodes that exist before the replay starts (it is extended as nodes arrive)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    wall0 = executor.now()
    mapping = dict(node_map or {})
    lent: dict[str, str] = {}
    applied: list[str] = []
    pending: list[asyncio.Future] = []

    def scaled(t: float) -> float:
        return wall0 + t * time_scale

    for ev in sorted(events, key=lambda e: e.time):
        delay = start + ev.time * time_scale - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        ids = list(ev.slot_ids) or [s.id for s in ev.slots]
        trace_nodes = list(dict.fromkeys(_trace_node(s) for s in ids))
        if ev.kind is EventKind.ARRIVE:
            for tn in trace_nodes:
                mapping[tn] = nodes.add_node()  # main thread: Ray's add_node installs signal handlers
        elif ev.kind is EventKind.LEAVE:
            for tn in trace_nodes:
                if tn in mapping:
                    await asyncio.to_thread(nodes.remove_node, mapping.pop(tn))
        elif ev.kind is EventKind.NOTICE:
            targets = [mapping[tn] for tn in trace_nodes if tn in mapping]
            if targets and ev.deadline is not None:
                await executor.notify_preemption(targets, deadline=scaled(ev.deadline))
        elif ev.kind is EventKind.LEND:
            free = [s for s in executor.lendable_slots() if s not in lent.values()]
            for sid, slot in zip(ids, free, strict=False):
                lent[sid] = slot
            chosen = [lent[s] for s in ids if s in lent]
            if chosen:
                until = scaled(ev.deadline) if ev.deadline is not None else executor.now() + 3600.0
                await executor.lend(chosen, until=until)
        elif ev.kind is EventKind.RECLAIM:
            chosen = [lent.pop(s) for s in ids if s in lent]
            if chosen:
                deadline = scaled(ev.deadline) if ev.deadline is not None else None
                # reclaim returns when the slots are back: do not hold up later events meanwhile.
                pending.append(asyncio.ensure_future(executor.reclaim(chosen, deadline=deadline)))
        applied.append(f"{loop.time() - start:7.2f}s {ev.kind.value} {','.join(ids)}")
    await asyncio.gather(*pending)
    return applied
