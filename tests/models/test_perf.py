"""Performance models: roofline and calibrated, through the PerfModel protocol.

Invariants (hypothesis), for the roofline and the shipped H100/H200 calibrations, every preset model, TP 1/2/4:
- decode step time is non-decreasing in batch and in KV tokens per sequence;
- prefill time is non-decreasing in prompt tokens, in cached tokens, and in the number of prompts;
- KV capacity in sequences is non-increasing in context length.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models import UserInputError, gpu_kind, model_spec
from rollplan.models.errors import SchemaError, UnknownNameError
from rollplan.models.perf import (
    CalibratedPerfModel,
    Calibration,
    PerfModel,
    RooflinePerfModel,
    default_provider,
    load_calibrated,
    load_calibration,
    perf_model,
    save_calibration,
    shipped_calibration,
)
from rollplan.models.perf.calibrated import StepFit, SwitchFit, Transfer
from rollplan.models.perf.compose import LayerShapes
from rollplan.models.perf.kernels import Curve, smooth_max

MODELS = ["qwen3-8b", "qwen3-30b-a3b", "llama-3-8b", "llama-2-70b"]


def make_perf(kind: str, gpu: str = "h100", model: str = "llama-3-8b", tp: int = 1) -> PerfModel:
    return perf_model(gpu, model, tp, calibrated=(kind == "calibrated"))


# --- protocol and construction ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["roofline", "calibrated"])
def test_models_satisfy_protocol(kind: str) -> None:
    perf = make_perf(kind)
    assert isinstance(perf, PerfModel)
    assert perf.gpu.name == "h100" and perf.model.name == "llama-3-8b" and perf.tp == 1


def test_perf_model_picks_implementation() -> None:
    assert isinstance(perf_model("h100", "qwen3-8b"), RooflinePerfModel)
    assert isinstance(perf_model("h200", "qwen3-8b", 2, calibrated=True), CalibratedPerfModel)
    with pytest.raises(UnknownNameError):
        perf_model("h900", "qwen3-8b")
    with pytest.raises(UnknownNameError):
        perf_model("h100", "gpt-9", calibrated=True)


def test_no_shipped_calibration_is_a_clear_user_error() -> None:
    with pytest.raises(UserInputError, match=r"no calibration is shipped for GPU kind .a100.*To fix"):
        perf_model("a100", "llama-3-8b", calibrated=True)


def test_default_provider_caches_per_gpu_and_tp() -> None:
    provide = default_provider("qwen3-8b", calibrated=True)
    a = provide("h100", 2)
    assert provide("h100", 2) is a
    assert provide("h200", 2) is not a and provide("h200", 2).gpu.name == "h200"


# --- roofline physics -----------------------------------------------------------------------------------------


def test_decode_is_weight_bandwidth_bound_at_batch_one() -> None:
    perf = RooflinePerfModel(gpu_kind("h100"), model_spec("llama-3-8b"))
    t = perf.decode_step_time(1, 100)
    floor = perf.model.weight_bytes / (perf.gpu.hbm_bandwidth * perf.mbu)
    assert floor < t < floor * 1.5 + perf.step_overhead


def test_long_prefill_is_compute_bound() -> None:
    perf = RooflinePerfModel(gpu_kind("h100"), model_spec("llama-3-8b"))
    n = 8192
    flops = 2 * perf.model.params * n
    t = perf.prefill_time([n])
    assert t > flops / (perf.gpu.bf16_flops * perf.mfu)
    # Causal attention makes 2 x 8192 cost more than twice 8192 / 2 x 2.
    assert perf.prefill_time([16384]) > 2 * perf.prefill_time([8192]) > 4 * perf.prefill_time([4096]) * 0.99


def test_tp_speeds_up_and_adds_allreduce() -> None:
    m, g = model_spec("llama-3-8b"), gpu_kind("h100")
    t1 = RooflinePerfModel(g, m, 1).decode_breakdown(64, 1000)
    t4 = RooflinePerfModel(g, m, 4).decode_breakdown(64, 1000)
    assert t1.allreduce == 0.0 and t4.allreduce > 0.0
    assert t4.total < t1.total
    h800 = RooflinePerfModel(gpu_kind("h800"), m, 4).decode_breakdown(64, 1000)
    assert h800.allreduce > t4.allreduce  # slower NVLink


def test_moe_reads_only_touched_experts() -> None:
    moe = RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-30b-a3b"), 1)
    dense = RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 1)
    # At batch 1 the MoE reads ~3B active parameters, less than the dense 8B model...
    assert moe.decode_step_time(1, 100) < dense.decode_step_time(1, 100)
    # ...while a large batch touches every expert (30B weights).
    assert moe.decode_breakdown(256, 100).gemm > 3 * moe.decode_breakdown(1, 100).gemm
    shapes = LayerShapes.of(model_spec("qwen3-30b-a3b"), 2)
    assert shapes.expert_ffn_local == 384 and shapes.experts == 128 and shapes.top_k == 8


def test_kv_capacity_memory_arithmetic() -> None:
    perf = RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 1)
    free = 80e9 * 0.9 - perf.model.weight_bytes - perf.activation_reserve_bytes
    assert perf.kv_capacity_tokens(0.9) == int(free // 147_456)
    assert perf.kv_capacity_seqs(4096, 0.9) == perf.kv_capacity_tokens(0.9) // 4096
    assert perf.kv_capacity_tokens(0.5) < perf.kv_capacity_tokens(0.9)
    # TP 2 splits weights and KV heads: more than twice the tokens of TP 1.
    assert RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 2).kv_capacity_tokens() > 2 * perf.kv_capacity_tokens()
    # Llama-2-70B does not fit one H100.
    assert RooflinePerfModel(gpu_kind("h100"), model_spec("llama-2-70b"), 1).kv_capacity_tokens() == 0


def test_kv_heads_replicate_beyond_tp() -> None:
    # Qwen3-30B-A3B has 4 KV heads: at TP 8 each GPU still holds one, so KV per GPU stops shrinking.
    s8 = LayerShapes.of(model_spec("qwen3-30b-a3b"), 8)
    assert s8.kv_heads == 1 and s8.q_heads == 4


def test_switching_times() -> None:
    perf = RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 1)
    assert 60 <= perf.cold_start_time() <= 350
    assert 0.1 <= perf.wake_time() <= 0.4
    assert perf.weight_sync_time(same_node=True) < perf.weight_sync_time(same_node=False)
    assert perf.weight_sync_time() > perf.switch.weight_sync_fixed
    assert perf.kv_transfer_time(10_000, True) < perf.kv_transfer_time(10_000, False)
    assert perf.kv_transfer_time(0, True) == perf.switch.link_latency
    assert perf.reprefill_time(4096) == pytest.approx(perf.prefill_time([4096]))
    assert perf.reprefill_time(0) == 0.0 and perf.role_switch_time() >= 0.0
    assert perf.weight_bytes() == perf.model.weight_bytes


def test_degenerate_inputs_are_zero() -> None:
    for kind in ("roofline", "calibrated"):
        perf = make_perf(kind)
        assert perf.decode_step_time(0, 100) == 0.0
        assert perf.prefill_time([]) == 0.0 and perf.prefill_time([0, 0]) == 0.0


# --- calibrated model -----------------------------------------------------------------------------------------


def test_shipped_calibrations_load_and_report_targets() -> None:
    for gpu in ("h100", "h200"):
        cal = shipped_calibration(gpu)
        assert cal.gpu == gpu and cal.gemm is not None and cal.attn_decode is not None and cal.attn_prefill is not None
        assert set(cal.allreduce) >= {2, 4}
        mape = cal.report["mape"]
        assert mape["decode_step"]["mape"] <= 0.15 and mape["prefill"]["mape"] <= 0.15
        assert all(cal.report["pass"].values())
    assert shipped_calibration("h100").report["tpot"]["max_abs_error_batch_ge_20"] <= 0.20


def test_shipped_calibration_is_small_numbers_only() -> None:
    import rollplan.models

    data = Path(rollplan.models.__file__).parent / "data"
    for gpu in ("h100", "h200"):
        path = data / f"calibrated_{gpu}.json"
        assert path.stat().st_size < 30_000
        assert json.loads(path.read_text())["schema"] == "rollplan.perf.calibration/1"


@pytest.mark.parametrize("model", MODELS)
def test_calibrated_close_to_roofline_in_magnitude(model: str) -> None:
    # Fitted on Llama-3-8B shapes, the kernel fits transfer to other shapes: within 2x of first principles.
    for tp in (2, 4):
        cal, roof = make_perf("calibrated", "h100", model, tp), make_perf("roofline", "h100", model, tp)
        for b, kv in ((1, 100), (64, 2000), (256, 8000)):
            assert 0.5 < cal.decode_step_time(b, kv) / roof.decode_step_time(b, kv) < 2.0
        assert 0.5 < cal.prefill_time([4096]) / roof.prefill_time([4096]) < 2.0


def test_h200_is_faster_than_h100_when_bandwidth_bound() -> None:
    h100 = make_perf("calibrated", "h100", "qwen3-8b", 1)
    h200 = make_perf("calibrated", "h200", "qwen3-8b", 1)
    assert h200.decode_step_time(32, 4000) < h100.decode_step_time(32, 4000)
    assert h200.kv_capacity_tokens() > h100.kv_capacity_tokens()


def test_calibrated_kv_transfer_uses_measured_send_recv() -> None:
    perf = make_perf("calibrated", "h100", "llama-3-8b", 1)
    assert isinstance(perf, CalibratedPerfModel)
    # Vidur: 64 MB in ~0.19 ms same node, ~2 ms across nodes.
    tokens = 64_000_000 // 131_072
    assert 1e-4 < perf.kv_transfer_time(tokens, True) < 4e-4
    assert 1e-3 < perf.kv_transfer_time(tokens, False) < 4e-3
    # Switching that the tables do not measure falls back to the roofline.
    assert perf.cold_start_time() == perf.roofline.cold_start_time()
    assert perf.wake_time() == perf.roofline.wake_time()


def test_unmeasured_kernels_fall_back_to_roofline() -> None:
    bare = Calibration(gpu="h100")
    perf = bare.perf_model("qwen3-8b", 2)
    roof = RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 2)
    assert perf.decode_step_time(16, 1000) == pytest.approx(roof.decode_step_time(16, 1000))
    assert perf.prefill_time([1000, 200]) == pytest.approx(roof.prefill_time([1000, 200]))
    assert perf.kv_transfer_time(100, False) == pytest.approx(roof.kv_transfer_time(100, False))
    # An all-reduce curve for TP 2 only: TP 4 falls back.
    cal = replace(shipped_calibration("h100"), allreduce={2: shipped_calibration("h100").allreduce[2]})
    k4 = cal.kernels(RooflinePerfModel(gpu_kind("h100"), model_spec("qwen3-8b"), 4))
    assert k4.allreduce(1e6, 4) == pytest.approx(roof.kernels.allreduce(1e6, 4))


def test_step_fit_takes_precedence_for_its_model_and_tp(tmp_path: Path) -> None:
    step = StepFit("tiny", 1, decode=(0.004, 0.0005, 1e-6), prefill=(0.005, 5e-5, 0.0, 2e-4), kv_capacity_tokens=4096)
    sw = SwitchFit(engine_start_s=2.0, wake_s=0.05, role_switch_s=0.02, weight_sync=Transfer(fixed_s=0.03),
                   kv_same_node=Transfer(fixed_s=1e-3, bytes_per_s=1e9))
    cal = Calibration(gpu="cpu", steps=(step,), switch=sw)
    path = tmp_path / "cpu_tiny.json"
    save_calibration(cal, path)
    assert load_calibration(path) == cal
    perf = load_calibrated(path)
    assert perf.model.name == "tiny" and perf.tp == 1
    assert perf.decode_step_time(8, 300) == pytest.approx(0.004 + 0.0005 * 8 + 1e-6 * 8 * 300)
    assert perf.prefill_time([100, 50]) == pytest.approx(0.005 + 5e-5 * 150 + 2e-4 * 2)
    assert perf.kv_capacity_tokens() == 4096 and perf.kv_capacity_seqs(1000) == 4
    assert (perf.cold_start_time(), perf.wake_time(), perf.role_switch_time(), perf.weight_sync_time()) == (2.0, 0.05, 0.02, 0.03)
    assert perf.kv_transfer_time(1000, True) == pytest.approx(1e-3 + 1000 * 1024 / 1e9)  # tiny: 1024 KV bytes per token
    # The same calibration through the public entry points, and a model/TP it has no step fit for.
    assert perf_model("cpu", "tiny", calibration=path).decode_step_time(8, 300) == perf.decode_step_time(8, 300)
    other = perf_model("cpu", "tiny", 2, calibration=cal)
    assert other.decode_step_time(8, 300) != perf.decode_step_time(8, 300)
    assert default_provider("tiny", calibration=path)("cpu", 1).wake_time() == 0.05


def test_load_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="cannot read calibration file"):
        load_calibration(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SchemaError, match=r"bad\.json:1"):
        load_calibration(bad)
    bad.write_text(json.dumps({"gpu": "h100", "gemm": {"launch_s": "fast"}}))
    with pytest.raises(SchemaError, match="gemm"):
        load_calibration(bad)
    bad.write_text(json.dumps({"gpu": "h100", "allreduce": {"2": {"x": [2, 1], "y": [1, 2]}}}))
    with pytest.raises(SchemaError, match=r"allreduce\.2: .*strictly increasing.*perf fit"):
        load_calibration(bad)
    bad.write_text(json.dumps({"gpu": "h100", "schema": "other/9"}))
    with pytest.raises(SchemaError, match="unsupported calibration schema"):
        load_calibration(bad)
    save_calibration(Calibration(gpu="h100"), bad)
    with pytest.raises(UserInputError, match="say which model"):
        load_calibrated(bad)
    assert load_calibrated(bad, "qwen3-8b", 2).tp == 2


# --- small building blocks ------------------------------------------------------------------------------------


def test_curve_interpolates_log_log_and_extrapolates_linearly() -> None:
    c = Curve((1e3, 1e6, 2e6), (1e-5, 1e-4, 2e-4))
    assert c(1.0) == 1e-5  # latency floor below the first knot
    assert c(1e6) == pytest.approx(1e-4)
    assert 1e-5 < c(3e4) < 1e-4
    assert c(4e6) == pytest.approx(4e-4)  # linear beyond the last knot


def test_smooth_max() -> None:
    assert smooth_max((3.0, 4.0), 1.0) == 7.0
    assert smooth_max((3.0, 4.0), 2.0) == pytest.approx(5.0)
    assert smooth_max((0.0, 0.0), 3.0) == 0.0
    assert 4.0 <= smooth_max((3.0, 4.0), 8.0) < 4.1


# --- invariants -----------------------------------------------------------------------------------------------

_perf_models = st.builds(
    make_perf,
    st.sampled_from(["roofline", "calibrated"]),
    st.sampled_from(["h100", "h200"]),
    st.sampled_from(MODELS),
    st.sampled_from([1, 2, 4]),
)


@settings(max_examples=60, deadline=None)
@given(_perf_models, st.integers(1, 512), st.integers(1, 512), st.floats(0, 30_000), st.floats(0, 30_000))
def test_decode_monotone(perf: PerfModel, b1: int, b2: int, kv1: float, kv2: float) -> None:
    (blo, bhi), (klo, khi) = sorted((b1, b2)), sorted((kv1, kv2))
    assert perf.decode_step_time(blo, klo) <= perf.decode_step_time(bhi, klo) * (1 + 1e-12)
    assert perf.decode_step_time(blo, klo) <= perf.decode_step_time(blo, khi) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(_perf_models, st.integers(1, 16_384), st.integers(1, 16_384), st.integers(0, 8192), st.integers(1, 8))
def test_prefill_monotone(perf: PerfModel, p1: int, p2: int, cached: int, seqs: int) -> None:
    lo, hi = sorted((p1, p2))
    assert perf.prefill_time([lo]) <= perf.prefill_time([hi]) * (1 + 1e-12)
    assert perf.prefill_time([lo]) <= perf.prefill_time([lo], [cached]) * (1 + 1e-12)
    assert perf.prefill_time([lo] * seqs) <= perf.prefill_time([lo] * (seqs + 1)) * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(_perf_models, st.floats(1, 100_000), st.floats(1, 100_000))
def test_kv_capacity_seqs_non_increasing(perf: PerfModel, c1: float, c2: float) -> None:
    lo, hi = sorted((c1, c2))
    assert perf.kv_capacity_seqs(hi) <= perf.kv_capacity_seqs(lo)


def test_h800_calibration_is_h100s_kernels_with_its_own_nvlink() -> None:
    # H800 = H100 die and HBM with NVLink capped at 400 GB/s: single-GPU steps priced as the H100 fit; the
    # NVLink-bound terms (TP all-reduce, same-node KV transfer) from the H800's slower link, so slower.
    from rollplan.models.perf import perf_model, shipped_calibration

    h800, h100 = (perf_model(g, "qwen3-8b", 1, calibrated=True) for g in ("h800", "h100"))
    assert h800.decode_step_time(32, 4000) == h100.decode_step_time(32, 4000)
    assert h800.step_time(1024, 8000, 16, 16 * 6000) == h100.step_time(1024, 8000, 16, 16 * 6000)
    assert h800.decode_step_time(32, 4000) != perf_model("h800", "qwen3-8b", 1).decode_step_time(32, 4000)
    t800, t100 = (perf_model(g, "qwen3-8b", 2, calibrated=True) for g in ("h800", "h100"))
    assert t800.decode_step_time(32, 4000) > t100.decode_step_time(32, 4000)
    assert t800.kv_transfer_time(10_000, True) > t100.kv_transfer_time(10_000, True)
    cal = shipped_calibration("h800")
    assert cal.gpu == "h800" and cal.report["derived_from"] == "h100" and not cal.allreduce
