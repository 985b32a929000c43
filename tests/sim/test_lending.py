"""Training-GPU lending schedule.

Invariants checked with hypothesis (any rollout completion times, either mode, any notice/delay):
- lending windows never overlap a training step, are disjoint and sorted, and only the last is open-ended;
- every closed window's deadline is the start of the next training step, and its RECLAIM is issued
  within the window, no earlier than ``reclaim_notice_s`` before the deadline;
- sync: step k starts at rollout k's completion; async: steps never overlap and start no earlier than their
  rollout's completion.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.errors import SchemaError, UnknownNameError, UserInputError
from rollplan.models.types import EventKind, SlotSource
from rollplan.sim.lending import (
    LendingConfig,
    LendingSchedule,
    LendMode,
    LendWindow,
    TrainStep,
    lending_config_from_dict,
)


def schedule(**kw) -> LendingSchedule:
    defaults = {"gpus": 8, "train_step_s": 100.0, "reclaim_notice_s": 10.0}
    return LendingSchedule(LendingConfig(**{**defaults, **kw}))


def test_lent_slots() -> None:
    s = schedule(gpus=10, gpus_per_node=8, gpu="h800")
    ids = s.slot_ids
    assert len(ids) == 10 and ids[0] == "train0/g0" and ids[8] == "train1/g0"
    assert all(x.source is SlotSource.LENT_BY_TRAINING and x.tp == 1 and x.gpu == "h800" for x in s.slots)
    assert schedule(gpus=0).windows([TrainStep(5, 10)]) == ()


def test_sync_mode_lends_during_rollout_and_reclaims_before_each_step() -> None:
    s = schedule(mode=LendMode.SYNC)
    steps = s.train_steps([300.0, 700.0])  # rollout 0: [0, 300), step 0: [300, 400), rollout 1: [400, 700)
    assert steps == (TrainStep(300.0, 400.0), TrainStep(700.0, 800.0))
    ids = s.slot_ids
    assert s.windows(steps) == (
        LendWindow(0.0, 300.0, 290.0, ids),
        LendWindow(400.0, 700.0, 690.0, ids),
        LendWindow(800.0, None, None, ids),
    )
    # "which lent slots are available in [t0, t1) and when must they be back"
    assert [w.end for w in s.available(250.0, 450.0, steps)] == [300.0, 700.0]
    assert s.window_at(350.0, steps) is None  # training
    assert s.window_at(650.0, steps).end == 700.0
    with pytest.raises(ValueError, match="sync mode"):
        s.train_steps([300.0, 350.0])  # rollout 1 cannot end before step 0 does


def test_async_mode_chains_steps_and_lends_only_while_training_is_idle() -> None:
    s = schedule(mode=LendMode.ASYNC, lend_delay_s=5.0)
    steps = s.train_steps([300.0, 350.0, 700.0])
    assert steps == (TrainStep(300.0, 400.0), TrainStep(400.0, 500.0), TrainStep(700.0, 800.0))
    assert [(w.start, w.end, w.reclaim_at) for w in s.windows(steps)] == [
        (5.0, 300.0, 290.0),
        (505.0, 700.0, 690.0),  # no window between steps 0 and 1 (back to back)
        (805.0, None, None),
    ]


def test_events_lend_with_deadlines_and_reclaim_with_notice() -> None:
    s = schedule(reclaim_notice_s=50.0)
    evs = s.events([TrainStep(30.0, 130.0)], start=0.0)
    assert [(e.time, e.kind, e.deadline) for e in evs] == [
        (0.0, EventKind.LEND, 30.0),
        (0.0, EventKind.RECLAIM, 30.0),  # a 30 s window gets its reclaim at once (notice clipped to the window)
        (130.0, EventKind.LEND, None),
    ]
    lend = evs[0]
    assert lend.slot_ids == s.slot_ids and all(x.return_by == 30.0 for x in lend.slots)
    assert evs[1].slot_ids == s.slot_ids


def test_next_train_step_waits_for_notice_when_the_start_is_learned_late() -> None:
    s = schedule(reclaim_notice_s=10.0)
    assert s.next_train_step(100.0) == TrainStep(100.0, 200.0)
    assert s.next_train_step(100.0, known_at=100.0) == TrainStep(110.0, 210.0)
    assert s.next_train_step(100.0, prev_end=150.0, known_at=100.0) == TrainStep(150.0, 250.0)
    assert schedule(gpus=0).next_train_step(100.0, known_at=100.0).start == 100.0  # nothing lent: no wait


def test_online_events() -> None:
    s = schedule(gpus=2)
    lend = s.lend_event(5.0)
    assert lend.kind is EventKind.LEND and lend.deadline is None and len(lend.slots) == 2
    rec = s.reclaim_event(90.0, 100.0)
    assert (rec.kind, rec.time, rec.deadline, rec.slot_ids) == (EventKind.RECLAIM, 90.0, 100.0, s.slot_ids)


def test_config_validation_and_parsing() -> None:
    cfg = lending_config_from_dict({"gpus": 4, "mode": "async", "train_step_s": 60})
    assert cfg == LendingConfig(gpus=4, mode=LendMode.ASYNC, train_step_s=60.0)
    with pytest.raises(SchemaError, match=r"scenario.yaml: lending.train_step_s"):
        lending_config_from_dict({"train_step_s": -1}, source="scenario.yaml")
    with pytest.raises(SchemaError, match=r"lending\.bogus"):
        lending_config_from_dict({"bogus": 1})
    with pytest.raises(UserInputError, match="reclaim_notice_s"):
        LendingConfig(reclaim_notice_s=float("nan"))
    with pytest.raises(UnknownNameError):
        LendingConfig(gpu="tpu")


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 500.0), min_size=1, max_size=8),
    mode=st.sampled_from(list(LendMode)),
    notice=st.floats(0.0, 60.0),
    delay=st.floats(0.0, 30.0),
    step=st.floats(1.0, 200.0),
)
def test_window_invariants(gaps, mode, notice, delay, step) -> None:
    s = schedule(mode=mode, reclaim_notice_s=notice, lend_delay_s=delay, train_step_s=step)
    done: list[float] = []
    t = 0.0
    for g in gaps:  # sync: the next rollout starts when the previous step ends
        t = (t if mode is LendMode.ASYNC or not done else done[-1] + step) + g
        done.append(t)
    steps = s.train_steps(done)
    for k, st_ in enumerate(steps):
        assert st_.start >= done[k]
        if mode is LendMode.SYNC:
            assert st_.start == done[k]
        if k:
            assert st_.start >= steps[k - 1].end
    windows = s.windows(steps)
    assert all(w.end is not None for w in windows[:-1]) and windows[-1].end is None
    for a, b in pairwise(windows):
        assert a.end <= b.start
    for w in windows:
        for st_ in steps:
            assert (w.end is not None and w.end <= st_.start) or w.start >= st_.end
        if w.end is not None:
            assert w.end in {x.start for x in steps}
            assert w.start <= w.reclaim_at <= w.end and w.reclaim_at >= w.end - notice - 1e-9
