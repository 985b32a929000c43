"""Training-job integration: the GRPO example, lossless weight updates, and bad input to the training API.

- ``examples/grpo_cpu.py`` on a short run (2 steps): its JSON has the documented shape, no trajectory is
  lost, duplicated or failed, one weight sync per step, the training node's engine is parked asleep at
  each reclaim, every turn ran on its step's weights (the parked engine is synced when it wakes), and the
  trainer's recomputed log-probs equal the engines' sampling log-probs (the syncs were exact). The
  learning target needs the full run (docs/integration.md has its figures).
- Bad input, no Ray needed: a state dict with missing, mis-shaped or unknown tensors, unreadable bytes,
  a version that does not go forward, a lend whose end is in the past -> one-line ``UserInputError``s
  with a "To fix" hint, raised before anything starts.
- On one real engine (loopback Ray): the same bad updates leave it serving the old weights (outputs
  equal the old weights' reference); an update while 16 long requests are in flight aborts none: each
  finishes to its full length (400 tokens) with ``weights_versions == (0, 1)``, its tokens before the switch are the
  old weights' greedy tokens and those after it equal the new weights' greedy continuation of the same
  prefix; turns started afterwards equal an engine built with the new weights.

The example runs first, in its own process, before this module's cluster starts (one engine-based run
at a time on this machine). Stops every process it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from executor_helpers import ReferenceEngine, env_factory, make_batch

from rollplan.executor.agent import RolloutItem, SamplingConfig
from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
from rollplan.executor.weights import LendError, WeightUpdateError, check_shapes, header_shapes

ROOT = Path(__file__).resolve().parents[2]
SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "To fix:" in text, text
    return text


# == the example ==========================================================================================
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_example_short_run() -> None:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    cmd = [sys.executable, str(ROOT / "examples" / "grpo_cpu.py"), "--steps", "2", "--groups", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=480, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert {"steps", "reward", "trajectories", "weight_syncs", "seconds"} <= set(out)
    assert out["steps"] == 2 and len(out["reward"]) == 2
    assert all(0.0 <= r <= 1.0 for r in out["reward"])
    assert out["trajectories"] == {"total": 64, "done": 64, "lost": 0, "duplicated": 0, "failed": 0}
    # One update per step; the training node's engine, parked asleep between lends, is synced when it
    # wakes (so every turn ran on its step's weights).
    assert out["weight_syncs"] == 2 and out["engine_weight_reloads"] >= 2
    assert out["turns_not_on_step_weights"] == 0
    assert out["lend"]["engine_parked"] == 2 and out["lend"]["steps_rollout_used_lent_slot"] >= 1
    assert out["logprob_max_gap"] < 1e-3
    assert {"rollout", "train", "weight_sync", "lend", "reclaim", "total"} <= set(out["seconds"])


# == bad input, before anything starts ====================================================================
def _state(model: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model / "model.safetensors"))


def test_check_shapes_names_what_is_wrong(tiny_model: Path) -> None:
    expected = header_shapes(tiny_model / "model.safetensors")
    check_shapes(expected, dict(expected))
    got = dict(expected)
    del got["lm_head.weight"]
    got["model.norm.weight"] = (7,)
    got["extra.bias"] = (1,)
    with pytest.raises(WeightUpdateError) as e:
        check_shapes(expected, got)
    text = _one_line(e.value)
    assert "1 missing tensor(s): lm_head.weight" in text
    assert "model.norm.weight [7] != [128]" in text and "1 unknown tensor(s): extra.bias" in text
    with pytest.raises(WeightUpdateError, match="not a safetensors file"):
        header_shapes(b"not safetensors")


def test_bad_input_is_refused_before_anything_starts(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from rollplan.executor.executor import RolloutExecutor

    ex = RolloutExecutor(ExecutorConfig(engine=EngineConfig(model=str(tiny_model))))
    state = _state(tiny_model)
    missing = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    misshaped = {**state, "model.embed_tokens.weight": torch.zeros(1024, 64)}
    cases = [
        (missing, 1, "1 missing tensor(s): model.layers.1.mlp.up_proj.weight"),
        (misshaped, 1, "model.embed_tokens.weight [1024, 64] != [1024, 128]"),
        (b"\x00" * 16, 1, "not a safetensors file"),
        (tmp_path / "nope.safetensors", 1, "does not exist"),
        (state, 0, "goes backwards"),
        (state, -3, "goes backwards"),
    ]
    for weights, version, needle in cases:
        with pytest.raises(WeightUpdateError) as e:
            asyncio.run(ex.update_weights(weights, version=version))
        assert needle in _one_line(e.value)
    with pytest.raises(LendError) as e:
        asyncio.run(ex.lend(["lent:x/0"], until=time.time() - 5))
    assert "in the past" in _one_line(e.value)
    assert ex.controller is None  # nothing was started (no Ray, no engine)


# == one real engine ======================================================================================
class Harness:
    """A loopback Ray cluster (head, one slot node, one lendable training node), one executor with one
    engine, and the event loop the tests run on."""

    def __init__(self, model: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from rollplan.executor.executor import RolloutExecutor

        self.loop = asyncio.new_event_loop()
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
        try:
            self.cluster.add_node(num_cpus=0, resources={SLOT: 1})
            self.cluster.add_node(num_cpus=0, resources={LEND: 1})
            ray.init(address=self.cluster.address, log_to_driver=False)
            config = ExecutorConfig(
                engine=EngineConfig(model=str(model), connector=KVConnectorConfig(kind="none")),
                slot_resource=SLOT,
                lend_resource=LEND,
                planner_time_limit=0.5,
            )
            self.executor = RolloutExecutor(config)
            self.run(self.executor.start())
            self.run(self.executor.warm_up(count=1), timeout=600)
        except BaseException:
            self.close()
            raise

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 180.0) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        import ray

        try:
            if getattr(self, "executor", None) is not None:
                self.run(self.executor.shutdown(), timeout=120)
        finally:
            self.loop.close()
            ray.shutdown()
            self.cluster.shutdown()


@pytest.fixture(scope="module")
def h(tiny_model: Path):
    harness = Harness(tiny_model)
    try:
        yield harness
    finally:
        harness.close()


SMALL = make_batch(8, max_tokens=16, prefix="n")


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_bad_updates_keep_the_old_weights(
    h: Harness, tiny_model: Path, reference_engine: ReferenceEngine
) -> None:
    import torch

    ex = h.executor
    state = _state(tiny_model)
    bad = [
        {k: v for k, v in state.items() if k != "lm_head.weight"},
        {**state, "model.norm.weight": torch.ones(64)},
    ]
    for weights in bad:
        with pytest.raises(WeightUpdateError):
            h.run(ex.update_weights(weights, version=1))
    with pytest.raises(LendError):
        h.run(ex.lend(ex.lendable_slots(), until=ex.now() - 1))
    assert not any(s.startswith("lent:") for s in ex.ctl.slots)
    results = h.run(ex.rollout(SMALL, env_factory))
    assert all(t.weights_versions == (0,) for r in results for t in r.turns)
    expected = reference_engine.rollout(SMALL)
    assert {r.id: r.token_ids for r in results} == expected


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_update_with_requests_in_flight_loses_nothing(
    h: Harness,
    tiny_model: Path,
    tiny_model_v1: Path,
    reference_engine: ReferenceEngine,
    reference_engine_v1: ReferenceEngine,
) -> None:
    ex = h.executor
    n_tokens = 400  # prompt ~15 tokens: the context stays under the engine's 512
    batch = [
        RolloutItem(
            id=f"long{i}",
            prompt=f"search the table for price {i} then compute the sum",
            max_turns=1,
            sampling=SamplingConfig(max_tokens=n_tokens, ignore_eos=True),
            data={"turns": 1},
        )
        for i in range(16)
    ]
    new_state = _state(tiny_model_v1)

    async def scenario() -> tuple[list[Any], list[float]]:
        task = asyncio.create_task(ex.rollout(batch, env_factory))
        t = time.monotonic()
        while not (len(ex.ctl.runs) == 16 and all(r.request_id for r in ex.ctl.runs.values())):
            assert time.monotonic() - t < 60, "the requests never all started"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # some tokens made with the old weights
        seconds = await ex.update_weights(new_state, version=1)
        return await task, seconds

    results, seconds = h.run(scenario())
    assert len(seconds) == 1
    assert ex.last_rollout["lost"] == ex.last_rollout["duplicated"] == 0
    turns = [r.turns[0] for r in results]
    assert all(r.status == "done" for r in results)
    assert all(t.finish_reason == "length" and len(t.token_ids) == n_tokens for t in turns)
    assert all(t.interruptions == 0 and len(t.engines) == 1 for t in turns), "a request was aborted"
    spanning = [(r, t) for r, t in zip(results, turns, strict=True) if t.weights_versions == (0, 1)]
    assert len(spanning) == len(turns), [t.weights_versions for t in turns]
    # Old weights up to the switch, then the new weights' greedy continuation of that prefix.
    prompts = [list(r.token_ids[: r.prompt_len]) for r in results]
    old_ref = reference_engine.generate(prompts, max_tokens=n_tokens)
    cut = [_lcp(list(t.token_ids), ref) for t, ref in zip(turns, old_ref, strict=True)]
    # Most requests made tokens on both sides of the switch (a loaded machine may not have scheduled
    # every one before it: then all its tokens are the new weights', which the check below also covers).
    assert sum(0 < c < n_tokens for c in cut) >= len(cut) // 2, cut
    assert all(c < n_tokens for c in cut), cut
    cont = reference_engine_v1.generate(
        [p + list(t.token_ids[:c]) for p, t, c in zip(prompts, turns, cut, strict=True)], max_tokens=n_tokens
    )
    for t, c, ref in zip(turns, cut, cont, strict=True):
        assert list(t.token_ids[c:]) == ref[: n_tokens - c]
    # Turns started after the update: the new weights only.
    after = h.run(ex.rollout(SMALL, env_factory))
    assert all(t.weights_versions == (1,) for r in after for t in r.turns)
    assert {r.id: r.token_ids for r in after} == reference_engine_v1.rollout(SMALL)
    # A version that does not go forward is refused; the engine keeps version 1.
    for version in (1, 0):
        with pytest.raises(WeightUpdateError, match="goes backwards"):
            h.run(ex.update_weights(_state(tiny_model), version=version))
    assert [s.weights_version for s in ex.ctl.slots.values() if s.serving] == [1]
