"""Trial variants of the rollplan policy's dispatch and admission, replayed on the bench's matrix cells.

How a developer checks an idea before it goes into the decision core (``rollplan.policy``): subclass the
simulator's policy, replay the same cells, compare tokens/s. Each variant below was tried on issue 18's
``128x16-history`` cells and not adopted (docs/simulator.md, "Sessions 22 and 23's trials", "Session 24's
trials and diagnostics", "Session 25's trials", "Session 26's trials", "Session 27", "Session 28's trials"
and "Session 30's trials");
this script reproduces those figures at the policy of the commit each section names (the variants subclass the
policy as it is, so a later change to it moves them; git checkout that commit to reproduce an older section):

    .venv/bin/python examples/policy_trials.py --cells parcae-hh:async:0,bamboo-p3:async:2 --json

Variants (``TRIALS``; ``rollplan`` / ``elastic-plus``: the policies as they are):

- ``growth`` / ``growth-2`` / ``growth-0.5``: a slot admits a sample that is not predicted-critical when what
  stays free covers its residents' predicted next turn (new prefill and decode tokens), times 1 / 2 / 0.5,
  instead of ``KV_HEADROOM`` / ``BULK_HEADROOM`` (the critical slots keep ``CRITICAL_HEADROOM``).
- ``resume`` / ``elastic-plus-resume``: a sample that has started (its KV evicted in a tool call, or its GPU
  gone) is dispatched before every unstarted one, as vLLM resumes a preempted request first.
- ``flat-bulk``: in the bulk regime every slot keeps the bulk headroom, the critical slots included.
- ``expected-critical``: the predicted-critical set sized per group of siblings by the expected number of
  them whose path reaches ``CRITICAL_SHARE`` of the longest (normal paths of the predicted mean and spread).
- ``affinity`` / ``elastic-plus-affinity``: prefix-aware placement (as a cache-aware router would route): a
  sample that is not predicted-critical and that the plan does not place starts, where it can, on the
  admitting slot whose resident siblings already hold the most of its prompt (fewest residents, then most
  free KV, among equals); otherwise as the policy does.
- ``critical-share-0.75`` / ``critical-share-0.7``: ``CRITICAL_SHARE`` lowered, so samples whose pessimistic
  path is 0.75 / 0.7 of the longest count as predicted-critical.
- ``oracle``: ``rollplan-oracle`` (rollplan told every sample's true lengths; a reference, not a variant).

Session 25's (docs/simulator.md, "Session 25's trials"):

- ``bulk-affinity``: ``affinity`` only while the latest plan finds the batch bound by its bulk (where the
  bulk's KV, which a shared prompt saves, decides the batch's end); otherwise as the policy.
- ``bulk-evictable``: while the batch is bound by its bulk, a sample that is not predicted-critical may take
  the KV of residents in tool calls on a slot hosting no predicted-critical sample (vLLM's admission, as
  elastic-plus admits; an engine evicts that KV for it), keeping ``BULK_HEADROOM`` free; otherwise as the
  policy.
- ``regime-keys``: the dispatch keys price a sample's predicted decode seconds at the decode step of the
  regime's bulk slots (``occupancy_step`` at one less their headroom) instead of the reference step, so
  decode-heavy samples rank by how long they run where they will run.
- ``model-headroom``: while the batch is bound by its critical path, the bulk slots' headroom is the largest
  of 0.3-0.7 (steps of 0.1) under which the step model (``regime_makespan``) still has the bulk end before
  the critical path, instead of ``KV_HEADROOM``: the bulk's samples decode beside fewer co-residents, so a
  sample the prediction missed (one that turns out critical) runs nearer its floor.
- ``critical-apart``: a predicted-critical sample starts on a slot hosting no other predicted-critical sample
  (the plan's slot included) when one admits it: the step model's critical regime counts one critical sample
  per critical slot, but siblings share their prompt's KV, so the KV headroom admits a group together.
- ``regime-by-groups``: the regime model (``bulk_regime_pays``) counts the predicted-critical sibling groups
  instead of the samples (a group's siblings are predicted alike and the plan places them together), so a
  batch with two critical groups is not found bound by its bulk for want of 32 critical slots.

Session 26's (docs/simulator.md, "Session 26's trials"):

- ``critical-moves``: a plan's rebalancing move (between two slots that keep decoding, which ``MOVES``
  "forced" drops) is carried out when the moved sample is predicted-critical: the sample whose steps end the
  batch goes where the plan finds it ends sooner.
- ``all-moves``: every plan move carried out (``MOVES`` "all"), for comparison.
- ``oracle-started`` / ``oracle-started-critical-moves``: ``rollplan-oracle-started`` (told a sample's true
  course once it starts; a reference) as it is, and with ``critical-moves``: whether in-flight knowledge
  pays once the plan may act on it by moving the sample.

Session 27's (docs/simulator.md, "Session 27: group survival after the first finisher"):

- ``pooled``: the group update pools a prompt's history with its finished siblings (the history already holds
  them) instead of replacing the history by them. Not adopted: it gains where the history is as good as the
  batch's own samples, which the bench's stationary workload makes it (every batch redraws one recorded run
  per prompt), and in a training job the lengths drift between epochs.

Session 28's (docs/simulator.md, "Session 28's trials"):

- ``isolate``: while the latest plan finds the batch bound by its critical path, each adopted plan is
  followed by moving (KV transfer) the residents of every slot hosting a predicted-critical sample that are
  not predicted-critical to the slot hosting none that admits them under the policy's own headroom, so the
  critical sample's steps carry fewer co-runners (the oracle's edge on the long Bamboo batches).
- ``isolate-fit``: the same, a destination keeping only the watermark free.

Session 30's (docs/simulator.md, "Session 30's trials"):

- ``expected-regime``: the regime minimises the expected end of the batch, E[max(bulk's end, longest path)]
  over the predictor's spreads (each path normal), instead of comparing the regimes at the single longest
  pessimistic path.
- ``express`` / ``express-started``: one express slot per batch (a dedicated slot, the least loaded when the
  batch's first sample is queued) takes no new sample; at each adopted plan the started predicted-critical
  samples with the longest paths (two at most on it) move there (KV transfer). ``express-started``: the same
  over ``rollplan-oracle-started`` (a reference: told a sample's true course once it starts).
  ``express-path``: the express slot only while the latest plan finds the batch bound by its critical path.
- ``factor`` / ``express-factor``: a started sample's remaining decode scaled by its decode tokens per turn
  against its started siblings' median (its verbosity), without and with the express slot.
- ``lane``: each of the first two predicted-critical sibling groups gets a lane slot where its samples start
  and no other group's sample starts while one of the group's samples is not in a tool call.
- ``pack-2`` / ``pack-4``: predicted-critical samples share a critical slot two / four at a time (critical
  headroom 0.7 / 0.55), the regime model counting ceil(critical / 2 or 4) critical slots.
- ``early-critical``: the critical-path regime's headrooms hold until every sample predicted-critical at the
  batch's start has finished its first segment, whatever the plans find.
- ``regime-3``: the step model picks, at each plan, among the bulk regime, the critical-path regime and
  ``pack-4``'s packed one, whichever it predicts ends the batch first.

Session 32's (docs/simulator.md, "Session 32's trials and diagnostics"):

- ``regime-by-slots``: the regime model counts the slots that host or will host a predicted-critical sample
  (where its KV is, else the plan's placement) instead of the samples: the plans put several on one slot.
- ``regime-bulk`` / ``regime-critical``: the admission regime fixed at every plan, bound by the bulk or by
  the critical path (with ``--per-batch``: what each batch takes under either, against rollplan's choice).
- ``regime-drain``: the regime model prices the longest path's steps at the regime's occupancy only until the
  bulk's predicted end, then at a batch of one (``drain_makespan``).

Session 33's (docs/simulator.md, "Session 33's trials"):

- ``regime-lend``: while training holds GPUs it lent before, the regime model counts them back after as long
  as training held them the last time (measured by the policy: from when they left to when they were lent
  again), sharing the bulk left then (``lend_makespan``).
- ``regime-occupancy``: the regime model counts each slot that hosts or will host predicted-critical samples
  once, at the occupancy their own predicted KV keeps it at when that is above the regime's headroom, and
  the longest path's steps at its slot's (``occupancy_makespan``).
- ``regime-expected-occupancy``: ``expected-regime``'s E[max(bulk's end, longest path)] with
  ``regime-occupancy``'s slots, each path priced at its slot's occupancy.
- ``regime-kv``: ``regime-occupancy`` with the bulk's end also bounded by the KV-seconds its samples hold (the
  context each is predicted to end with, for its predicted life) over the KV the regime leaves the slots;
  ``regime-kv-expected-lend``: that bound, the regimes compared in expectation, and the lent GPUs counted
  back as ``regime-lend`` counts them.
- ``z-siblings``: each sample's pessimistic path at the expected longest of its group's unfinished samples
  (mean + E[max of n standard normals] spreads, ``expected_max_normal``) instead of ``DISPATCH_Z`` (that of 16).

Session 35's (docs/simulator.md, "Session 35: the clairvoyant reference's own choices"), references, not
variants (each is ``oracle``, told every sample's true course, with one of its own choices changed):

- ``oracle-regime-bulk`` / ``oracle-regime-critical``: the oracle with the admission regime fixed at every
  plan (``regime-bulk`` / ``regime-critical`` over the oracle).
- ``oracle-critical-share-0.7`` / ``oracle-critical-share-0.95``: the oracle with ``CRITICAL_SHARE`` 0.7 / 0.95
  (which samples count as critical, their true paths against the longest).
- ``rollplan-window`` / ``oracle-window``: rollplan / the oracle told when the window ends (no training job
  knows): in a batch whose longest predicted remaining path runs past the window's end, every slot admits as
  vLLM does (``window_aware``).

Physics (``bench replay``'s flags of the same names; the bench's by default): ``--fold-tool-s S``, ``--tool-kv
pinned|evictable|offload``, ``--evicted-return policy|slot`` replay every cell under those physics.

Diagnostics (the figures docs/simulator.md quotes for these trials):

- ``--per-batch``: each replay's rollout seconds per batch (None: the batch the window's end cuts), each
  batch's floor (``bench_replay.batch_floors``, what the ceiling chains), the seconds the complete batches
  ran over their floors in all, and the cut batch (``cut_batch_row``): the tokens the replay got from it
  against what the ceiling's cut-batch term allows from the same start.
- ``--hold-h H``: the window runs H hours past the trace's end, the last availability held (an assumption,
  not trace data): shows how long the batch the trace's end cuts takes each variant to finish.
- ``--last N``: per batch, the N samples that finished last: their group, start and end (seconds from the
  batch's start), their floor (``bench_replay.traj_floor``) and how many times their floor they ran.
- ``--timeline S``: every S simulated seconds (at the policy's next invocation), the replay's running and
  pending samples, decoding slots and their mean KV occupancy, the share of their KV held by samples in tool
  calls, the KV held by the residents not in tool calls per running sample and the mean context the running samples' steps
  are priced at, and for the rollplan policy's admission (not elastic-plus's) the predicted-critical samples,
  the slots hosting one, the mean KV occupancy of those slots and of the others, and the admission regime.

Each replay is deterministic; cells run in ``--jobs`` worker processes. Prints one JSON document (``--json``)
or a table: tokens/s per cell and variant.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from rollplan.models.errors import UserInputError
from rollplan.policy.dispatch import (
    DISPATCH_Z,
    REF_STEP_KV,
    Headrooms,
    bulk_regime_pays,
    critical_set,
    occupancy_step,
    pessimistic_parts,
    reference_step,
    regime_makespan,
    required_room,
)
from rollplan.policy.predict import Predictor
from rollplan.sim.bench_replay import (
    BENCH_TRACES,
    EVICTED_RETURN,
    FOLD_TOOL_S,
    MATRIX_MODES,
    batch_floors,
    cut_batch_tokens_at,
    matrix_scenario,
    matrix_workload,
    traj_floor,
)
from rollplan.sim.engine import EVICTED_RETURN_MODES, TOOL_KV_MODES
from rollplan.sim.policies import (
    DECODING,
    ORACLE,
    ElasticPlus,
    OracleRollplan,
    RollplanPolicy,
    StartedOracleRollplan,
    follows_plan,
    make_policy,
)
from rollplan.sim.replay import perf_factory, run_policy
from rollplan.sim.state import DONE, MOVE, PREFILL, TOOL

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STARTED_FIRST = 1e12
"""Added to a started sample's dispatch key (``resume``): larger than any path in seconds, so it sorts first."""


class GrowthReserve(RollplanPolicy):
    """``growth``: admission keeps the residents' predicted next-turn KV free (``scale`` times)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self._growth: dict[int, float] = {}

    def _predict(self, sim: Any, j: int, progress: Any = None, pf_done: Any = None) -> Any:
        rem = super()._predict(sim, j, progress, pf_done)
        turns = rem[3]
        self._growth[j] = min(1.0, max(0.0, turns - 1.0)) * (rem[0] + rem[1]) / max(turns, 1.0)
        return rem

    def choose_slot(self, sim: Any, j: int) -> int | None:
        t = sim.trajs[j]
        need = sim.need_new(t)
        crit = self._critical()
        hi = self.headrooms.levels(self._bulk_bound)[0]  # the critical slots' (j itself critical: everywhere)
        crit_slots = set() if j in crit else self._critical_slots(sim, crit)

        def room_needed(s: Any) -> float:
            reserve = min(self.scale * sum(self._growth.get(r, 0.0) for r in s.residents),
                          max(0, s.kv_cap - s.watermark - need))
            if j in crit or s.idx in crit_slots:
                return max(reserve, required_room(hi, s.kv_cap, s.watermark, need))
            return reserve

        def room(s: Any) -> float:
            return s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need

        if t.preferred >= 0 and follows_plan(j in self._informed):
            s = sim.slots[t.preferred]
            if s.present and s.role in DECODING and s.ready_at <= sim.now and room(s) >= room_needed(s):
                return self._admit(j, s.idx, crit)
        best = None  # the fewest residents, then the most free KV; the first of equals (as the policy's loop)
        for s in self.candidates(sim):
            if room(s) >= room_needed(s) and (best is None or s.n_res < best.n_res
                                              or (s.n_res == best.n_res and s.kv_free > best.kv_free)):
                best = s
        return None if best is None else self._admit(j, best.idx, crit)


def started_first(base: type[RollplanPolicy]) -> type[RollplanPolicy]:
    """``resume``: ``base`` with started samples ahead of unstarted ones in its dispatch heap."""

    class StartedFirst(base):  # type: ignore[valid-type, misc]
        def enqueued(self, sim: Any, j: int) -> None:
            super().enqueued(sim, j)
            t = sim.trajs[j]
            if t.t_start >= 0:  # a second entry ahead of the first; the stale one is skipped by ``order``
                heapq.heappush(self._heap, (-self._cp.get(j, 0.0) - STARTED_FIRST, t.pseq, j))

        def _rebuild_heap(self, sim: Any) -> None:
            trajs = sim.trajs
            self._heap = [(-self._cp.get(j, 0.0) - (STARTED_FIRST if trajs[j].t_start >= 0 else 0.0),
                           trajs[j].pseq, j) for j in sim.iter_pending()]
            heapq.heapify(self._heap)

    StartedFirst.name = base.name
    return StartedFirst


@dataclass(frozen=True, slots=True)
class FlatBulkHeadrooms(Headrooms):
    """``flat-bulk``: in the bulk regime the critical slots keep the others' (bulk) headroom too."""

    def levels(self, bulk_bound: bool) -> tuple[float, float]:
        hi, lo = Headrooms.levels(self, bulk_bound)
        return (lo, lo) if bulk_bound else (hi, lo)


class FlatBulk(RollplanPolicy):
    def __init__(self) -> None:
        super().__init__()
        h = self.headrooms
        self.headrooms = FlatBulkHeadrooms(h.default, h.bulk, h.critical)


class ExpectedCritical(RollplanPolicy):
    """``expected-critical``: per group, only the expected count of candidates is predicted-critical."""

    def __init__(self) -> None:
        super().__init__()
        self._mu: dict[int, float] = {}
        self._sd: dict[int, float] = {}

    def _predict(self, sim: Any, j: int, progress: Any = None, pf_done: Any = None) -> Any:
        rem = super()._predict(sim, j, progress, pf_done)
        a = self._a_ref
        self._mu[j] = rem[0] * a + rem[2]
        self._sd[j] = rem[4][0] * a + rem[4][2]
        return rem

    def enqueued(self, sim: Any, j: int) -> None:
        super().enqueued(sim, j)
        self._crit = None  # recomputed by ``_critical`` (the base adds to it in place)

    def _critical(self) -> set[int]:
        if self._crit is None:
            cp, informed = self._cp, self._informed
            self._cp_max = max((v for k, v in cp.items() if k in informed), default=0.0)
            thr = self.critical_share * self._cp_max
            trajs = self.sim.trajs
            groups: dict[str, list[int]] = {}
            for j in critical_set(cp, self.critical_share, informed):
                groups.setdefault(trajs[j].group, []).append(j)
            out: set[int] = set()
            for js in groups.values():
                expected = sum(1.0 if self._sd.get(k, 0.0) <= 0 else
                               0.5 * math.erfc((thr - self._mu.get(k, cp[k])) / self._sd[k] / math.sqrt(2.0))
                               for k in js)
                js.sort(key=lambda k: (trajs[k].slot < 0, -cp[k], k))
                out.update(js[:max(1, math.ceil(expected - 1e-9))])
            self._crit = out
            self._crit_slots_at = -1.0
        return self._crit


def shared_prefix_slot(cands: Sequence[Any], sim: Any, t: Any, admits: Callable[[Any], bool]) -> Any | None:
    """``affinity``: among ``cands`` that ``admits``, the slot whose resident siblings hold the most of ``t``'s
    prompt (``Simulator.prefix_bonus`` > 0), then the fewest residents, then the most free KV; None if no
    admitting slot holds any of it."""
    best, best_key = None, None
    for s in cands:
        bonus = sim.prefix_bonus(s, t)
        if bonus <= 0 or not admits(s):
            continue
        key = (-bonus, s.n_res, -s.kv_free)
        if best_key is None or key < best_key:
            best, best_key = s, key
    return best


class Affinity(RollplanPolicy):
    """``affinity``: the plan's slot first (as the policy), then the slot sharing the prompt, then as the policy."""

    def choose_slot(self, sim: Any, j: int) -> int | None:
        t = sim.trajs[j]
        crit = self._critical()
        if j in crit:
            return super().choose_slot(sim, j)
        if t.preferred >= 0 and follows_plan(j in self._informed):
            got = super().choose_slot(sim, j)  # j is not critical: no side effect on the critical slots
            if got == t.preferred:
                return got
        need = sim.need_new(t)
        hi, lo = self.headrooms.levels(self._bulk_bound)
        crit_slots = self._critical_slots(sim, crit)

        def admits(s: Any) -> bool:
            room = s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need
            return room >= required_room(hi if s.idx in crit_slots else lo, s.kv_cap, s.watermark, need)

        s = shared_prefix_slot(self.candidates(sim), sim, t, admits)
        return self._admit(j, s.idx, crit) if s is not None else super().choose_slot(sim, j)


class ElasticPlusAffinity(ElasticPlus):
    """``elastic-plus-affinity``: elastic-plus placing a sample where its siblings hold its prompt, under vLLM's
    admission (evictable tool-call KV counts as free), else as elastic-plus."""

    def choose_slot(self, sim: Any, j: int) -> int | None:
        t = sim.trajs[j]
        need = sim.need_new(t)
        s = shared_prefix_slot(self.candidates(sim), sim, t,
                               lambda s: sim.free_for_new(s) + sim.prefix_bonus(s, t) >= need)
        return s.idx if s is not None else super().choose_slot(sim, j)


class BulkAffinity(Affinity):
    """``bulk-affinity``: ``affinity`` in the bulk regime only."""

    def choose_slot(self, sim: Any, j: int) -> int | None:
        if not self._bulk_bound:
            return RollplanPolicy.choose_slot(self, sim, j)
        return super().choose_slot(sim, j)


class BulkEvictable(RollplanPolicy):
    """``bulk-evictable``: in the bulk regime a non-critical sample may take tool-call KV on a non-critical slot."""

    def choose_slot(self, sim: Any, j: int) -> int | None:
        crit = self._critical()
        if not self._bulk_bound or j in crit:
            return super().choose_slot(sim, j)
        t = sim.trajs[j]
        need = sim.need_new(t)
        hi, lo = self.headrooms.levels(True)
        crit_slots = self._critical_slots(sim, crit)

        def admits(s: Any) -> bool:
            if s.idx in crit_slots:  # the policy's own rule there
                room = s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need
                return room >= required_room(hi, s.kv_cap, s.watermark, need)
            room = sim.free_for_new(s) + sim.prefix_bonus(s, t) - need  # the watermark already kept
            return room >= required_room(lo, s.kv_cap, 0, need)

        if t.preferred >= 0 and follows_plan(j in self._informed):
            s = sim.slots[t.preferred]
            if s.present and s.role in DECODING and s.ready_at <= sim.now and admits(s):
                return self._admit(j, s.idx, crit)
        best = None  # the fewest residents, then the most free KV (as the policy's loop)
        for s in self.candidates(sim):
            if admits(s) and (best is None or s.n_res < best.n_res
                              or (s.n_res == best.n_res and s.kv_free > best.kv_free)):
                best = s
        return None if best is None else self._admit(j, best.idx, crit)


def regime_scale(policy: RollplanPolicy, sim: Any) -> float:
    """``regime-keys``: the decode step of the regime's bulk slots (``occupancy_step`` at one less their
    headroom) over the reference step, at least 1 (so a key is never below the policy's)."""
    if not sim.live or policy._a_ref <= 0:
        return 1.0
    lo = policy.headrooms.levels(policy._bulk_bound)[1]
    return max(1.0, occupancy_step(sim.live[0].perf.perf, 1.0 - lo)[0] / policy._a_ref)


def regime_key(policy: RollplanPolicy, j: int, scale: float) -> float:
    """``regime-keys``: j's pessimistic path with its decode seconds times ``scale``."""
    return policy._cp.get(j, 0.0) + policy._cp_dec.get(j, 0.0) * (scale - 1.0)


class RegimeKeys(RollplanPolicy):
    """``regime-keys``: dispatch keys with decode seconds at the regime's bulk-slot step."""

    def enqueued(self, sim: Any, j: int) -> None:
        super().enqueued(sim, j)  # a second entry, ahead of the base's (its key is never lower)
        heapq.heappush(self._heap, (-regime_key(self, j, regime_scale(self, sim)), sim.trajs[j].pseq, j))

    def _rebuild_heap(self, sim: Any) -> None:
        trajs, scale = sim.trajs, regime_scale(self, sim)
        self._heap = [(-regime_key(self, j, scale), trajs[j].pseq, j) for j in sim.iter_pending()]
        heapq.heapify(self._heap)

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        self._rebuild_heap(sim)  # the regime this plan set prices the keys


class CriticalApart(RollplanPolicy):
    """``critical-apart``: a predicted-critical sample avoids slots hosting another one while some slot admits it."""

    _exclude: frozenset[int] = frozenset()

    def candidates(self, sim: Any) -> list[Any]:
        cands = super().candidates(sim)
        return [s for s in cands if s.idx not in self._exclude] if self._exclude else cands

    def choose_slot(self, sim: Any, j: int) -> int | None:
        crit = self._critical()
        if j not in crit:
            return super().choose_slot(sim, j)
        trajs = sim.trajs
        taken = frozenset(trajs[k].slot for k in crit if k != j and trajs[k].slot >= 0)
        t = trajs[j]
        preferred = t.preferred
        if taken:
            self._exclude = taken
            if preferred in taken:
                t.preferred = -1  # not the plan's slot either
            try:
                got = super().choose_slot(sim, j)
            finally:
                self._exclude, t.preferred = frozenset(), preferred
            if got is not None:
                return got
        return super().choose_slot(sim, j)


def regime_inputs(policy: RollplanPolicy, sim: Any, plan: Any) -> tuple[float, dict[str, Any]]:
    """What the policy's regime decision (``bulk_regime_pays``) reads of an adopted plan: its work bound, and
    the longest pessimistic path's decode and tool seconds, the step model, the plan's decoding slots and the
    predicted-critical count as keyword arguments of ``regime_makespan``."""
    from rollplan.solver.core.bounds import BOUND_WORK

    j = max(policy._cp, key=policy._cp.__getitem__)
    dec_s = policy._cp_dec.get(j, 0.0)
    return plan.bounds.get(BOUND_WORK, 0.0), {
        "path_decode_s": dec_s, "path_tool_s": policy._cp[j] - dec_s, "perf": sim.live[0].perf.perf,
        "slots": sum(1 for r in plan.roles.values() if r.decodes), "critical": len(policy._critical())}


class RegimeByGroups(RollplanPolicy):
    """``regime-by-groups``: the regime decided with the count of predicted-critical sibling groups."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        args["critical"] = len({sim.trajs[k].group for k in self._critical()})
        self._bulk_bound = bulk_regime_pays(work, headrooms=self.headrooms, **args)


class RegimeBySlots(RollplanPolicy):
    """``regime-by-slots``: the regime decided with the number of slots that host or will host a
    predicted-critical sample (its slot when it holds KV, else the plan's placement, else one of its own):
    ``regime_makespan`` assumes one per slot, while the plan places several on a slot."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        index = sim.slot_index
        slots: set[Any] = set()
        for k in self._critical():
            t = sim.trajs[k]
            sid = plan.placement.get(t.spec.id)
            slots.add(t.slot if t.slot >= 0 else index.get(sid, ("own", k)))
        args["critical"] = len(slots)
        self._bulk_bound = bulk_regime_pays(work, headrooms=self.headrooms, **args)


def drain_makespan(bulk: bool, work_bound: float, path_decode_s: float, path_tool_s: float, *, perf: Any,
                   slots: int, critical: int, headrooms: Headrooms) -> float:
    """``regime_makespan`` with the longest path's slot drained once the bulk is done: its steps are priced at
    the regime's occupancy until the bulk's end ``B`` (``regime_makespan`` with no path), then at a batch of one;
    the path's decode and tool seconds interleave evenly."""
    kw = {"perf": perf, "slots": slots, "critical": critical, "headrooms": headrooms}
    b_end = regime_makespan(bulk, work_bound, 0.0, 0.0, **kw)
    t_hi = regime_makespan(bulk, 0.0, path_decode_s, path_tool_s, **kw)  # the path alone, held at the occupancy
    lo = float(perf.decode_step_time(1, REF_STEP_KV)) / reference_step(perf)
    path = t_hi if b_end >= t_hi else b_end + (1.0 - b_end / t_hi) * (path_decode_s * lo + path_tool_s)
    return max(path, b_end)


class DrainRegime(RollplanPolicy):
    """``regime-drain``: the regime decided by ``drain_makespan`` (the longest path's slot drains when the
    bulk is done) instead of ``regime_makespan`` (its slot at the regime's occupancy throughout)."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live or self.headrooms.default <= 0:
            return
        work, args = regime_inputs(self, sim, plan)
        self._bulk_bound = (drain_makespan(True, work, headrooms=self.headrooms, **args)
                            <= drain_makespan(False, work, headrooms=self.headrooms, **args))


def lend_share(end: float, later_in: float, now: float, more: float) -> float:
    """When work that ``now`` capacity ends at ``end`` (seconds from now) ends if ``more`` capacity joins
    ``later_in`` seconds from now: what is left then is shared by both."""
    return later_in + (end - later_in) * now / (now + more) if more > 0 and end > later_in else end


def lend_makespan(bulk: bool, work_bound: float, path_decode_s: float, path_tool_s: float, *, perf: Any,
                  slots: int, critical: int, headrooms: Headrooms, later: int, later_in: float) -> float:
    """``regime_makespan`` with ``later`` more decoding slots of the same kind joining ``later_in`` seconds from
    now (the GPUs training lends back once its step ends): the bulk's work left at ``later_in`` is shared by
    ``slots + later`` slots; the longest path is priced as ``regime_makespan`` prices it."""
    kw = {"perf": perf, "slots": slots, "critical": critical, "headrooms": headrooms}
    b_end = regime_makespan(bulk, work_bound, 0.0, 0.0, **kw)
    b_end = lend_share(b_end, later_in, slots, max(later, 0))
    return max(regime_makespan(bulk, 0.0, path_decode_s, path_tool_s, **kw), b_end)


class LendOutlook:
    """Mixin over the simulator's rollplan policy: watches the GPUs training lends (``lend_outlook``)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._gone: dict[int, float] = {}  # lent slot index -> when it left
        self._held_s: float | None = None  # how long training held its GPUs last time
        self._seen: dict[int, bool] = {}

    def _observe(self, sim: Any) -> None:
        from rollplan.models.types import SlotSource

        for s in sim.slots:
            if s.source is not SlotSource.LENT_BY_TRAINING:
                continue
            was = self._seen.get(s.idx)
            if was is True and not s.present:
                self._gone[s.idx] = sim.now
            elif was is False and s.present and s.idx in self._gone:
                self._held_s = sim.now - self._gone.pop(s.idx)
            self._seen[s.idx] = s.present

    def on_replan(self, sim: Any, reason: str) -> None:
        self._observe(sim)
        super().on_replan(sim, reason)  # type: ignore[misc]

    def lend_outlook(self, sim: Any) -> tuple[int, float]:
        """(lent slots training holds or is reclaiming, seconds from now until they are expected back):
        back after as long as training held them the last time; (0, 0.0) before that was seen."""
        from rollplan.models.types import SlotSource

        self._observe(sim)
        if self._held_s is None:
            return 0, 0.0
        # Lent slots gone (since when) or being reclaimed (gone at their deadline): back after training.
        leaves = [self._gone[s.idx] if not s.present else s.return_by for s in sim.slots
                  if s.source is SlotSource.LENT_BY_TRAINING
                  and ((not s.present and s.idx in self._gone) or (s.present and s.return_by is not None))]
        if not leaves:
            return 0, 0.0
        return len(leaves), max(0.0, max(leaves) + self._held_s - sim.now)


class LendRegime(LendOutlook, RollplanPolicy):
    """``regime-lend``: the regime decided by ``lend_makespan``: while training holds GPUs it lent before,
    they are expected back after as long as training held them last time (observed: from the moment they
    left to the moment they were lent again), and counted from then."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live or self.headrooms.default <= 0:
            return
        later, later_in = self.lend_outlook(sim)
        if not later:
            return
        work, args = regime_inputs(self, sim, plan)
        kw = {"headrooms": self.headrooms, "later": later, "later_in": later_in, **args}
        self._bulk_bound = lend_makespan(True, work, **kw) <= lend_makespan(False, work, **kw)


def critical_occupancy(load: float, cap: float, headroom: float) -> float:
    """The KV occupancy of a slot hosting predicted-critical samples of ``load`` tokens, kept at ``headroom``:
    what the headroom leaves, or their own load when that is more (at most full)."""
    return min(1.0, max(1.0 - headroom, load / cap if cap > 0 else 1.0))


def occupancy_makespan(bulk: bool, work_bound: float, path_decode_s: float, path_tool_s: float, *, perf: Any,
                       slots: int, loads: Sequence[float], path_load: float | None, cap: float,
                       headrooms: Headrooms) -> float:
    """``regime_makespan`` with each slot hosting predicted-critical samples counted once, at the occupancy its
    critical samples' own KV keeps it at when that is above the regime's headroom: ``loads`` holds, per such
    slot, the mean KV its critical samples are predicted to hold over their remaining course; ``path_load`` the
    load of the longest path's slot (None: on a slot of its own, at no more than its own KV)."""
    n = max(slots, 1)
    h_c, h_o = headrooms.levels(bulk)
    ref = reference_step(perf)

    def occ(load: float) -> float:
        return critical_occupancy(load, cap, h_c)

    crit = sorted(loads, reverse=True)[:n]
    u_path = occ(path_load if path_load is not None else 0.0) if crit else 1.0 - h_o
    path = path_decode_s * (occupancy_step(perf, u_path)[0] / ref if ref > 0 else 1.0) + path_tool_s
    full = occupancy_step(perf, 1.0)[1]
    rate = (sum(occupancy_step(perf, occ(x))[1] for x in crit)
            + (n - len(crit)) * occupancy_step(perf, 1.0 - h_o)[1]) / (n * full)
    return max(path, work_bound / rate if rate > 0 else math.inf)


class OccupancyRegime(RollplanPolicy):
    """``regime-occupancy``: the regime decided by ``occupancy_makespan``: the slots that host or will host a
    predicted-critical sample (its slot when it holds KV there, else the plan's placement, else one of its
    own), each at the occupancy its critical samples' predicted KV keeps it at."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live or self.headrooms.default <= 0:
            return
        work, args = regime_inputs(self, sim, plan)
        loads, where = critical_loads(self, sim, plan)
        top = max(self._cp, key=self._cp.__getitem__)
        kw = {"perf": args["perf"], "slots": args["slots"], "loads": list(loads.values()),
              "path_load": loads.get(where.get(top)), "cap": float(sim.live[0].kv_cap), "headrooms": self.headrooms}
        self._bulk_bound = (occupancy_makespan(True, work, args["path_decode_s"], args["path_tool_s"], **kw)
                            <= occupancy_makespan(False, work, args["path_decode_s"], args["path_tool_s"], **kw))


def critical_loads(policy: RollplanPolicy, sim: Any, plan: Any) -> tuple[dict[Any, float], dict[int, Any]]:
    """Per slot that hosts or will host predicted-critical samples (its slot when it holds KV there, else the
    plan's placement, else one of its own), the mean KV they are predicted to hold over their remaining
    course (context now plus half the predicted rest); and each such sample's slot."""
    index = sim.slot_index
    loads: dict[Any, float] = {}
    where: dict[int, Any] = {}
    for k in policy._critical():
        t = sim.trajs[k]
        dec, turns, tool, ctx = sim.progress(t)
        pf_done = sim.slots[0].perf.spec_prefill(t.spec)[2][min(turns, t.n - 1)] if turns else 0
        rem = policy.predictor.remaining_raw(t.key, t.group, dec, pf_done, tool, turns)
        kv = (ctx if t.slot >= 0 else 0.0) + 0.5 * (rem[0] + rem[1])
        w = t.slot if t.slot >= 0 else index.get(plan.placement.get(t.spec.id), ("own", k))
        loads[w] = loads.get(w, 0.0) + kv
        where[k] = w
    return loads, where


def slot_paths(policy: Any, js: Sequence[int], loads: dict[Any, float], where: dict[int, Any], *, perf: Any,
               cap: float, h_c: float, h_o: float) -> list[tuple[float, float, int]]:
    """``expected_makespan``'s paths (mean, spread, count) of samples ``js`` (their ``ExpectedRegime._mu``): each
    one's decode at its slot's occupancy, a predicted-critical sample's by ``critical_occupancy``, any other's
    at the other slots' headroom ``h_o``."""
    ref = reference_step(perf)
    paths: dict[tuple[float, float], int] = {}
    for j in js:
        u = critical_occupancy(loads[where[j]], cap, h_c) if j in where else 1.0 - h_o
        ratio = occupancy_step(perf, u)[0] / ref if ref > 0 else 1.0
        d, sd, t, st = policy._mu[j]
        key = (d * ratio + t, sd * ratio + st)
        paths[key] = paths.get(key, 0) + 1
    return [(m, sd, c) for (m, sd), c in paths.items()]


class FixedRegime(RollplanPolicy):
    """``regime-bulk`` / ``regime-critical``: the admission regime fixed for every plan (``BULK``: bound by its
    bulk or by its critical path), whatever the step model finds; per batch against rollplan, how much a
    perfect regime decision could move each batch (``--per-batch``)."""

    BULK = True

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        self._bulk_bound = self.BULK


MODEL_HEADROOMS = (0.3, 0.4, 0.5, 0.6, 0.7)


class ModelHeadroom(RollplanPolicy):
    """``model-headroom``: the critical-path regime's bulk headroom from the step model, per adopted plan."""

    def _apply(self, sim: Any, plan: Any) -> None:
        self.headrooms = Headrooms()  # the regime is decided with the policy's own headrooms
        super()._apply(sim, plan)
        if self._bulk_bound or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        fits = [h for h in MODEL_HEADROOMS
                if regime_makespan(False, work, headrooms=Headrooms(default=h), **args)
                <= regime_makespan(False, 0.0, headrooms=Headrooms(default=h), **args)]
        if fits:
            self.headrooms = Headrooms(default=max(fits))


def critical_moves(base: type[RollplanPolicy]) -> type[RollplanPolicy]:
    """``base`` with the plans' rebalancing moves of predicted-critical samples carried out (``critical-moves``)."""

    class CriticalMoves(base):  # type: ignore[valid-type, misc]
        def _carries_out(self, sim: Any, t: Any, plan: Any) -> bool:
            return t.idx in self._critical() or super()._carries_out(sim, t, plan)

    CriticalMoves.__name__ = f"CriticalMoves{base.__name__}"
    return CriticalMoves


class Isolate(RollplanPolicy):
    """``isolate``: while the latest plan finds the batch bound by its critical path, each adopted plan is
    followed by moving (KV transfer) the residents of every slot hosting a predicted-critical sample that are
    not predicted-critical themselves to the slot hosting none that admits them under the policy's own rule
    (fewest residents, then most free KV): the critical sample's steps then carry fewer co-runners."""

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if not self._bulk_bound:
            self._isolate(sim)

    headroom = True  # the destination keeps the policy's headroom (``isolate-fit``: only the watermark)

    def _isolate(self, sim: Any) -> None:
        crit = self._critical()
        crit_slots = set(self._critical_slots(sim, crit))
        if not crit_slots:
            return
        lo = self.headrooms.levels(False)[1] if self.headroom else 0.0
        for sidx in sorted(crit_slots):
            src = sim.slots[sidx]
            for r in list(src.residents):
                t = sim.trajs[r]
                if r in crit or not t.kv_ok or t.state in (PREFILL, MOVE):
                    continue
                need = t.reserved + t.sh
                best = None
                for d in self.candidates(sim):
                    if d.idx in crit_slots:
                        continue
                    room = d.kv_free - d.watermark + sim.prefix_bonus(d, t) - need
                    if room < required_room(lo, d.kv_cap, d.watermark, need):
                        continue
                    if best is None or d.n_res < best.n_res or (d.n_res == best.n_res and d.kv_free > best.kv_free):
                        best = d
                if best is not None:
                    sim.migrate(r, best.idx, by_kv=True)


class IsolateFit(Isolate):
    """``isolate-fit``: ``isolate`` with destinations that only keep the watermark free."""

    headroom = False


def expected_makespan(bulk_s: float, paths: Sequence[tuple[float, float, int]], points: int = 200) -> float:
    """E[max(bulk_s, max_k P_k)] for independent normal paths P_k ~ (mean, spread), each ``count`` times
    (``paths``: (mean, spread, count)): bulk_s + the integral from bulk_s of P(max_k P_k > x)."""
    if not paths:
        return bulk_s
    top = max(m + 6.0 * sd for m, sd, _n in paths)
    if top <= bulk_s:
        return bulk_s
    dx = (top - bulk_s) / points
    acc = 0.0
    for i in range(points):
        x = bulk_s + (i + 0.5) * dx
        log_cdf = 0.0
        for m, sd, n in paths:
            if sd <= 0.0:
                if x < m:
                    log_cdf = -math.inf
                    break
                continue
            c = 0.5 * (1.0 + math.erf((x - m) / (sd * math.sqrt(2.0))))
            if c <= 0.0:
                log_cdf = -math.inf
                break
            log_cdf += n * math.log(c)
        acc += 1.0 - math.exp(log_cdf)
    return bulk_s + acc * dx


class ExpectedRegime(RollplanPolicy):
    """``expected-regime``: the regime minimises the expected end of the batch, E[max(bulk's end, longest
    path)], over the predictor's spreads (each path normal: mean, spread at the regime's step), instead of
    comparing the two regimes at the single longest pessimistic path (mean + ``DISPATCH_Z`` spreads)."""

    TOP = 64

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._mu: dict[int, tuple[float, float, float, float]] = {}

    def _predict(self, sim: Any, j: int, progress: Any = None, pf_done: Any = None) -> Any:
        rem = super()._predict(sim, j, progress, pf_done)
        a, sds = self._a_ref, rem[4]
        self._mu[j] = (rem[0] * a, sds[0] * a, rem[2], sds[2])
        return rem

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        kw = {k: args[k] for k in ("perf", "slots", "critical")}
        live = [j for j in self._cp if j in self._mu]
        live.sort(key=self._cp.__getitem__, reverse=True)
        cand: dict[tuple[float, float, float, float], int] = {}
        for j in live:
            key = self._mu[j]
            cand[key] = cand.get(key, 0) + 1
            if len(cand) >= self.TOP:
                break
        out = []
        for bulk in (True, False):
            # ``regime_makespan``'s own terms: the bulk's end (no path), and a decode second's length on the
            # regime's critical step (one decode second, no work, no tool)
            b = regime_makespan(bulk, work, 0.0, 0.0, headrooms=self.headrooms, **kw)
            ratio = regime_makespan(bulk, 0.0, 1.0, 0.0, headrooms=self.headrooms, **kw)
            paths = [(d * ratio + t, sd * ratio + st, c) for (d, sd, t, st), c in cand.items()]
            out.append(expected_makespan(b, paths))
        self._bulk_bound = out[0] <= out[1]


class ExpectedOccupancy(ExpectedRegime):
    """``regime-expected-occupancy``: ``expected-regime``'s expected end of the batch, E[max(bulk's end,
    longest path)] over the predictor's spreads, with ``regime-occupancy``'s slots: the bulk's end by
    ``occupancy_makespan``, each predicted-critical sample's decode priced at its slot's occupancy, every
    other one at the regime's headroom for the other slots."""

    def _apply(self, sim: Any, plan: Any) -> None:
        RollplanPolicy._apply(self, sim, plan)
        if self.regime == "share" or not self._cp or not sim.live or self.headrooms.default <= 0:
            return
        work, args = regime_inputs(self, sim, plan)
        perf = args["perf"]
        loads, where = critical_loads(self, sim, plan)
        cap = float(sim.live[0].kv_cap)
        live = sorted((j for j in self._cp if j in self._mu), key=self._cp.__getitem__, reverse=True)[: self.TOP]
        out = []
        for bulk in (True, False):
            h_c, h_o = self.headrooms.levels(bulk)
            b = occupancy_makespan(bulk, work, 0.0, 0.0, perf=perf, slots=args["slots"], loads=list(loads.values()),
                                   path_load=None, cap=cap, headrooms=self.headrooms)
            out.append(expected_makespan(b, slot_paths(self, live, loads, where, perf=perf, cap=cap, h_c=h_c, h_o=h_o)))
        self._bulk_bound = out[0] <= out[1]


class KvRegime(ExpectedRegime):
    """``regime-kv``: ``regime-occupancy``'s model with the bulk's end also bounded by the KV it must hold: every
    unfinished sample holds the context it is predicted to end with (its context now plus the predicted rest,
    ``KV_GROWTH`` = 1: a segment reserves its end context from its start) for its predicted remaining life
    (decode at its slot's occupancy plus tool seconds), and a regime leaves each slot only ``1 - headroom`` of
    its KV (a critical slot at least its critical samples' load) to hold it in. ``regime-kv-expected-lend``:
    the same bound on the bulk, the regimes compared by ``expected-regime``'s E[max(bulk's end, longest path)]
    (each path at its slot's occupancy; ``EXPECTED``), and the GPUs training holds counted back as
    ``regime-lend`` counts them (``LendOutlook``)."""

    KV_GROWTH = 1.0
    EXPECTED = False

    def lend_outlook(self, sim: Any) -> tuple[int, float]:
        return 0, 0.0

    def _apply(self, sim: Any, plan: Any) -> None:
        RollplanPolicy._apply(self, sim, plan)
        if self.regime == "share" or not self._cp or not sim.live or self.headrooms.default <= 0:
            return
        work, args = regime_inputs(self, sim, plan)
        perf, n = args["perf"], max(args["slots"], 1)
        loads, where = critical_loads(self, sim, plan)
        cap = float(sim.live[0].kv_cap)
        ref = reference_step(perf)
        later, later_in = self.lend_outlook(sim)
        kv_of: dict[int, float] = {}
        for j in self._cp:
            t = sim.trajs[j]
            if t.state == DONE or j not in self._mu:
                continue
            dec, turns, tool, ctx = sim.progress(t)
            pf_done = sim.slots[0].perf.spec_prefill(t.spec)[2][min(turns, t.n - 1)] if turns else 0
            rem = self.predictor.remaining_raw(t.key, t.group, dec, pf_done, tool, turns)
            kv_of[j] = (ctx if t.slot >= 0 else 0.0) + self.KV_GROWTH * (rem[0] + rem[1])
        out = []
        for bulk in (True, False):
            h_c, h_o = self.headrooms.levels(bulk)
            crit = sorted(loads.values(), reverse=True)[:n]
            occ_c = [critical_occupancy(x, cap, h_c) for x in crit]
            usable = (sum(occ_c) + (n - len(crit)) * (1.0 - h_o)) * cap
            kvs = 0.0
            for j, kv in kv_of.items():
                u = critical_occupancy(loads[where[j]], cap, h_c) if j in where else 1.0 - h_o
                d, _sd, t, _st = self._mu[j]
                kvs += kv * (d * occupancy_step(perf, u)[0] / ref + t)
            kw = {"perf": perf, "slots": n, "loads": list(loads.values()), "cap": cap, "headrooms": self.headrooms}
            b_work = occupancy_makespan(bulk, work, 0.0, 0.0, path_load=None, **kw)
            b_kv = kvs / usable if usable > 0 else math.inf
            # the lent slots share what is left when they are back (their KV at the other slots' headroom)
            b_end = max(lend_share(b_work, later_in, n, later),
                        lend_share(b_kv, later_in, usable, later * (1.0 - h_o) * cap))
            if self.EXPECTED:
                js = sorted(kv_of, key=self._cp.__getitem__, reverse=True)[: self.TOP]
                out.append(expected_makespan(b_end, slot_paths(self, js, loads, where, perf=perf, cap=cap, h_c=h_c,
                                                               h_o=h_o)))
            else:
                top = max(self._cp, key=self._cp.__getitem__)
                out.append(max(b_end, occupancy_makespan(bulk, 0.0, args["path_decode_s"], args["path_tool_s"],
                                                         path_load=loads.get(where.get(top)), **kw)))
        self._bulk_bound = out[0] <= out[1]


def window_aware(base: type[RollplanPolicy]) -> type[RollplanPolicy]:
    """``base`` told when the replay's window ends (``Simulator.end_time``), which no training job knows: at each
    adopted plan, when its longest predicted remaining path (``_cp``, the unfinished samples') runs past the
    window's end, the batch is one the window cuts and every slot admits as vLLM does (``Headrooms(default=0)``,
    the bulk regime); otherwise the base's headrooms. A reference for what the window's cut batch pays a policy
    that packs it, not a variant."""

    class WindowAware(base):  # type: ignore[valid-type, misc]
        def _apply(self, sim: Any, plan: Any) -> None:
            super()._apply(sim, plan)
            if self._cp and sim.now + max(self._cp.values()) > sim.end_time:
                self.headrooms = Headrooms(default=0.0)
                self._bulk_bound = True
            else:
                self.headrooms = Headrooms()

    WindowAware.__name__ = f"WindowAware{base.__name__}"
    return WindowAware


def express(base: type[RollplanPolicy]) -> type[RollplanPolicy]:
    """``base`` with an express slot per batch: one decoding slot (a dedicated one, the least loaded when the
    batch starts) takes no new sample that is not predicted-critical, and at each adopted plan every started,
    predicted-critical sample (at most ``EXPRESS_MAX`` on it) moves there (KV transfer) when it fits."""

    class Express(base):  # type: ignore[valid-type, misc]
        EXPRESS_MAX = 2
        ONLY_PATH = False

        def _lane(self, sim: Any) -> int:
            if self._express_batch != sim.batch or (self.ONLY_PATH and self._bulk_bound):
                return -1
            return self._express

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self._express = -1
            self._express_batch = -1

        def _pick(self, sim: Any) -> int:
            if self._express_batch != sim.batch or not (0 <= self._express < len(sim.slots)
                                                        and sim.slots[self._express].present):
                cands = [s for s in super().candidates(sim) if s.source.name == "DEDICATED"] or super().candidates(sim)
                if not cands:
                    return -1
                best = min(cands, key=lambda s: (s.n_res, -s.kv_free))
                self._express, self._express_batch = best.idx, sim.batch
            return self._express

        def choose_slot(self, sim: Any, j: int) -> Any:
            t = sim.trajs[j]
            if self._lane(sim) >= 0 and t.preferred == self._express:
                t.preferred = -1
            return super().choose_slot(sim, j)

        def _new_batch(self, sim: Any) -> None:
            fresh = sim.batch != self._batch
            super()._new_batch(sim)
            if fresh:
                self._pick(sim)

        def candidates(self, sim: Any) -> list[Any]:
            c = super().candidates(sim)
            e = self._lane(sim)
            if e < 0:
                return c
            return [s for s in c if s.idx != e]

        def _apply(self, sim: Any, plan: Any) -> None:
            super()._apply(sim, plan)
            self._pick(sim)
            e = self._lane(sim)
            if e < 0:
                return
            dst = sim.slots[e]
            crit = self._critical()
            on = sum(1 for r in dst.residents if r in crit)
            for j in sorted(crit, key=lambda k: -self._cp.get(k, 0.0)):
                if on >= self.EXPRESS_MAX:
                    break
                t = sim.trajs[j]
                if t.slot < 0 or t.slot == e or not t.kv_ok or t.t_start < 0 or t.state in (PREFILL, MOVE, DONE):
                    continue
                if dst.kv_free - dst.watermark < t.reserved + t.sh:
                    continue
                sim.migrate(j, e, by_kv=True)
                on += 1

    Express.__name__ = f"Express{base.__name__}"
    return Express


class SampleFactor(RollplanPolicy):
    """``factor``: a started sample's remaining decode is scaled by how verbose it has been against its started
    siblings: (its decode tokens per finished turn) / (the median of that over its group's started siblings),
    once it has finished ``MIN_TURNS`` turns (the samples of a prompt follow one course, each at its own
    verbosity)."""

    MIN_TURNS = 2

    def snapshot(self, sim: Any) -> Any:
        rates: dict[str, list[float]] = {}
        for t in sim.trajs:
            if t.state == DONE:
                continue
            dec, turns, _tool, _ctx = sim.progress(t)
            if turns >= self.MIN_TURNS:
                rates.setdefault(t.group, []).append(dec / turns)
        self._grate = {g: sorted(v)[len(v) // 2] for g, v in rates.items() if len(v) >= 2}
        return super().snapshot(sim)

    def _predict(self, sim: Any, j: int, progress: Any = None, pf_done: Any = None) -> Any:
        rem = super()._predict(sim, j, progress, pf_done)
        t = sim.trajs[j]
        dec, turns, _tool, _ctx = progress if progress is not None else sim.progress(t)
        g = getattr(self, "_grate", {}).get(t.group)
        if g is None or turns < self.MIN_TURNS or g <= 0:
            return rem
        f = (dec / turns) / g
        new_dec = max(1.0, (rem[0] + dec) * f - dec)
        rem = (new_dec, *rem[1:])
        a, sds = self._a_ref, rem[4]
        dec_s, tool_s = pessimistic_parts(new_dec, sds[0], rem[2], sds[2], a, self.dispatch_z)
        self._cp[j] = dec_s + tool_s
        self._cp_dec[j] = dec_s
        return rem


class GroupLane(RollplanPolicy):
    """``lane``: each predicted-critical sibling group gets a lane: the least loaded admitting slot when its
    first sample is placed, where its samples start (when the lane keeps the watermark free after them) and
    where no sample of another group starts while one of the group's samples is not in a tool call or done."""

    MAX_LANES = 2

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._lanes: dict[str, int] = {}
        self._lane_batch = -1

    def _lane_state(self, sim: Any) -> tuple[dict[str, int], set[int]]:
        if self._lane_batch != sim.batch:
            self._lanes, self._lane_batch = {}, sim.batch
        active: set[int] = set()
        if self._lanes:
            left: dict[str, bool] = {}
            for t in sim.trajs:
                if t.group in self._lanes and not left.get(t.group) and t.state not in (DONE, TOOL):
                    left[t.group] = True
            active = {s for g, s in self._lanes.items() if left.get(g)}
        return self._lanes, active

    def candidates(self, sim: Any) -> list[Any]:
        c = super().candidates(sim)
        block = getattr(self, "_block", None)
        return c if not block else [s for s in c if s.idx not in block]

    def choose_slot(self, sim: Any, j: int) -> Any:
        t = sim.trajs[j]
        lanes, active = self._lane_state(sim)
        crit = self._critical()
        if j in crit:
            lane = lanes.get(t.group)
            if lane is None and len(lanes) < self.MAX_LANES:
                cands = [s for s in super().candidates(sim) if s.idx not in lanes.values()]
                if cands:
                    lane = min(cands, key=lambda s: (s.n_res, -s.kv_free)).idx
                    lanes[t.group] = lane
                    active.add(lane)
            if lane is not None:
                s = sim.slots[lane]
                need = sim.need_new(t)
                if (s.present and s.role in DECODING and s.ready_at <= sim.now and s.return_by is None
                        and s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need >= 0):
                    return self._admit(j, lane, crit)
        mine = lanes.get(t.group)
        self._block = {x for x in active if x != mine}
        if t.preferred in self._block:
            t.preferred = -1
        try:
            return super().choose_slot(sim, j)
        finally:
            self._block = None


class CriticalPack(RollplanPolicy):
    """``pack-P``: predicted-critical samples may share a critical slot ``P`` at a time (critical headroom
    ``HEADROOM``), and the regime model counts ceil(critical / P) critical slots."""

    PACK = 2
    HEADROOM = 0.7

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.headrooms = Headrooms(critical=self.HEADROOM)

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        args["critical"] = -(-args["critical"] // self.PACK)
        self._bulk_bound = bulk_regime_pays(work, headrooms=self.headrooms, **args)


class ThreeRegimes(RollplanPolicy):
    """``regime-3``: at each adopted plan the step model (``regime_makespan``) compares three admission regimes
    and keeps the one it predicts ends the batch first: the bulk regime, the critical-path regime (one
    predicted-critical sample per critical slot, ``CRITICAL_HEADROOM``) and the packed one of ``pack-4``
    (critical slots shared ``PACK`` at a time at critical headroom ``HEADROOM``, ceil(critical / ``PACK``) of
    them). Ties go to the earlier in that order."""

    PACK = 4
    HEADROOM = 0.55

    def _apply(self, sim: Any, plan: Any) -> None:
        self.headrooms = Headrooms()
        super()._apply(sim, plan)
        if self.regime == "share" or not self._cp or not sim.live:
            return
        work, args = regime_inputs(self, sim, plan)
        plain = Headrooms()
        packed = Headrooms(critical=self.HEADROOM)
        ends = [regime_makespan(True, work, headrooms=plain, **args),
                regime_makespan(False, work, headrooms=plain, **args),
                regime_makespan(False, work, headrooms=packed,
                                **{**args, "critical": -(-args["critical"] // self.PACK)})]
        best = min(range(3), key=ends.__getitem__)
        self._bulk_bound = best == 0
        if best == 2:
            self.headrooms = packed


class EarlyCritical(RollplanPolicy):
    """``early-critical``: the critical-path regime's headrooms (``Headrooms.levels(False)``) hold until every
    sample predicted-critical at the batch's start has finished its first segment (reached a tool call or
    its end), whatever the plans find; then the regime as the policy decides it."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self._early_batch = -1
        self._early: set[int] = set()

    def _apply(self, sim: Any, plan: Any) -> None:
        super()._apply(sim, plan)
        if self._early_batch != sim.batch:
            self._early_batch = sim.batch
            self._early = set(self._critical())
        self._early = {j for j in self._early if sim.trajs[j].turn == 0 and sim.trajs[j].state not in (TOOL, DONE)}
        if self._early:
            self._bulk_bound = False


class PooledPredictor(Predictor):
    """``Predictor`` whose group update pools a prompt's history with its finished siblings (the history
    already holds them) instead of replacing the history by them: a group's first finishers are its shortest
    samples, so their mean alone reads the unfinished siblings short."""

    def total(self, key: str, group: str) -> Any:
        h = self._history.get(key)
        g = self._groups.get(group)
        if h is not None and h.n and (g is None or h.n > g.n):
            return h.mean(), h, "history"
        return super().total(key, group)


class Pooled(RollplanPolicy):
    """``pooled``: rollplan with ``PooledPredictor``."""

    def __init__(self) -> None:
        super().__init__()
        self.predictor = PooledPredictor()


def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals] (0 for n <= 1): how many spreads above their mean the
    longest of ``n`` samples runs, in expectation (1.766 for 16, ``DISPATCH_Z``'s 1.77). The integral of
    x d(Phi(x)^n) over [-10, 10] by the midpoint rule (step 0.01)."""
    if n <= 1:
        return 0.0
    h, total = 0.01, 0.0
    for i in range(-1000, 1000):
        x = (i + 0.5) * h
        total += x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * (0.5 * math.erfc(-x / math.sqrt(2.0))) ** (n - 1)
    return total * h


class SiblingsZ(RollplanPolicy):
    """``z-siblings``: each sample's pessimistic path at the expected longest of its group's unfinished samples,
    mean + E[max of n normals] spreads (``expected_max_normal``, n the group's unfinished samples), instead of
    ``DISPATCH_Z`` (the expected longest of 16) for every sample: a group with one sample left is expected to
    run its mean, one of 8 samples (the 32 x 8 cells) 1.42 spreads above it."""

    def __init__(self) -> None:
        super().__init__()
        self._live_n: dict[str, int] = {}
        self._live_batch = -1
        self._z: dict[int, float] = {}

    def _predict(self, sim: Any, j: int, progress: Any = None, pf_done: Any = None) -> Any:
        if self._live_batch != sim.batch:
            self._live_batch = sim.batch
            self._live_n = {}
            for t in sim.trajs:
                if t.state != DONE:
                    self._live_n[t.group] = self._live_n.get(t.group, 0) + 1
        n = self._live_n.get(sim.trajs[j].group, 1)
        z = self._z.get(n)
        if z is None:
            z = self._z[n] = expected_max_normal(n)
        self.dispatch_z = z
        try:
            return super()._predict(sim, j, progress, pf_done)
        finally:
            self.dispatch_z = DISPATCH_Z

    def on_traj_done(self, sim: Any, j: int) -> None:
        super().on_traj_done(sim, j)
        g = sim.trajs[j].group
        if self._live_n.get(g, 0) > 0:
            self._live_n[g] -= 1


TRIALS: dict[str, Callable[[], Any]] = {
    "rollplan": lambda: make_policy("rollplan"),
    "expected-regime": ExpectedRegime,
    "express": lambda: express(RollplanPolicy)(),
    "express-started": lambda: express(StartedOracleRollplan)(),
    "express-path": lambda: type("ExpressPath", (express(RollplanPolicy),), {"ONLY_PATH": True})(),
    "factor": SampleFactor,
    "lane": GroupLane,
    "pack-2": CriticalPack,
    "early-critical": EarlyCritical,
    "regime-3": ThreeRegimes,
    "pack-4": lambda: type("Pack4", (CriticalPack,), {"PACK": 4, "HEADROOM": 0.55})(),
    "express-factor": lambda: express(SampleFactor)(),
    "elastic-plus": lambda: make_policy("elastic-plus"),
    "growth": lambda: GrowthReserve(1.0),
    "growth-2": lambda: GrowthReserve(2.0),
    "growth-0.5": lambda: GrowthReserve(0.5),
    "resume": lambda: started_first(RollplanPolicy)(),
    "elastic-plus-resume": lambda: started_first(ElasticPlus)(),
    "flat-bulk": FlatBulk,
    "expected-critical": ExpectedCritical,
    "affinity": Affinity,
    "elastic-plus-affinity": ElasticPlusAffinity,
    "critical-share-0.75": lambda: RollplanPolicy(critical_share=0.75),
    "critical-share-0.7": lambda: RollplanPolicy(critical_share=0.7),
    "oracle": lambda: make_policy(ORACLE),
    "bulk-affinity": BulkAffinity,
    "bulk-evictable": BulkEvictable,
    "regime-keys": RegimeKeys,
    "model-headroom": ModelHeadroom,
    "critical-apart": CriticalApart,
    "regime-by-groups": RegimeByGroups,
    "regime-by-slots": RegimeBySlots,
    "regime-bulk": FixedRegime,
    "regime-drain": DrainRegime,
    "regime-lend": LendRegime,
    "regime-occupancy": OccupancyRegime,
    "regime-expected-occupancy": ExpectedOccupancy,
    "regime-kv": KvRegime,
    "regime-kv-expected-lend": lambda: type("KvExpectedLend", (LendOutlook, KvRegime), {"EXPECTED": True})(),
    "regime-critical": lambda: type("CriticalRegime", (FixedRegime,), {"BULK": False})(),
    "isolate": Isolate,
    "isolate-fit": IsolateFit,
    "critical-moves": lambda: critical_moves(RollplanPolicy)(),
    "all-moves": lambda: RollplanPolicy(moves="all"),
    "oracle-started": StartedOracleRollplan,
    "oracle-started-critical-moves": lambda: critical_moves(StartedOracleRollplan)(),
    "pooled": Pooled,
    "z-siblings": SiblingsZ,
    "oracle-regime-bulk": lambda: type("OracleBulk", (FixedRegime, OracleRollplan), {})(),
    "oracle-regime-critical": lambda: type("OracleCritical", (FixedRegime, OracleRollplan), {"BULK": False})(),
    "oracle-critical-share-0.7": lambda: OracleRollplan(critical_share=0.7),
    "oracle-critical-share-0.95": lambda: OracleRollplan(critical_share=0.95),
    "rollplan-window": lambda: window_aware(RollplanPolicy)(),
    "oracle-window": lambda: window_aware(OracleRollplan)(),
}


def timeline_probe(policy: Any, every_s: float, rows: list[dict[str, Any]]) -> Any:
    """``policy`` (a fresh trial policy) sampled into ``rows`` at its invocations, at most every ``every_s``
    simulated seconds (``--timeline``); the replay's decisions are unchanged."""
    base = type(policy)
    last = [-math.inf]

    def sample(sim: Any) -> None:
        if sim.now - last[0] < every_s:
            return
        last[0] = sim.now
        states = [t.state for t in sim.trajs]
        dec = [s for s in sim.live if s.role in DECODING]
        occ = {s.idx: 1.0 - s.kv_free / s.kv_cap for s in dec}
        row: dict[str, Any] = {"t": round(sim.now, 1), "batch": sim.batch, "running": sum(s.n_run for s in dec),
                               "pending": sim.n_pending, "decoding_slots": len(dec),
                               "kv_slots": round(sum(occ.values()) / len(occ), 3) if occ else None}
        # What the decoding slots' KV holds: the share held by residents in tool calls (``kv_idle``); the KV
        # the residents not in tool calls hold per running trajectory (``kv_per_running``: a segment reserves
        # the context it ends with from its start; a shared prompt counts once per slot); the mean context
        # the running trajectories' steps are priced at (``step_ctx``: each one's segment's mean context).
        n_run = sum(s.n_run for s in dec)
        cap, reserved, idle = (sum(getattr(s, f) for s in dec) for f in ("kv_cap", "reserved", "idle"))
        row.update(kv_idle=round(idle / cap, 3) if cap else None,
                   kv_per_running=round((reserved - idle) / n_run) if n_run else None,
                   step_ctx=round(sum(s.kv_sum for s in dec) / n_run) if n_run else None)
        if isinstance(policy, RollplanPolicy) and not isinstance(policy, ElasticPlus):  # its admission's split
            crit = policy._critical()
            cslots = policy._critical_slots(sim, crit)
            on = [v for k, v in occ.items() if k in cslots]
            off = [v for k, v in occ.items() if k not in cslots]
            row.update(critical=sum(1 for j in crit if states[j] != DONE), critical_slots=len(on),
                       kv_critical_slots=round(sum(on) / len(on), 3) if on else None,
                       kv_other_slots=round(sum(off) / len(off), 3) if off else None,
                       regime="bulk" if policy._bulk_bound else "critical path")
        rows.append(row)

    class Probed(base):  # type: ignore[valid-type, misc]
        def on_replan(self, sim: Any, reason: str) -> None:
            super().on_replan(sim, reason)
            sample(sim)

        def on_traj_done(self, sim: Any, j: int) -> None:
            super().on_traj_done(sim, j)
            sample(sim)

    Probed.name = base.name
    policy.__class__ = Probed
    return policy


def parse_cells(text: str) -> list[tuple[str, str, int]]:
    """``trace:mode:seed`` items, comma separated; ``UserInputError`` naming the bad item."""
    traces = {t[0] for t in BENCH_TRACES}
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in traces or parts[1] not in MATRIX_MODES or not parts[2].isdigit():
            raise UserInputError(f"--cells: bad cell {item!r}",
                                 fix=f"write trace:mode:seed, trace in {sorted(traces)}, mode in {list(MATRIX_MODES)}")
        out.append((parts[0], parts[1], int(parts[2])))
    if not out:
        raise UserInputError("--cells is empty", fix="name at least one trace:mode:seed")
    return out


def parse_trials(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    for n in names:
        if n not in TRIALS:
            raise UserInputError(f"--trials: unknown trial {n!r}", fix=f"use some of {list(TRIALS)}")
    return names


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """What a replay reports beside tokens/s (see the module docstring)."""

    per_batch: bool = False
    hold_h: float | None = None
    timeline_s: float | None = None
    last: int | None = None


def last_probe(policy: Any, scenario: Any, n: int,
               out: dict[int, list[dict[str, Any]]]) -> tuple[Any, Callable[[], None]]:
    """``policy`` recording, per batch, its ``n`` last-finishing samples (``--last``; the replay's decisions are
    unchanged), and the call that writes them into ``out`` once the replay is over."""
    base = type(policy)
    step = perf_factory(scenario.model, calibrated=scenario.calibrated, config=scenario.sim)(scenario.gpu, 1).decode
    fold = scenario.sim.fold_tool_s
    ends: dict[int, list[tuple[float, int, Any]]] = {}

    class Probed(base):  # type: ignore[valid-type, misc]
        def on_traj_done(self, sim: Any, j: int) -> None:
            super().on_traj_done(sim, j)
            t = sim.trajs[j]
            row = (sim.now, j, (t.group, t.t_start - sim.batch_start, sim.now - sim.batch_start, t.spec))
            heap = ends.setdefault(sim.batch, [])
            (heapq.heappush if len(heap) < n else heapq.heappushpop)(heap, row)

    Probed.name = base.name
    policy.__class__ = Probed

    def finish() -> None:
        for b, heap in sorted(ends.items()):
            rows = []
            for _end, _j, (group, start, end, spec) in sorted(heap, reverse=True):
                floor = traj_floor(spec, step, fold)
                rows.append({"group": group, "start_s": round(start, 1), "end_s": round(end, 1),
                             "floor_s": round(floor, 1), "ran_over_floor": round((end - start) / floor, 3)
                             if floor > 0 else None})
            out[b] = rows

    return policy, finish


@dataclass(frozen=True, slots=True)
class Physics:
    """The simulator physics the cells replay under (``bench replay``'s flags of the same names); the bench's by
    default."""

    fold_tool_s: float = FOLD_TOOL_S
    tool_kv: str = "evictable"
    evicted_return: str = EVICTED_RETURN


def cut_batch_row(sc: Any, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The batch the window's end cut in this replay (``--per-batch``), None when none was: its index and start,
    the decode tokens the replay got from it (the replay's tokens less its complete batches' whole tokens), the
    batch's whole tokens, and what the ceiling's cut-batch term allows from the same start
    (``bench_replay.cut_batch_tokens_at``): how much of the ceiling's count a schedule reaches in that batch."""
    cut = [b for b in summary["batches"] if b["rollout_s"] is None]
    if not cut:
        return None
    b = cut[0]
    whole_of = {}
    for i in {x["index"] for x in summary["batches"]}:
        specs, _keys = sc.batches.batch(i + sc.warmup_batches)
        whole_of[i] = float(sum(sum(sp.decode) for sp in specs))
    complete = sum(whole_of[x["index"]] for x in summary["batches"] if x["rollout_s"] is not None)
    got = summary["throughput_tokens_per_s"] * sc.end_time - complete
    bound = cut_batch_tokens_at(sc, b["index"], b["start_s"])[0]
    return {"index": b["index"], "start_s": round(b["start_s"], 1), "tokens": round(got),
            "whole": round(whole_of[b["index"]]), "bound_at_start": round(bound)}


def run_one(job: tuple[str, str, int, str, str, float | None, Diagnostics, Physics]) -> dict[str, Any]:
    """One variant's replay of one ``128x16-history`` cell (``window_h``: the window cut to that many hours)."""
    trace, mode, seed, trial, data, window_h, diag, phys = job
    sc = matrix_scenario(Path(data), trace, mode, matrix_workload("128x16-history"), seed=seed, window_h=window_h,
                         fold_tool_s=phys.fold_tool_s, tool_kv=phys.tool_kv, evicted_return=phys.evicted_return)
    if diag.hold_h is not None:
        sc = replace(sc, duration_s=sc.end_time + diag.hold_h * 3600.0)
    policy = TRIALS[trial]()
    timeline: list[dict[str, Any]] = []
    if diag.timeline_s is not None:
        policy = timeline_probe(policy, diag.timeline_s, timeline)
    last: dict[int, list[dict[str, Any]]] = {}
    finish_last: Callable[[], None] | None = None
    if diag.last is not None:
        policy, finish_last = last_probe(policy, sc, diag.last, last)
    s = run_policy(sc, policy).summary
    if finish_last is not None:
        finish_last()
    row = {"trace": trace, "mode": mode, "seed": seed, "trial": trial,
           "tokens_per_s": s["throughput_tokens_per_s"], "batches": s["batches_completed"],
           "evictions": s.get("counters", {}).get("evictions", 0)}
    if diag.per_batch:
        row["rollout_s"] = [b["rollout_s"] for b in s["batches"]]
        floors = batch_floors(sc, range(len(row["rollout_s"])))
        row["floor_s"] = [round(floors[i], 1) for i in range(len(row["rollout_s"]))]
        row["over_floors_s"] = round(sum(r - floors[i] for i, r in enumerate(row["rollout_s"]) if r is not None), 1)
        row["cut_batch"] = cut_batch_row(sc, s)
    if diag.timeline_s is not None:
        row["timeline"] = timeline
    if diag.last is not None:
        row["last"] = {str(b): v for b, v in last.items()}
    return row


def run_trials(data: Path, cells: Sequence[tuple[str, str, int]], trials: Sequence[str], *, jobs: int = 2,
               window_h: float | None = None, diagnostics: Diagnostics = Diagnostics(),
               physics: Physics = Physics()) -> list[dict[str, Any]]:
    """Every trial on every cell, in cell then trial order."""
    work = [(c[0], c[1], c[2], t, str(data), window_h, diagnostics, physics) for c in cells for t in trials]
    if jobs > 1:
        with Pool(jobs, maxtasksperchild=1) as pool:
            return pool.map(run_one, work)
    return [run_one(w) for w in work]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (../shared/data)")
    ap.add_argument("--cells", default="parcae-hh:async:0,bamboo-p3:async:2,bamboo-g4dn:async:0,bamboo-p3:sync:0")
    ap.add_argument("--trials", default=",".join(TRIALS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--window-h", type=float, default=None, help="cut each window to its first hours")
    ap.add_argument("--per-batch", action="store_true", help="each replay's rollout seconds per batch")
    ap.add_argument("--hold-h", type=float, default=None,
                    help="run this many hours past the trace's end, its last availability held")
    ap.add_argument("--timeline", type=float, default=None, metavar="SECONDS",
                    help="sample each replay's state every SECONDS of simulated time")
    ap.add_argument("--last", type=int, default=None, metavar="N",
                    help="per batch, the N samples that finished last (start, end, floor)")
    ap.add_argument("--fold-tool-s", type=float, default=FOLD_TOOL_S, help="the simulator's segment folding")
    ap.add_argument("--tool-kv", default="evictable", help="KV of trajectories in tool calls: " + "|".join(TOOL_KV_MODES))
    ap.add_argument("--evicted-return", default=EVICTED_RETURN, help="|".join(EVICTED_RETURN_MODES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        cells, trials = parse_cells(args.cells), parse_trials(args.trials)
        if not args.data.is_dir():
            raise UserInputError(f"--data: no folder {args.data}", fix="pass the shared data folder (../shared/data)")
        for flag, v in (("--hold-h", args.hold_h), ("--timeline", args.timeline)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise UserInputError(f"{flag} must be a positive number, got {v}", fix=f"pass {flag} > 0 or leave it out")
        if args.last is not None and args.last < 1:
            raise UserInputError(f"--last must be at least 1, got {args.last}", fix="pass --last N with N >= 1")
        if not (math.isfinite(args.fold_tool_s) and args.fold_tool_s >= 0):
            raise UserInputError(f"--fold-tool-s must be a number >= 0, got {args.fold_tool_s}", fix="pass --fold-tool-s 0 or more")
        if args.tool_kv not in TOOL_KV_MODES:
            raise UserInputError(f"--tool-kv must be one of {list(TOOL_KV_MODES)}, got {args.tool_kv!r}",
                                 fix="pass --tool-kv " + " or ".join(TOOL_KV_MODES))
        if args.evicted_return not in EVICTED_RETURN_MODES:
            raise UserInputError(f"--evicted-return must be one of {list(EVICTED_RETURN_MODES)}, got {args.evicted_return!r}",
                                 fix="pass --evicted-return " + " or ".join(EVICTED_RETURN_MODES))
        if args.hold_h is not None and args.window_h is not None:
            raise UserInputError("--hold-h and --window-h both given", fix="cut the window or extend it, not both")
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = run_trials(args.data, cells, trials, jobs=args.jobs, window_h=args.window_h,
                      diagnostics=Diagnostics(args.per_batch, args.hold_h, args.timeline, args.last),
                      physics=Physics(args.fold_tool_s, args.tool_kv, args.evicted_return))
    if args.json:
        print(json.dumps({"trials": rows}, indent=1))
    else:
        for r in rows:
            print(f"{r['trace']:12} {r['mode']:5} {r['seed']}  {r['trial']:21} {r['tokens_per_s']:10.1f}  "
                  f"batches {r['batches']:3}  evictions {r['evictions']}")
            if "rollout_s" in r:
                print("    rollout s per batch: " + ", ".join("cut" if x is None else f"{x:.1f}" for x in r["rollout_s"]))
                print("    floor s per batch:   " + ", ".join(f"{x:.1f}" for x in r["floor_s"])
                      + f"  (complete batches over their floors: {r['over_floors_s']:.1f} s)")
                c = r.get("cut_batch")
                if c is not None:
                    print(f"    cut batch {c['index']} from {c['start_s']:.1f} s: {c['tokens']:,} of its {c['whole']:,}"
                          f" tokens; the ceiling's term from that start {c['bound_at_start']:,}")
            if "timeline" in r:
                print(f"    timeline: {len(r['timeline'])} samples (--json prints them)")
            for b, rows_b in r.get("last", {}).items():
                print(f"    batch {b} last: " + "; ".join(
                    f"{x['group']} {x['start_s']:.0f}-{x['end_s']:.0f} s ({x['ran_over_floor']}x floor)" for x in rows_b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
