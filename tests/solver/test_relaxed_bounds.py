"""A DEADLINE_RELAXED plan carries only deadline-free bounds: no on-time bound survives into it."""

from __future__ import annotations

import logging

import pytest
from factories import T0, make_slot, make_snapshot, make_traj, planner_config

from rollplan.models.types import EngineState, Phase, Role, SlotSource, SolveStatus
from rollplan.solver import plan


def test_on_time_bounds_do_not_carry_into_a_relaxed_plan(caplog: pytest.LogCaptureFixture) -> None:
    # The only slot is due back 20 s from now but needs a cold start first: no plan can be on time, so
    # the on-time co-running bound is enormous and must not be reported (before: kept, then dropped loudly).
    snap = make_snapshot(
        slots=[make_slot("s0", gpu="a100", role=Role.OFF, engine=EngineState.NONE, source=SlotSource.PREEMPTIBLE,
                         return_by=T0 + 20.0)],
        trajectories=[make_traj("t0", slot="s0", phase=Phase.PREFILL_PENDING, context=200, decode=20000.0)],
    )
    with caplog.at_level(logging.WARNING, logger="rollplan.solver.api"):
        p = plan(snap, config=planner_config(backend="greedy"))
    assert p.status is SolveStatus.DEADLINE_RELAXED
    assert "dropping bounds" not in caplog.text
    assert 0 < p.lower_bound <= p.makespan
    assert all(v <= p.makespan * (1 + 1e-9) for v in p.bounds.values())
