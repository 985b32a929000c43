"""The decision core's length predictor (``rollplan.policy.predict.Predictor``, the simulator's and the
executor's): what a policy may know.

Invariants checked:
- sources in order: the default prior before anything finished; the mean over every finished trajectory for an
  unseen prompt; the prompt's own history across batches; the group (same prompt, same batch) once a sibling
  finished (Seer-style), and a new batch drops group statistics but keeps the history;
- a trajectory past its prediction is expected to go on for ``SURVIVAL`` times what it has done (heavy tails);
- group survival: a group is predicted to run at least ``1 + SURVIVAL`` times what its most advanced unfinished
  sample has done, whatever the source (also once siblings finished: they are its short ones);
  ``group_floors`` is that sample's progress, by brute force over random progress lists (hypothesis);
- the snapshot hot path ``remaining_raw`` agrees with ``remaining`` (hypothesis, random observations, progress
  and floors);
- a budget caps the prediction (never more decode tokens or turns than the budget leaves, at least one), and
  a budget prior scales with the budget;
- ``SpreadCheck`` counts a finished total within one / two spreads exactly when it is.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.policy.predict import DEFAULT_PRIOR, SURVIVAL, Predictor, SpreadCheck, Totals, group_floors


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


def test_group_survival_holds_after_a_sibling_finished() -> None:
    p = Predictor()
    p.start_batch(0)
    p.observe("k", "b0:g", totals(decode=3000, tool=100, turns=10))  # last batch: this prompt ran 3000 tokens
    p.start_batch(1)
    p.observe("k", "b1:g", totals(decode=500, tool=20, turns=4))  # this batch's first finisher: a short one
    alone = p.remaining("k", "b1:g", NOTHING)
    assert alone.source == "group" and alone.decode.mean == pytest.approx(500)
    floor = Totals(decode=1200.0, prefill=0.0, tool=40.0, turns=6.0)  # a sibling still running has done this
    r = p.remaining("k", "b1:g", NOTHING, floor=floor)
    g = 1.0 + SURVIVAL
    assert r.source == "group"
    assert r.decode.mean == pytest.approx(g * 1200.0)
    assert r.tool.mean == pytest.approx(g * 40.0) and r.turns.mean == pytest.approx(g * 6.0)
    # A floor below 1 / (1 + SURVIVAL) of the prediction changes nothing.
    low = p.remaining("k", "b1:g", NOTHING, floor=Totals(300.0, 0.0, 5.0, 2.0))
    assert low.decode.mean == pytest.approx(500)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 50), st.integers(0, 9),
                          st.integers(0, 9)), max_size=12))
def test_group_floors_is_the_most_advanced_unfinished_sample(rows) -> None:
    progress = [(g, float(d), float(tool), float(turns)) for g, d, tool, turns in rows]
    floors = group_floors(progress)
    assert set(floors) == {r[0] for r in progress}
    for g, f in floors.items():
        mine = [r for r in progress if r[0] == g]
        top = max(r[1] for r in mine)
        first = next(r for r in mine if r[1] == top)  # the first of equals
        assert (f.decode, f.prefill, f.tool, f.turns) == (top, 0.0, first[2], first[3])


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
    floor=st.one_of(st.none(), st.tuples(st.floats(0, 6e4), st.floats(0, 3e3), st.integers(0, 70))),
)
def test_hot_path_agrees_with_the_reference(history, key, group, done, floor) -> None:
    p = Predictor()
    for k, g, d, pf, tool, turns in history:
        p.observe(k, g, Totals(d, pf, tool, float(turns)))
    dec_done, pf_done, tool_done, turns_done = done
    f = None if floor is None else Totals(floor[0], 0.0, floor[1], float(floor[2]))
    ref = p.remaining(key, group, Totals(dec_done, pf_done, tool_done, float(turns_done)), floor=f)
    fl = (0.0, 0.0, 0.0) if f is None else (f.decode, f.tool, f.turns)
    dec, pre, tool, turns, sds = p.remaining_raw(key, group, dec_done, pf_done, tool_done, float(turns_done), *fl)
    assert (dec, pre, tool, turns) == pytest.approx(
        (ref.decode.mean, ref.prefill.mean, ref.tool.mean, ref.turns.mean), rel=1e-9, abs=1e-9
    )
    assert sds == pytest.approx((ref.decode.spread, ref.prefill.spread, ref.tool.spread, ref.turns.spread), rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(done_dec=st.floats(0, 5000), done_turns=st.floats(0, 30), max_turns=st.integers(1, 40),
       max_tokens=st.integers(1, 512), seen=st.booleans())
def test_budget_caps_the_prediction(done_dec: float, done_turns: float, max_turns: int, max_tokens: int,
                                    seen: bool) -> None:
    prior = Predictor.budget_prior(max_turns, max_tokens)
    p = Predictor(prior=prior)
    p.start_batch(0)
    if seen:
        p.observe("k", "b0:g", totals(decode=3 * max_turns * max_tokens, turns=3 * max_turns))
    budget = Totals(float(max_turns * max_tokens), 0.0, 0.0, float(max_turns))
    done = Totals(min(done_dec, budget.decode), 0.0, 0.0, min(done_turns, budget.turns))
    r = Predictor.capped(p.remaining("k", "b0:g", done), done, budget)
    assert 1.0 <= r.decode.mean <= max(budget.decode - done.decode, 1.0)
    assert 1.0 <= r.turns.mean <= max(budget.turns - done.turns, 1.0)
    assert 0.0 <= r.decode.spread <= r.decode.mean


def test_budget_prior_scales_with_the_budget() -> None:
    small, big = Predictor.budget_prior(4, 16), Predictor.budget_prior(8, 64)
    assert small.decode == 0.5 * 4 * 16 and big.decode == 0.5 * 8 * 64 and big.turns > small.turns
    p = Predictor(prior=small)
    p.start_batch(0)
    r = p.remaining("k", "g", NOTHING)
    assert r.source == "default" and r.decode.mean == pytest.approx(small.decode)


def test_spread_check_counts_within_one_and_two_spreads() -> None:
    c = SpreadCheck()
    assert c.within(1) is None
    for actual in (100.0, 109.0, 115.0, 125.0):  # mean 100, spread 10: |err| 0, 9, 15, 25
        c.add(100.0, 10.0, actual)
    assert c.within(1) == 0.5 and c.within(2) == 0.75
    assert c.summary()["mean_abs_error"] == pytest.approx((0 + 9 + 15 + 25) / 4)
