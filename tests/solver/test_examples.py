"""``example_snapshot``: valid, deterministic, realistic mixes (sources, engines, phases, lost KV)."""

from __future__ import annotations

from collections import Counter

import pytest
from factories import planner_config

from rollplan.models.io import check_snapshot, snapshot_from_json, to_json
from rollplan.models.specs import model_spec
from rollplan.models.types import EngineState, Phase, Role, SlotSource
from rollplan.solver import build_instance, example_snapshot


def test_deterministic_and_round_trips() -> None:
    a = example_snapshot(32, 512, seed=7)
    assert a == example_snapshot(32, 512, seed=7)
    assert a != example_snapshot(32, 512, seed=8)
    assert snapshot_from_json(to_json(a)) == a


@pytest.mark.parametrize(("model", "gpu"), [("qwen3-8b", "h800"), ("qwen3-30b-a3b", "h100"), ("llama-2-70b", "a100"), ("tiny", "cpu")])
def test_valid_for_every_preset(model: str, gpu: str) -> None:
    snap = check_snapshot(example_snapshot(16, 200, seed=1, model=model, gpu=gpu))
    build_instance(snap, planner_config())  # every trajectory fits some slot
    spec = model_spec(model)
    for t in snap.trajectories:
        peak = t.context_tokens + t.remaining_prefill_tokens.mean + t.remaining_decode_tokens.mean
        assert peak <= spec.max_context


def test_realistic_mix() -> None:
    snap = example_snapshot(64, 1024, seed=3)
    sources = Counter(s.source for s in snap.slots)
    assert all(sources[src] > 0 for src in SlotSource)
    assert all(s.return_by is not None for s in snap.slots if s.source is SlotSource.LENT_BY_TRAINING)
    engines = Counter(s.engine for s in snap.slots)
    assert all(engines[e] > 0 for e in EngineState)
    assert any(s.weights_version < snap.weights_version for s in snap.slots if s.engine is EngineState.WARM)
    roles = Counter(s.role for s in snap.slots if s.engine is EngineState.WARM)
    assert roles[Role.MIXED] > roles[Role.PREFILL] + roles[Role.DECODE]
    phases = Counter(t.phase for t in snap.trajectories)
    assert all(phases[p] > 0 for p in Phase)
    assert all(t.tool_until is not None for t in snap.trajectories if t.phase is Phase.IN_TOOL)
    assert any(t.slot is None and t.context_tokens > 0 for t in snap.unfinished)  # lost KV
    # GRPO groups: similar lengths inside a group, heavy tail across groups.
    by_group: dict[str, list[float]] = {}
    for t in snap.unfinished:
        total = t.context_tokens + t.remaining_decode_tokens.mean
        by_group.setdefault(t.group, []).append(total)
    assert len(by_group) >= 100
    means = sorted(sum(v) / len(v) for v in by_group.values())
    assert means[-1] > 4 * means[len(means) // 2]


def test_edge_sizes() -> None:
    assert example_snapshot(0, 0).slots == ()
    assert len(example_snapshot(1, 3).trajectories) == 3
    with pytest.raises(ValueError):
        example_snapshot(-1, 3)
