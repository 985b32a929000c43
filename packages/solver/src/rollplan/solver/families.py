"""Benchmark families: snapshots where planning is hard in one named way (for the bench, the CLI, tests).

``family_snapshot(family, slots, trajectories, seed=0)``; ``FAMILIES`` lists the names:

- ``example``: ``examples.example_snapshot`` (mid-batch, mixed sources and engines): usually bound by one
  long trajectory's critical path, so every backend proves a ~0% gap quickly;
- ``work-bound``: identical warm MIXED H800 slots, every trajectory mid-flight at home with a long agentic
  context (20-34k tokens) and ~2k tokens still to decode (log-normal, sigma 0.3): the slots' KV memory
  binds (a slot cannot run all its trajectories at once), so the makespan is the KV-weighted decode work
  spread over the slots and placement quality decides the gap (not one trajectory's critical path);
- ``heterogeneous``: the same on a rotation of H100 / H800 / A100 slots (different speeds and KV
  capacities), contexts 12-30k tokens;
- ``deadlines``: H800, two thirds dedicated, one third lent by training and due back 60 s after the snapshot
  (warm), trajectories (contexts 8-26k) spread over all of them: the plan must drain the lent slots in time
  or move their work;
- ``long-tail``: H100 / A100 slots, heavy-tailed lengths (log-normal sigma 1.4, capped to the window), 60%
  mid-flight (contexts 4-20k), 40% new: a few trajectories set the makespan, the rest fill in.

Sizes are slots / trajectories, 16 trajectories per slot (``SIZES``): with so few per slot, lengths alone
leave every plan at its critical-path bound; the long contexts are what make these instances hard.
Every snapshot passes ``inputs.check_inputs``; deterministic for (family, slots, trajectories, seed, model).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from rollplan.models.errors import UnknownNameError
from rollplan.models.perf import perf_model
from rollplan.models.specs import model_spec
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
from rollplan.solver.examples import (
    GPUS_PER_NODE,
    GROUP_SIZE,
    SNAPSHOT_TIME,
    WEIGHTS_VERSION,
    engine_tp,
    example_snapshot,
)

FAMILIES = ("example", "work-bound", "heterogeneous", "deadlines", "long-tail")
SIZES: dict[str, tuple[int, int]] = {"S": (32, 512), "M": (256, 4096), "L": (1024, 16384)}
"""Bench sizes: (slots, trajectories)."""
LENT_DEADLINE_SECONDS = 60.0


def _slots(gpus: Sequence[str], n: int, model: str, *, lent_share: float = 0.0, time: float) -> list[Slot]:
    out: list[Slot] = []
    n_lent = round(n * lent_share)
    node_fill: dict[str, int] = {}
    for i in range(n):
        gpu = gpus[i % len(gpus)]
        tp = engine_tp(model, gpu)
        lent = i >= n - n_lent
        # Nodes hold one GPU kind: key the node by kind and a running count of its engines.
        kind_key = f"{gpu}{'-lent' if lent else ''}"
        k = node_fill.get(kind_key, 0)
        node_fill[kind_key] = k + 1
        per_node = max(1, GPUS_PER_NODE // tp)
        node = f"{kind_key}-n{k // per_node:03d}"
        out.append(
            Slot(
                id=f"{node}-s{k % per_node}",
                gpu=gpu,
                node=node,
                tp=tp,
                source=SlotSource.LENT_BY_TRAINING if lent else SlotSource.DEDICATED,
                return_by=time + LENT_DEADLINE_SECONDS if lent else None,
                role=Role.MIXED,
                engine=EngineState.WARM,
                weights_version=WEIGHTS_VERSION,
            )
        )
    return out


def _max_ctx(model: str, slots: Sequence[Slot]) -> int:
    spec = model_spec(model)
    caps = [perf_model(s.gpu, spec.name, s.tp).kv_capacity_tokens(0.9) for s in {(s.gpu, s.tp): s for s in slots}.values()]
    return int(min([spec.max_context, *caps]))


def _batch(
    rng: random.Random,
    n: int,
    slots: Sequence[Slot],
    *,
    model: str,
    median: float,
    sigma: float,
    mid_flight: float,
    context: tuple[float, float] | None = None,
) -> list[Trajectory]:
    """``n`` trajectories in GRPO groups: ``mid_flight`` share decoding at home on a slot, the rest new.

    ``context``: (low, high) tokens already held by a mid-flight trajectory (uniform), instead of the
    prompt plus its progress; its remaining decode is then the whole drawn length.
    """
    max_ctx = _max_ctx(model, slots)
    out: list[Trajectory] = []
    for g in range(math.ceil(n / GROUP_SIZE)):
        gid = f"g{g:05d}"
        group_len = rng.lognormvariate(math.log(median), sigma)
        turns = rng.randint(1, 4)
        prompt = max(16, int(rng.lognormvariate(math.log(1200.0), 0.4)))
        obs = rng.uniform(100.0, 600.0)
        tool_s = rng.uniform(0.5, 5.0)
        for k in range(GROUP_SIZE):
            if len(out) >= n:
                break
            total = max(8.0, group_len * rng.uniform(0.85, 1.15))
            if rng.random() < mid_flight:
                progress = rng.uniform(0.05, 0.6)
                phase, slot = Phase.DECODING, rng.choice(slots).id
                done_turns = min(turns - 1, int(progress * turns))
                if context is None:
                    ctx = int(prompt + total * progress + obs * done_turns)
                    rem_decode = total * (1 - progress)
                else:
                    ctx = int(rng.uniform(*context))
                    rem_decode = total
                rem_prefill = obs * (turns - 1 - done_turns)
                rem_turns = turns - done_turns
            else:
                phase, slot, ctx = Phase.PREFILL_PENDING, None, 0
                rem_decode, rem_prefill, rem_turns = total, prompt + obs * (turns - 1), turns
            peak = ctx + rem_prefill + rem_decode
            if peak > 0.98 * max_ctx:  # fit the window (and the smallest slot's KV)
                f = 0.98 * max_ctx / peak
                ctx, rem_prefill, rem_decode = int(ctx * f), rem_prefill * f, max(1.0, rem_decode * f)
            out.append(
                Trajectory(
                    id=f"{gid}-{k}",
                    group=gid,
                    phase=phase,
                    context_tokens=ctx,
                    slot=slot,
                    remaining_decode_tokens=Estimate(round(rem_decode, 1), round(0.25 * rem_decode, 1)),
                    remaining_prefill_tokens=Estimate(round(rem_prefill, 1), round(0.25 * rem_prefill, 1)),
                    remaining_tool_seconds=Estimate(round(tool_s * (rem_turns - 1), 3), round(0.5 * tool_s, 3)),
                    remaining_turns=Estimate(float(rem_turns), 1.0 if rem_turns > 1 else 0.0),
                )
            )
    return out


def family_snapshot(
    family: str, slots: int, trajectories: int, seed: int = 0, *, model: str = "qwen3-8b"
) -> ClusterSnapshot:
    """The ``family`` snapshot with ``slots`` slots and ``trajectories`` trajectories (module docstring).

    Raises ``UnknownNameError`` for a family outside ``FAMILIES``.
    """
    if family not in FAMILIES:
        raise UnknownNameError("snapshot family", family, FAMILIES)
    if slots < 1 or trajectories < 0:
        raise ValueError("a family snapshot needs slots >= 1 and trajectories >= 0")
    if family == "example":
        return example_snapshot(slots, trajectories, seed=seed, model=model)
    rng = random.Random(f"rollplan-family-{family}-{seed}")
    time = SNAPSHOT_TIME
    spec = model_spec(model)
    if family == "work-bound":
        sl = _slots(("h800",), slots, spec.name, time=time)
        trajs = _batch(rng, trajectories, sl, model=spec.name, median=2000.0, sigma=0.3, mid_flight=1.0,
                       context=(20000.0, 34000.0))
    elif family == "heterogeneous":
        sl = _slots(("h100", "h800", "a100"), slots, spec.name, time=time)
        trajs = _batch(rng, trajectories, sl, model=spec.name, median=2500.0, sigma=0.4, mid_flight=1.0,
                       context=(12000.0, 30000.0))
    elif family == "deadlines":
        sl = _slots(("h800",), slots, spec.name, lent_share=1 / 3, time=time)
        trajs = _batch(rng, trajectories, sl, model=spec.name, median=2500.0, sigma=0.4, mid_flight=1.0,
                       context=(8000.0, 26000.0))
    else:  # long-tail
        sl = _slots(("h100", "a100"), slots, spec.name, time=time)
        trajs = _batch(rng, trajectories, sl, model=spec.name, median=1500.0, sigma=1.4, mid_flight=0.6,
                       context=(4000.0, 20000.0))
    return ClusterSnapshot(
        time=time, model=spec.name, slots=tuple(sl), trajectories=tuple(trajs), weights_version=WEIGHTS_VERSION
    )
