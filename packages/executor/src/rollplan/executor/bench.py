"""``rollplan bench executor``: switching latencies of real vLLM CPU engines under the executor.

Measured (medians over ``repeats``):
- engine start: spawn an ``EngineActor`` and start vLLM until it serves (the engines are started in
  parallel, as the executor starts them);
- wake (and sleep): an engine's sleep/wake round trip (CPU: sleep = not routed, see docs/executor.md);
- weight sync: in-place ``reload_weights`` per engine, and end to end through ``update_weights`` (pause,
  reload, KV store cleared, prefix cache reset, resume);
- role switch: applying PREFILL/DECODE roles (routing only, no restart), and the first P/D request after
  it (prefill on the PREFILL engine, KV through the connector, first token on the DECODE engine);
- migration per trajectory: a trajectory decoding on engine A moves to engine B: abort on A, then either
  KV transfer (A re-stores the context's KV through the connector, B loads it) or re-prefill (B recomputes),
  until B has produced its next token.
- profile: prefill and decode step timings over batch sizes (``--profile-out`` writes them, with every
  switching sample and the KV capacity, as JSONL in the format ``rollplan perf fit --profile`` reads, see
  docs/perf.md; re-prefill samples are written as ``prefill`` records of the whole context).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SLOT = "rollplan_slot"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


async def _bench(
    model: Path, new_weights: Path, repeats: int, batches: list[int], kv_dir: Path, log: Callable[[str], None],
    policy: str = "rollplan", rollout_trajectories: int = 32,
) -> tuple[dict, list[dict]]:
    from safetensors.torch import load_file

    from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
    from rollplan.executor.executor import RolloutExecutor

    cfg = ExecutorConfig(
        engine=EngineConfig(
            model=str(model), connector=KVConnectorConfig(kind="example", storage_path=str(kv_dir))
        ),
        slot_resource=SLOT,
        policy=policy,
        replan_interval=2.0,
        planner_time_limit=0.5,
    )
    ex = RolloutExecutor(cfg)
    profile: list[dict] = []
    out: dict[str, Any] = {"repeats": repeats}
    try:
        await ex.start()
        ex.ctl.autoplan = False  # the benchmark drives every action itself
        slots = ex.slot_ids()[:2]
        log(f"starting {len(slots)} engines")
        starts = await ex.warm_up(slots)
        out["engine_start_s"] = {"median": _median(list(starts.values())), "samples": sorted(starts.values())}
        out["engine_start_parts_s"] = {s: ex.ctl.slots[s].engine.start_timings for s in slots}  # type: ignore[union-attr]
        profile += [{"phase": "engine_start", "seconds": v} for v in starts.values()]
        a, b = (ex.ctl.slots[s].engine for s in slots)
        assert a is not None and b is not None

        log("sleep / wake")
        sleeps, wakes = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            await a.sleep()
            sleeps.append(time.perf_counter() - t)
            t = time.perf_counter()
            await a.wake()
            wakes.append(time.perf_counter() - t)
        out["sleep_s"] = _median(sleeps)
        out["wake_s"] = _median(wakes)
        out["sleep_mode"] = (await a.actor.info.remote())["sleep_mode"]
        profile += [{"phase": "wake", "seconds": w} for w in wakes]

        info = await a.actor.info.remote()
        if info.get("kv_capacity_tokens"):
            out["kv_capacity_tokens"] = info["kv_capacity_tokens"]
            profile.append({"phase": "kv_capacity", "tokens": info["kv_capacity_tokens"]})

        log("weight sync")
        states = [
            load_file(str(new_weights / "model.safetensors")),
            load_file(str(model / "model.safetensors")),
        ]
        weight_bytes = (model / "model.safetensors").stat().st_size
        per_engine, e2e = [], []
        for i in range(repeats):
            t = time.perf_counter()
            secs = await ex.update_weights(states[i % 2], version=i + 1)
            e2e.append(time.perf_counter() - t)
            per_engine += secs
        if repeats % 2 == 1:  # leave the engines on the original weights
            await ex.update_weights(states[1], version=repeats + 1)
        out["weight_sync_reload_s"] = _median(per_engine)
        out["weight_sync_end_to_end_s"] = _median(e2e)
        profile += [{"phase": "weight_sync", "seconds": s, "bytes": weight_bytes} for s in e2e]

        log("role switch")
        switch, first = [], []
        for i in range(repeats):
            t = time.perf_counter()
            await ex.switch_roles({slots[0]: "prefill", slots[1]: "decode"})
            switch.append(time.perf_counter() - t)
            prompt = [10 + (i * 37 + k * 11) % 900 for k in range(96)]
            t = time.perf_counter()
            await a.actor.generate.remote(f"bench-sw{i}:p", prompt, {"max_tokens": 1})
            res = await b.actor.generate.remote(f"bench-sw{i}", prompt, {"max_tokens": 1})
            first.append(time.perf_counter() - t)
            out["pd_cached_tokens"] = res["num_cached_tokens"]
            t = time.perf_counter()
            await ex.switch_roles({slots[0]: "mixed", slots[1]: "mixed"})
            switch.append(time.perf_counter() - t)
        out["role_switch_s"] = _median(switch)
        out["pd_first_token_after_switch_s"] = _median(first)
        profile += [{"phase": "role_switch", "seconds": s} for s in switch]

        log("migration")
        for mode in ("kv", "reprefill"):
            lat, toks = [], []
            work: list[tuple[float, int, int]] = []  # (seconds inside the engines, context, cached)
            for i in range(repeats):
                prompt = [10 + (i * 53 + k * 7 + (0 if mode == "kv" else 500)) % 1000 for k in range(160)]
                rid = f"bench-mig-{mode}-{i}"
                task = asyncio.ensure_future(
                    a.actor.generate.remote(rid, prompt, {"max_tokens": 200, "ignore_eos": True})
                )
                await asyncio.sleep(0.3)
                t = time.perf_counter()
                await a.actor.abort.remote([rid])
                part = (await task)["token_ids"]
                ctx = prompt + part
                export = 0.0
                if mode == "kv":
                    export = (await a.actor.generate.remote(rid + ":x", ctx, {"max_tokens": 1}))["seconds"]
                res = await b.actor.generate.remote(rid + ":b", ctx, {"max_tokens": 1})
                lat.append(time.perf_counter() - t)
                toks.append(len(ctx))
                work.append((export + res["seconds"], len(ctx), int(res["num_cached_tokens"])))
                out[f"migration_{mode}_cached_tokens"] = res["num_cached_tokens"]
            out[f"migration_{mode}_s"] = _median(lat)
            out[f"migration_{mode}_context_tokens"] = _median([float(x) for x in toks])
            # Profile: the engines' share (no Ray round trips). KV: export + load, per token moved; re-prefill:
            # a prefill of the whole context on the target (the fit has no separate re-prefill phase).
            for secs, n, cached in work:
                if mode == "kv":
                    profile.append(
                        {"phase": "kv_transfer", "tokens": cached, "same_node": True, "seconds": secs}
                    )
                else:
                    profile.append(
                        {"phase": "prefill", "prompt_tokens": [n], "cached_tokens": [cached], "seconds": secs}
                    )

        log("prefill / decode profile")
        steps = []
        n_dec = 48
        for bsz in batches:
            pre_s, step_s = [], []
            for trial in range(3):  # medians: other processes share the cores
                base_tok = 10 + 97 * trial
                prompts = [
                    [(base_tok + bsz * 31 + j * 17 + k) % 1000 + 6 for k in range(64)] for j in range(bsz)
                ]
                r1 = await a.actor.generate_many.remote(prompts, {"max_tokens": 1})
                prompts2 = [[p[0] + 1, *p[1:]] for p in prompts]  # new prompts: no prefix-cache hit
                r2 = await a.actor.generate_many.remote(
                    prompts2, {"max_tokens": n_dec + 1, "ignore_eos": True}
                )
                pre_s.append(r1["seconds"])
                step_s.append(max((r2["seconds"] - r1["seconds"]) / n_dec, 0.0))
            pre, step = statistics.median(pre_s), statistics.median(step_s)
            profile.append({"phase": "prefill", "prompt_tokens": [64] * bsz, "seconds": pre})
            profile.append({"phase": "decode", "batch": bsz, "kv_tokens": 64 + n_dec // 2, "seconds": step})
            steps.append({"batch": bsz, "prefill_s": pre, "decode_step_s": step})
        out["profile"] = steps

        if rollout_trajectories:
            from rollplan.executor.toy import ToyToolEnv, make_toy_batch

            log(f"rollout under the {policy} policy")
            ex.ctl.autoplan = True
            batch = make_toy_batch(rollout_trajectories, group_size=4, max_tokens=32, turns=(2, 4), prefix="bench")
            t = time.perf_counter()
            results = await ex.rollout(batch, ToyToolEnv)
            wall = time.perf_counter() - t
            tokens = sum(r.generated_tokens for r in results)
            out["rollout"] = {
                "policy": policy,
                "trajectories": len(batch),
                "done": sum(1 for r in results if r.ok),
                "seconds": wall,
                "tokens_per_s": tokens / wall if wall > 0 else None,
                "admissions": len(ex.ctl.admissions),
                "replans": ex.ctl.stats.replans,
                "prediction_spreads": ex.ctl.predictor.spreads.summary(),
            }
    finally:
        await ex.shutdown()
    return out, profile


def run_bench(
    *,
    repeats: int = 5,
    batches: tuple[int, ...] = (1, 4, 16, 32),
    model: Path | None = None,
    log: Callable[[str], None] = lambda _m: None,
    policy: str = "rollplan",
    rollout_trajectories: int = 32,
) -> tuple[dict, list[dict]]:
    """Start a local Ray instance with two slots, measure, then roll out ``rollout_trajectories`` toy
    trajectories under ``policy`` (the decision core's, as the simulator runs it: a real A/B on the same
    engines), stop everything. Returns (summary, profile)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from rollplan.executor.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="rollplan-bench-") as tmp:
        root = Path(tmp)
        log("building the tiny model")
        base = model or build_tiny_model(root / "m0", seed=0)
        new = build_tiny_model(root / "m1", seed=1)
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(num_cpus=2, resources={SLOT: 2}, include_dashboard=False, log_to_driver=False)
        try:
            t = time.perf_counter()
            out, profile = asyncio.run(_bench(base, new, repeats, list(batches), root / "kv", log, policy,
                                              rollout_trajectories))
            out["wall_s"] = time.perf_counter() - t
        finally:
            if started_ray:
                ray.shutdown()
    return out, profile


def write_profile(path: Path, records: list[dict]) -> None:
    """One JSON object per line (the format ``rollplan perf fit --profile`` reads)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
