"""The simulator's length predictor (``rollplan.sim.predict.Predictor``): what a policy may know.

Invariants checked:
- sources in order: the default prior before anything finished; the mean over every finished trajectory for an
  unseen prompt; the prompt's own history across batches; the group (same prompt, same batch) once a sibling
  finished (Seer-style), and a new batch drops group statistics but keeps the history;
- a trajectory past its prediction is expected to go on for ``SURVIVAL`` times what it has done (heavy tails);
- the snapshot hot path ``remaining_raw`` agrees with ``remaining`` (hypothesis, random observations/progress).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.sim.predict import DEFAULT_PRIOR, SURVIVAL, Predictor, Totals


def totals(decode: float = 1000.0, prefill: float = 4000.0, tool: float = 50.0, turns: float = 10.0) -> Totals:
    return Totals(decode, prefill, tool, turns)


NOTHING = Totals(0.0, 0.0, 0.0, 0.0)


def test_sources_default_global_history_then_group() -> None:
    p = Predictor()
    p.start_batch(0)
    r = p.remaining("promptA", "b0:gA", NOTHING)
    assert r.source == "default" and r.decode.mean == DEFAULT_PRIOR.decode

    p.observe("promptB", "b0:gB", totals(decode=2000))
    assert p.remaining("promptA", "b0:gA", NOTHING).source == "global"  # A never seen: every finished one

    p.start_batch(1)
    p.observe("promptA", "b1:gA", totals(decode=600))
    p.start_batch(2)  # a later batch: A's history (600) beats the global mean (1300)
    r = p.remaining("promptA", "b2:gA", NOTHING)
    assert r.source == "history" and r.decode.mean == pytest.approx(600)

    p.observe("promptA", "b2:gA", totals(decode=900))  # first sibling of this batch's group finished
    r = p.remaining("promptA", "b2:gA", NOTHING)
    assert r.source == "group" and r.decode.mean == pytest.approx(900)
    assert p.groups_seen == 3  # b0:gB, b1:gA, b2:gA

    p.start_batch(3)  # group statistics restart; A's history now holds 600 and 900
    r = p.remaining("promptA", "b3:gA", NOTHING)
    assert r.source == "history" and r.decode.mean == pytest.approx(750)


def test_past_its_prediction_a_trajectory_is_expected_to_go_on() -> None:
    p = Predictor()
    p.observe("k", "g", totals(decode=1000, turns=10))
    done = Totals(decode=1600.0, prefill=5000.0, tool=60.0, turns=12.0)
    r = p.remaining("k", "g", done)
    assert r.decode.mean == pytest.approx(SURVIVAL * 1600.0)
    assert r.turns.mean == pytest.approx(SURVIVAL * 12.0)


obs = st.tuples(
    st.sampled_from(["k0", "k1", "k2"]), st.sampled_from(["g0", "g1"]),
    st.floats(1, 5e4), st.floats(0, 2e5), st.floats(0, 2e3), st.integers(1, 60),
)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(obs, max_size=8),
    key=st.sampled_from(["k0", "k1", "k2", "k9"]),
    group=st.sampled_from(["g0", "g1", "g9"]),
    done=st.tuples(st.floats(0, 6e4), st.floats(0, 2e5), st.floats(0, 3e3), st.integers(0, 70)),
)
def test_hot_path_agrees_with_the_reference(history, key, group, done) -> None:
    p = Predictor()
    for k, g, d, pf, tool, turns in history:
        p.observe(k, g, Totals(d, pf, tool, float(turns)))
    dec_done, pf_done, tool_done, turns_done = done
    ref = p.remaining(key, group, Totals(dec_done, pf_done, tool_done, float(turns_done)))
    dec, pre, tool, turns, sds = p.remaining_raw(key, group, dec_done, pf_done, tool_done, float(turns_done))
    assert (dec, pre, tool, turns) == pytest.approx(
        (ref.decode.mean, ref.prefill.mean, ref.tool.mean, ref.turns.mean), rel=1e-9, abs=1e-9
    )
    assert sds == pytest.approx((ref.decode.spread, ref.prefill.spread, ref.tool.spread, ref.turns.spread), rel=1e-9, abs=1e-9)
