"""Dispatch order and admission: which waiting trajectory starts next, and on which slot.

Both adapters decide with these functions: the simulator's policies (``rollplan.sim.policies``: its hot path
inlines ``required_room`` per slot and a test checks it picks what ``choose_slot`` picks) and the executor's
controller (``rollplan.executor.controller``: every new trajectory waits in a ``DispatchQueue`` until a
slot admits it). Callers: on every change of what could start (a trajectory queued or finished, a plan
applied, a slot serving); each call is O(waiting x slots). Pure: no I/O, no clock.

Notations (tokens unless said otherwise):

  path_j      pessimistic remaining critical path of j (seconds): its predicted decode tokens times a
              reference decode step plus its tool seconds, each plus ``DISPATCH_Z`` spreads
  need_j      KV its next turn takes on a slot (context + this turn's new tokens)
  cap_s       slot s's KV capacity;  free_s  what its residents leave (those in tool calls count as held)
  wm_s        the engine's admission watermark (vLLM keeps it free for running requests)
  bonus_js    prompt tokens of j a resident sibling already holds on s (prefix caching)
  h           the admission headroom (share of cap_s to keep free after admitting j), by ``Headrooms``

Admission: s admits j when ``free_s - wm_s + bonus_js - need_j >= min(h cap_s, max(0, cap_s - wm_s - need_j))``
(``required_room``: never more than an empty slot could leave after j, so every j fits somewhere).
Choice: the plan's slot for j when it admits j, else the admitting slot with the fewest residents, then the
most free KV (``choose_slot``). Order: longest ``path_j`` first, first come first among equals; the head
of the queue blocks the rest (an engine's FCFS admission), see ``DispatchQueue``. Regime (which ``h`` applies,
``Headrooms.levels``): at each adopted plan, bound by its bulk when the bulk regime's headrooms are predicted
to end the batch no later than the critical path's (``bulk_regime_pays``, from the step model).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)

DISPATCH_Z = 1.77
"""Waiting trajectories are dispatched by a pessimistic remaining critical path: predicted mean + ``DISPATCH_Z``
spreads (of decode tokens and tool seconds, from the samples behind the prediction). 1.77 is about the
expected largest of 16 standard normal samples: of a prompt's samples the longest decides when the group is
done, so prompts whose lengths vary a lot start early. The plain mean let trajectories predicted short (but
long) start late in throughput-bound batches of the bench's Bamboo p3 replay and finish last."""

KV_HEADROOM = 0.3
"""Share of a slot's KV the rollplan policy keeps free when admitting a new trajectory, on top of the KV its
residents hold, those in tool calls included: the default, on slots that host no predicted-critical
trajectory while the batch is bound by its critical path (``BULK_HEADROOM`` and ``CRITICAL_HEADROOM`` are the
other two). Chosen on the bench's two Bamboo traces (``rollplan bench replay``, rollplan's throughput, 0.05
to 0.5 tried as one headroom for every slot): 0.3 gave the best mean of the two. Much less packs slots, so
residents coming back from a tool call are preempted and re-prefill, and the longest trajectories decode
beside more co-residents. ``Headrooms(default=0)``: the engine's watermark alone (no headroom anywhere)."""
BULK_HEADROOM = 0.1
"""The headroom, while the latest plan finds the batch bound by its bulk (``bulk_regime_pays``), on slots that host
no predicted-critical trajectory, for a trajectory that is not one. Then the batch ends when the bulk's work
is done, so packing the bulk's slots tighter (more trajectories decoding at once) is worth more than its
trajectories' own speed; while the batch is bound by its longest trajectories, a tighter bulk only finishes
earlier and waits. Chosen on the bench's Bamboo traces (0, 0.05, 0.1 and 0.2 tried; ad-hoc script): on g4dn,
where the preemptible GPUs are fewer, one headroom of 0.3 everywhere left the bulk short of KV in the batches
its bulk bounds; p3 moved by under 0.2%."""
CRITICAL_HEADROOM = 0.85
"""The headroom, while the latest plan finds the batch bound by its critical path, on a slot that hosts a
predicted-critical trajectory (``CRITICAL_SHARE``), and for admitting one anywhere. Fewer co-residents make
its decode steps faster: the batch's longest trajectories decoded 1.3-1.8x slower than alone beside the bulk.
Never more than an empty slot could leave after admitting the trajectory (``required_room``). Chosen on the
bench's traces with ``BULK_SHARE`` (0.65, 0.75, 0.8, 0.85 and 0.9 tried; ad-hoc script; see
docs/simulator.md): with ``BULK_SHARE`` 0.8, 0.85 gave the best throughput on Bamboo p3, and 0.9 left too few
trajectories beside the critical ones."""
BULK_SHARE = 0.8
"""The share rule's threshold (``is_bulk_bound``), which the policies no longer use: ``bulk_regime_pays``
decides the regime from the step model. The share rule remains as the executor's fallback without a perf
model and as ``rollplan bench sensitivity``'s comparison. The batch is bound by its bulk when the plan's
work/capacity bound is at least this share of the largest pessimistic remaining critical path
(``DISPATCH_Z``). The work bound has every GPU decode at full speed with no headroom, prefill or tool wait;
the bulk runs slower than that. Chosen with ``CRITICAL_HEADROOM`` on the bench's traces (1, 0.85, 0.8, 0.75
and 0.7 tried; ad-hoc script)."""
CRITICAL_SHARE = 0.85
"""A trajectory is predicted-critical when its pessimistic remaining critical path (see ``DISPATCH_Z``) is at
least this share of the largest one of the batch's unfinished trajectories (0.5, 0.7 and 0.85 tried)."""
INFORMED_SOURCES = frozenset(("group", "history"))
"""Prediction sources (``rollplan.policy.predict``) that know something about the trajectory itself: its
group's finished siblings or its prompt's history. Only such trajectories can be predicted-critical: the
prior and the mean over every finished trajectory give every trajectory without information the same
prediction, so "the longest predicted" would single out all of them (a batch of unseen prompts would have every
trajectory critical and every admission held to the critical headroom)."""


REF_STEP_BATCH = 8
REF_STEP_KV = 16384.0
"""The reference decode step that turns predicted decode tokens into seconds in ``path_j``: one step of
``REF_STEP_BATCH`` sequences holding ``REF_STEP_KV`` KV tokens each (``reference_step``). Only the order of the
paths and their ratios to one another (``CRITICAL_SHARE``, ``bulk_regime_pays``) use it, so one fixed step of a
loaded engine at an agentic context length serves every slot; both adapters use this one, so the same
predictions give the same keys in the simulator and the executor."""


class _DecodeStep(Protocol):
    def decode_step_time(self, batch: int, kv_tokens: float) -> float: ...


def reference_step(perf: _DecodeStep) -> float:
    """Seconds of the reference decode step (``REF_STEP_BATCH``, ``REF_STEP_KV``) of ``perf``."""
    return float(perf.decode_step_time(REF_STEP_BATCH, REF_STEP_KV))


def pessimistic_path(decode: float, decode_spread: float, tool: float, tool_spread: float, step_s: float,
                     z: float = DISPATCH_Z) -> float:
    """``path_j`` (seconds): remaining decode tokens at ``step_s`` seconds a step plus tool seconds, each with
    ``z`` spreads added."""
    return decode * step_s + tool + z * (decode_spread * step_s + tool_spread)


def pessimistic_parts(decode: float, decode_spread: float, tool: float, tool_spread: float, step_s: float,
                      z: float = DISPATCH_Z) -> tuple[float, float]:
    """``pessimistic_path`` split into (its decode seconds, its tool seconds)."""
    return (decode + z * decode_spread) * step_s, tool + z * tool_spread


def critical_set(paths: Mapping[K, float], share: float = CRITICAL_SHARE,
                 informed: Collection[K] | None = None) -> set[K]:
    """The predicted-critical trajectories: ``path_j >= share * max_k path_k``, over the trajectories whose
    prediction is ``informed`` (``INFORMED_SOURCES``) when that set is given."""
    if informed is not None:
        paths = {k: v for k, v in paths.items() if k in informed}
    top = max(paths.values(), default=0.0)
    return {k for k, v in paths.items() if v >= share * top}


def is_bulk_bound(work_bound: float, max_path: float, share: float = BULK_SHARE) -> bool:
    """The share rule (``regime="share"``; the executor's fallback without a step model): the plan finds the
    batch bound by its bulk when its work/capacity bound reaches ``share`` of the largest pessimistic critical
    path. ``bulk_regime_pays`` decides the same question from the step model instead."""
    return work_bound >= share * max_path


@dataclass(frozen=True, slots=True)
class Headrooms:
    """The admission headroom by regime and slot (see the constants). ``default == 0``: no headroom anywhere
    (vLLM's admission: the watermark alone)."""

    default: float = KV_HEADROOM
    bulk: float = BULK_HEADROOM
    critical: float = CRITICAL_HEADROOM

    def levels(self, bulk_bound: bool) -> tuple[float, float]:
        """(headroom on slots hosting a predicted-critical trajectory, on the others):

        ==================  ======================  ======================
        batch bound by      slot hosts a critical   other slots
        ==================  ======================  ======================
        critical path       ``critical``            ``default``
        bulk                ``default``             ``bulk``
        ==================  ======================  ======================
        """
        if self.default <= 0:
            return 0.0, 0.0
        lo = min(self.bulk, self.default)
        hi = max(self.critical, self.default)
        return (self.default, lo) if bulk_bound else (hi, self.default)


def required_room(headroom: float, kv_cap: float, watermark: float, need: float) -> float:
    """KV a slot must still have free after admitting a trajectory of ``need`` tokens: ``headroom`` of its
    capacity, but never more than an empty slot would leave (``max(0, cap - watermark - need)``)."""
    return min(headroom * kv_cap, max(0.0, kv_cap - watermark - need))


class _StepModel(_DecodeStep, Protocol):
    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int: ...


def occupancy_step(perf: _StepModel, occupancy: float) -> tuple[float, float]:
    """(seconds of one decode step, decode tokens/s) of an engine of ``perf`` whose KV is ``occupancy`` (0-1)
    full of sequences of ``REF_STEP_KV`` tokens each (at least one sequence)."""
    seqs = max(1, round(max(0.0, min(1.0, occupancy)) * perf.kv_capacity_tokens() / REF_STEP_KV))
    step = float(perf.decode_step_time(seqs, REF_STEP_KV))
    return step, (seqs / step if step > 0 else 0.0)


def regime_makespan(bulk: bool, work_bound: float, path_decode_s: float, path_tool_s: float, *,
                    perf: _StepModel, slots: int, critical: int, headrooms: Headrooms) -> float:
    """Predicted end of the batch (seconds from now) when admission keeps ``headrooms.levels(bulk)``: the larger
    of its longest pessimistic path and its bulk's work.

    Notations: ``n`` = ``slots`` (the plan's decoding slots), ``n_c = min(critical, n)`` slots hosting a
    predicted-critical trajectory, counted one per such trajectory (an upper count: the headroom admits a
    group's siblings together while their contexts are short, and the plans place them together, e.g. 32 on
    7-9 slots in docs/simulator.md's "Session 32's trials and diagnostics", where counting the slots instead
    was tried and not adopted), (``h_c``, ``h_o``) = ``headrooms.levels(bulk)``; ``step(u)``, ``rate(u)``:
    ``occupancy_step`` at occupancy ``u``.

      path = path_decode_s * step(1 - h) / step_ref + path_tool_s    (h = h_c when n_c > 0, else h_o;
                                                                       step_ref: the ``REF_STEP_BATCH`` step)
      rate = (n_c rate(1 - h_c) + (n - n_c) rate(1 - h_o)) / (n rate(1))
      makespan = max(path, work_bound / rate)

    ``work_bound`` is the plan's work/capacity bound (every slot decoding full), so ``work_bound / rate`` is the
    bulk's end when each slot keeps its headroom free. Both terms are estimates of the same kind as the
    dispatch order's (``reference_step``); only the comparison of the two regimes uses them."""
    n = max(slots, 1)
    n_c = min(max(critical, 0), n)
    h_c, h_o = headrooms.levels(bulk)
    ref = float(perf.decode_step_time(REF_STEP_BATCH, REF_STEP_KV))
    path_step, _ = occupancy_step(perf, 1.0 - (h_c if n_c else h_o))
    path = path_decode_s * (path_step / ref if ref > 0 else 1.0) + path_tool_s
    full = occupancy_step(perf, 1.0)[1]
    rate = (n_c * occupancy_step(perf, 1.0 - h_c)[1] + (n - n_c) * occupancy_step(perf, 1.0 - h_o)[1]) / (n * full)
    return max(path, work_bound / rate if rate > 0 else math.inf)


def bulk_regime_pays(work_bound: float, path_decode_s: float, path_tool_s: float, *, perf: _StepModel, slots: int,
                     critical: int, headrooms: Headrooms = Headrooms()) -> bool:
    """Whether the batch is bound by its bulk: the bulk regime's headrooms (``Headrooms.levels(True)``) are
    predicted to end it no later than the critical path's (``regime_makespan``). Replaces a share of the work
    bound against the longest path (``is_bulk_bound``) by the step model's own trade: the critical path's
    headroom speeds the longest trajectory's steps and takes decode rate from the bulk on as many slots as
    there are critical trajectories. Callers: both adapters, when a plan is adopted (its work bound, the
    longest pessimistic path's decode and tool seconds at the reference step, the plan's decoding slots, the
    number of predicted-critical trajectories); a few perf-model calls each. With no headroom rule (``headrooms.default <= 0``) the regime changes
    nothing: False."""
    if headrooms.default <= 0:
        return False
    bulk, crit = (regime_makespan(b, work_bound, path_decode_s, path_tool_s, perf=perf, slots=slots,
                                  critical=critical, headrooms=headrooms) for b in (True, False))
    return bulk <= crit


MOVE_RULES = ("all", "forced")
"""Which of a plan's migrations an adapter carries out (``carries_out_move``): "all" of them, or only the
"forced" ones (the trajectory's slot is leaving or stops decoding)."""
MOVES = "forced"
"""The rule both adapters apply by default (the simulator's rollplan policy, ``ExecutorConfig.moves``): the
forced moves only. Not a constant chosen by a sweep but one of two rules, measured both ways at one commit
(docs/simulator.md, "The replay bench's record", "The plans' moves"): on the replay matrix "forced" is ahead in 6 of the 12 128 x 16 cells (up to
+1.2%), equal in 4 and behind in 2 (parcae-hh and hl async, -0.3% and -0.1%), no cell below the best other
policy; on the held-out scenarios of ``rollplan bench sensitivity`` every plan move carried out reads 0.995 to
1.033 of it, median 1.000 (1.033: a batch that starts before the window's end); and it carries out a few
percent of the migrations (p3: 370 against 12,636), each an abort and a resume on a real engine."""


def carries_out_move(rule: str, *, source_leaving: bool, source_decodes: bool) -> bool:
    """Whether an adapter carries out a plan's migration of a trajectory off the slot that holds its KV.

    ``source_leaving``: that slot is going (a preemption notice or a reclaim deadline: its KV is lost unless
    moved, or it is already gone); ``source_decodes``: the plan keeps it decoding (MIXED or DECODE).
    Under ``rule`` "forced" only the moves the slot forces are carried out: off a leaving slot, or off one the
    plan turns to PREFILL or OFF. A move between two slots that both keep decoding (a rebalancing move) is
    not: while trajectories wait to be admitted the dispatcher balances the slots by where it starts them,
    and the planner prices a move by its KV transfer alone, not by what it costs the moved trajectory on its
    new slot (it arrives where the admission headroom already counts the residents, and its KV there is the
    first an admission evicts while it is in a tool call; docs/simulator.md, "The replay bench's record",
    has the measurements).
    Under "all" every move is carried out. Callers: both adapters, once per migration of each adopted
    plan. A trajectory with no KV anywhere has no slot to leave: its "move" is a placement, always kept (the
    caller does not ask)."""
    if rule not in MOVE_RULES:
        raise ValueError(f"unknown move rule {rule!r}; use one of {MOVE_RULES}")
    return rule == "all" or source_leaving or not source_decodes


@dataclass(frozen=True, slots=True)
class SlotLoad:
    """What admission reads of one slot that takes new work now (serving, decoding, not being returned).
    ``key``: the adapter's slot handle; ``bonus``: prompt tokens of the trajectory being placed that a
    resident sibling holds there; ``hosts_critical``: a predicted-critical trajectory resides there."""

    key: Hashable
    kv_cap: int
    kv_free: int
    watermark: int
    residents: int
    bonus: int = 0
    hosts_critical: bool = False

    def room_after(self, need: int) -> int:
        return self.kv_free - self.watermark + self.bonus - need


def admits(slot: SlotLoad, need: int, headroom: float) -> bool:
    """Whether ``slot`` admits a trajectory of ``need`` tokens under ``headroom`` (module docstring)."""
    return slot.room_after(need) >= required_room(headroom, slot.kv_cap, slot.watermark, need)


def follows_plan(informed: bool) -> bool:
    """Whether a pending trajectory starts on the slot the plan placed it on (when that slot admits it) rather
    than on the least loaded admitting slot.

    Only an informed prediction (``INFORMED_SOURCES``) makes the plan's choice between slots mean anything for
    this trajectory: every uninformed trajectory has the same prediction (the prior, or the mean of what
    finished), so the plan's placement of one rather than another is a tie it broke at plan time, on loads
    that have moved since. The dispatcher breaks that tie on the loads of now. Measured on the replay matrix
    (docs/simulator.md, "The replay bench's record"): it only acts in first-epoch batches, where nothing is informed.
    """
    return informed


def choose_slot(need: int, candidates: Sequence[SlotLoad], *, preferred: SlotLoad | None = None,
                critical: bool = False, bulk_bound: bool = False,
                headrooms: Headrooms = Headrooms(), informed: bool = True) -> Hashable | None:
    """The slot (its ``key``) a trajectory of ``need`` tokens starts on now, or None: ``preferred`` (the plan's
    slot, when the adapter finds it serving) if it admits it, else the admitting candidate with the fewest
    residents, then the most free KV (the first of equals). ``critical``: the trajectory is predicted-critical
    (the critical slots' headroom applies everywhere). ``informed``: its prediction knows something about it
    (``INFORMED_SOURCES``); only then is ``preferred`` followed (``follows_plan``)."""
    hi, lo = headrooms.levels(bulk_bound)
    if critical:
        lo = hi

    def headroom(s: SlotLoad) -> float:
        return hi if s.hosts_critical else lo

    if preferred is not None and follows_plan(informed) and admits(preferred, need, headroom(preferred)):
        return preferred.key
    best: SlotLoad | None = None
    for s in candidates:
        if not admits(s, need, headroom(s)):
            continue
        if best is None or s.residents < best.residents or (s.residents == best.residents and s.kv_free > best.kv_free):
            best = s
    return None if best is None else best.key


class DispatchQueue(Generic[K]):
    """Waiting trajectories, longest pessimistic path first (first queued first among equals). ``push`` again
    to re-key; ``discard`` to drop. ``order()`` yields the queue's keys in dispatch order without removing
    them (the caller stops at the first one no slot admits: the head blocks the rest)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._live: dict[K, tuple[float, int]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def push(self, key: K, path: float) -> None:
        old = self._live.get(key)
        seq = old[1] if old is not None else self._seq
        if old is None:
            self._seq += 1
        self._live[key] = (path, seq)
        heapq.heappush(self._heap, (-path, seq, key))

    def discard(self, key: K) -> None:
        self._live.pop(key, None)

    def order(self) -> Iterator[K]:
        # One heap entry per live key: a key pushed again with an unchanged path leaves two equal entries,
        # both current; the key must still come out once.
        seen: set[K] = set()
        valid = []
        for p, s, k in self._heap:
            if k not in seen and self._live.get(k) == (-p, s):
                seen.add(k)
                valid.append((p, s, k))
        heapq.heapify(valid)
        self._heap = valid[:]
        while valid:
            yield heapq.heappop(valid)[2]
