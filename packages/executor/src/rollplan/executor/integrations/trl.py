"""TRL drop-in: ``GRPOTrainer(rollout_func=RollplanRollout(...))`` runs TRL's rollouts on rollplan's executor.

    executor = RolloutExecutor(ExecutorConfig(engine=EngineConfig(model=model_dir)))
    with RollplanRollout(executor, env=lambda item: ToyToolEnv(item), max_turns=2, lend=True) as rollout:
        rollout.start(warm_up=1)                        # Ray, tokenizer, planning loop, one engine
        trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=GRPOConfig(...),
                              train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)
        trainer.train()
    # leaving the block shuts the executor down (every engine actor it started) and stops its loop

The contract of TRL 1.16's ``rollout_func`` (``trl/trainer/grpo_trainer.py``: ``RolloutFunc``, ``_generate``),
as the trainer really calls it: ``rollout_func(prompts, trainer) -> dict`` is called once per generation
batch (every ``steps_per_generation * num_iterations`` optimizer steps) from the training loop, which
waits for it. ``prompts`` is this process's slice of the batch as TRL's ``RepeatSampler`` made it: each
dataset prompt ``num_generations`` times in a row (``num_generations_eval`` in eval mode), as text or as
chat messages. The dict must hold, per input prompt and in its order, ``prompt_ids`` and
``completion_ids`` (lists of token ids) and ``logprobs`` (the sampling log-prob of every completion
token); an optional ``env_mask`` (1 on the model's tokens, 0 on tokens an environment inserted) becomes
TRL's ``tool_mask`` and keeps those tokens out of the loss; every other key is passed, per completion,
to the reward functions as a keyword argument. (TRL's docstring says the prompts come "with no
duplication"; the 1.16 code passes them repeated, and the rewards, extra fields and advantages are
indexed per input row, so one completion per input row is what works.) With ``use_vllm=False`` TRL pushes
no weights itself: ``self._last_loaded_step`` is only kept for its own vLLM backends.

What this adapter does per call: every run of ``num_generations`` identical prompts becomes one GRPO
group (``RolloutItem.group``), one ``RolloutItem`` per input row; ``RolloutExecutor.rollout`` runs them
(multi-turn with ``env``: generate -> tool -> observation -> generate ...); the completion is everything
after the prompt (the model's turns and the observations), ``env_mask`` is 0 exactly on the observation
tokens, ``logprobs`` are the engines' sampling log-probs (0.0 on observation tokens, which the mask
drops). Before the rollout it pushes the trainer's weights when ``trainer.state.global_step`` moved since
the last push (``update_weights(state_dict, version=global_step)``: the engines serve the model's
checkpoint as version 0); with ``lend`` it lends the training node's slots for the rollout and reclaims
them before returning to the optimizer step. Extra keys for the reward functions: ``env_reward`` (the
env's reward, None where it gave none), ``trajectory_status``, ``num_turns`` and ``weights_version``
(the weights that generated each completion's last turn). ``env_reward`` (below) is a ready TRL reward
function that returns the env's reward.

Bad input is refused with one line (``TrlRolloutError``, a ``UserInputError``; "To fix: ...") before any
engine is touched: prompts that do not come as runs of ``num_generations`` (a sampler other than TRL's,
or a ``num_generations`` the batch cannot hold), a trainer on several processes, a prompt longer than the
engines' ``max_model_len``, and a call before the executor was started (``RolloutNotStartedError``).

trl is never imported here at run time (only for type checking): the adapter works on whatever object
TRL passes as ``trainer`` through the attributes named above.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from rollplan.executor.agent import (
    EnvFactory,
    Observation,
    RolloutItem,
    SamplingConfig,
    TrajectoryResult,
    TurnOutput,
    prompt_ids,
)
from rollplan.models import UserInputError

if TYPE_CHECKING:
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rollplan.executor.executor import RolloutExecutor

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "BackgroundLoop",
    "RolloutCall",
    "RolloutNotStartedError",
    "RollplanRollout",
    "TrlRolloutError",
    "env_reward",
]


class TrlRolloutError(UserInputError):
    """A ``rollout_func`` call rollplan cannot serve as asked (refused before any engine is touched)."""


class RolloutNotStartedError(TrlRolloutError):
    """The trainer called the rollout before the executor was started."""


# -- an event loop for a synchronous caller ---------------------------------------------------------------
class BackgroundLoop:
    """An asyncio event loop on a daemon thread: TRL's training loop is synchronous, the executor is async
    and must live on one loop for its whole life (its planning and polling tasks run there)."""

    def __init__(self, name: str = "rollplan-trl-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's own)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BackgroundLoop.run called from its own loop thread: await the coroutine")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()  # a timeout or a KeyboardInterrupt must not leave the rollout running
            raise

    def close(self) -> None:
        """Stop the loop and join its thread (pending tasks are cancelled first)."""
        if self.loop.is_closed():
            return

        async def _cancel_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.run(_cancel_rest(), timeout=30.0)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout=30.0)
        if not self._thread.is_alive():
            self.loop.close()


# -- the adapter ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RolloutCall:
    """What one ``rollout_func`` call did. ``pushed``: the weights version pushed before it (None: no
    push). ``lent``: the slots lent for it (and reclaimed before it returned)."""

    step: int
    prompts: int
    groups: int
    num_generations: int
    pushed: int | None
    lent: tuple[str, ...]
    statuses: Mapping[str, int]
    seconds: float
    push_seconds: float


class _SingleTurn:
    """No env: the trajectory ends after the model's first turn."""

    async def step(self, turn: TurnOutput) -> Observation:
        return Observation(done=True)


def _single_turn(item: RolloutItem) -> _SingleTurn:
    return _SingleTurn()


def env_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """A TRL reward function: the reward the env gave each trajectory (None where it gave none, which TRL
    treats as unscorable). Use with ``RollplanRollout`` only (it passes ``env_reward``)."""
    rewards = kwargs.get("env_reward")
    if rewards is None:
        raise TrlRolloutError(
            "env_reward got no 'env_reward' column",
            fix="use env_reward only with GRPOTrainer(rollout_func=RollplanRollout(...))",
        )
    return [None if r is None else float(r) for r in rewards]


class RollplanRollout:
    """A TRL ``GRPOTrainer`` ``rollout_func`` on a ``RolloutExecutor`` (contract: the module docstring).

    ``env``: a factory of envs (``RolloutItem -> Env``) for multi-turn trajectories; None = single turn.
    ``sampling``: per-turn sampling (``max_tokens`` is per turn); None = from the trainer's args
    (``max_completion_length``, ``temperature``, ``top_p``). Log-probs are always requested. ``seed``: a
    base seed; each trajectory gets its own seed from it, the call count and its row (None: the
    sampling's seed if set, else unseeded). ``max_turns``: default 4 with an env, 1 without. ``chat``:
    text prompts get the chat template (chat-message prompts always do). ``lend``: lend these slots (True:
    every ``executor.lendable_slots()``) for each rollout, until ``lend_seconds`` from its start, and
    reclaim them with ``reclaim_seconds`` of drain time before returning. ``push_weights``: push the
    trainer's weights when its global step moved. ``loop``: the loop the executor runs on, if the caller
    made one (default: the adapter makes its own; ``start``/``run`` use it). ``timeout``: seconds one
    call may take (None: no limit).
    """

    def __init__(
        self,
        executor: RolloutExecutor,
        *,
        env: EnvFactory | None = None,
        sampling: SamplingConfig | None = None,
        max_turns: int | None = None,
        chat: bool = False,
        seed: int | None = None,
        lend: bool | Sequence[str] = False,
        lend_seconds: float = 600.0,
        reclaim_seconds: float = 10.0,
        push_weights: bool = True,
        loop: BackgroundLoop | None = None,
        timeout: float | None = None,
    ) -> None:
        self.executor = executor
        self.env = env
        self.sampling = sampling
        self.max_turns = max_turns if max_turns is not None else (4 if env is not None else 1)
        self.chat = chat
        self.seed = seed
        self.lend = lend
        self.lend_seconds = lend_seconds
        self.reclaim_seconds = reclaim_seconds
        self.push_weights = push_weights
        self.timeout = timeout
        self._own_loop = loop is None
        self._loop = loop
        self._started_here = False
        self._pushed_step = 0  # the engines start on the checkpoint: the trainer's step 0
        self.calls: list[RolloutCall] = []
        self.pushes: list[int] = []
        self.last_results: list[TrajectoryResult] = []

    # -- life cycle ---------------------------------------------------------------------------------------
    @property
    def loop(self) -> BackgroundLoop:
        if self._loop is None:
            self._loop = BackgroundLoop()
        return self._loop

    @property
    def started(self) -> bool:
        return self.executor.controller is not None and self._loop is not None and self._loop.running

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the executor's loop (e.g. ``rollout.run(executor.warm_up(count=2))``)."""
        return self.loop.run(coro, timeout)

    def start(self, *, warm_up: int | Sequence[str] | None = None, timeout: float = 600.0) -> None:
        """Start the executor on the loop (Ray, tokenizer, planning loop); ``warm_up``: start that many
        engines (or engines on those slots) now rather than when the first rollout plans them."""
        self._started_here = True  # even a start that fails half-way is shut down by close()
        self.run(self.executor.start(), timeout)
        if isinstance(warm_up, int):
            self.run(self.executor.warm_up(count=warm_up, timeout=timeout), timeout + 5.0)
        elif warm_up is not None:
            self.run(self.executor.warm_up(list(warm_up), timeout=timeout), timeout + 5.0)

    def close(self) -> None:
        """Shut the executor down if ``start`` started it (every engine actor it started), and stop the
        loop if the adapter made it. Idempotent."""
        if self._loop is None:
            return
        try:
            if self._started_here and self._loop.running:
                self._loop.run(self.executor.shutdown(), timeout=120.0)
        finally:
            self._started_here = False
            if self._own_loop:
                self._loop.close()
                self._loop = None

    def __enter__(self) -> RollplanRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the rollout_func ---------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        t0 = time.perf_counter()
        g = _num_generations(trainer)
        groups = _groups(prompts, g, _num_processes(trainer))
        if not self.started:
            raise RolloutNotStartedError(
                "rollout_func was called but the rollplan executor is not started",
                fix="call rollout.start() (or rollout.run(executor.start())) before trainer.train()",
            )
        step = int(trainer.state.global_step)
        call = len(self.calls)
        items = self._items(prompts, groups, trainer, call)
        limit = self.executor.config.engine.max_model_len
        tok = self.executor.tokenizer
        for it in items[::g]:
            n = len(prompt_ids(it, tok))
            if n + 1 > limit:
                raise TrlRolloutError(
                    f"a prompt of {n} tokens does not fit the engines' max_model_len {limit}",
                    fix="shorten the dataset's prompts (or filter them), or raise EngineConfig.max_model_len",
                    tokens=n,
                    max_model_len=limit,
                )
        pushed, t_push = None, 0.0
        if self.push_weights and step != self._pushed_step:
            t = time.perf_counter()
            model: Any = trainer.model
            accelerator = getattr(trainer, "accelerator", None)
            if accelerator is not None:
                model = accelerator.unwrap_model(model)  # DDP/FSDP wrappers rename the tensors
            state = model.state_dict()
            self.run(self.executor.update_weights(state, version=step), self.timeout)
            self._pushed_step = step
            self.pushes.append(step)
            pushed, t_push = step, time.perf_counter() - t
        lent = self._lend_slots()
        results = self.run(self._rollout(items, lent), self.timeout)
        self.last_results = results
        out = _to_trl(results, pad_id=_pad_id(tok))
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        self.calls.append(
            RolloutCall(
                step=step,
                prompts=len(prompts),
                groups=len(groups),
                num_generations=g,
                pushed=pushed,
                lent=tuple(lent),
                statuses=statuses,
                seconds=time.perf_counter() - t0,
                push_seconds=t_push,
            )
        )
        if statuses.get("failed"):
            log.warning("rollout call %d: %d trajectories failed", call, statuses["failed"])
        return out

    def _sampling(self, trainer: GRPOTrainer) -> SamplingConfig:
        if self.sampling is not None:
            return replace(self.sampling, logprobs=True)
        args: Any = trainer.args  # a GRPOConfig
        return SamplingConfig(
            max_tokens=int(args.max_completion_length or 64),
            temperature=float(args.temperature),
            top_p=float(args.top_p),
            logprobs=True,
        )

    def _items(
        self, prompts: list[Any], groups: list[tuple[int, int]], trainer: GRPOTrainer, call: int
    ) -> list[RolloutItem]:
        sampling = self._sampling(trainer)
        base = self.seed if self.seed is not None else sampling.seed
        rng = random.Random(f"{base}:{call}") if base is not None else None
        tok = self.executor.tokenizer
        items: list[RolloutItem] = []
        for j, (a, b) in enumerate(groups):
            prompt, chat = _prompt(prompts[a], tok, self.chat)
            for k in range(b - a):
                s = sampling if rng is None else replace(sampling, seed=rng.randrange(1 << 31))
                items.append(
                    RolloutItem(
                        id=f"trl{call}-g{j}-{k}",
                        prompt=prompt,
                        group=f"trl{call}-g{j}",
                        max_turns=self.max_turns,
                        sampling=s,
                        chat=chat,
                    )
                )
        return items

    def _lend_slots(self) -> list[str]:
        if self.lend is False:
            return []
        if self.lend is True:
            slots = self.executor.lendable_slots()
            if not slots:
                log.info("lend=True but the cluster has no lendable slot: rollout without lending")
            return slots
        return list(self.lend)

    async def _rollout(self, items: list[RolloutItem], lent: list[str]) -> list[TrajectoryResult]:
        ex = self.executor
        env = self.env or _single_turn
        task = asyncio.create_task(ex.rollout(items, env))
        try:
            if lent:
                await asyncio.sleep(0)  # the batch is registered: the lend's re-plan sees the work
                await ex.lend(lent, until=ex.now() + self.lend_seconds)
            return await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if lent:
                # Back before the optimizer step, whatever happened to the rollout.
                await ex.reclaim(lent, deadline=ex.now() + self.reclaim_seconds)


# -- helpers ----------------------------------------------------------------------------------------------
def _num_generations(trainer: Any) -> int:
    model = getattr(trainer, "model", None)
    training = bool(getattr(model, "training", True))
    g = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
    if g is None and not training:
        g = getattr(trainer, "num_generations", None)
    if not isinstance(g, int) or g < 1:
        raise TrlRolloutError(
            f"the trainer's num_generations is {g!r}",
            fix="pass GRPOConfig(num_generations=N) with N >= 2 (one GRPO group of N samples per prompt)",
            num_generations=g,
        )
    return g


def _num_processes(trainer: Any) -> int:
    accelerator = getattr(trainer, "accelerator", None)
    return int(getattr(accelerator, "num_processes", 1) or 1)


def _groups(prompts: Sequence[Any], g: int, processes: int) -> list[tuple[int, int]]:
    """Row ranges of the GRPO groups: TRL's sampler repeats each prompt ``g`` times in a row."""
    if processes != 1:
        raise TrlRolloutError(
            f"rollout_func runs on {processes} trainer processes, and each would drive its own executor",
            fix="run the trainer on one process (the executor spreads the rollout over the Ray cluster's "
            "engines), or call RollplanRollout from rank 0 only and broadcast its output",
            processes=processes,
        )
    n = len(prompts)
    if n == 0 or n % g:
        raise TrlRolloutError(
            f"{n} prompts cannot be GRPO groups of num_generations={g}",
            fix="let GRPOTrainer's own sampler feed rollout_func (each prompt num_generations times in a row); "
            "generation_batch_size must be a multiple of num_generations",
            prompts=n,
            num_generations=g,
        )
    groups = [(a, a + g) for a in range(0, n, g)]
    for a, b in groups:
        if any(prompts[i] != prompts[a] for i in range(a + 1, b)):
            raise TrlRolloutError(
                f"rows {a}..{b - 1} are not one prompt repeated num_generations={g} times",
                fix="let GRPOTrainer's own sampler feed rollout_func (it repeats each prompt num_generations "
                "times in a row), with the same num_generations on the trainer",
                rows=(a, b),
                num_generations=g,
            )
    return groups


def _prompt(prompt: Any, tokenizer: Any, chat: bool) -> tuple[str | tuple[int, ...], bool]:
    """A TRL prompt as ``RolloutItem.prompt``: text (chat-templated if ``chat``), or chat messages rendered
    with the tokenizer's chat template into token ids."""
    if isinstance(prompt, str):
        return prompt, chat
    if isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # BatchEncoding in recent transformers
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids), False
    if isinstance(prompt, list | tuple) and all(isinstance(i, int) for i in prompt):
        return tuple(prompt), False
    raise TrlRolloutError(
        f"unsupported prompt type {type(prompt).__name__}",
        fix="give the dataset's 'prompt' column as text or as chat messages [{'role': ..., 'content': ...}]",
    )


def _pad_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0))


def _to_trl(results: Sequence[TrajectoryResult], *, pad_id: int) -> dict[str, list[Any]]:
    """TRL's rollout dict, one row per trajectory, in batch order."""
    out: dict[str, list[Any]] = {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        "env_mask": [],
        "env_reward": [],
        "trajectory_status": [],
        "num_turns": [],
        "weights_version": [],
    }
    for r in results:
        completion, mask, logprobs = completion_tensors(r)
        if not completion:
            # A trajectory that failed before its first token: TRL needs a non-empty completion; one pad
            # token, masked out of the loss, stands in (its reward is None: TRL leaves it unscored).
            completion, mask, logprobs = [pad_id], [0], [0.0]
        out["prompt_ids"].append(list(r.token_ids[: r.prompt_len]))
        out["completion_ids"].append(completion)
        out["logprobs"].append(logprobs)
        out["env_mask"].append(mask)
        out["env_reward"].append(r.reward)
        out["trajectory_status"].append(r.status)
        out["num_turns"].append(len(r.turns))
        out["weights_version"].append(r.turns[-1].weights_version if r.turns else None)
    return out


def completion_tensors(result: TrajectoryResult) -> tuple[list[int], list[int], list[float]]:
    """``(completion_ids, env_mask, logprobs)`` of one trajectory: every token after the prompt, 1 on
    the model's tokens (each turn's span) and 0 on observation tokens, the engines' sampling log-probs on
    the model's tokens (0.0 on observations and where the engine returned none)."""
    completion = list(result.completion_ids)
    mask = [0] * len(completion)
    logprobs = [0.0] * len(completion)
    for t in result.turns:
        a = t.context_tokens - result.prompt_len
        b = a + len(t.token_ids)
        mask[a:b] = [1] * (b - a)
        if t.logprobs is not None:
            logprobs[a:b] = [float(x) for x in t.logprobs]
    return completion, mask, logprobs
