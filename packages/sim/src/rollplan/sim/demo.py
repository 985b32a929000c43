"""``rollplan demo``: a built-in, seeded replay needing no files, shaped like PEARL's evaluation.

16 dedicated H800s; 8 training GPUs lent between training steps; up to 16 preemptible H800s from a seeded
synthetic spot process (allocations and preemptions every ~5 min on average, 30 s notice); Qwen3-8B; the
built-in SWE-like multi-turn prompt set, 128 prompts x 16 samples per batch (a large GRPO batch: the
regime where placement and order matter, see docs/simulator.md); ``batches`` RL iterations (sync, 120 s
training steps) of a job already ``DEMO_WARMUP`` steps in (rollplan's history prior has seen them); all five
policies.
"""

from __future__ import annotations

from rollplan.sim.engine import SimConfig
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.replay import Scenario, batch_source
from rollplan.sim.traces import synthetic_spot_trace

DEMO_BATCHES = 5
DEMO_GROUPS, DEMO_SAMPLES = 128, 16
DEMO_WARMUP = 2
DEMO_HORIZON_S = 6 * 3600.0


def demo_scenario(seed: int = 0, *, batches: int = DEMO_BATCHES) -> Scenario:
    """The demo scenario (deterministic in ``seed``)."""
    trace = synthetic_spot_trace(DEMO_HORIZON_S, max_gpus=16, seed=seed, gpu="h800", initial_gpus=8,
                                 mean_alloc_gap_s=300.0, mean_preempt_gap_s=300.0, notice_s=30.0)
    return Scenario(
        name=f"demo(seed={seed})",
        batches=batch_source("builtin", model="qwen3-8b", groups=DEMO_GROUPS, samples=DEMO_SAMPLES, seed=seed),
        model="qwen3-8b",
        gpu="h800",
        dedicated=16,
        trace=trace,
        lending=LendingConfig(gpus=8, gpu="h800", train_step_s=120.0, mode=LendMode.SYNC),
        max_batches=batches,
        duration_s=DEMO_HORIZON_S,
        seed=seed,
        sim=SimConfig(),
        warmup_batches=DEMO_WARMUP,
    )
