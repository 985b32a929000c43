"""The agent loop: multi-turn trajectories driven against routed engines.

One trajectory: generate (on the engine the router picks) -> ``await env.step(turn)`` -> append the
observation's tokens to the context -> generate ... until the env says done, ``max_turns`` is reached or
the context hits the engine's maximum length. A generation interrupted by a migration (abort) or a lost
engine resumes on the next routed engine with the context plus the tokens made so far and the token
budget reduced accordingly: under greedy sampling the turn's tokens equal an uninterrupted run.

The loop knows nothing about plans: a ``Router`` (the controller) tells it where to run and may interrupt
it. Types here are the public result types of ``RolloutExecutor.rollout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollplan.models import EngineLostError, ExecutorError, Phase

log = logging.getLogger(__name__)

MAX_INTERRUPTIONS = 1000
"""A turn interrupted (migrated, engine lost, engine not serving) more often than this fails its trajectory."""


# -- inputs ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """Per-turn sampling. ``temperature`` 0 = greedy. ``logprobs``: return the sampled tokens' logprobs."""

    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def params(self, max_tokens: int) -> dict[str, Any]:
        """The plain dict ``EngineActor.generate`` takes, with the turn's remaining ``max_tokens``."""
        return {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "logprobs": self.logprobs,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids),
        }


@dataclass(frozen=True, slots=True)
class RolloutItem:
    """One trajectory to run. ``prompt``: token ids, or text (chat-templated as one user message when
    ``chat`` is true, plainly tokenized otherwise). ``group``: GRPO group (siblings of one prompt)."""

    id: str
    prompt: str | tuple[int, ...]
    group: str = ""
    max_turns: int = 4
    sampling: SamplingConfig = SamplingConfig()
    chat: bool = True
    data: Any = None


@dataclass(frozen=True, slots=True)
class TurnOutput:
    """What the env sees after a generation: the turn's tokens and text, and the whole context so far."""

    item: RolloutItem
    turn: int
    token_ids: tuple[int, ...]
    text: str
    context: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True, slots=True)
class Observation:
    """The env's answer: tokens or text to append (text is tokenized without special tokens), whether
    the trajectory is done, and an optional reward."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    done: bool = False
    reward: float | None = None


class Env(Protocol):
    """A (tool) environment for one trajectory. ``step`` may take seconds (tool calls); raising marks the
    trajectory failed with the error, the others carry on."""

    async def step(self, turn: TurnOutput) -> Observation: ...


EnvFactory = Callable[[RolloutItem], Env]


# -- results -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn. ``engines``: slots that generated its tokens, in order (several after a migration).
    ``prefill_slot``: the PREFILL slot that prefilled it (P/D), if any. ``num_cached_tokens``: KV the
    (last) engine did not compute itself (prefix cache or loaded through the KV connector).
    ``weights_version``: the weights version of its last token. ``weights_versions``: the engine's
    versions from the admission of the turn's request to its end, oldest first: one entry, unless a weight
    update happened while the turn was in flight (the turn then carried on with the new weights, nothing
    regenerated; a request that only waited at the paused engine lists the old version too)."""

    index: int
    context_tokens: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str
    engines: tuple[str, ...]
    prefill_slot: str | None
    num_cached_tokens: int
    weights_version: int
    started: float
    generate_seconds: float
    tool_seconds: float
    observation_ids: tuple[int, ...] = ()
    interruptions: int = 0
    weights_versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TrajectoryResult:
    """A finished trajectory. ``status``: "done" (env said done), "max_turns", "truncated" (context hit the
    model length) or "failed" (``error`` holds the env's or the executor's error). ``token_ids``: the
    whole context (prompt, generations, observations); ``prompt_len`` marks where the prompt ends."""

    id: str
    group: str
    status: str
    token_ids: tuple[int, ...]
    prompt_len: int
    turns: tuple[TurnRecord, ...]
    started: float
    finished: float
    error: str | None = None
    reward: float | None = None

    @property
    def engines(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.turns:
            for e in t.engines:
                seen[e] = None
        return tuple(seen)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    @property
    def completion_ids(self) -> tuple[int, ...]:
        return self.token_ids[self.prompt_len :]

    @property
    def ok(self) -> bool:
        return self.status != "failed"


# -- the loop ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class TrajectoryRun:
    """Mutable driver-side state of one running trajectory (owned by the controller and the loop)."""

    item: RolloutItem
    prompt_ids: list[int]
    context: list[int]
    phase: Phase = Phase.PREFILL_PENDING
    home: str | None = None  # slot whose engine holds this trajectory's KV
    placement: str | None = None  # where the next generation should run
    kv_move: bool = False  # the pending move home -> placement should carry KV (connector) if it can
    request_id: str | None = None
    request_slot: str | None = None
    partial: list[int] = field(default_factory=list)  # tokens of the current turn so far
    turn: int = 0
    generated: int = 0
    tool_seconds: float = 0.0
    tool_until: float | None = None
    observation_tokens: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    interruptions: int = 0
    finished_count: int = 0
    started: float = 0.0

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def group(self) -> str:
        return self.item.group or self.item.id


@dataclass(frozen=True, slots=True)
class Route:
    """Where one generation attempt runs: ``slot`` (with its engine handle), optionally ``prefill_slot``
    (P/D: prefill there first, KV through the connector) and ``export_from`` (KV migration: re-store the
    context's KV from the old engine first)."""

    slot: str
    engine: Any
    prefill_slot: str | None = None
    prefill_engine: Any = None
    export_from: str | None = None
    export_engine: Any = None


class Router(Protocol):
    """What the loop needs from the controller."""

    def clock(self) -> float: ...

    async def route(self, run: TrajectoryRun) -> Route: ...

    def engine_failed(self, slot: str, exc: BaseException, engine: Any = None) -> None: ...

    def attempt_started(self, run: TrajectoryRun, slot: str) -> None: ...

    def kv_export_failed(self, run: TrajectoryRun, slot: str | None, exc: BaseException) -> None: ...

    def turn_finished(self, run: TrajectoryRun, record: TurnRecord) -> None: ...

    def trajectory_finished(self, run: TrajectoryRun, result: TrajectoryResult) -> None: ...

    def weights_gate(self) -> asyncio.Event: ...


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def prompt_ids(item: RolloutItem, tokenizer: Any) -> list[int]:
    """Token ids of ``item.prompt`` (chat template for text when ``item.chat``)."""
    if not isinstance(item.prompt, str):
        return list(item.prompt)
    if item.chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": item.prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in recent transformers
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(item.prompt, add_special_tokens=False))


def _is_engine_lost(exc: BaseException) -> bool:
    """The engine behind a request is gone: its actor died (node lost) or its vLLM core did (the actor
    raises ``EngineLostError``; Ray re-raises it as a ``RayTaskError`` that is also an instance of it)."""
    import ray.exceptions

    if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError | EngineLostError):
        return True
    return isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, EngineLostError)


class AgentLoop:
    """Runs trajectories against a ``Router``. ``max_model_len`` caps every context."""

    def __init__(self, router: Router, tokenizer: Any, *, max_model_len: int) -> None:
        self.router = router
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    async def run(self, run: TrajectoryRun, env: Env) -> TrajectoryResult:
        """Run one trajectory to the end. Env errors end it as failed; engine losses are retried."""
        item = run.item
        run.started = self.router.clock()
        status, error, reward = "max_turns", None, None
        try:
            while run.turn < item.max_turns:
                record = await self._generate_turn(run)
                if len(run.context) >= self.max_model_len - 1:
                    run.turns.append(record)
                    self.router.turn_finished(run, record)
                    status = "truncated"
                    break
                run.phase = Phase.IN_TOOL
                t0 = self.router.clock()
                text = self.tokenizer.decode(record.token_ids, skip_special_tokens=True)
                obs = await env.step(
                    TurnOutput(
                        item, run.turn, record.token_ids, text, tuple(run.context), record.finish_reason
                    )
                )
                tool_s = self.router.clock() - t0
                run.tool_seconds += tool_s
                obs_ids: tuple[int, ...] = ()
                if not obs.done:
                    if obs.token_ids is not None:
                        obs_ids = tuple(obs.token_ids)
                    elif obs.text:
                        obs_ids = tuple(self.tokenizer.encode(obs.text, add_special_tokens=False))
                record = _replace_turn(record, tool_seconds=tool_s, observation_ids=obs_ids)
                run.turns.append(record)
                run.observation_tokens += len(obs_ids)
                run.context.extend(obs_ids)
                run.turn += 1
                self.router.turn_finished(run, record)
                if obs.reward is not None:
                    reward = obs.reward
                if obs.done:
                    status = "done"
                    break
                if len(run.context) >= self.max_model_len - 1:
                    status = "truncated"
                    break
                run.phase = Phase.PREFILL_PENDING
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # env errors (and executor errors) fail this trajectory only
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            log.info("trajectory %s failed: %s", run.id, error)
        run.phase = Phase.DONE
        run.finished_count += 1
        result = TrajectoryResult(
            id=run.id,
            group=run.group,
            status=status,
            token_ids=tuple(run.context),
            prompt_len=len(run.prompt_ids),
            turns=tuple(run.turns),
            started=run.started,
            finished=self.router.clock(),
            error=error,
            reward=reward,
        )
        self.router.trajectory_finished(run, result)
        return result

    async def _generate_turn(self, run: TrajectoryRun) -> TurnRecord:
        item = run.item
        start = self.router.clock()
        context_len = len(run.context)
        budget = item.sampling.max_tokens
        run.partial = []
        logprobs: list[float] | None = [] if item.sampling.logprobs else None
        engines: list[str] = []
        prefill_slot, cached, version, finish, attempt = None, 0, 0, "length", 0
        interruptions = 0
        versions: list[int] = []
        while len(run.partial) < budget:
            if interruptions > MAX_INTERRUPTIONS:
                raise ExecutorError(
                    f"turn {run.turn} interrupted {interruptions} times", fix="check the engines' logs"
                )
            await self.router.weights_gate().wait()
            route = await self.router.route(run)
            prompt = run.context + run.partial
            room = self.max_model_len - len(prompt)
            if room <= 0:
                finish = "length"
                break
            want = min(budget - len(run.partial), room)
            rid = f"{run.id}:t{run.turn}:a{attempt}"
            attempt += 1
            if route.export_engine is not None:
                # KV migration: the old engine re-stores this context's KV through the connector. If it
                # fails (engine gone meanwhile), the target simply recomputes: same tokens, more time.
                try:
                    await route.export_engine.generate.remote(rid + ":x", prompt, {"max_tokens": 1})
                except Exception as exc:
                    self.router.kv_export_failed(run, route.export_from, exc)
                run.kv_move = False
            self.router.attempt_started(run, route.slot)
            try:
                if route.prefill_engine is not None:
                    try:
                        pre = await route.prefill_engine.generate.remote(
                            rid + ":p", prompt, {"max_tokens": 1}
                        )
                    except Exception as exc:
                        if not _is_engine_lost(exc):
                            raise
                        self.router.engine_failed(route.prefill_slot or "", exc, route.prefill_engine)
                    else:
                        if pre["finish_reason"] in ("stop", "length"):
                            prefill_slot = route.prefill_slot
                run.phase = Phase.DECODING
                run.request_id, run.request_slot = rid, route.slot
                out = await route.engine.generate.remote(rid, prompt, item.sampling.params(want))
            except Exception as exc:
                if not _is_engine_lost(exc):
                    raise
                self.router.engine_failed(route.slot, exc, route.engine)
                interruptions += 1
                continue
            finally:
                run.request_id = run.request_slot = None
            new = out["token_ids"]
            if out["finish_reason"] == "unavailable":
                interruptions += 1
                await asyncio.sleep(0.05)  # routing changed under us: ask again
                continue
            run.partial.extend(new)
            run.generated += len(new)
            run.home = route.slot
            if new or out["finish_reason"] != "abort":
                engines.append(route.slot)
            if logprobs is not None and out["logprobs"] is not None:
                logprobs.extend(out["logprobs"])
            cached = int(out["num_cached_tokens"])
            version = int(out["weights_version"])
            if new:
                for v in (int(out.get("first_weights_version", version)), version):
                    if not versions or versions[-1] != v:
                        versions.append(v)
            finish = out["finish_reason"]
            if finish in ("stop", "length"):
                break
            if finish != "abort":  # e.g. vLLM's "error": retrying would not help
                raise ExecutorError(f"engine on slot {route.slot} ended a request with {finish!r}")
            interruptions += 1  # aborted: migrated or drained; resume where the router says
        tokens = tuple(run.partial)
        run.context.extend(tokens)
        run.partial = []
        run.interruptions += interruptions
        return TurnRecord(
            index=run.turn,
            context_tokens=context_len,
            token_ids=tokens,
            logprobs=tuple(logprobs) if logprobs is not None else None,
            finish_reason=finish,
            engines=tuple(engines),
            prefill_slot=prefill_slot,
            num_cached_tokens=cached,
            weights_version=version,
            weights_versions=tuple(versions) or (version,),
            started=start,
            generate_seconds=self.router.clock() - start,
            tool_seconds=0.0,
            interruptions=interruptions,
        )


def _replace_turn(rec: TurnRecord, **kw: Any) -> TurnRecord:
    from dataclasses import replace

    return replace(rec, **kw)
