"""Helpers for the executor tests: a toy tool env, batches, and a single-engine greedy reference computed
with vLLM's in-process ``LLM`` (no Ray)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from rollplan.executor import toy
from rollplan.executor.agent import RolloutItem, TurnOutput

ToyToolEnv = toy.ToyToolEnv


def make_batch(
    n: int = 32, *, group_size: int = 4, max_tokens: int = 16, seed: int = 0, prefix: str = "t"
) -> list[RolloutItem]:
    """``n`` items in groups of ``group_size`` sharing a prompt; 2-4 turns per group."""
    return toy.make_toy_batch(n, group_size=group_size, max_tokens=max_tokens, seed=seed, prefix=prefix)


def env_factory(item: RolloutItem) -> ToyToolEnv:
    return ToyToolEnv(item)


# -- single-engine reference -------------------------------------------------------------------------------
class ReferenceEngine:
    """vLLM's in-process ``LLM`` (one engine, this process) running the same agent loop turn by turn."""

    def __init__(self, model: Path, **engine_overrides: object) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(str(model))
        kw: dict[str, object] = {
            "model": str(model),
            "dtype": "float32",
            "max_model_len": 512,
            "enforce_eager": True,
            "kv_cache_memory_bytes": 64 << 20,
            "block_size": 32,
            "seed": 0,
            "disable_log_stats": True,
        }
        kw.update(engine_overrides)
        self.llm = LLM(**kw)

    def generate(self, contexts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def rollout(self, batch: Sequence[RolloutItem]) -> dict[str, tuple[int, ...]]:
        """Final context (prompt + generations + observations) of every item, greedy, envs without sleeps."""
        from rollplan.executor.agent import prompt_ids

        ctx = {it.id: prompt_ids(it, self.tokenizer) for it in batch}
        active = {it.id: it for it in batch}
        turn = 0
        while active:
            ids = list(active)
            gens = self.generate([ctx[i] for i in ids], max_tokens=active[ids[0]].sampling.max_tokens)
            for i, gen in zip(ids, gens, strict=True):
                it = active[i]
                ctx[i] = ctx[i] + gen
                text = self.tokenizer.decode(gen, skip_special_tokens=True)
                env = ToyToolEnv(it, sleep=None)
                try:
                    obs = asyncio.run(
                        env.step(TurnOutput(it, turn, tuple(gen), text, tuple(ctx[i]), "length"))
                    )
                except RuntimeError:
                    del active[i]
                    continue
                if obs.done:
                    del active[i]
                    continue
                ctx[i] = ctx[i] + self.tokenizer.encode(obs.text or "", add_special_tokens=False)
                if turn + 1 >= it.max_turns:
                    del active[i]
            turn += 1
        return {k: tuple(v) for k, v in ctx.items()}
