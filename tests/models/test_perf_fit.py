"""Fitting calibrations: numeric tools, profiler JSONL, and the shared measured tables.

Invariants (hypothesis):
- NNLS returns non-negative coefficients and recovers exact non-negative solutions;
- isotonic regression output is non-decreasing and keeps the mean;
- a monotone curve fitted to any points is non-decreasing.

The profile tests use synthetic measurements generated from known coefficients (a stand-in for the
executor's profiler output, which needs real engines): the fit must recover them.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models import gpu_kind
from rollplan.models.errors import TraceError, UserInputError
from rollplan.models.perf import (
    Calibration,
    load_calibrated,
    perf_model,
    save_calibration,
    shipped_calibration,
)
from rollplan.models.perf import fit as fitting
from rollplan.models.perf.numeric import isotonic, nnls

# --- numeric tools --------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_nnls_recovers_non_negative_solutions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.random((30, 4)) + 0.1
    x = rng.random(4) * (rng.random(4) > 0.3)
    got = nnls(a, a @ x)
    assert np.all(got >= 0)
    assert np.allclose(got, x, atol=1e-6)
    # With a target that wants negative weights, coefficients stay >= 0.
    assert np.all(nnls(a, a @ (x - 1.0)) >= 0)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40))
def test_isotonic_non_decreasing_and_mean_preserving(y: list[float]) -> None:
    out = isotonic(y)
    assert len(out) == len(y)
    assert np.all(np.diff(out) >= -1e-9)
    assert np.mean(out) == pytest.approx(np.mean(y), abs=1e-6)


@given(st.lists(st.tuples(st.floats(1, 1e9), st.floats(1e-6, 1.0)), min_size=2, max_size=60))
def test_monotone_curve(points: list[tuple[float, float]]) -> None:
    curve, err = fitting.monotone_curve(points, max_knots=8)
    xs = [*sorted({x for x, _ in points}), 2000000000.0]
    ys = [curve(x) for x in xs]
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(ys))
    assert err >= 0


# --- profiler JSONL -----------------------------------------------------------------------------------------

DEC = (0.004, 5e-4, 1e-6)  # fixed, per sequence, per (sequence x KV token)
PRE = (0.005, 5e-5, 5e-8, 2e-4)  # fixed, per token, per attention work, per sequence


def synthetic_profile() -> list[str]:
    lines = ["# synthetic profiler output (known coefficients)"]
    for b in (1, 2, 4, 8, 16):
        for kv in (10, 100, 300, 1000):
            t = DEC[0] + DEC[1] * b + DEC[2] * b * kv
            lines.append(json.dumps({"phase": "decode", "batch": b, "kv_tokens": kv, "seconds": t}))
    for prompts, cached in (([64], [0]), ([128, 64], [0, 0]), ([256], [0]), ([32] * 4, [0] * 4), ([100], [200]), ([500, 20], [0, 40])):
        work = sum(n * (c + n / 2) for n, c in zip(prompts, cached, strict=True))
        t = PRE[0] + PRE[1] * sum(prompts) + PRE[2] * work + PRE[3] * len(prompts)
        lines.append(json.dumps({"phase": "prefill", "prompt_tokens": prompts, "cached_tokens": cached, "seconds": t}))
    lines += [
        '{"phase": "engine_start", "seconds": 1.8}',
        '{"phase": "engine_start", "seconds": 2.2}',
        '{"phase": "wake", "seconds": 0.05}',
        '{"phase": "weight_sync", "seconds": 0.03}',
        '{"phase": "role_switch", "seconds": 0.02}',
        '{"phase": "kv_transfer", "tokens": 100, "same_node": true, "seconds": 0.0011}',
        '{"phase": "kv_transfer", "tokens": 1000, "same_node": true, "seconds": 0.002}',
        '{"phase": "kv_capacity", "tokens": 65536}',
        "",
    ]
    return lines


def test_fit_profile_recovers_known_coefficients(tmp_path: Path) -> None:
    records = fitting.parse_profile(synthetic_profile(), source="synthetic.jsonl")
    cal = fitting.fit_profile(records, "cpu", "tiny")
    step = cal.step_fit("tiny", 1)
    assert step is not None and step.decode is not None and step.prefill is not None
    assert np.allclose(step.decode, DEC, rtol=1e-6, atol=1e-12)
    assert np.allclose(step.prefill, PRE, rtol=1e-5, atol=1e-12)
    assert cal.report["mape"]["decode_step"] < 1e-6 and cal.report["mape"]["prefill"] < 1e-6
    assert step.switch is not None and step.switch.engine_start_s == pytest.approx(2.0)
    path = tmp_path / "cpu_tiny.json"
    save_calibration(cal, path)
    perf = load_calibrated(path)
    assert perf.decode_step_time(8, 300) == pytest.approx(DEC[0] + DEC[1] * 8 + DEC[2] * 2400)
    assert perf.prefill_time([100], [200]) == pytest.approx(PRE[0] + PRE[1] * 100 + PRE[2] * 100 * 250 + PRE[3])
    assert (perf.cold_start_time(), perf.wake_time(), perf.weight_sync_time(), perf.role_switch_time()) == pytest.approx(
        (2.0, 0.05, 0.03, 0.02))
    # 1 ms fixed + 1 us per token (1024 bytes per token on the tiny model).
    assert perf.kv_transfer_time(500, True) == pytest.approx(0.0011 + 400 * 0.0009 / 900, rel=1e-6)
    assert perf.kv_transfer_time(500, False) == perf.roofline.kv_transfer_time(500, False)  # not measured
    assert perf.kv_capacity_tokens() == 65536
    assert perf_model("cpu", "tiny", calibrated=True, calibration=path).decode_step_time(2, 10) == pytest.approx(
        DEC[0] + 2 * DEC[1] + 20 * DEC[2])


def test_fit_profile_with_few_points_falls_back_to_fewer_terms() -> None:
    recs = fitting.parse_profile([
        '{"phase": "decode", "batch": 4, "kv_tokens": 100, "seconds": 0.01}',
        '{"phase": "prefill", "prompt_tokens": [128], "seconds": 0.02}',
        '{"phase": "prefill", "prompt_tokens": [256], "seconds": 0.03}',
    ])
    step = fitting.fit_profile(recs, "cpu", "tiny").step_fit("tiny", 1)
    assert step is not None and step.decode == (0.01, 0.0, 0.0)
    assert step.prefill is not None and step.prefill_time([128], [0]) == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "p.jsonl:2: not valid JSON"),
        ("[1, 2]", "p.jsonl:2: expected a JSON object"),
        ('{"phase": "warp", "seconds": 1}', "p.jsonl:2: unknown phase 'warp'"),
        ('{"phase": "decode", "batch": 4, "kv_tokens": 10}', "p.jsonl:2: missing field 'seconds'"),
        ('{"phase": "decode", "batch": 0, "kv_tokens": 10, "seconds": 0.1}', "p.jsonl:2: decode needs batch >= 1"),
        ('{"phase": "decode", "batch": "8", "kv_tokens": 10, "seconds": 0.1}', "p.jsonl:2: field 'batch' must be an integer"),
        ('{"phase": "decode", "batch": 8, "kv_tokens": 10, "seconds": -1}', "p.jsonl:2: field 'seconds' must be > 0"),
        ('{"phase": "prefill", "prompt_tokens": [0], "seconds": 0.1}', "p.jsonl:2: prefill needs prompt_tokens"),
        ('{"phase": "prefill", "prompt_tokens": [5], "cached_tokens": [1, 2], "seconds": 0.1}', "p.jsonl:2: prefill needs"),
        ('{"phase": "kv_transfer", "seconds": 0.1}', "p.jsonl:2: kv_transfer needs tokens"),
        ('{"phase": "kv_capacity", "tokens": -3}', "p.jsonl:2: kv_capacity needs tokens > 0"),
    ],
)
def test_parse_profile_errors_name_file_line(line: str, match: str) -> None:
    with pytest.raises(TraceError, match=match) as info:
        fitting.parse_profile(['{"phase": "wake", "seconds": 0.1}', line], source="p.jsonl")
    assert "To fix:" in str(info.value)


def test_read_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="cannot read profile"):
        fitting.read_profile(tmp_path / "none.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# nothing\n\n")
    with pytest.raises(TraceError, match="no measurements"):
        fitting.read_profile(empty)


def test_fit_tables_missing_data_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="data folder"):
        fitting.fit_tables(tmp_path / "nowhere", "h100")
    with pytest.raises(UserInputError, match=r"measured table .* not found"):
        fitting.fit_tables(tmp_path, "h100")
    with pytest.raises(UserInputError, match="no measurements for GPU kind 'cpu'"):
        fitting.fit_tables(tmp_path, "cpu")


def test_burst_schedule_accounting() -> None:
    sched = fitting.burst_schedule(40, 200, 150, max_num_seqs=16, max_batched_tokens=2048)
    assert len(sched.outputs) == 40 and max(sched.step_seqs) <= 16
    # Every prefill step admits at most 2048 / 200 = 10 prompts; every prompt is prefilled exactly once.
    pre = [s for s, p in zip(sched.step_seqs, sched.step_prefill, strict=True) if p]
    assert max(pre) <= 10 and sum(pre) == 40
    assert all(a <= b for a, b in zip(sched.first, sched.last, strict=True))
    res = fitting.burst_result(sched, [0.01] * len(sched.step_seqs))
    assert res.duration_s == pytest.approx(0.01 * len(sched.step_seqs))
    assert res.median_tpot_s >= 0.01  # at least one step per token, more when prefills interleave


# --- shared measured tables -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_fit(shared_data: Path) -> Calibration:
    return fitting.fit_tables(shared_data, "h100")


def test_h100_fit_meets_targets(h100_fit: Calibration) -> None:
    # Issue 13's targets: kernel-table step MAPE <= 5%, TPOT against the Lambda vLLM sweep within 10%.
    rep = h100_fit.report
    assert rep["targets"]["step_mape_max"] == 0.05 and rep["targets"]["tpot_error_max"] == 0.10
    for phase in ("decode_step", "prefill", "mixed_step"):
        assert rep["mape"][phase]["mape"] <= 0.05
        assert set(rep["mape"][phase]["by_tp"]) == {"1", "2", "4"}
        assert all(v <= 0.05 for v in rep["mape"][phase]["by_tp"].values())
    tpot = rep["tpot"]
    big = [r for r in tpot["rows"] if r["num_prompts"] >= 20]
    assert len(big) == 5 and all(abs(r["error"]) <= 0.10 for r in big)
    assert rep["pass"] == {"decode_step_mape": True, "prefill_mape": True, "mixed_step_mape": True, "tpot_batch_ge_20": True}


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_per_tp_predicted_vs_measured(gpu: str, h100_fit: Calibration, shared_data: Path) -> None:
    # TP 1/2/4/8 (the attention table's TP-equivalent head shapes, the all-reduce table's GPU counts): decode,
    # prefill and mixed steps, each with a MAPE and an example point, predicted vs measured.
    rep = h100_fit.report if gpu == "h100" else fitting.fit_tables(shared_data, gpu).report
    rows = {r["tp"]: r for r in rep["per_tp"]["rows"]}
    assert sorted(rows) == [1, 2, 4, 8]
    for tp, row in rows.items():
        for phase in ("decode", "prefill", "mixed"):
            m = row[phase]
            assert m["points"] >= 60 and m["mape"] <= 0.07, (gpu, tp, phase, m["mape"])
            ex = m["example"]
            assert abs(ex["predicted_ms"] / ex["measured_ms"] - 1.0) <= 0.10
            # The all-reduce term is the measured curve on tp GPUs: none at TP 1, a real share above.
            assert (ex["measured_allreduce_ms"] == 0.0) == (tp == 1)
        # A mixed step costs less than its decode step plus a same-size chunk, on the measured tables too.
        assert row["mixed"]["example"]["measured_ms"] > row["decode"]["example"]["measured_ms"]
    # Splitting over more GPUs is sub-linear: all-reduce grows while the GEMMs shrink.
    dec = [rows[tp]["decode"]["example"]["measured_ms"] for tp in (1, 2, 4, 8)]
    assert all(b < a for a, b in itertools.pairwise(dec)) and dec[0] / dec[3] < 8 * 0.6
    # The shipped file carries the same section as a fresh fit.
    assert shipped_calibration(gpu).report["per_tp"]["rows"][0]["tp"] == 1


def test_vidur_cross_check_by_tp(h100_fit: Calibration) -> None:
    v = h100_fit.report["vidur_linear_by_tp"]
    assert [r["tp"] for r in v["rows"]] == [1, 2, 4, 8]
    assert all(r["points"] > 200 and 0.0 <= r["mape"] < 0.35 for r in v["rows"])


def test_h100_fit_is_physical(h100_fit: Calibration) -> None:
    g = gpu_kind("h100")
    assert h100_fit.gemm is not None and h100_fit.attn_decode is not None
    assert 0.5 * g.bf16_flops < h100_fit.gemm.flops_per_s <= g.bf16_flops
    assert 0.6 * g.hbm_bandwidth < h100_fit.gemm.weight_bytes_per_s <= g.hbm_bandwidth
    assert 0.6 * g.hbm_bandwidth < h100_fit.attn_decode.kv_bytes_per_s <= g.hbm_bandwidth
    assert 0.0 <= (h100_fit.step_overhead_s or 0.0) < 5e-3


def test_shipped_h100_matches_a_fresh_fit(h100_fit: Calibration) -> None:
    # The package data is what `make calibrate` writes: refitting reproduces it (up to float noise).
    shipped = shipped_calibration("h100")
    assert shipped.gemm is not None and h100_fit.gemm is not None
    assert shipped.gemm.flops_per_s == pytest.approx(h100_fit.gemm.flops_per_s, rel=1e-3)
    assert shipped.attn_decode is not None and h100_fit.attn_decode is not None
    assert shipped.attn_decode.kv_bytes_per_s == pytest.approx(h100_fit.attn_decode.kv_bytes_per_s, rel=1e-3)
    assert shipped.report["mape"]["decode_step"]["mape"] == pytest.approx(h100_fit.report["mape"]["decode_step"]["mape"], abs=1e-3)
    assert shipped.step_overhead_s == pytest.approx(h100_fit.step_overhead_s, rel=1e-3)


def test_h200_fit_meets_targets(shared_data: Path) -> None:
    rep = fitting.fit_tables(shared_data, "h200").report
    assert all(rep["mape"][phase]["mape"] <= 0.05 for phase in ("decode_step", "prefill", "mixed_step"))
    assert all(rep["pass"].values())
    assert rep["step_overhead"]["fitted_on"].endswith("(h100)")  # no H200 sweep: host overhead from H100


def test_profile_switching_belongs_to_its_model() -> None:
    # A profile of Llama-3-8B on H100 on top of the shipped kernel fit: its engine start applies to that model
    # only, while its KV-link measurement (per byte) applies GPU-wide.
    recs = fitting.parse_profile([
        '{"phase": "engine_start", "seconds": 30.0}',
        '{"phase": "kv_transfer", "tokens": 1000, "same_node": false, "seconds": 0.01}',
        '{"phase": "kv_transfer", "tokens": 2000, "same_node": false, "seconds": 0.015}',
    ])
    cal = fitting.fit_profile(recs, "h100", "llama-3-8b", base=shipped_calibration("h100"))
    llama, qwen = cal.perf_model("llama-3-8b", 1), cal.perf_model("qwen3-8b", 1)
    assert llama.cold_start_time() == 30.0
    assert qwen.cold_start_time() == qwen.roofline.cold_start_time()
    assert llama.kv_transfer_time(1000, False) == pytest.approx(0.01)
    assert qwen.kv_transfer_time(1000, False) > llama.kv_transfer_time(1000, False)  # more KV bytes per token
    # Without decode/prefill records the kernel composition still answers for both.
    assert llama.decode_step_time(8, 300) == pytest.approx(shipped_calibration("h100").perf_model("llama-3-8b").decode_step_time(8, 300))


def test_reprefill_records_are_prefills_of_the_whole_context() -> None:
    recs = fitting.parse_profile(
        ['{"phase": "reprefill", "tokens": 300, "seconds": 0.04}'], source="p.jsonl"
    )
    assert len(recs) == 1
    assert recs[0].phase == "prefill"
    assert recs[0].prompt_tokens == (300,)
    assert recs[0].cached_tokens == (0,)
    with pytest.raises(TraceError, match=r"p\.jsonl:1"):
        fitting.parse_profile(['{"phase": "reprefill", "tokens": 0, "seconds": 0.04}'], source="p.jsonl")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.pop("gpu"), "c.json: gpu: Field required"),
        (lambda d: d["gemm"].pop("p"), "c.json: gemm.p: Field required"),
        (lambda d: d["gemm"].update(flops_per_s=0), "c.json: gemm.flops_per_s: must be a finite number > 0"),
        (lambda d: d["attn_decode"].update(launch_s=-1e-6), "c.json: attn_decode.launch_s: must be a finite number >= 0"),
        (lambda d: d["gemm"].update(p=0.5), "c.json: gemm.p: must be a finite number >= 1"),
        (lambda d: d.update(step_overhead_s=-0.001), "c.json: step_overhead_s: must be a finite number >= 0"),
        (lambda d: d.update(allreduce={"1": {"x": [1.0], "y": [1e-5]}}), "c.json: allreduce.1: all-reduce curves are keyed"),
        (lambda d: d.update(steps=[{"model": "tiny", "tp": 1, "decode": [0.01, -1.0, 0.0]}]),
         "c.json: steps.0.decode.1: must be a finite number >= 0"),
    ],
)
def test_bad_calibration_files_name_the_field(edit: object, needle: str, tmp_path: Path) -> None:
    from rollplan.models.perf.calibrated import calibration_to_dict

    doc = calibration_to_dict(shipped_calibration("h100"))
    edit(doc)  # type: ignore[operator]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserInputError, match=re.escape(needle)) as info:
        perf_model("h100", "qwen3-8b", calibration=path)
    assert "To fix: regenerate it with `rollplan perf fit`" in str(info.value)


def test_a_calibration_for_another_gpu_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    save_calibration(shipped_calibration("h100"), path)
    with pytest.raises(UserInputError, match="calibration field 'gpu' is 'h100'") as info:
        perf_model("h200", "qwen3-8b", calibration=path)
    assert "--gpu h100" in str(info.value)


# --- mixed steps (a prefill chunk batched with decodes) -----------------------------------------------------

MIX = (0.006, 5e-5, 5e-8, 1.1e-6)  # fixed, per token (chunk + decodes), per chunk attention work, per KV token read


def mixed_truth(p: int, c: int, b: int, kv: float) -> float:
    return MIX[0] + MIX[1] * (p + b) + MIX[2] * p * (c + p / 2) + MIX[3] * kv


MIXED_GRID = [(p, c, b, b * kv) for p in (32, 128, 400) for c in (0, 256) for b in (1, 4, 16) for kv in (60, 300)]


def test_fit_profile_recovers_mixed_steps_within_2_percent(tmp_path: Path) -> None:
    # Synthetic mixed steps from a known monotone model with +-1% deterministic noise, beside the decode and
    # prefill records of the synthetic profile: the fit recovers the model within 2% at every measured point
    # and at points it never saw, and step_time uses it (the grid lies between the larger part and the sum).
    rng = np.random.default_rng(0)
    lines = synthetic_profile()
    for p, c, b, kv in MIXED_GRID:
        t = mixed_truth(p, c, b, kv) * (1 + rng.uniform(-0.01, 0.01))
        lines.append(json.dumps({"phase": "mixed", "prefill_tokens": p, "prefill_context": c, "decode_seqs": b,
                                 "decode_kv_tokens": kv, "seconds": t}))
    cal = fitting.fit_profile(fitting.parse_profile(lines, source="mixed.jsonl"), "cpu", "tiny")
    step = cal.step_fit("tiny", 1)
    assert step is not None and step.mixed is not None and all(x >= 0 for x in step.mixed)
    assert cal.report["mape"]["mixed_form"] < 0.02
    path = tmp_path / "cpu_tiny.json"
    save_calibration(cal, path)
    perf = load_calibrated(path)
    step = perf.calibration.step_fit("tiny", 1)
    assert step is not None and step.mixed is not None
    inside = 0
    for p, c, b, kv in [*MIXED_GRID, (64, 100, 2, 500.0), (256, 0, 12, 2000.0), (200, 300, 8, 1600.0)]:
        truth = mixed_truth(p, c, b, kv)
        assert step.mixed_fit_time(p, c, b, kv) == pytest.approx(truth, rel=0.02)
        # step_time: the fit, kept between the larger part and the sum of the (synthetic) decode and prefill fits
        dec, pre = perf.decode_step_time(b, kv / b), perf.prefill_time([p], [c])
        assert perf.step_time(p, c, b, kv) == pytest.approx(min(max(truth, dec, pre), dec + pre), rel=0.02)
        inside += max(dec, pre) < truth < dec + pre
    assert inside >= 10  # enough points where step_time is the fit itself


def test_mixed_fit_is_kept_between_the_larger_part_and_the_sum() -> None:
    from rollplan.models.perf.calibrated import StepFit

    # A mixed fit far below the parts (and one far above) is clamped: monotone, special cases intact.
    for mixed in ((1e-5, 0.0, 0.0, 0.0), (1.0, 1e-3, 1e-6, 1e-4)):
        fit = StepFit("tiny", 1, decode=DEC, prefill=PRE, mixed=mixed)
        perf = Calibration(gpu="cpu", steps=(fit,)).perf_model("tiny", 1)
        for p, c, b, kv in MIXED_GRID:
            dec, pre, got = perf.decode_step_time(b, kv / b), perf.prefill_time([p], [c]), perf.step_time(p, c, b, kv)
            assert max(dec, pre) * (1 - 1e-12) <= got <= (dec + pre) * (1 + 1e-12)
            for i in range(4):
                more = [p, c, b, kv]
                more[i] += 7
                assert perf.step_time(*more) >= got * (1 - 1e-12)  # type: ignore[arg-type]
        assert perf.step_time(0, 0, 4, 400) == perf.decode_step_time(4, 100)
        assert perf.step_time(128, 0, 0, 0) == perf.prefill_time([128], [0])


def test_mixed_fit_with_few_points_falls_back_to_fewer_terms() -> None:
    one = '{"phase": "mixed", "prefill_tokens": 64, "decode_seqs": 4, "decode_kv_tokens": 400, "seconds": 0.02}'
    step = fitting.fit_profile(fitting.parse_profile([one]), "cpu", "tiny").step_fit("tiny", 1)
    assert step is not None and step.mixed == (0.02, 0.0, 0.0, 0.0)


def test_calibration_files_without_a_mixed_fit_still_load(tmp_path: Path) -> None:
    # Files written before mixed fits existed have no "mixed" key: they load, and step_time keeps the
    # decode + chunk rule (less one intercept).
    from rollplan.models.perf.calibrated import StepFit, calibration_to_dict

    cal = Calibration(gpu="cpu", steps=(StepFit("tiny", 1, decode=DEC, prefill=PRE),))
    doc = calibration_to_dict(cal)
    for s in doc["steps"]:
        s.pop("mixed")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    perf = load_calibrated(path)
    step = perf.calibration.step_fit("tiny", 1)
    assert step is not None and step.mixed is None
    assert perf.step_time(128, 0, 8, 2400) == pytest.approx(step.mixed_time(128, 0, 8, 2400))
    # A negative mixed coefficient is refused naming the field.
    doc["steps"][0]["mixed"] = [0.01, -1.0, 0.0, 0.0]
    path.write_text(json.dumps(doc))
    with pytest.raises(UserInputError, match=re.escape("old.json: steps.0.mixed.1: must be a finite number >= 0")):
        load_calibrated(path)


MIXED_OK = {"phase": "mixed", "prefill_tokens": 128, "prefill_context": 0, "decode_seqs": 8, "decode_kv_tokens": 2400,
            "seconds": 0.02}


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"prefill_tokens": 0}, "m.jsonl:2: mixed needs prefill_tokens >= 1 and decode_seqs >= 1"),
        ({"decode_seqs": 0}, "m.jsonl:2: mixed needs prefill_tokens >= 1 and decode_seqs >= 1"),
        ({"prefill_tokens": 12.5}, "m.jsonl:2: field 'prefill_tokens' must be an integer"),
        ({"decode_seqs": True}, "m.jsonl:2: field 'decode_seqs' must be an integer"),
        ({"prefill_context": -1}, "m.jsonl:2: field 'prefill_context' must be an integer >= 0"),
        ({"decode_kv_tokens": 3}, "m.jsonl:2: mixed needs decode_kv_tokens >= decode_seqs (8)"),
        ({"decode_kv_tokens": "many"}, "m.jsonl:2: field 'decode_kv_tokens' must be a number"),
        ({"seconds": 0}, "m.jsonl:2: field 'seconds' must be > 0"),
        ({"decode_seqs": None}, "m.jsonl:2: field 'decode_seqs' must be an integer"),
    ],
)
def test_bad_mixed_records_name_file_line(edit: dict, match: str) -> None:
    rec = {**MIXED_OK, **edit}
    with pytest.raises(TraceError, match=re.escape(match)) as info:
        fitting.parse_profile(['{"phase": "wake", "seconds": 0.1}', json.dumps(rec)], source="m.jsonl")
    msg = str(info.value)
    assert "To fix:" in msg and "\n" not in msg


def test_a_mixed_record_without_a_required_field_names_it() -> None:
    rec = dict(MIXED_OK)
    rec.pop("decode_kv_tokens")
    with pytest.raises(TraceError, match=re.escape("m.jsonl:1: missing field 'decode_kv_tokens'")):
        fitting.parse_profile([json.dumps(rec)], source="m.jsonl")
    rec = dict(MIXED_OK)
    rec.pop("prefill_context")  # optional: nothing cached
    (got,) = fitting.parse_profile([json.dumps(rec)], source="m.jsonl")
    assert (got.prefill_tokens, got.prefill_context, got.decode_seqs, got.decode_kv_tokens) == (128, 0, 8, 2400.0)
