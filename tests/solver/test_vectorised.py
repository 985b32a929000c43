"""The numpy forms of the planner's hot loops return exactly what their per-item references return.

Invariants (exact float equality, not approximate):
- ``build_instance``'s arrays and its lazily built ``trajs`` equal ``_traj_coeffs`` per trajectory, and an
  ``Instance`` built by hand from those objects gets the same arrays (hypothesis over random snapshots);
- ``evaluate`` == ``evaluate_reference`` on random decisions, problems (non-decoding slot, KV too large,
  no PREFILL slot) included, and ``evaluate_ids`` with missing trajectories prices the rest the same way;
- ``capped_waterfill`` == ``capped_waterfill_reference`` on random windows (ties, closed windows, zero rates);
- the greedy home pass (``_home_pass``) leaves the same state and pool as ``_home_pass_reference``, through
  the matrix path and the slot-by-slot path, at loose and tight targets.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from factories import planner_config, snapshots
from hypothesis import HealthCheck, given, settings

from rollplan.models.specs import model_spec
from rollplan.models.types import Role
from rollplan.solver.core.bounds import capped_waterfill, capped_waterfill_reference
from rollplan.solver.core.evaluate import evaluate, evaluate_ids, evaluate_reference
from rollplan.solver.core.instance import Instance, _traj_coeffs, build_instance
from rollplan.solver.examples import example_snapshot
from rollplan.solver.search import placement as greedy
from rollplan.solver.search.state import SlotState

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
ARRAY_FIELDS = ("D", "P", "W", "Dsd", "Wsd", "Dq", "Wq", "kbar", "peak", "ctx", "home", "kv_lost", "a", "c", "mu", "kv", "tau", "node", "type_of")


def _same_arrays(a: Instance, b: Instance) -> None:
    for name in ARRAY_FIELDS:
        assert np.array_equal(getattr(a.arrays, name), getattr(b.arrays, name)), name
    assert a.arrays.ids == b.arrays.ids


@FAST
@given(snapshots(max_slots=4, max_trajectories=12))
def test_instance_arrays_match_the_per_trajectory_coefficients(snap) -> None:
    inst = build_instance(snap, planner_config())
    pos = {s.id: i for i, s in enumerate(snap.slots)}
    spec = model_spec(snap.model)
    ref = tuple(
        _traj_coeffs(t, pos.get(t.slot) if t.slot is not None else None, spec.max_context, snap.time)
        for t in snap.unfinished
    )
    assert inst.unfinished == snap.unfinished
    assert len(inst.trajs) == len(ref)
    assert tuple(inst.trajs) == ref  # every field, exactly (the lazy TrajTable against the reference objects)
    by_hand = Instance(snap, inst.config, inst.slots, ref, inst.kv_bytes_per_token)
    _same_arrays(inst, by_hand)
    for j in range(len(ref)):
        for s in range(len(inst.slots)):
            assert inst.move_seconds(j, s) == by_hand.move_seconds(j, s)
            assert inst.fits(j, s) == (ref[j].peak_kv <= inst.slots[s].kv_capacity)


def _random_decision(inst: Instance, rng: random.Random) -> tuple[list[Role], list[int]]:
    """Roles and a placement, problems allowed (non-decoding hosts, KV overflow, DECODE without PREFILL)."""
    roles = [rng.choice([Role.OFF, Role.MIXED, Role.MIXED, Role.PREFILL, Role.DECODE]) for _ in inst.slots]
    placement = [rng.randrange(len(inst.slots)) for _ in range(len(inst.trajs))]
    return roles, placement


@pytest.mark.parametrize(("n_s", "n_j", "seed"), [(3, 20, 1), (8, 64, 2), (16, 300, 3), (64, 1500, 4)])
def test_evaluate_equals_the_reference(n_s: int, n_j: int, seed: int) -> None:
    inst = build_instance(example_snapshot(n_s, n_j, seed), planner_config(switch_weight=0.3))
    rng = random.Random(seed)
    for _ in range(20):
        roles, placement = _random_decision(inst, rng)
        assert evaluate(inst, roles, placement) == evaluate_reference(inst, roles, placement)
        hosts = [s for s, r in enumerate(roles) if r.decodes] or [0]
        clean = [rng.choice([s for s in hosts if inst.fits(j, s)] or hosts) for j in range(len(inst.trajs))]
        assert evaluate(inst, roles, clean) == evaluate_reference(inst, roles, clean)


def test_evaluate_ids_with_missing_trajectories_prices_the_rest() -> None:
    inst = build_instance(example_snapshot(8, 60, 5), planner_config())
    rng = random.Random(5)
    roles = [Role.MIXED] * len(inst.slots)
    placement = [rng.randrange(len(inst.slots)) for _ in inst.trajs]
    keep = [j for j in range(len(inst.trajs)) if j % 3]
    by_id = {inst.trajs[j].id: inst.slots[placement[j]].id for j in keep}
    ev = evaluate_ids(inst, {sl.id: r for sl, r in zip(inst.slots, roles, strict=True)}, by_id)
    sub = Instance(inst.snapshot, inst.config, inst.slots, tuple(inst.trajs[j] for j in keep), inst.kv_bytes_per_token,
                   phi=inst.phi)
    ref = evaluate_reference(sub, roles, [placement[j] for j in keep])
    assert dataclasses.replace(ev, problems=ref.problems) == ref
    assert len(ev.problems) == len(ref.problems) + len(inst.trajs) - len(keep)


def test_capped_waterfill_equals_the_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3000):
        k = int(rng.integers(1, 30))
        starts = np.round(rng.random(k) * rng.choice([1.0, 10.0, 100.0]), int(rng.integers(0, 3)))
        rates = rng.random(k) * rng.choice([1e-3, 1.0, 100.0])
        rates[rng.random(k) < 0.2] = 0.0
        ends = starts + np.round(rng.random(k) * 50.0, 1)
        ends[rng.random(k) < 0.5] = math.inf
        ends[rng.random(k) < 0.1] = starts[0]  # closed windows, ties with starts
        work = float(rng.random() * rng.choice([0.01, 1.0, 100.0, 1e4]))
        assert capped_waterfill(starts, rates, ends, work) == capped_waterfill_reference(starts, rates, ends, work)


@pytest.mark.parametrize("ragged", [greedy.RAGGED, 0.0])
@pytest.mark.parametrize(("n_s", "n_j", "seed"), [(8, 64, 1), (32, 512, 2), (128, 2048, 3)])
def test_home_pass_equals_the_reference(
    n_s: int, n_j: int, seed: int, ragged: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(greedy, "RAGGED", ragged)
    inst = build_instance(example_snapshot(n_s, n_j, seed), planner_config())
    prep = greedy.Prep(inst)
    deadlines = [math.inf if sl.deadline is None else sl.deadline for sl in inst.slots]
    timed = [d != math.inf for d in deadlines]
    for cfg in greedy.candidate_configs(prep, limit=4):
        for target in (cfg.makespan if math.isfinite(cfg.makespan) else 0.0, 0.0, 60.0, 1e9):
            limit = [min(target + greedy.HOME_SLACK, d + 1e-9) for d in deadlines]
            ref, new = SlotState(prep, cfg.roles), SlotState(prep, cfg.roles)
            pool_ref = greedy._home_pass_reference(prep, ref, limit, timed)
            pool_new = greedy._home_pass(prep, new, limit, timed)
            assert sorted(pool_ref) == sorted(pool_new)
            for name in ("sum_d", "max_d", "occ", "extra", "cp", "finish", "members", "where"):
                assert getattr(ref, name) == getattr(new, name), name
