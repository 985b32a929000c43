"""TRL's own GRPOTrainer on CPU, its rollouts on rollplan's executor (real vLLM engines, loopback Ray).

    .venv/bin/python examples/trl_grpo_cpu.py [--seed 0] [--steps 10]

A thin wrapper around ``rollplan.executor.integrations.trl.RollplanRollout``: the tiny Llama is built
locally; a loopback Ray cluster starts with a head, one rollout node and one training node (its slot is
lent to rollout while the trainer waits for each batch, and reclaimed before the optimizer step); TRL's
``GRPOTrainer`` (``use_vllm=False``: it generates nothing itself) trains the model with
``rollout_func=RollplanRollout(...)``, which runs every generation batch on the executor, two turns per
trajectory with a tool call between them, and pushes the trainer's weights to the engines whenever the
trainer's global step moved. The task is the one of ``examples/grpo_cpu.py`` (the reward is the
fraction of the model's own tokens that are numbers: learnable from random weights in ~10 steps), given
to TRL through the env's reward (``env_reward``).

Prints one JSON line: ``steps``, ``reward`` (TRL's logged mean reward per step), ``weight_pushes``
(versions), ``rollout_calls``, ``trajectories`` {total, done, failed}, ``lent_rollouts`` and seconds.
Exit status 1 if a step is missing or a trajectory failed. Stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLOT = "rollplan_slot"
LEND = "rollplan_lent_slot"
TOPICS = ["price", "order", "table", "weather", "city", "count", "sum", "value", "row", "item"]


def run(model_dir: Path, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rollplan.executor.agent import SamplingConfig
    from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
    from rollplan.executor.executor import RolloutExecutor
    from rollplan.executor.integrations.trl import RollplanRollout, env_reward
    from rollplan.executor.toy import NumericToolEnv, numeric_tokens

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the engines share this machine's cores
    timings: dict[str, float] = {}
    ex = RolloutExecutor(
        ExecutorConfig(
            engine=EngineConfig(model=str(model_dir), connector=KVConnectorConfig(kind="none")),
            slot_resource=SLOT,
            lend_resource=LEND,
            planner_time_limit=0.5,
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    numeric = numeric_tokens(tokenizer)
    with RollplanRollout(
        ex,
        env=lambda item: NumericToolEnv(item, numeric),
        max_turns=2,
        sampling=SamplingConfig(max_tokens=args.max_tokens, temperature=1.0),
        seed=args.seed,
        lend=True,
        lend_seconds=300.0,
    ) as rollout:
        t = time.perf_counter()
        rollout.start(warm_up=1)
        timings["engine_start"] = time.perf_counter() - t
        rng = random.Random(args.seed)
        prompts = [
            f"compute the {rng.choice(TOPICS)} of the {rng.choice(TOPICS)} with the tool then answer"
            for _ in range(args.groups * args.steps)
        ]
        config = GRPOConfig(
            output_dir=str(out_dir),
            use_cpu=True,
            bf16=False,  # TRL's default is bf16 autocast; the engines run float32
            report_to="none",
            max_steps=args.steps,
            per_device_train_batch_size=args.groups * args.group_size,
            num_generations=args.group_size,
            max_completion_length=args.max_tokens,
            temperature=1.0,
            learning_rate=args.lr,
            beta=0.0,
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32),
            reward_funcs=env_reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        t = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its log dicts; stdout is the JSON line
            trainer.train()
        timings["train"] = time.perf_counter() - t
        calls = rollout.calls
    rewards = [round(float(h["reward"]), 4) for h in trainer.state.log_history if "reward" in h]
    statuses: dict[str, int] = {}
    for c in calls:
        for k, v in c.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
    total = sum(statuses.values())
    k = min(3, len(rewards))
    return {
        "seed": args.seed,
        "steps": trainer.state.global_step,
        "reward": rewards,
        "reward_first3": round(sum(rewards[:k]) / max(k, 1), 4),
        "reward_last3": round(sum(rewards[-k:]) / max(k, 1), 4),
        "weight_pushes": rollout.pushes,
        "rollout_calls": len(calls),
        "trajectories": {
            "total": total,
            "done": total - statuses.get("failed", 0),
            "failed": statuses.get("failed", 0),
        },
        "lent_rollouts": sum(1 for c in calls if c.lent),
        "seconds": {
            **timings,
            "rollout": sum(c.seconds for c in calls),
            "weight_push": sum(c.push_seconds for c in calls),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="num_generations (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per model turn")
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still runs the clean-up
    t0 = time.perf_counter()
    import ray
    from ray.cluster_utils import Cluster

    from rollplan.executor.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="rollplan-trl-") as tmp:
        model = build_tiny_model(Path(tmp) / "model", seed=args.seed)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=0, resources={SLOT: 1})  # the rollout node
            cluster.add_node(num_cpus=0, resources={LEND: 1})  # the training node: lent for each rollout
            ray.init(address=cluster.address, log_to_driver=False)
            out = run(model, args, Path(tmp) / "trainer")
        finally:
            ray.shutdown()
            cluster.shutdown()
    out["seconds"]["total"] = time.perf_counter() - t0
    out["seconds"] = {k: round(v, 2) for k, v in out["seconds"].items()}
    print(json.dumps(out))
    ok = out["steps"] == args.steps and out["trajectories"]["failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
