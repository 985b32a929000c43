"""Elastic agentic rollout on real vLLM CPU engines over a local multi-node Ray cluster (loopback).

    .venv/bin/python examples/elastic_rollout_cpu.py [--trajectories 48] [--cheap-start] [--policy elastic-plus]

Builds the tiny model, starts a Ray cluster on this machine (head + three nodes with one slot each + one
training node that can lend its slot), starts engines on the three slots, and runs a multi-turn rollout
with a toy tool env while an availability trace is replayed against the cluster (``replay_availability``):
at 1 s training lends its slot (until 120 s), at 2 s node b is preempted without notice (removed), at
2.5 s a node arrives, at 5 s training reclaims its slot (deadline 8 s). The planner decides what to do at
each event (``--cheap-start`` tells it engine starts cost 0.5 s instead of the measured tens of seconds,
so it puts engines on the new capacity). ``--policy``: the decision core's policy the controller runs
(rollplan: the planner, its placement and the core's admission; elastic-plus: no planner, every slot MIXED,
vLLM's admission). Prints one JSON object: the policy, trajectories total / done / failed / lost /
duplicated, re-plans, actions applied by kind with their mean latency, tokens/s. Stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"


async def scenario(cluster, nodes: dict, model: Path, kv_dir: Path, n: int, cheap_start: bool,
                   policy: str = "rollplan") -> dict:
    from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
    from rollplan.executor.executor import RolloutExecutor
    from rollplan.executor.perf import measured_provider
    from rollplan.executor.replay import ClusterNodes, replay_availability
    from rollplan.executor.toy import ToyToolEnv, make_toy_batch
    from rollplan.models import AvailabilityEvent, EventKind, Slot

    # Engines sharing this machine's cores are batch-bound: tell the planner (decode_c), so it spreads work.
    perf = measured_provider("tiny", decode_c=5e-3, engine_start=0.5 if cheap_start else None)
    config = ExecutorConfig(
        engine=EngineConfig(
            model=str(model), connector=KVConnectorConfig(kind="example", storage_path=str(kv_dir))
        ),
        slot_resource=SLOT,
        lend_resource=LEND,
        replan_interval=2.0,
        planner_time_limit=0.5,
        perf=perf,
        policy=policy,
    )
    ex = RolloutExecutor(config)
    control = ClusterNodes(cluster, {SLOT: 1})
    node_map = {name: control.adopt(node) for name, node in nodes.items() if name != "lend"}
    # The availability trace, replayed in real time from the start of the rollout (seconds).
    trace = [
        AvailabilityEvent(1.0, EventKind.LEND, slot_ids=("train/g0",), deadline=120.0),
        AvailabilityEvent(2.0, EventKind.LEAVE, slot_ids=("b/g0",)),  # preempted without notice
        AvailabilityEvent(2.5, EventKind.ARRIVE, slots=(Slot("d/g0", "cpu", "d"),)),
        AvailabilityEvent(5.0, EventKind.RECLAIM, slot_ids=("train/g0",), deadline=8.0),
    ]
    try:
        await ex.start()
        t0 = time.perf_counter()
        starts = await ex.warm_up(count=3)
        warm = time.perf_counter() - t0
        batch = make_toy_batch(n, group_size=4, max_tokens=32, turns=(3, 5))
        t0 = time.perf_counter()
        replay = asyncio.create_task(replay_availability(ex, trace, nodes=control, node_map=node_map))
        results = await ex.rollout(batch, ToyToolEnv)
        wall = time.perf_counter() - t0
        applied = await replay
        runs = ex.ctl.runs.values()
        stats = ex.stats()
        tokens = sum(r.generated_tokens for r in results)
        return {
            "policy": policy,
            "moves": ex.ctl.config.moves,  # which plan moves are carried out (ExecutorConfig.moves)
            "moves_not_carried_out": ex.ctl.stats.moves_not_carried_out,
            "admissions": len(ex.ctl.admissions),
            "trajectories": {
                "total": len(batch),
                "done": sum(1 for r in results if r.ok),
                "failed": sum(1 for r in results if not r.ok),
                "lost": sum(1 for r in runs if r.finished_count == 0),
                "duplicated": sum(1 for r in runs if r.finished_count > 1)
                + len(results)
                - len({r.id for r in results}),
            },
            "replans": stats["replans"],
            "plan_status": stats["plan_status"],
            "actions": stats["actions"],
            "engine_start_seconds": starts,
            "warm_up_seconds": warm,
            "returns_seconds_before_deadline": stats["returns_before_deadline"],
            "tokens": tokens,
            "rollout_seconds": wall,
            "tokens_per_second": tokens / wall,
            "engines_per_trajectory_mean": sum(len(r.engines) for r in results) / len(results),
            "events": applied,
        }
    finally:
        await ex.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=48)
    parser.add_argument("--cheap-start", action="store_true", help="plan with 0.5 s engine starts")
    parser.add_argument("--policy", default="rollplan", choices=("rollplan", "elastic-plus"),
                        help="the decision core's policy the controller runs")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray
    from ray.cluster_utils import Cluster

    from rollplan.executor.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="rollplan-example-") as tmp:
        model = build_tiny_model(Path(tmp) / "model", seed=0)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            nodes = {name: cluster.add_node(num_cpus=0, resources={SLOT: 1}) for name in ("a", "b", "c")}
            nodes["lend"] = cluster.add_node(num_cpus=0, resources={LEND: 1})
            ray.init(address=cluster.address, log_to_driver=False)
            out = asyncio.run(
                scenario(cluster, nodes, model, Path(tmp) / "kv", args.trajectories, args.cheap_start, args.policy)
            )
        finally:
            ray.shutdown()
            cluster.shutdown()
    print(json.dumps(out, indent=2))
    return 0 if out["trajectories"]["done"] == out["trajectories"]["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
