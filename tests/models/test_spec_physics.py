"""Decode-step physics with speculation (rollplan.models.perf.spec).

Invariants (hypothesis, roofline models of every preset pairing below):
- E(a, k) = (1 - a^(k+1)) / (1 - a) lies in [1, k + 1], equals 1 at a = 0 and k + 1 at a = 1, and never
  decreases in a or k;
- more acceptance is never slower per token (same batch, context and draft length);
- at a = 0 every token costs a whole verify step (never less than a plain decode step);
- k = 0 is plain decoding (speedup 1); the verify step never gets cheaper with a longer draft;
- the best draft length is never slower per token than plain decoding.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.errors import SchemaError
from rollplan.models.perf import perf_model
from rollplan.models.perf.spec import (
    best_draft_length,
    expected_tokens_per_step,
    speculative_step,
    verify_step_time,
)

MODELS = [perf_model("h100", "llama-3-8b"), perf_model("h200", "qwen3-8b", 2), perf_model("cpu", "tiny")]

acc = st.floats(0.0, 1.0, allow_nan=False)
ks = st.integers(0, 10)
batches = st.integers(1, 256)
kvs = st.floats(1.0, 8192.0)


@given(a=acc, b=acc, k=ks)
def test_expected_tokens_bounds_and_monotone(a: float, b: float, k: int) -> None:
    lo, hi = sorted((a, b))
    e_lo, e_hi = expected_tokens_per_step(lo, k), expected_tokens_per_step(hi, k)
    assert 1.0 - 1e-12 <= e_lo <= e_hi + 1e-9 <= k + 1 + 1e-9
    assert expected_tokens_per_step(hi, k + 1) >= e_hi - 1e-12
    assert expected_tokens_per_step(0.0, k) == 1.0
    assert expected_tokens_per_step(1.0, k) == k + 1


def test_expected_tokens_closed_form() -> None:
    assert math.isclose(expected_tokens_per_step(0.5, 3), 1 + 0.5 + 0.25 + 0.125)
    assert math.isclose(expected_tokens_per_step(0.999999, 4), 5.0, rel_tol=1e-5)


@settings(max_examples=60, deadline=None)
@given(m=st.sampled_from(range(len(MODELS))), a=acc, b=acc, k=st.integers(1, 8), batch=batches, kv=kvs)
def test_more_acceptance_is_never_slower_per_token(m: int, a: float, b: float, k: int, batch: int,
                                                   kv: float) -> None:
    perf = MODELS[m]
    lo, hi = sorted((a, b))
    slow = speculative_step(perf, batch, kv, lo, k)
    fast = speculative_step(perf, batch, kv, hi, k)
    assert fast.seconds_per_token <= slow.seconds_per_token * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(m=st.sampled_from(range(len(MODELS))), k=st.integers(0, 8), batch=batches, kv=kvs)
def test_zero_acceptance_costs_a_verify_step_per_token(m: int, k: int, batch: int, kv: float) -> None:
    perf = MODELS[m]
    s = speculative_step(perf, batch, kv, 0.0, k)
    plain = perf.decode_step_time(batch, kv)
    assert s.tokens_per_step == 1.0
    assert s.seconds_per_token == pytest.approx(verify_step_time(perf, batch, kv, k))
    assert s.seconds_per_token >= plain * (1 - 1e-9)
    assert verify_step_time(perf, batch, kv, k + 1) >= verify_step_time(perf, batch, kv, k) * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from(range(len(MODELS))), a=acc, batch=batches, kv=kvs)
def test_no_draft_is_plain_decoding_and_best_never_loses(m: int, a: float, batch: int, kv: float) -> None:
    perf = MODELS[m]
    s0 = speculative_step(perf, batch, kv, a, 0)
    assert s0.step_s == pytest.approx(perf.decode_step_time(batch, kv))
    assert s0.speedup == pytest.approx(1.0)
    best = best_draft_length(perf, batch, kv, a, k_max=8)
    assert best.seconds_per_token <= s0.seconds_per_token * (1 + 1e-12)


def test_memory_bound_decode_gains_from_speculation() -> None:
    # Small-batch decode on an H100 reads the weights every step: verifying 5 tokens costs about one step.
    s = speculative_step(MODELS[0], 1, 1024, 0.8, 4)
    assert s.speedup > 2.0


@pytest.mark.parametrize(("a", "k"), [(-0.1, 2), (1.5, 2), (float("nan"), 2), (0.5, -1), (0.5, 1.5)])
def test_bad_inputs_are_one_line_with_a_fix(a: float, k) -> None:
    with pytest.raises(SchemaError, match="To fix:"):
        expected_tokens_per_step(a, k)
