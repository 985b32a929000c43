"""``PerfModel.step_time``: one forward pass of a mixed batch (a prefill chunk batched with decodes).

Invariants (hypothesis, for the roofline and the shipped calibrated models on H100 and H200, Qwen3-8B and
Qwen3-30B-A3B, TP 1/2/4, and for a whole-step profile fit):
- special cases: ``step_time(0, 0, b, b * kv) == decode_step_time(b, kv)``, ``step_time(p, c, 0, 0) ==
  prefill_time([p], [c])``, and an empty step costs nothing;
- monotone: non-decreasing in each of prefill_tokens, prefill_context, decode_seqs (at the same total KV) and
  decode_kv_tokens;
- batching pays but never for free: ``max(decode step, prefill chunk) <= mixed step <= decode step + prefill
  chunk`` (the weights are read once for both, and neither part gets faster by running with the other);
- bad arguments (negative, non-integer counts, bool, NaN, infinity, string) raise ``UserInputError`` whose
  message names the argument; numpy integers and integral floats are accepted.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.errors import UserInputError
from rollplan.models.perf import PerfModel, perf_model
from rollplan.models.perf.calibrated import CalibratedPerfModel, Calibration, StepFit

REL = 1e-9  # float noise allowed on inequalities (the sums are reassociated)

CASES = [(cal, gpu, model, tp) for cal in (False, True) for gpu in ("h100", "h200")
         for model in ("qwen3-8b", "qwen3-30b-a3b") for tp in (1, 2, 4)]
STEPFIT = ("stepfit", "cpu", "tiny", 1)
STEPFIT_DECODE_ONLY = ("stepfit-decode", "cpu", "tiny", 1)  # a profile without prefill records: kernels fill in


@cache
def model_for(case: tuple[object, str, str, int]) -> PerfModel:
    cal, gpu, model, tp = case
    if cal == "stepfit":
        # A whole-step profile fit (as `rollplan perf fit --profile` writes): its own mixed form.
        fit = StepFit("tiny", 1, decode=(0.004, 5e-4, 1e-6), prefill=(0.005, 5e-5, 5e-8, 2e-4))
        return Calibration(gpu="cpu", steps=(fit,)).perf_model("tiny", 1)
    if cal == "stepfit-decode":
        fit = StepFit("tiny", 1, decode=(0.004, 5e-4, 1e-6))
        return Calibration(gpu="cpu", steps=(fit,)).perf_model("tiny", 1)
    return perf_model(gpu, model, tp, calibrated=bool(cal))


all_cases = st.sampled_from([*CASES, STEPFIT, STEPFIT_DECODE_ONLY])
chunk = st.one_of(st.just(0), st.integers(1, 32), st.integers(1, 8192))
context = st.one_of(st.just(0), st.integers(0, 65536))
seqs = st.one_of(st.just(0), st.integers(1, 8), st.integers(1, 512))
kv_mean = st.integers(0, 32768)


def test_every_case_is_calibrated_or_roofline_as_asked() -> None:
    for case in CASES:
        assert isinstance(model_for(case), CalibratedPerfModel) == case[0]
    assert isinstance(model_for(STEPFIT), CalibratedPerfModel)
    assert isinstance(model_for(STEPFIT_DECODE_ONLY), CalibratedPerfModel)


@settings(max_examples=80, deadline=None)
@given(all_cases, st.integers(1, 512), kv_mean, st.integers(1, 8192), context)
def test_decode_only_and_prefill_only_are_the_special_cases(case: tuple[object, str, str, int], b: int, kv: int,
                                                           p: int, c: int) -> None:
    perf = model_for(case)
    assert perf.step_time(0, 0, b, b * kv) == pytest.approx(perf.decode_step_time(b, kv), rel=1e-12)
    assert perf.step_time(p, c, 0, 0) == pytest.approx(perf.prefill_time([p], [c]), rel=1e-12)
    assert perf.step_time(0, 0, 0, 0) == 0.0


@settings(max_examples=150, deadline=None)
@given(all_cases, chunk, context, seqs, kv_mean, st.integers(0, 3), st.integers(1, 2048))
def test_monotone_in_every_argument(case: tuple[object, str, str, int], p: int, c: int, b: int, kv: int, which: int,
                                    more: int) -> None:
    perf = model_for(case)
    args = [p, c, b, b * kv]
    base = perf.step_time(*args)
    args[which] += more
    assert perf.step_time(*args) >= base * (1 - REL)


@settings(max_examples=150, deadline=None)
@given(all_cases, st.integers(1, 8192), context, st.integers(1, 512), kv_mean)
def test_mixed_step_between_the_larger_part_and_the_sum(case: tuple[object, str, str, int], p: int, c: int, b: int,
                                                        kv: int) -> None:
    perf = model_for(case)
    decode = perf.decode_step_time(b, kv)
    chunk_time = perf.prefill_time([p], [c])
    mixed = perf.step_time(p, c, b, b * kv)
    assert max(decode, chunk_time) * (1 - REL) <= mixed <= (decode + chunk_time) * (1 + REL)


@pytest.mark.parametrize("case", [c for c in CASES if c[1] == "h100"] + [STEPFIT])
def test_a_mixed_step_is_strictly_cheaper_than_its_parts(case: tuple[object, str, str, int]) -> None:
    # Weights read once, one per-step overhead: a 256-token chunk with 32 decodes saves real time.
    perf = model_for(case)
    mixed = perf.step_time(256, 1024, 32, 32 * 2000)
    assert mixed < perf.decode_step_time(32, 2000) + perf.prefill_time([256], [1024]) - 1e-4


def test_numpy_and_integral_float_counts_are_accepted() -> None:
    perf = model_for(CASES[0])
    want = perf.step_time(128, 64, 8, 8000)
    assert perf.step_time(np.int64(128), np.int32(64), np.int64(8), np.float64(8000.0)) == want  # type: ignore[arg-type]
    assert perf.step_time(128.0, 64.0, 8.0, 8000) == want  # type: ignore[arg-type]


BAD = [-1, 2.5, True, float("nan"), float("inf"), "8", None]


@pytest.mark.parametrize("case", [CASES[0], CASES[-1], STEPFIT, STEPFIT_DECODE_ONLY])
@pytest.mark.parametrize("position", range(4))
@pytest.mark.parametrize("value", BAD)
def test_bad_arguments_raise_naming_the_argument(case: tuple[object, str, str, int], position: int, value: object) -> None:
    name = ("prefill_tokens", "prefill_context", "decode_seqs", "decode_kv_tokens")[position]
    if position == 3 and value == 2.5:
        value = -0.5  # KV tokens are a sum of means: fractions are fine, negatives are not
    args: list[object] = [64, 128, 4, 400]
    args[position] = value
    with pytest.raises(UserInputError, match=rf"step_time: {name}=") as info:
        model_for(case).step_time(*args)  # type: ignore[arg-type]
    assert "To fix:" in str(info.value) and "\n" not in str(info.value)
