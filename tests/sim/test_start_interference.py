"""``SimConfig.start_interference``: while an engine cold-starts, every serving slot's steps take ``1 + x`` times as
long (engines sharing one host's CPU cores; 0 = separate GPU nodes).

Checked: x = 0 and "no start during the run" change nothing; a lone trajectory decoding through a start
finishes where the piecewise-linear oracle says; the stretch ends when the start does; bad values are one-line
errors.
"""

from __future__ import annotations

import math

import pytest

from rollplan.models.errors import SchemaError
from rollplan.models.perf import default_provider
from rollplan.models.types import AvailabilityEvent, EngineState, EventKind, Slot, SlotSource
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj, Simulator
from rollplan.sim.events import EvKind
from rollplan.sim.policies import make_policy


class _OneBatch:
    def __init__(self, specs):
        self.specs = tuple(specs)

    def start(self, sim):
        return [sim.q.make(0.0, EvKind.BATCH_START, 0, 0)]

    def on_event(self, sim, ev):
        if ev.kind == EvKind.BATCH_START:
            return sim.start_batch(0, self.specs, [s.group for s in self.specs], weights_version=0)
        return []

    def on_batch_done(self, sim):
        sim.stop()
        return []

    def lending_event(self, index):
        raise IndexError(index)


def _run(x: float, arrive_at: float | None, decode: int = 3000) -> tuple[float, float, float]:
    """(finish time of one trajectory decoding ``decode`` tokens alone on a warm slot, its step time, the cold
    start of an engine on a node arriving at ``arrive_at``) under elastic-plus (which starts it at once)."""
    cfg = SimConfig(start_interference=x, fold_tool_s=0.0)
    provider = default_provider("qwen3-8b")
    cache: dict = {}

    def perf_for(gpu: str, tp: int) -> FastPerf:
        if (gpu, tp) not in cache:
            cache[gpu, tp] = FastPerf(provider(gpu, tp), cfg.prefill_chunk, 40960, cfg.mem_util)
        return cache[gpu, tp]

    events = () if arrive_at is None else (AvailabilityEvent(arrive_at, EventKind.ARRIVE, slot_ids=("d/g0",),
                                                             slots=(Slot("d/g0", "h800", "d"),)),)
    done: dict[str, float] = {}
    pol = make_policy("elastic-plus")
    inner = pol.on_traj_done

    def on_done(sim, j):
        done[sim.trajs[j].spec.id] = sim.now
        inner(sim, j)

    pol.on_traj_done = on_done
    sim = Simulator(model="qwen3-8b", perf_for=perf_for, policy=pol,
                    driver=_OneBatch([SimTraj("t0", "g0", 8, (0,), (decode,), (0.0,))]), availability=events,
                    dedicated=(Slot("a/g0", "h800", "a", source=SlotSource.DEDICATED, engine=EngineState.WARM),),
                    config=cfg)
    sim.run()
    perf = perf_for("h800", 1)
    return done["t0"], perf.decode(1, 8 + decode / 2), perf.cold_start


def test_zero_and_no_start_change_nothing() -> None:
    base = _run(0.0, None)[0]
    assert _run(0.0, 1.0)[0] == pytest.approx(base, rel=1e-12)
    assert _run(0.5, None)[0] == pytest.approx(base, rel=1e-12)


def test_a_start_stretches_the_steps_it_overlaps_and_only_those() -> None:
    x = 0.5
    base, _, cold = _run(0.0, None)
    t_arrive = 1.0
    hit = _run(x, t_arrive)[0]
    assert cold > 0 and hit > base
    # Oracle: the trajectory's work left at the arrival (base - t_arrive seconds at the normal speed) runs
    # at 1/(1 + x) during the start, at full speed after it.
    left = base - t_arrive
    if left * (1 + x) <= cold:
        expect = t_arrive + left * (1 + x)
    else:
        expect = t_arrive + cold + (left - cold / (1 + x))
    assert hit == pytest.approx(expect, rel=2e-3)


def test_bad_values_are_one_line_errors() -> None:
    for bad in (-0.1, math.inf, "0.3", True):
        with pytest.raises(SchemaError, match="start_interference"):
            SimConfig(start_interference=bad)  # type: ignore[arg-type]
