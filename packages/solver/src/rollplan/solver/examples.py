"""Realistic, valid example snapshots (for the CLI demo, benchmarks and tests).

``example_snapshot(slots=N, trajectories=M, seed=K)`` builds a cluster in the middle of a rollout batch:

- slots on nodes of 8 GPUs, ``tp`` sized so the model's weights take at most 60% of the engine's memory;
  sources mixed: dedicated (~60%), lent by training with ``return_by`` deadlines 2-10 minutes ahead (~25%),
  preemptible (~15%, a third of them under a 30-120 s preemption notice);
- engines warm (serving), sleeping (lent training GPUs keep a sleeping vLLM) or cold (just-arrived spot GPUs);
  ~10% of warm slots run a stale ``weights_version``; current roles mostly MIXED with a few P/D pairs;
- trajectories mid-flight in GRPO groups of 8: lengths similar within a group (+-20%), heavy-tailed across
  groups (log-normal); phases decoding / in_tool (with ``tool_until``) / prefill_pending / done; ~3% lost their
  KV (``slot`` None, ``context_tokens`` > 0); every context fits ``ModelSpec.max_context``.

Deterministic for a given (arguments, seed). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import random

from rollplan.models.perf import perf_model
from rollplan.models.specs import gpu_kind, model_spec
from rollplan.models.types import (
    ClusterSnapshot,
    EngineState,
    Estimate,
    Phase,
    Role,
    Slot,
    SlotSource,
    Trajectory,
)

GPUS_PER_NODE = 8
GROUP_SIZE = 8
SNAPSHOT_TIME = 1000.0
WEIGHTS_VERSION = 7


def engine_tp(model: str, gpu: str) -> int:
    """Smallest power-of-two TP degree whose memory holds the weights in at most 60% of it (max 8)."""
    spec, kind = model_spec(model), gpu_kind(gpu)
    tp = 1
    while tp < GPUS_PER_NODE and spec.weight_bytes > 0.6 * tp * kind.memory_bytes:
        tp *= 2
    return tp


def _slots(n: int, rng: random.Random, tp: int, gpu: str, time: float) -> list[Slot]:
    per_node = max(1, GPUS_PER_NODE // tp)
    out: list[Slot] = []
    for i in range(n):
        node = f"node{i // per_node:03d}"
        u = rng.random()
        # The first slot is always a warm dedicated one, so every example has somewhere safe to run.
        if i == 0 or u < 0.6:
            source, return_by = SlotSource.DEDICATED, None
            engine = EngineState.WARM if rng.random() < 0.85 else rng.choice([EngineState.SLEEPING, EngineState.NONE])
        elif u < 0.85:
            source = SlotSource.LENT_BY_TRAINING
            return_by = time + rng.uniform(120.0, 600.0)
            engine = rng.choices([EngineState.WARM, EngineState.SLEEPING, EngineState.NONE], [0.4, 0.45, 0.15])[0]
        else:
            source = SlotSource.PREEMPTIBLE
            return_by = time + rng.uniform(30.0, 120.0) if rng.random() < 0.33 else None
            engine = EngineState.WARM if rng.random() < 0.5 else EngineState.NONE
        if engine is EngineState.WARM:
            role = rng.choices([Role.MIXED, Role.PREFILL, Role.DECODE], [0.86, 0.04, 0.10])[0]
            version = WEIGHTS_VERSION if (i == 0 or rng.random() < 0.9) else WEIGHTS_VERSION - 1
        else:
            role = Role.OFF
            version = WEIGHTS_VERSION - 1 if engine is EngineState.SLEEPING else 0
        out.append(
            Slot(
                id=f"{node}-s{i % per_node}",
                gpu=gpu,
                node=node,
                tp=tp,
                source=source,
                return_by=return_by,
                role=role,
                engine=engine,
                weights_version=version,
            )
        )
    # A PREFILL slot needs a DECODE slot to feed and vice versa; a lone half of a pair becomes MIXED.
    roles = {s.role for s in out}
    if (Role.PREFILL in roles) != (Role.DECODE in roles):
        out = [Slot(**{**_fields(s), "role": Role.MIXED}) if s.role in (Role.PREFILL, Role.DECODE) else s for s in out]
    return out


def _fields(s: Slot) -> dict[str, object]:
    return {name: getattr(s, name) for name in Slot.__slots__}


def example_snapshot(
    slots: int = 8,
    trajectories: int = 64,
    seed: int = 0,
    model: str = "qwen3-8b",
    gpu: str = "h800",
) -> ClusterSnapshot:
    """A realistic, valid snapshot of ``slots`` slots and ``trajectories`` trajectories (see the module doc)."""
    if slots < 0 or trajectories < 0:
        raise ValueError("slots and trajectories must be >= 0")
    rng = random.Random(f"rollplan-example-{seed}")
    spec = model_spec(model)
    tp = engine_tp(spec.name, gpu)
    time = SNAPSHOT_TIME
    slot_list = _slots(slots, rng, tp, gpu, time)
    kv_cap = perf_model(gpu, spec.name, tp).kv_capacity_tokens(0.9)
    max_ctx = min(spec.max_context, kv_cap)
    hosts = [s for s in slot_list if s.role.decodes and (s.return_by is None or s.return_by > time + 60.0)]
    scale = max_ctx / 40960.0  # token scales shrink with small models (the tiny CPU model holds 512 tokens)

    trajs: list[Trajectory] = []
    n_groups = math.ceil(trajectories / GROUP_SIZE) if trajectories else 0
    for g in range(n_groups):
        gid = f"g{g:04d}"
        # Heavy tail across groups: log-normal total response length, median ~3k tokens.
        group_len = min(rng.lognormvariate(math.log(3000.0), 0.9), 0.7 * spec.max_context) * scale
        group_turns = rng.randint(1, 6)
        prompt = max(1, int(rng.lognormvariate(math.log(1500.0), 0.5) * scale))
        obs = rng.uniform(100.0, 800.0) * scale
        tool_s = rng.uniform(0.5, 8.0)
        for k in range(GROUP_SIZE):
            if len(trajs) >= trajectories:
                break
            total = max(8.0, group_len * rng.uniform(0.8, 1.2))
            turns = group_turns
            progress = rng.random()
            done_turns = min(turns - 1, int(progress * turns))
            rem_turns = turns - done_turns
            generated = total * progress
            rem_decode = max(1.0, total - generated)
            rem_prefill = obs * (rem_turns - 1)
            context = int(prompt + generated + obs * done_turns)
            u = rng.random()
            tid = f"{gid}-{k}"
            slot = rng.choice(hosts).id if hosts else None
            tool_until = None
            if u < 0.05:
                phase = Phase.DONE
                rem_decode = rem_prefill = 0.0
                rem_turns = 0
            elif u < 0.62:
                phase = Phase.DECODING
            elif u < 0.87:
                phase = Phase.IN_TOOL
                tool_until = time + rng.uniform(0.2, tool_s * 1.5)
            else:
                phase = Phase.PREFILL_PENDING
                if rng.random() < 0.3:  # a brand-new trajectory: only its prompt, nowhere yet
                    context, slot = 0, None
                    rem_prefill += prompt
            if phase is not Phase.DONE and slot is not None and rng.random() < 0.03:
                slot = None  # its slot vanished: KV lost, the context must be recomputed
            # Every peak (context + remaining growth) fits the model's context window.
            peak = context + rem_prefill + rem_decode
            if peak > 0.98 * max_ctx:
                shrink = 0.98 * max_ctx / peak
                context, rem_prefill = int(context * shrink), rem_prefill * shrink
                rem_decode = max(1.0, rem_decode * shrink) if phase is not Phase.DONE else 0.0
            spread = 0.25
            trajs.append(
                Trajectory(
                    id=tid,
                    group=gid,
                    phase=phase,
                    context_tokens=max(0, context),
                    slot=slot if phase is not Phase.DONE else None,
                    remaining_decode_tokens=Estimate(round(rem_decode, 1), round(rem_decode * spread, 1)),
                    remaining_prefill_tokens=Estimate(round(rem_prefill, 1), round(rem_prefill * spread, 1)),
                    remaining_tool_seconds=Estimate(round(tool_s * max(rem_turns - 1, 0), 3), round(tool_s * 0.5, 3)),
                    remaining_turns=Estimate(float(rem_turns), 1.0 if rem_turns > 1 else 0.0),
                    tool_until=tool_until,
                )
            )
    return ClusterSnapshot(
        time=time, model=spec.name, slots=tuple(slot_list), trajectories=tuple(trajs), weights_version=WEIGHTS_VERSION
    )
