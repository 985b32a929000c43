"""Hardware and model presets: exact architecture-derived figures, lookups, unknown names.

Invariants (hypothesis):
- for every preset model, KV bytes per token = 2 * layers * kv_heads * head_dim * dtype bytes;
- MoE experts touched by n tokens is non-decreasing in n, between top_k (n = 1) and the expert count.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollplan.models import (
    GPU_PRESETS,
    MODEL_PRESETS,
    GpuKind,
    ModelSpec,
    UnknownNameError,
    gpu_kind,
    model_spec,
)


def test_kv_bytes_per_token_exact_values() -> None:
    # Qwen3-8B: 36 layers x 8 KV heads x 128 head dim x K and V x 2 bytes (bf16).
    assert model_spec("qwen3-8b").kv_bytes_per_token == 147_456
    # Qwen3-30B-A3B: 48 layers x 4 KV heads x 128 x 2 x 2.
    assert model_spec("qwen3-30b-a3b").kv_bytes_per_token == 98_304
    assert model_spec("llama-3-8b").kv_bytes_per_token == 131_072
    assert model_spec("llama-2-70b").kv_bytes_per_token == 327_680


def test_required_presets_exist() -> None:
    assert {"h800", "h100", "h200", "a100", "cpu"} <= set(GPU_PRESETS)
    assert {"qwen3-8b", "qwen3-30b-a3b", "llama-3-8b", "llama-2-70b", "tiny"} <= set(MODEL_PRESETS)
    for g in GPU_PRESETS.values():
        assert isinstance(g, GpuKind) and g.memory_bytes > 0 and g.bf16_flops > 0 and g.hbm_bandwidth > 0
        assert g.nvlink_bandwidth > 0 and g.network_bandwidth > 0


def test_gpu_figures() -> None:
    h100, h200 = gpu_kind("h100"), gpu_kind("h200")
    assert h100.bf16_flops == h200.bf16_flops  # same compute die
    assert h200.hbm_bandwidth > h100.hbm_bandwidth and h200.memory_bytes > h100.memory_bytes
    assert gpu_kind("h800").nvlink_bandwidth < h100.nvlink_bandwidth  # export-restricted NVLink


def test_moe_total_vs_active_params() -> None:
    moe = model_spec("qwen3-30b-a3b")
    assert moe.is_moe and moe.active_params < moe.params
    assert moe.experts_touched(1) == pytest.approx(moe.experts_per_token)
    assert moe.experts_touched(10_000) == pytest.approx(moe.num_experts)
    assert moe.weight_bytes_read(1) < moe.weight_bytes_read(1000) <= moe.weight_bytes * 1.0001
    dense = model_spec("qwen3-8b")
    assert not dense.is_moe and dense.experts_touched(100) == 0.0
    assert dense.weight_bytes_read(1) == dense.weight_bytes


def test_lookup_is_case_and_separator_insensitive() -> None:
    assert gpu_kind("H100") is GPU_PRESETS["h100"]
    assert gpu_kind("a100-80gb") is GPU_PRESETS["a100"]
    assert model_spec("Qwen3_8B") is MODEL_PRESETS["qwen3-8b"]
    assert model_spec("llama3-8b") is MODEL_PRESETS["llama-3-8b"]
    spec = model_spec("tiny")
    assert model_spec(spec) is spec and gpu_kind(GPU_PRESETS["cpu"]) is GPU_PRESETS["cpu"]


@pytest.mark.parametrize(("fn", "name", "what"), [(gpu_kind, "h900", "GPU kind"), (model_spec, "gpt-9", "model")])
def test_unknown_names_list_known_ones(fn, name: str, what: str) -> None:
    with pytest.raises(UnknownNameError) as info:
        fn(name)
    text = str(info.value)
    assert what in text and repr(name) in text and "To fix: use one of:" in text
    assert "\n" not in text


@given(st.sampled_from(sorted(MODEL_PRESETS)))
def test_kv_bytes_formula(name: str) -> None:
    m: ModelSpec = MODEL_PRESETS[name]
    assert m.kv_bytes_per_token == 2 * m.layers * m.kv_heads * m.head_dim * m.dtype_bytes


@given(st.floats(0, 5000), st.floats(0, 5000))
def test_experts_touched_monotone(a: float, b: float) -> None:
    moe = model_spec("qwen3-30b-a3b")
    lo, hi = sorted((a, b))
    assert moe.experts_touched(lo) <= moe.experts_touched(hi) + 1e-9
    assert moe.experts_touched(hi) <= moe.num_experts + 1e-9


@pytest.mark.parametrize(
    ("model", "tp", "needle"),
    [
        ("qwen3-8b", 3, "tp=3 does not divide qwen3-8b's 32 attention heads"),
        ("qwen3-8b", 0, "tp=0 is not a positive integer"),
        ("qwen3-8b", -4, "tp=-4 is not a positive integer"),
        ("qwen3-8b", 2.0, "tp=2.0 is not a positive integer"),
        ("qwen3-8b", True, "tp=True is not a positive integer"),
        ("qwen3-8b", "2", "tp='2' is not a positive integer"),
        ("tiny", 4, "tp=4 does not divide tiny's 2 attention heads"),
    ],
)
def test_tp_degree_checks(model: str, tp: object, needle: str) -> None:
    from rollplan.models.errors import UserInputError
    from rollplan.models.perf import perf_model
    from rollplan.models.specs import check_tp

    with pytest.raises(UserInputError, match=re.escape(needle)) as info:
        check_tp(model_spec(model), tp)
    assert "To fix:" in str(info.value)
    for calibrated in (False, True):
        if model == "tiny" and calibrated:
            continue  # no shipped calibration for the CPU
        with pytest.raises(UserInputError, match=re.escape(needle)):
            perf_model("h100", model, tp, calibrated=calibrated)  # type: ignore[arg-type]


def test_valid_tp_degrees_pass() -> None:
    import numpy as np

    from rollplan.models.specs import check_tp

    assert [check_tp(model_spec("qwen3-8b"), t) for t in (1, 2, 4, 8, 16, 32)] == [1, 2, 4, 8, 16, 32]
    assert check_tp(model_spec("llama-2-70b"), 16) == 16  # 8 KV heads replicated over 16 GPUs
    assert check_tp(model_spec("qwen3-8b"), np.int64(4)) == 4
