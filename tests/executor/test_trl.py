"""The TRL drop-in (``rollplan.executor.integrations.trl.RollplanRollout``) against TRL's own ``GRPOTrainer``.

- ``rollplan.executor.integrations.trl`` imports neither trl nor torch (a fresh interpreter).
- Bad input, no Ray needed (a real ``GRPOTrainer`` on the tiny model): a rollout before the executor was
  started (called directly, and from ``trainer.train()``), prompts that are not runs of the trainer's
  ``num_generations`` (a count that is no multiple of it; runs of another length) -> one-line
  ``TrlRolloutError``s with a "To fix" hint; nothing starts.
- On real vLLM CPU engines (loopback Ray cluster: head, one rollout node, one training node whose slot is
  lent for every rollout): ``GRPOTrainer(rollout_func=RollplanRollout(...))`` trains 2 steps
  (``max_steps=2``) on a 2-turn toy tool env. Checked: both steps ran; every prompt got
  ``num_generations`` completions (one GRPO group per prompt, its rows sharing one prompt's ids); one
  weight push per step after the first (version 1 before the second rollout) and the engines generated
  the second rollout with it (every turn's ``weights_version``), with the first on the checkpoint (0);
  the sampling log-probs the adapter returned equal what TRL's own
  ``_get_per_token_logps_and_entropies`` recomputes on the returned ids with the trainer's current
  model (and differ from the initial model's at the second call: the push mattered); ``env_mask`` is 0
  exactly on the tool observations' tokens; the lent slot was lent and reclaimed around each rollout;
  a prompt longer than the engines' ``max_model_len`` is refused with one line.

Stops every process it started (adapter.close() shuts the executor down; the cluster is shut down).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "trl", reason="needs trl (the rollplan-executor[trl] extra: pip install 'rollplan-executor[trl]')"
)

from rollplan.executor.agent import SamplingConfig
from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
from rollplan.executor.executor import RolloutExecutor
from rollplan.executor.integrations.trl import (
    RolloutNotStartedError,
    RollplanRollout,
    TrlRolloutError,
)
from rollplan.executor.toy import ToyToolEnv

pytestmark = pytest.mark.trl

SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"
G = 4  # num_generations
PROMPTS = [
    "search the table for the price then answer",
    "compute the sum of the row with the tool",
    "find the city then compute the count",
    "look up the value and answer the question",
    "search the order then compute the total",
    "compute the item count with the tool then answer",
]


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "To fix:" in text, text
    return text


def even_reward(completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
    """A reward with spread inside a group (so the step changes the weights): the share of even ids."""
    return [sum(1 for t in ids if t % 2 == 0) / len(ids) for ids in completion_ids]


def _trainer(model_dir: Path, out: Path, rollout_func: Any, *, lr: float = 1e-2) -> Any:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast; the engines run float32 (log-probs compared below)
        report_to="none",
        max_steps=2,
        per_device_train_batch_size=2 * G,  # two prompts (GRPO groups) per step
        num_generations=G,
        max_completion_length=8,
        temperature=1.0,
        learning_rate=lr,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=even_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def _config(model_dir: Path) -> ExecutorConfig:
    return ExecutorConfig(
        engine=EngineConfig(model=str(model_dir), connector=KVConnectorConfig(kind="none")),
        slot_resource=SLOT,
        lend_resource=LEND,
        planner_time_limit=0.5,
    )


# == the adapter needs no trl at import ===================================================================
def test_adapter_module_does_not_import_trl() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import rollplan.executor.integrations.trl as m; "
        "assert 'trl' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)[:5]; "
        "print(m.RollplanRollout.__name__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "RollplanRollout", proc.stderr[-2000:]


# == bad input, before anything starts ====================================================================
def test_bad_input_refused_before_anything_starts(tiny_model: Path, tmp_path: Path) -> None:
    adapter = RollplanRollout(RolloutExecutor(_config(tiny_model)), env=lambda it: ToyToolEnv(it, sleep=None))
    trainer = _trainer(tiny_model, tmp_path / "out", adapter)
    try:
        assert trainer.num_generations == G
        valid = [PROMPTS[0]] * G + [PROMPTS[1]] * G
        with pytest.raises(RolloutNotStartedError) as e:
            adapter(valid, trainer)
        assert "not started" in _one_line(e.value) and "rollout.start()" in str(e.value)
        # The same through TRL's own training loop: its first generation batch calls the adapter.
        with pytest.raises(RolloutNotStartedError):
            trainer.train()
        assert trainer.state.global_step == 0
        # A batch the trainer's num_generations cannot split into GRPO groups.
        with pytest.raises(TrlRolloutError) as e:
            adapter([PROMPTS[0]] * (G + 2), trainer)
        assert f"cannot be GRPO groups of num_generations={G}" in _one_line(e.value)
        # Runs of 2 (another sampler, or another num_generations) under a trainer with 4.
        with pytest.raises(TrlRolloutError) as e:
            adapter([PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]] * 2, trainer)
        assert "not one prompt repeated" in _one_line(e.value)
        assert adapter.calls == [] and adapter.pushes == [] and not adapter.started
    finally:
        adapter.close()


# == GRPOTrainer on real engines ==========================================================================
class _Recorder:
    """The rollout_func the trainer gets: the adapter, plus checks that need the trainer's model at the
    moment of the call (TRL's own log-prob recomputation on the returned ids)."""

    def __init__(self, adapter: RollplanRollout, initial: Any) -> None:
        self.adapter = adapter
        self.initial = initial  # a copy of the model before training
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        import torch

        out = self.adapter(prompts, trainer)
        gaps, gaps_initial = [], []
        with torch.no_grad():
            for p, c, lp, m in zip(
                out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], strict=True
            ):
                ids = torch.tensor([p + c])
                attn = torch.ones_like(ids)
                mask = torch.tensor(m, dtype=torch.bool)
                engine = torch.tensor(lp)
                for model, into in ((trainer.model, gaps), (self.initial, gaps_initial)):
                    trl_lp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn, len(c))
                    into.append(float((trl_lp[0] - engine)[mask].abs().max()))
        self.calls.append(
            {
                "prompts": list(prompts),
                "step": trainer.state.global_step,
                "out": out,
                "results": list(self.adapter.last_results),
                "gap": max(gaps),
                "gap_initial": max(gaps_initial),
            }
        )
        return out


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_trainer_on_real_engines(tiny_model: Path, tmp_path: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    adapter: RollplanRollout | None = None
    try:
        cluster.add_node(num_cpus=0, resources={SLOT: 1})  # the rollout node
        cluster.add_node(num_cpus=0, resources={LEND: 1})  # the training node: lent for each rollout
        ray.init(address=cluster.address, log_to_driver=False)
        ex = RolloutExecutor(_config(tiny_model))
        adapter = RollplanRollout(
            ex,
            env=lambda it: ToyToolEnv(it, sleep=(0.0, 0.01)),  # 2 turns, a tool observation between them
            max_turns=2,
            sampling=SamplingConfig(max_tokens=8, temperature=1.0),
            seed=0,
            lend=True,
            lend_seconds=120.0,
            reclaim_seconds=10.0,
            timeout=300.0,
        )
        adapter.start(warm_up=1)
        lendable = ex.lendable_slots()
        assert len(lendable) == 1
        recorder = _Recorder(adapter, None)
        trainer = _trainer(tiny_model, tmp_path / "out", recorder)
        recorder.initial = copy.deepcopy(trainer.model).eval()
        trainer.train()
        stats = ex.stats()

        # Both steps ran, one generation batch each.
        assert trainer.state.global_step == 2
        assert [c["step"] for c in recorder.calls] == [0, 1]
        assert [c.step for c in adapter.calls] == [0, 1]
        losses = [h for h in trainer.state.log_history if "loss" in h]
        assert len(losses) == 2

        for call in recorder.calls:
            prompts, out, results = call["prompts"], call["out"], call["results"]
            n = len(prompts)
            assert n == 2 * G
            assert all(len(out[k]) == n for k in out)  # one completion per input row, every key
            # One GRPO group per prompt: G rows each, sharing the prompt's ids.
            for a in range(0, n, G):
                assert len(set(prompts[a : a + G])) == 1
                assert len({tuple(p) for p in out["prompt_ids"][a : a + G]}) == 1
                assert len({r.group for r in results[a : a + G]}) == 1
            assert len({r.group for r in results}) == n // G
            assert all(r.status in ("done", "max_turns") for r in results)
            # env_mask: 0 exactly on the tool observations' tokens, 1 on the model's turns.
            for r, c, m, lp in zip(
                results, out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
            ):
                expect_ids: list[int] = []
                expect_mask: list[int] = []
                for t in r.turns:
                    expect_ids += list(t.token_ids) + list(t.observation_ids)
                    expect_mask += [1] * len(t.token_ids) + [0] * len(t.observation_ids)
                assert c == expect_ids and m == expect_mask
                assert len(lp) == len(c)
                assert len(r.turns) == 2 and 0 in m  # the observation sits between the two turns
            # Log-probs: the engines' sampling log-probs equal TRL's recomputation with the trainer's model.
            assert call["gap"] < 1e-3, call["gap"]

        # One push per step after the first; the engines generated each rollout with the step's weights.
        assert adapter.pushes == [1]
        assert [c.pushed for c in adapter.calls] == [None, 1]
        assert {v for v in recorder.calls[0]["out"]["weights_version"]} == {0}
        assert {v for v in recorder.calls[1]["out"]["weights_version"]} == {1}
        assert all(t.weights_versions == (1,) for r in recorder.calls[1]["results"] for t in r.turns)
        assert stats["actions"].get("sync_weights", {}).get("count", 0) >= 1
        # The push mattered: the initial weights no longer explain the second rollout's tokens.
        assert recorder.calls[0]["gap_initial"] < 1e-3
        assert recorder.calls[1]["gap_initial"] > 1e-2, recorder.calls[1]["gap_initial"]
        # The training node's slot was lent for each rollout and reclaimed before returning.
        assert [c.lent for c in adapter.calls] == [tuple(lendable)] * 2
        lends = [e for e in ex.ctl.stats.events if e[1] in ("lend", "reclaim")]
        assert [e[1] for e in lends] == ["lend", "reclaim"] * 2
        assert all(ex.ctl.slots[s].returned for s in lendable)

        # A prompt the engines cannot hold: refused before anything runs.
        with pytest.raises(TrlRolloutError) as e:
            adapter([" ".join(["price"] * 600)] * G, trainer)
        assert "max_model_len 512" in _one_line(e.value)
        assert len(adapter.calls) == 2
    finally:
        if adapter is not None:
            adapter.close()
        ray.shutdown()
        cluster.shutdown()
