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
- profile: decode step timings over batch sizes and prefill request latencies (the summary);
  ``--profile-out`` writes the decode steps, with every switching sample, the KV capacity and the steps
  below, as JSONL in the format ``rollplan perf fit --profile`` reads (docs/perf.md; re-prefill samples are
  written as ``prefill`` records of the whole context);
- steps: while ``batch`` greedy decodes run, new prompts are submitted one at a time; vLLM runs each as a
  chunk in the same forward pass as the decodes, and that step's duration is the gap between two token
  arrivals of a decode (``EngineActor.time_mixed_steps``), written as ``mixed`` records; the other gaps are
  ``decode`` records; prompt batches submitted beside a single decode are the ``prefill`` records (one step
  each, not a request's latency).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
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
            # (prefill records come from the per-step timings below: ``pre`` is a request's latency, with
            # the engine's request handling around the forward pass)
            profile.append({"phase": "decode", "batch": bsz, "kv_tokens": 64 + n_dec // 2, "seconds": step})
            steps.append({"batch": bsz, "prefill_s": pre, "decode_step_s": step})
        out["profile"] = steps

        log("mixed-step profile")
        # Per-step timings: the gap between two token arrivals of a running decode is one engine step.
        rows: list[dict] = []
        rng = random.Random("prefill-steps")
        groups: list[list[list[int]]] = []
        for _trial in range(STEP_TRIALS):
            for bsz in batches:  # prefill-only steps (one clock decode runs beside them: ~1 token of work)
                n = min(64, PREFILL_STEP_TOKENS // bsz)
                groups.append([[rng.randrange(6, 1000) for _ in range(n)] for _ in range(bsz)])
            groups += [[[rng.randrange(6, 1000) for _ in range(n)]] for n in MIXED_CHUNKS]
            long = [rng.randrange(6, 1000) for _ in range(MIXED_PREFIX)]
            groups += [[long], *([long + [rng.randrange(6, 1000) for _ in range(n)]] for n in MIXED_AFTER_PREFIX)]
        clock = [[rng.randrange(6, 1000) for _ in range(MIXED_DECODE_PROMPTS[0])]]
        res = await a.actor.time_mixed_steps.remote(clock, groups)
        rows += probe_steps(res, MIXED_DECODE_PROMPTS[0], phase="prefill")
        for bsz in batches:
            for dec_len in MIXED_DECODE_PROMPTS:
                rng = random.Random(f"mixed-{bsz}-{dec_len}")
                decs = [[rng.randrange(6, 1000) for _ in range(dec_len)] for _ in range(bsz)]
                groups = []
                for _trial in range(STEP_TRIALS):
                    fresh = [[rng.randrange(6, 1000) for _ in range(n)] for n in (*MIXED_CHUNKS, MIXED_PREFIX)]
                    # the last prompts re-send the prefix-only one plus new tokens: chunks after cached context
                    groups += [[f] for f in fresh]
                    groups += [[fresh[-1] + [rng.randrange(6, 1000) for _ in range(n)]] for n in MIXED_AFTER_PREFIX]
                res = await a.actor.time_mixed_steps.remote(decs, groups)
                rows += probe_steps(res, dec_len, phase="mixed")
        records, summary = step_records(rows)
        profile += records
        out["mixed_profile"] = summary

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
                "moves": ex.ctl.config.moves,
                "moves_not_carried_out": ex.ctl.stats.moves_not_carried_out,
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


MIXED_DECODE_PROMPTS = (48, 240)  # prompt tokens of each running decode (two KV depths per batch size)
MIXED_CHUNKS = (128, 400)  # new prompts submitted while the decodes run: one chunk each, nothing cached
# A 256-token prompt, then it again plus 32 and plus 128 new tokens (256 cached: a turn's observation after
# its context). Chunks of new prompts below one KV block (32 tokens) are left out: the engine's file KV
# connector stores no block of them, so they skip a per-prompt save every other chunk pays.
MIXED_PREFIX, MIXED_AFTER_PREFIX = 256, (32, 128)
STEP_TRIALS = 5  # each chunk timed this many times, the median counts (other processes share the cores)
PREFILL_STEP_TOKENS = 1536  # a prefill-only group stays inside one step's token budget (vLLM's default 2048)


def probe_steps(res: dict, decode_prompt_tokens: int, *, phase: str) -> list[dict]:
    """Steps timed by one ``EngineActor.time_mixed_steps`` run.

    The decodes advance one token per engine step, so the gap between two arrivals of the first decode's
    tokens is one step. The step whose output carries a group's first tokens (the arrival nearest its
    ``done`` time, its first and last prompt both within a third of the gap) ran the group with the decodes:
    a ``phase`` row (``mixed``; ``prefill`` for a group timed beside a single clock decode, whose one token is
    negligible next to the chunk). Its decodes read ``batch * (decode_prompt_tokens + tokens made before it)``
    KV tokens. The other gaps are decode-only steps: one ``decode`` row, their median. A gap whose output
    carries more than one token (steps merged before the actor read them) is not one step and is skipped."""
    arr = [(float(t), int(n)) for t, n in res["decode"]]
    batch = len(res["decode_tokens"])
    made = [0]
    for _, n in arr:
        made.append(made[-1] + n)
    rows, taken = [], set()
    for p in res["prefills"]:
        if not arr:
            break
        i = min(range(len(arr)), key=lambda k: abs(arr[k][0] - p["done"]))
        if i < 1 or arr[i][1] != 1:
            continue
        tol = (arr[i][0] - arr[i - 1][0]) / 3
        if abs(arr[i][0] - p["done"]) > tol or abs(arr[i][0] - p.get("first_done", p["done"])) > tol:
            continue
        taken.add(i)
        rows.append({"phase": phase, "decode_seqs": batch, "decode_prompt_tokens": decode_prompt_tokens,
                     "prompt_tokens": [int(n) for n in p["prompt_tokens"]],
                     "cached_tokens": [int(c) for c in p["cached_tokens"]],
                     "decode_kv_tokens": batch * (decode_prompt_tokens + made[i]), "seconds": arr[i][0] - arr[i - 1][0]})
    plain = [k for k in range(2, len(arr)) if arr[k][1] == 1 and k not in taken]
    if plain:
        rows.append({"phase": "decode", "decode_seqs": batch, "decode_prompt_tokens": decode_prompt_tokens,
                     "kv_tokens": statistics.median(decode_prompt_tokens + made[k] for k in plain),
                     "seconds": statistics.median(arr[k][0] - arr[k - 1][0] for k in plain)})
    return rows


def step_records(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Profile records (docs/perf.md) from ``probe_steps`` rows, per point the median over its trials (a gap
    between two arrivals also shrinks when the first one was read late, so the fastest would be biased low):
    ``mixed`` (``{"phase": "mixed", "prefill_tokens", "prefill_context", "decode_seqs", "decode_kv_tokens",
    "seconds"}``), ``prefill`` (new tokens per prompt after its cached ones) and ``decode``; and the mixed
    summary rows (with the decode-only step of the same run next to each mixed step)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        shape = (tuple(r["prompt_tokens"]), tuple(r["cached_tokens"])) if r["phase"] != "decode" else ()
        groups.setdefault((r["phase"], r["decode_seqs"], r["decode_prompt_tokens"], shape), []).append(r)
    decode_s = {(b, d): statistics.median(r["seconds"] for r in rs) for (ph, b, d, _), rs in groups.items()
                if ph == "decode"}
    records, summary = [], []
    for (phase, b, dec_len, shape), rs in sorted(groups.items()):
        secs = statistics.median(r["seconds"] for r in rs)
        if phase == "decode":
            kv = statistics.median(r["kv_tokens"] for r in rs)
            records.append({"phase": "decode", "batch": b, "kv_tokens": kv, "seconds": secs})
            continue
        prompts, cached = shape
        new = [n - c for n, c in zip(prompts, cached, strict=True)]
        if phase == "prefill":
            records.append({"phase": "prefill", "prompt_tokens": new, "cached_tokens": list(cached), "seconds": secs})
            continue
        kv = int(statistics.median(r["decode_kv_tokens"] for r in rs))
        records.append({"phase": "mixed", "prefill_tokens": new[0], "prefill_context": cached[0], "decode_seqs": b,
                        "decode_kv_tokens": kv, "seconds": secs})
        summary.append({"decode_seqs": b, "decode_prompt_tokens": dec_len, "prefill_tokens": new[0],
                        "prefill_context": cached[0], "decode_kv_tokens": kv, "mixed_step_s": secs,
                        "mixed_step_min_s": min(r["seconds"] for r in rs),
                        "decode_step_s": decode_s.get((b, dec_len)), "samples": len(rs)})
    return records, summary


def write_profile(path: Path, records: list[dict]) -> None:
    """One JSON object per line (the format ``rollplan perf fit --profile`` reads)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# -- speculative decoding (issue 17, docs/seer.md) ---------------------------------------------------------
# Kept apart from the sections above: `rollplan bench executor --spec` adds this measurement to the output.


def _spec_batches(rep: int, groups: int, prompt_tokens: int = 32) -> list[list[int]]:
    """One prompt per group; every repeat gets new prompts (no cross-repeat cache or draft hits)."""
    return [
        [6 + (rep * 131 + g * 37 + k * 11) % 1000 for k in range(prompt_tokens)] for g in range(groups)
    ]


async def _spec_round(
    actor: Any, prompts: list[list[int]], samples: int, max_tokens: int, tag: str
) -> tuple[float, list[dict]]:
    """One grouped round on one engine: each group's first sample (the lead) runs, then its ``samples - 1``
    siblings run together (Seer's setting: a sibling that finished first). Returns (seconds, outputs in
    a fixed order: leads, then siblings group by group)."""
    params = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    names = [f"{tag}-g{g}" for g in range(len(prompts))]
    t = time.perf_counter()
    lead = await actor.generate_many.remote(prompts, params, groups=names)
    rest = [p for p in prompts for _ in range(samples - 1)]
    rest_groups = [n for n in names for _ in range(samples - 1)]
    siblings = await actor.generate_many.remote(rest, params, groups=rest_groups)
    return time.perf_counter() - t, lead["outputs"] + siblings["outputs"]


async def _spec_bench(
    model: Path, method: str, k: int, repeats: int, groups: int, samples: int, max_tokens: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import contextlib

    import ray

    from rollplan.executor.config import EngineConfig, KVConnectorConfig, SpeculativeConfig
    from rollplan.executor.engine import EngineActor

    spec_cfg = SpeculativeConfig(method=method, num_speculative_tokens=k)
    base = EngineConfig(model=str(model), connector=KVConnectorConfig(kind="none"))
    configs = {"plain": base, "spec": EngineConfig(
        model=str(model), connector=KVConnectorConfig(kind="none"), speculative=spec_cfg
    )}
    # One engine per actor process: vLLM 0.32 cannot build a second engine in a process after an ngram one.
    actors: dict[str, Any] = {
        name: ray.remote(EngineActor).options(num_cpus=0, max_concurrency=1000).remote(f"spec-{name}", cfg)
        for name, cfg in configs.items()
    }
    try:
        log(f"starting a plain and a {method} engine")
        await asyncio.gather(*(a.start.remote() for a in actors.values()))
        warm = _spec_batches(10_000, 2)
        for a in actors.values():
            await _spec_round(a, warm, 2, 16, "warm")
        tps: dict[str, list[float]] = {"plain": [], "spec": []}
        lossless = True
        drafted = accepted = steps = 0
        per_request: list[float] = []
        for rep in range(repeats):
            prompts = _spec_batches(rep, groups)
            outs: dict[str, list[dict]] = {}
            for name in ("plain", "spec") if rep % 2 == 0 else ("spec", "plain"):  # alternate: drifting load
                secs, outs[name] = await _spec_round(actors[name], prompts, samples, max_tokens, f"r{rep}")
                tokens = sum(len(o["token_ids"]) for o in outs[name])
                tps[name].append(tokens / secs)
            lossless = lossless and all(
                a["token_ids"] == b["token_ids"] for a, b in zip(outs["plain"], outs["spec"], strict=True)
            )
            for o in outs["spec"]:
                c = o.get("spec") or {}
                drafted += c.get("drafted", 0)
                accepted += c.get("accepted", 0)
                steps += c.get("steps", 0)
                if c.get("drafted"):
                    per_request.append(c["accepted"] / c["drafted"])
            log(f"repeat {rep + 1}/{repeats}: plain {tps['plain'][-1]:.0f} tok/s, {method} {tps['spec'][-1]:.0f} tok/s")
        plain, spec = statistics.median(tps["plain"]), statistics.median(tps["spec"])
        per_request.sort()
        return {
            "method": method,
            "num_speculative_tokens": k,
            "lossless": lossless,
            "speedup": spec / plain if plain > 0 else None,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_tokens_per_step": 1.0 + accepted / steps if steps else 1.0,
            "decode_tokens_per_s": {"plain": plain, "spec": spec},
            "samples_tokens_per_s": {n: sorted(v) for n, v in tps.items()},
            "per_request_acceptance": {
                "requests": len(per_request),
                "min": per_request[0] if per_request else None,
                "median": statistics.median(per_request) if per_request else None,
                "max": per_request[-1] if per_request else None,
            },
            "workload": {
                "groups": groups, "samples_per_group": samples, "max_tokens": max_tokens, "greedy": True,
                "schedule": "per group: one sample first, then its siblings together; same on both engines",
                "repeats": repeats,
            },
        }
    finally:
        for a in actors.values():
            with contextlib.suppress(Exception):  # the actor is killed below either way
                await asyncio.wait_for(a.stop.remote(), timeout=20.0)
            ray.kill(a)


def run_spec_bench(
    *,
    method: str = "group-ngram",
    num_speculative_tokens: int = 8,
    repeats: int = 5,
    groups: int = 4,
    samples: int = 8,
    max_tokens: int = 256,
    model: Path | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Speculative decoding on grouped samples: a plain and a speculative engine (same model, same settings
    otherwise) decode the same greedy grouped workload, ``repeats`` times, alternating which goes first.
    Returns the ``speculative`` object: lossless (every token identical to the plain engine's), speedup
    (median generated tokens/s, speculative over plain), acceptance_rate (accepted / drafted tokens over every
    request, vLLM's per-request counts), method, and the samples behind them. Starts and stops its own Ray
    instance (unless one is running) and both engines."""
    from rollplan.executor.config import SpeculativeConfig

    SpeculativeConfig(method=method, num_speculative_tokens=num_speculative_tokens)  # bad input: fail first
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from rollplan.executor.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="rollplan-spec-") as tmp:
        base = model or build_tiny_model(Path(tmp) / "m0", seed=0)
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            t = time.perf_counter()
            out = asyncio.run(
                _spec_bench(base, method, num_speculative_tokens, repeats, groups, samples, max_tokens, log)
            )
            out["wall_s"] = time.perf_counter() - t
        finally:
            if started_ray:
                ray.shutdown()
    return out
