"""A toy tool environment and batch builder for examples, benchmarks and tests.

``ToyToolEnv`` is deterministic given the generated tokens: the observation is a checksum of the turn's
tokens, the number of turns is fixed per item (``item.data["turns"]``), tool latency is a seeded
uniform sleep, and ``item.data["raise_at"]`` makes the tool raise on that turn (a crashing tool).
``NumericToolEnv`` is the training examples' two-turn task with a verifiable reward (examples/grpo_cpu.py,
examples/trl_grpo_cpu.py).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from rollplan.executor.agent import Observation, RolloutItem, SamplingConfig, TurnOutput

WORDS = [
    "search",
    "the",
    "table",
    "for",
    "price",
    "then",
    "compute",
    "the",
    "sum",
    "and",
    "answer",
    "the",
    "question",
]


@dataclass
class ToyToolEnv:
    """See the module docstring. ``sleep``: (low, high) seconds of tool latency, or None for none."""

    item: RolloutItem
    sleep: tuple[float, float] | None = (0.05, 0.25)

    async def step(self, turn: TurnOutput) -> Observation:
        data = self.item.data or {}
        if self.sleep is not None:
            rng = random.Random(f"{self.item.id}:{turn.turn}")
            await asyncio.sleep(rng.uniform(*self.sleep))
        if data.get("raise_at") == turn.turn:
            raise RuntimeError(f"tool crashed on turn {turn.turn}")
        if turn.turn + 1 >= data.get("turns", 2):
            return Observation(done=True, reward=float(len(turn.token_ids)))
        digest = sum((i + 1) * t for i, t in enumerate(turn.token_ids)) % 997
        return Observation(text=f" result {digest} ok")


def make_toy_batch(
    n: int = 32,
    *,
    group_size: int = 4,
    max_tokens: int = 16,
    turns: tuple[int, int] = (2, 4),
    seed: int = 0,
    prefix: str = "t",
) -> list[RolloutItem]:
    """``n`` greedy items in groups of ``group_size`` sharing a prompt (a per-sibling suffix makes their
    outputs differ); every group gets a number of turns drawn from ``turns``."""
    rng = random.Random(seed)
    items = []
    for g in range(n // group_size):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        n_turns = rng.randint(*turns)
        for k in range(group_size):
            items.append(
                RolloutItem(
                    id=f"{prefix}{g}-{k}",
                    prompt=f"{prompt} ({k})",
                    group=f"{prefix}g{g}",
                    max_turns=max(turns[1], 1),
                    sampling=SamplingConfig(max_tokens=max_tokens, ignore_eos=True),
                    data={"turns": n_turns},
                )
            )
    return items


@dataclass
class NumericToolEnv:
    """Two turns: the model's first turn is a tool call (its tokens are the argument), the tool answers
    ``" result N ok"`` (N a checksum of the call, after a short seeded latency); the model's second turn is the
    answer. Reward (on the last turn): the fraction of all the model's tokens that are numeric (``numeric``:
    ``numeric_tokens(tokenizer)``), in [0, 1] and checkable from the token ids alone. A randomly initialised
    model starts near the numeric share of its vocabulary with a spread within each group, so GRPO has a
    signal from the first step."""

    item: Any
    numeric: frozenset[int]
    generated: list[int] = field(default_factory=list)

    async def step(self, turn: Any) -> Observation:
        self.generated.extend(turn.token_ids)
        if turn.turn == 0:
            await asyncio.sleep(random.Random(f"{self.item.id}").uniform(0.005, 0.03))
            value = sum((i + 1) * t for i, t in enumerate(turn.token_ids)) % 997
            return Observation(text=f" result {value} ok")
        hits = sum(1 for t in self.generated if t in self.numeric)
        return Observation(done=True, reward=hits / len(self.generated) if self.generated else 0.0)


def numeric_tokens(tokenizer: Any) -> frozenset[int]:
    """Token ids whose text is a number (digits, optionally with surrounding spaces)."""
    return frozenset(i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isdigit())
