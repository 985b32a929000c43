"""``EngineActor``: one Ray actor per slot that owns one vLLM ``AsyncLLM`` engine.

The actor is an async Ray actor (``num_cpus=0``, one unit of the slot resource, pinned to the slot's
node); all its methods run on one event loop, so state changes between awaits are atomic. Lifecycle:
see ``rollplan.executor.lifecycle``. Only SERVING admits new requests; a request sent to an engine that
is not SERVING comes back with ``finish_reason == "unavailable"`` (the caller re-routes) instead of an
exception, because that is routine while roles and placements change. Once vLLM's core has died
(``EngineDeadError``), every request raises ``EngineLostError``: the caller treats the engine as lost.

Everything engine-specific is vLLM's: generation and abort (``AsyncLLM.generate``/``abort``), weight
sync (``collective_rpc`` into ``WeightSyncExtension`` -> ``reload_weights``, then
``reset_prefix_cache``), pause/resume around the sync, sleep/wake where the platform supports sleep
mode. On CPU vLLM has no sleep mode: SLEEPING then only means "not routed" and the weights stay
resident; ``info()["sleep_mode"]`` says which one is in effect.

Results cross the Ray boundary as plain dicts (see ``GenerateResult`` in ``rollplan.executor.agent``).

Speculative decoding (``EngineConfig.speculative``): a request whose params name a ``group`` is tagged with it
in its vLLM request id, so the group-ngram proposer drafts from that group's siblings on this engine
(``rollplan.executor.spec``); every result then carries ``spec`` = {drafted, accepted} tokens (vLLM's
per-request spec-decode metrics).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from rollplan.executor.config import EngineConfig
from rollplan.executor.lifecycle import EngineStatus, Lifecycle
from rollplan.models import EngineLostError

log = logging.getLogger(__name__)


def sampling_params(params: dict[str, Any], *, delta: bool = False) -> Any:
    """vLLM ``SamplingParams`` from the plain dict the driver sends.

    Keys: max_tokens, temperature (0 = greedy), top_p, seed, logprobs (bool: return the sampled token's
    logprob), ignore_eos, stop_token_ids. Other keys (e.g. ``group``) are not vLLM's and are ignored here.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=int(params.get("max_tokens", 16)),
        temperature=float(params.get("temperature", 0.0)),
        top_p=float(params.get("top_p", 1.0)),
        seed=params.get("seed"),
        logprobs=0 if params.get("logprobs") else None,
        ignore_eos=bool(params.get("ignore_eos", False)),
        stop_token_ids=list(params.get("stop_token_ids", ())),
        output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
    )


def _spec_counts(metrics: Any) -> dict[str, int]:
    """Drafted and accepted draft tokens of one request (vLLM ``RequestSpecDecodeMetrics``)."""
    accepted = sum(j * c for j, c in enumerate(metrics.histogram))
    return {"drafted": int(metrics.num_draft_tokens), "accepted": int(accepted), "steps": int(sum(metrics.histogram))}


def _chosen_logprobs(completion: Any) -> list[float] | None:
    if completion.logprobs is None:
        return None
    return [float(lp[tok].logprob) for tok, lp in zip(completion.token_ids, completion.logprobs, strict=True)]


def _renice_tree(pid: int, nice: int) -> None:
    """Set the CPU niceness of every thread of ``pid`` and of its child processes (vLLM's engine core is one),
    recursively (Linux niceness is per thread; /proc lists them). Best effort: elsewhere, or without the
    privilege to raise a priority again, the engine keeps what it has (logged)."""
    seen: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError as exc:
                log.debug("renice of %s to %s failed: %s", tid, nice, exc)
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass


class EngineActor:
    """Owns one AsyncLLM. Construct through Ray (see ``rollplan.executor.engine_pool``)."""

    def __init__(self, slot_id: str, config: EngineConfig) -> None:
        # vLLM reads its environment at import: set it before anything imports vllm in this process.
        os.environ.update(config.env_vars())
        self._slot = slot_id
        self._config = config
        self._life = Lifecycle(slot_id)
        self._engine: Any = None
        self._version = 0
        self._inflight: set[str] = set()
        # Aborts that arrived before their request (the abort overtook it): refused on arrival. Bounded.
        self._cancelled: dict[str, None] = {}
        self._sleep_mode = False
        self._started_at = time.time()
        self._dead: str | None = None  # why vLLM's core died, once it has
        self._vids: dict[str, str] = {}  # request id -> vLLM request id, where they differ (group tag)
        self._base_nice: int | None = None
        if config.start_nice:
            self._base_nice = os.getpriority(os.PRIO_PROCESS, 0)
            _renice_tree(os.getpid(), self._base_nice + int(config.start_nice))

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(
        self, weights: bytes | None = None, weights_path: str | None = None, version: int = 0
    ) -> dict:
        """CREATED -> LOADING -> SERVING: import vLLM, build the engine, then load ``weights`` (safetensors
        bytes or path) if given. Returns timings in seconds: import, create, weights, total."""
        self._life.fire("load", time.time())
        t0 = time.perf_counter()
        try:
            if self._config.cpu_threads is not None:
                import torch

                torch.set_num_threads(self._config.cpu_threads)
            from vllm import AsyncEngineArgs
            from vllm.config import KVTransferConfig
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

            t1 = time.perf_counter()
            self._sleep_mode = bool(self._config.sleep_mode and current_platform.is_sleep_mode_available())
            kwargs = self._config.engine_kwargs(sleep_mode_available=self._sleep_mode)
            if "kv_transfer_config" in kwargs:
                kwargs["kv_transfer_config"] = KVTransferConfig(**kwargs["kv_transfer_config"])
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
            t2 = time.perf_counter()
            if weights is not None or weights_path is not None:
                await self._engine.collective_rpc(
                    "rollplan_reload_weights", kwargs={"data": weights, "path": weights_path}
                )
                await self._engine.reset_prefix_cache()
            self._version = version
            t3 = time.perf_counter()
        except BaseException:
            self._life.fire("stop", time.time())
            self._shutdown_engine()
            raise
        finally:
            if self._base_nice is not None:  # serving (or failed): back to the normal priority
                _renice_tree(os.getpid(), self._base_nice)
                self._base_nice = None
        self._life.fire("ready", time.time())
        return {"import": t1 - t0, "create": t2 - t1, "weights": t3 - t2, "total": t3 - t0}

    async def sleep(self) -> float:
        """SERVING -> SLEEPING. With vLLM sleep mode: offload weights, drop KV (level 1). Without (CPU): the
        engine stays resident and is simply not routed to. Returns seconds."""
        self._life.require(EngineStatus.SERVING, action="sleep")
        t = time.perf_counter()
        if self._sleep_mode:
            await self._engine.sleep(level=1)
        self._life.fire("sleep", time.time())
        return time.perf_counter() - t

    async def wake(self) -> float:
        """SLEEPING -> SERVING. Returns seconds."""
        self._life.require(EngineStatus.SLEEPING, action="wake")
        t = time.perf_counter()
        if self._sleep_mode:
            await self._engine.wake_up()
        self._life.fire("wake", time.time())
        return time.perf_counter() - t

    async def drain(self) -> int:
        """SERVING/SLEEPING -> DRAINING: refuse new requests. Returns the number still in flight."""
        self._life.fire("drain", time.time())
        return len(self._inflight)

    async def undrain(self) -> None:
        self._life.fire("undrain", time.time())

    async def stop(self) -> float:
        """Any state -> STOPPED: abort in-flight requests and shut the engine down. Idempotent."""
        if self._life.state is EngineStatus.STOPPED:
            return 0.0
        t = time.perf_counter()
        self._life.fire("stop", time.time())
        if self._engine is not None and self._inflight:
            await self._engine.abort([self._vids.get(r, r) for r in self._inflight])
        self._shutdown_engine()
        return time.perf_counter() - t

    def _shutdown_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

    # -- requests ----------------------------------------------------------------------------------------
    def _vllm_id(self, request_id: str, params: dict[str, Any]) -> str:
        """The id vLLM sees: tagged with the request's ``group`` when group-ngram drafting is on."""
        group = params.get("group")
        spec = self._config.speculative
        if group is None or spec is None or spec.method != "group-ngram":
            return request_id
        from rollplan.executor.spec import group_request_id

        vid = self._vids[request_id] = group_request_id(request_id, str(group))
        return vid
    async def generate(
        self, request_id: str, prompt_ids: list[int], params: dict[str, Any]
    ) -> dict[str, Any]:
        """Run one request to completion (or abort). Returns a plain dict:

        token_ids, logprobs (None unless asked), finish_reason ("stop" | "length" | "abort" |
        "unavailable"), num_cached_tokens (prefix cache + KV loaded through the connector),
        prompt_tokens, seconds, slot, weights_version (when it finished) and first_weights_version (when
        it was admitted: they differ when a weight update happened while the request was in flight; it
        then carried on with the new weights, see ``update_weights``). On abort, ``token_ids`` holds the
        tokens made so far.
        """
        t = time.perf_counter()
        first_version = self._version
        self._check_alive()
        if not self._life.state.accepts_requests:
            return self._unavailable(prompt_ids)
        if self._cancelled.pop(request_id, 0) is None:
            return {**self._unavailable(prompt_ids), "finish_reason": "abort"}
        self._inflight.add(request_id)
        last = None
        try:
            async for out in self._engine.generate(
                {"prompt_token_ids": list(prompt_ids)}, sampling_params(params), self._vllm_id(request_id, params)
            ):
                last = out
        except Exception as exc:
            self._raise_if_dead(exc)
            raise
        finally:
            self._inflight.discard(request_id)
            self._vids.pop(request_id, None)
        if last is None:  # aborted before the engine produced any output
            return {
                **self._unavailable(prompt_ids),
                "finish_reason": "abort",
                "seconds": time.perf_counter() - t,
            }
        comp = last.outputs[0]
        spec = getattr(comp, "spec_decode_metrics", None)
        return {
            "spec": None if spec is None else _spec_counts(spec),
            "token_ids": list(comp.token_ids),
            "logprobs": _chosen_logprobs(comp),
            "finish_reason": str(comp.finish_reason or "abort"),
            "num_cached_tokens": int(last.num_cached_tokens or 0),
            "prompt_tokens": len(prompt_ids),
            "seconds": time.perf_counter() - t,
            "slot": self._slot,
            "weights_version": self._version,
            "first_weights_version": first_version,
        }

    async def generate_stream(self, request_id: str, prompt_ids: list[int], params: dict[str, Any]):
        """Streaming variant (call with ``num_returns="streaming"``): yields dicts with the new
        ``token_ids`` (and ``logprobs``) of each engine step; the last one carries ``finish_reason``."""
        self._check_alive()
        if not self._life.state.accepts_requests:
            yield self._unavailable(prompt_ids)
            return
        self._inflight.add(request_id)
        try:
            async for out in self._guard(
                self._engine.generate(
                    {"prompt_token_ids": list(prompt_ids)},
                    sampling_params(params, delta=True),
                    self._vllm_id(request_id, params),
                )
            ):
                comp = out.outputs[0]
                yield {
                    "token_ids": list(comp.token_ids),
                    "logprobs": _chosen_logprobs(comp),
                    "finish_reason": str(comp.finish_reason) if out.finished else None,
                    "num_cached_tokens": int(out.num_cached_tokens or 0),
                    "slot": self._slot,
                    "weights_version": self._version,
                }
        finally:
            self._inflight.discard(request_id)
            self._vids.pop(request_id, None)

    async def generate_many(
        self, prompts: list[list[int]], params: dict[str, Any], groups: list[str] | None = None
    ) -> dict[str, Any]:
        """Run a batch of requests concurrently (measurement helper: no per-request Ray round trip).
        ``groups``: one group per prompt (speculative group drafting), else ``params``' own.
        Returns seconds (wall) and per-request outputs as in ``generate``."""
        t = time.perf_counter()
        stamp = f"{self._slot}-batch-{time.monotonic_ns()}"
        per = [params] * len(prompts) if groups is None else [{**params, "group": g} for g in groups]
        outs = await asyncio.gather(
            *(self.generate(f"{stamp}-{i}", p, per[i]) for i, p in enumerate(prompts))
        )
        return {"seconds": time.perf_counter() - t, "outputs": list(outs)}

    async def time_mixed_steps(
        self, decode_prompts: list[list[int]], prefill_groups: list[list[list[int]]], *, warm_steps: int = 6,
        gap_steps: int = 3,
    ) -> dict[str, Any]:
        """Measurement helper for mixed steps (``rollplan bench executor``): run ``decode_prompts`` as greedy
        decodes (ignore_eos, streamed), and once they have made ``warm_steps`` tokens submit each group of
        ``prefill_groups`` in turn (its prompts at once, ``max_tokens=1``), the next group ``gap_steps``
        decode tokens after the previous one finished; then abort the decodes. vLLM schedules new prompts as
        chunks in the same forward pass as the running decodes, so the gap between two token arrivals of a
        decode that brackets a group's first tokens is one mixed step (a group within the step's token budget).

        Returns (times: ``time.perf_counter`` seconds in this actor) ``decode``: ``[(time, new tokens), ...]``
        of the first decode's outputs; ``decode_tokens``: tokens each decode made; ``prefills``: per group
        ``{"submitted", "first_done", "done", "prompt_tokens": [...], "cached_tokens": [...]}`` (``first_done`` /
        ``done``: when its first / last prompt's token arrived)."""
        self._check_alive()
        self._life.require(EngineStatus.SERVING, action="time_mixed_steps")
        stamp = f"{self._slot}-mixed-{time.monotonic_ns()}"
        budget = warm_steps + len(prefill_groups) * (gap_steps + 4) + 8
        arrivals: list[tuple[float, int]] = []
        made = [0] * len(decode_prompts)
        progress = asyncio.Event()
        dec_params = sampling_params({"max_tokens": budget, "ignore_eos": True}, delta=True)
        ids = [f"{stamp}-d{i}" for i in range(len(decode_prompts))]

        async def decode(i: int, prompt: list[int]) -> None:
            self._inflight.add(ids[i])
            try:
                async for out in self._guard(self._engine.generate({"prompt_token_ids": prompt}, dec_params, ids[i])):
                    n = len(out.outputs[0].token_ids)
                    made[i] += n
                    if i == 0:
                        arrivals.append((time.perf_counter(), n))
                        progress.set()
            finally:
                self._inflight.discard(ids[i])

        async def prefill(rid: str, prompt: list[int]) -> tuple[int, float]:
            last = None
            async for out in self._guard(
                    self._engine.generate({"prompt_token_ids": prompt}, sampling_params({"max_tokens": 1}), rid)):
                last = out
            return (int(last.num_cached_tokens or 0) if last is not None else 0), time.perf_counter()

        async def until(tokens: int) -> None:
            while made[0] < tokens and not tasks[0].done():
                progress.clear()
                await progress.wait()

        tasks = [asyncio.ensure_future(decode(i, list(p))) for i, p in enumerate(decode_prompts)]
        tasks[0].add_done_callback(lambda _t: progress.set())  # a decode that ended wakes ``until``
        prefills: list[dict[str, Any]] = []
        try:
            await until(warm_steps)
            for j, group in enumerate(prefill_groups):
                t = time.perf_counter()
                res = await asyncio.gather(*(prefill(f"{stamp}-p{j}-{k}", list(p)) for k, p in enumerate(group)))
                prefills.append({"submitted": t, "first_done": min(d for _, d in res), "done": max(d for _, d in res),
                                 "prompt_tokens": [len(p) for p in group], "cached_tokens": [c for c, _ in res]})
                await until(made[0] + gap_steps)
        finally:
            await self._engine.abort([r for r in ids if r in self._inflight])
            await asyncio.gather(*tasks, return_exceptions=True)
        return {"decode": arrivals, "decode_tokens": made, "prefills": prefills}

    async def abort(self, request_ids: list[str]) -> list[str]:
        """Abort requests; returns those that were in flight here (the others are ignored)."""
        live = [r for r in request_ids if r in self._inflight]
        for r in request_ids:
            if r not in self._inflight:
                self._cancelled[r] = None
        while len(self._cancelled) > 4096:
            self._cancelled.pop(next(iter(self._cancelled)))
        if live and self._engine is not None:
            await self._engine.abort([self._vids.get(r, r) for r in live])
        return live

    # -- engine death ------------------------------------------------------------------------------------
    def _raise_if_dead(self, exc: BaseException) -> None:
        """vLLM's core died (``EngineDeadError``): remember it and raise ``EngineLostError`` instead, which
        callers handle like a lost actor. Any other error is the caller's to handle."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(exc, EngineDeadError) or self._dead is not None:
            if self._dead is None:
                self._dead = f"{type(exc).__name__}: {exc}"
                log.error("engine on slot %s died: %s", self._slot, self._dead)
            raise EngineLostError(
                f"the vLLM engine on slot {self._slot} died ({self._dead})",
                fix="nothing: the executor restarts or replaces it; see the engine's log for the cause",
                slot=self._slot,
            ) from exc

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineLostError(f"the vLLM engine on slot {self._slot} died ({self._dead})", slot=self._slot)

    async def _guard(self, stream: Any) -> AsyncIterator[Any]:
        """``stream``'s items; vLLM's core dying on the way becomes ``EngineLostError``."""
        try:
            async for out in stream:
                yield out
        except Exception as exc:
            self._raise_if_dead(exc)
            raise

    def _unavailable(self, prompt_ids: list[int]) -> dict[str, Any]:
        return {
            "token_ids": [],
            "logprobs": None,
            "finish_reason": "unavailable",
            "num_cached_tokens": 0,
            "prompt_tokens": len(prompt_ids),
            "seconds": 0.0,
            "slot": self._slot,
            "weights_version": self._version,
            "first_weights_version": self._version,
            "state": self._life.state.value,
        }

    # -- weights -----------------------------------------------------------------------------------------
    async def pause(self) -> None:
        """Freeze scheduling before a weight sync: vLLM ``pause_generation(mode="keep")``, so in-flight
        requests keep their place (none is aborted) and carry on after ``resume``; caches are kept here
        and reset by ``reset_cache`` once the new weights are in."""
        self._life.require(EngineStatus.SERVING, EngineStatus.SLEEPING, EngineStatus.DRAINING, action="pause")
        await self._engine.pause_generation(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        await self._engine.resume_generation()

    async def reload_weights(
        self, data: bytes | None = None, path: str | None = None, version: int = 0
    ) -> float:
        """Install new weights in place (``collective_rpc`` -> worker ``reload_weights``). Returns seconds.

        Does not reset caches: call ``reset_cache`` after every engine sharing a KV store has reloaded and
        the store is cleared (stale KV must not be loaded back)."""
        self._life.require(
            EngineStatus.SERVING, EngineStatus.SLEEPING, EngineStatus.DRAINING, action="reload_weights"
        )
        t = time.perf_counter()
        await self._engine.collective_rpc("rollplan_reload_weights", kwargs={"data": data, "path": path})
        self._version = version
        return time.perf_counter() - t

    async def reset_cache(self) -> bool:
        """Drop the prefix cache; running requests are preempted and recompute their KV (new weights)."""
        return bool(await self._engine.reset_prefix_cache(reset_running_requests=True))

    async def update_weights(
        self, data: bytes | None = None, path: str | None = None, version: int = 0
    ) -> float:
        """pause -> reload -> reset cache -> resume, for a single engine (no shared KV store to clear)."""
        t = time.perf_counter()
        await self.pause()
        try:
            await self.reload_weights(data, path, version)
            await self.reset_cache()
        finally:
            await self.resume()
        return time.perf_counter() - t

    # -- introspection -----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        import ray

        kv_tokens = None
        if self._engine is not None:
            cache = self._engine.vllm_config.cache_config
            if cache.num_gpu_blocks:
                kv_tokens = int(cache.num_gpu_blocks) * int(cache.block_size)
        return {
            "slot": self._slot,
            "kv_capacity_tokens": kv_tokens,
            "state": self._life.state.value,
            "weights_version": self._version,
            "inflight": len(self._inflight),
            "sleep_mode": self._sleep_mode,
            "speculative": None if self._config.speculative is None else self._config.speculative.method,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "history": [(t, e, s.value) for t, e, s in self._life.history],
        }

    def ping(self) -> str:
        return self._life.state.value
