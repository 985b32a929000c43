"""The planning instance: a snapshot turned into the numbers the formulation uses.

Called once per ``plan()``; every backend (MILP, CP-SAT, greedy, exhaustive), the bounds and
``evaluate()`` read the same ``Instance``, so they all price a decision identically.

Notations (times in seconds relative to the snapshot time, tokens in tokens):

  s in S        slots in the snapshot;  j in J  unfinished trajectories
  r in R        roles {OFF, MIXED, PREFILL, DECODE}
  a_s, c_s      decode step time tau_s(b) = a_s + c_s * b (linearised at the representative KV length)
  mu_s          prefill rate of slot s in its decoding roles (tokens/s): a chunk of ``PREFILL_CHUNK - b`` tokens
                batched with b = the reference batch of decodes in one forward pass adds
                ``t_chunk - S(b)`` seconds to the slot's time (``PerfModel.step_time``: the weights are read once;
                S(b) = t_dec(b) + t_chunk - t_mix); linearised once per solve at the representative context
  mup_s         prefill throughput of slot s as a PREFILL slot (prefill-only steps: chunk / t_chunk); <= mu_s
  Kcap_s        KV capacity of slot s (tokens)
  nmax          max concurrent sequences per engine (vLLM ``max_num_seqs``)
  D_j           predicted remaining decode tokens of j
  P_j           predicted remaining prefill tokens of j (new observation tokens; + its whole context when its KV
                was lost and must be recomputed)
  W_j           predicted remaining tool seconds of j (incl. what is left of a running tool call)
  kbar_j        mean KV tokens j holds while it runs (context + half of the remaining growth)
  Kpk_j         peak KV tokens of j (context + remaining prefill + remaining decode); must fit Kcap_s
  O_j           decode-slot occupancy of j in steps: D_j + W_j / tau_ref_s (tool waits hold KV, so they lower
                effective concurrency)
  w_js          share of slot s one occupancy step of j takes: max(kbar_j / Kcap_s, 1 / nmax)
  on_s          seconds before slot s can serve if it is on: engine (cold start | wake | 0) + weight sync if stale
  sw_s(r)       role-switch seconds when r differs from the current role (0 otherwise)
  m_js          seconds to move j's KV to s when s is not j's home: min(KV transfer, re-prefill) (0 at home or
                when the KV is lost, in which case the recompute is already in P_j)
  d_s           deadline of slot s (return_by - time), or None
  lam           switch_weight: objective weight of one switching GPU-second
  phi           co-running share (``PlannerConfig.co_running``; estimated per instance by ``co_running_share``):
                the share of the other trajectories' work on a slot that falls in decode steps of its critical
                trajectory: each of their decode tokens adds c_s to such a step, each second of their prefill
                (MIXED) or KV receive (DECODE), e_ks, stalls it. Both lengthen j's own path.
  e_js          seconds j's own prefill (MIXED: P_j / mu_s) or KV receive (DECODE: x_js) stalls slot s

Per-slot completion time for decision (role r_s, placed set J_s), see ``evaluate``:
  MIXED:   T_s = st_s + c_s sum D_j + a_s max(max D_j, sum O_j w_js) + sum P_j / mu_s + sum m_js
  DECODE:  T_s = st_s + c_s sum D_j + a_s max(max D_j, sum O_j w_js) + sum x_j + sum m_js
           (x_j = KV receive time of j's new prefill tokens from a PREFILL slot)
  both:    T_s >= st_s + CP_js + phi sum_{k on s, k != j} (c_s D_k + e_ks)  for every j on s
           CP_js = D_j (a_s + c_s) + W_j + P_j / mu_s  (j's own critical path at batch 1); the phi term: the
           co-residents' tokens decoded and prefill chunks run in j's steps (continuous batching runs them in
           the same forward passes). Written Q_js + phi sum_k (c_s D_k + e_ks), Q_js = CP_js - phi (c_s D_j + e_js).
  PREFILL: T_p = st_p + L_p / mu_p, where sum_p L_p = sum of P_j over trajectories on DECODE slots
  st_s = on_s + sw_s(r_s)  when r_s != OFF
Objective: C + lam * SW + penalty * sum overrun_s, with C >= T_s for all s and T_s <= d_s + overrun_s.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import numpy as np

from rollplan.models.errors import InfeasiblePlanError
from rollplan.models.perf import PerfModel, PerfProvider, default_provider
from rollplan.models.specs import model_spec
from rollplan.models.types import ClusterSnapshot, EngineState, Phase, Role, Slot, Trajectory
from rollplan.solver.config import PlannerConfig, stopped_clock
from rollplan.solver.core import pricing

PREFILL_CHUNK = 2048
"""Tokens per prefill forward used to rate a slot's prefill throughput (vLLM's default chunk size)."""
BATCH_REF = 64
"""Second batch size at which the decode step time is sampled to linearise tau(b) = a + c b."""

ROLES: tuple[Role, ...] = (Role.OFF, Role.MIXED, Role.PREFILL, Role.DECODE)
T = TypeVar("T")
ROLE_CODE = {Role.OFF: 0, Role.MIXED: 1, Role.PREFILL: 2, Role.DECODE: 3}


@dataclass(frozen=True, slots=True)
class SlotCoeffs:
    """Per-slot coefficients (see the module Notations)."""

    id: str
    node: str
    tp: int
    gpu: str
    a: float
    c: float
    mu: float
    mu_p: float
    kv_capacity: float
    on_seconds: float
    engine_seconds: float
    sync_seconds: float
    current_role: Role
    engine: EngineState
    deadline: float | None
    tau_ref: float
    same_node_kv_rate: float
    cross_node_kv_rate: float

    def start_seconds(self, role: Role, role_switch_seconds: float) -> float:
        """st_s: seconds before the slot serves in ``role`` (0 for OFF)."""
        if role is Role.OFF:
            return 0.0
        return self.on_seconds + (role_switch_seconds if role is not self.current_role else 0.0)

    @property
    def is_on_now(self) -> bool:
        return self.current_role is not Role.OFF


@dataclass(frozen=True, slots=True)
class TrajCoeffs:
    """Per-trajectory coefficients (see the module Notations)."""

    id: str
    group: str
    decode: float
    prefill: float
    tool: float
    kbar: float
    peak_kv: float
    context: int
    home: int | None
    kv_lost: bool
    decode_spread: float = 0.0
    tool_spread: float = 0.0


@dataclass(frozen=True, slots=True, eq=False)
class InstanceArrays:
    """The instance's coefficients as numpy vectors (per slot / per trajectory), built once per instance
    (``Instance.arrays``).

    Every value is the same float as the corresponding ``SlotCoeffs`` / ``TrajCoeffs`` field. Shared by
    ``evaluate``, the bounds and the greedy / repair backends. ``deadline`` is +inf where a slot has none;
    ``home`` is -1 where a trajectory has no home (new, or its KV was lost). ``Dq`` / ``Wq``: decode tokens
    and tool seconds at ``config.path_z`` spreads (``Dsd`` / ``Wsd``) above ``D`` / ``W``
    (``pricing.path_quantile``), what every critical path is priced with; ``D`` / ``W`` everywhere else. ``type_of[s]`` indexes slot types
    (slots equal in every perf coefficient); ``rep[k]`` is one slot of type k. ``node[s]``: an integer per
    distinct node name. Read-only by contract (the arrays are shared, never written).
    """

    stlb: np.ndarray
    on: np.ndarray
    a: np.ndarray
    c: np.ndarray
    mu: np.ndarray
    mu_p: np.ndarray
    kv: np.ndarray
    tau: np.ndarray
    same: np.ndarray
    cross: np.ndarray
    tp: np.ndarray
    deadline: np.ndarray
    cur_code: np.ndarray
    type_of: np.ndarray
    rep: np.ndarray
    node: np.ndarray
    D: np.ndarray
    P: np.ndarray
    W: np.ndarray
    kbar: np.ndarray
    peak: np.ndarray
    ctx: np.ndarray
    home: np.ndarray
    kv_lost: np.ndarray
    Dsd: np.ndarray
    Wsd: np.ndarray
    ids: tuple[str, ...]
    groups: tuple[str, ...]
    Dq: np.ndarray
    Wq: np.ndarray


_TRAJ_FIELDS = ("D", "P", "W", "kbar", "peak", "ctx", "home", "kv_lost", "Dsd", "Wsd", "ids", "groups")


def _take(cols: dict[str, Any], keep: Sequence[int]) -> dict[str, Any]:
    """Trajectory columns (``_TRAJ_FIELDS``) of the trajectories ``keep`` only, in that order."""
    idx = np.asarray(keep, dtype=np.int64)
    out = {name: cols[name][idx] for name in _TRAJ_FIELDS[:-2]}
    rows = idx.tolist()
    return out | {"ids": tuple(cols["ids"][j] for j in rows), "groups": tuple(cols["groups"][j] for j in rows)}


class TrajTable(Sequence[TrajCoeffs]):
    """``Instance.trajs`` built by ``build_instance``: the ``TrajCoeffs`` are made on first access, from the
    trajectory columns (``_TRAJ_FIELDS``: the arrays ``InstanceArrays`` takes).

    Reason: at 16k trajectories making the objects costs more than the rest of ``build_instance``, and the
    planner's own hot paths read ``Instance.arrays`` instead. Behaves as a read-only tuple (equality and
    hash included); the objects are made once, all together, and kept.
    """

    __slots__ = ("_items", "columns")

    def __init__(self, columns: dict[str, Any]) -> None:
        self.columns = columns
        self._items: tuple[TrajCoeffs, ...] | None = None

    def _all(self) -> tuple[TrajCoeffs, ...]:
        if self._items is None:
            x = self.columns
            homes = [None if h < 0 else h for h in x["home"].tolist()]
            self._items = tuple(
                map(
                    TrajCoeffs,
                    x["ids"],
                    x["groups"],
                    x["D"].tolist(),
                    x["P"].tolist(),
                    x["W"].tolist(),
                    x["kbar"].tolist(),
                    x["peak"].tolist(),
                    x["ctx"].astype(np.int64).tolist(),
                    homes,
                    x["kv_lost"].tolist(),
                    x["Dsd"].tolist(),
                    x["Wsd"].tolist(),
                )
            )
        return self._items

    def __len__(self) -> int:
        return len(self.columns["ids"])

    @overload
    def __getitem__(self, i: int) -> TrajCoeffs: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[TrajCoeffs, ...]: ...
    def __getitem__(self, i: int | slice) -> TrajCoeffs | tuple[TrajCoeffs, ...]:
        return self._all()[i]

    def __iter__(self) -> Iterator[TrajCoeffs]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TrajTable | tuple):
            return self._all() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return f"TrajTable({len(self)} trajectories)"


@dataclass(frozen=True, slots=True)
class Instance:
    """Everything a backend needs, derived from one snapshot and one config. Immutable.

    ``trajs``: per-trajectory coefficients (a ``TrajTable`` from ``build_instance``; any sequence of
    ``TrajCoeffs`` when built by hand). ``arrays``: the same numbers as numpy vectors, always derived from
    ``slots``, ``trajs`` and ``config`` (so ``dataclasses.replace`` keeps them consistent). ``unfinished``:
    the snapshot's unfinished trajectories in ``trajs`` order, when known (``build_instance``), else None.
    ``phi``: the co-running share (Notations); 0 (a trajectory's path at batch 1) unless set.
    """

    snapshot: ClusterSnapshot
    config: PlannerConfig
    slots: tuple[SlotCoeffs, ...]
    trajs: Sequence[TrajCoeffs]
    kv_bytes_per_token: int
    unfinished: tuple[Trajectory, ...] | None = field(default=None, compare=False, repr=False)
    phi: float = 0.0
    arrays: InstanceArrays = field(init=False, compare=False, repr=False)
    _memo: dict[Hashable, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        t = self.trajs
        cols = t.columns if isinstance(t, TrajTable) else _columns_of(t)
        z = self.config.path_z
        paths = {"Dq": pricing.path_quantile(cols["D"], cols["Dsd"], z),
                 "Wq": pricing.path_quantile(cols["W"], cols["Wsd"], z)}
        x = InstanceArrays(**_slot_arrays(self.slots, self.config.role_switch_seconds), **cols, **paths)
        object.__setattr__(self, "arrays", x)

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, once per instance and ``key``: for pure functions of the instance (bounds, ...),
        which ``plan()`` and the backends ask for several times. The instance stays immutable in value."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def lam(self) -> float:
        return self.config.switch_weight

    def slot_index(self, slot_id: str) -> int:
        for i, s in enumerate(self.slots):
            if s.id == slot_id:
                return i
        raise KeyError(slot_id)

    def restricted(self, keep: Sequence[int]) -> Instance:
        """This instance with trajectories ``keep`` only (same slots, same coefficients)."""
        cols = {name: getattr(self.arrays, name) for name in _TRAJ_FIELDS}
        return Instance(self.snapshot, self.config, self.slots, TrajTable(_take(cols, keep)), self.kv_bytes_per_token,
                        phi=self.phi)

    # -- per (j, s) quantities, computed on demand (|J| x |S| can be 16M at the largest scale) ---------------
    # They read ``arrays`` (the same floats as ``trajs``), so that calling them does not build ``trajs``;
    # the formulas are ``pricing``'s.
    def share(self, j: int, s: int) -> float:
        """w_js: fraction of slot s's KV/sequence budget one occupancy step of j takes."""
        return pricing.share(float(self.arrays.kbar[j]), self.slots[s].kv_capacity)

    def occupancy(self, j: int, s: int) -> float:
        """O_j on slot s, in decode steps."""
        x = self.arrays
        return pricing.occupancy(float(x.D[j]), float(x.W[j]), self.slots[s].tau_ref)

    def fits(self, j: int, s: int) -> bool:
        """Whether j's peak KV fits slot s at all."""
        return float(self.arrays.peak[j]) <= self.slots[s].kv_capacity

    def move_seconds(self, j: int, s: int) -> float:
        """m_js: seconds to move j's KV to s (0 at home or when the KV is already lost)."""
        home = int(self.arrays.home[j])
        if home < 0 or home == s:
            return 0.0
        return pricing.move_seconds(float(self.arrays.ctx[j]), self._rate(home, s), self.slots[s].mu)

    def move_by_kv(self, j: int, s: int) -> bool:
        """True when moving j to s is cheaper by KV transfer than by re-prefill."""
        return self.kv_transfer_seconds(j, s) <= self.reprefill_seconds(j, s)

    def _rate(self, home: int, s: int) -> float:
        src, dst = self.slots[home], self.slots[s]
        return pricing.transfer_rate(src.node == dst.node, dst.same_node_kv_rate, dst.cross_node_kv_rate)

    def kv_transfer_seconds(self, j: int, s: int) -> float:
        home = int(self.arrays.home[j])
        if home < 0:
            return math.inf
        return pricing.kv_transfer_seconds(float(self.arrays.ctx[j]), self._rate(home, s))

    def reprefill_seconds(self, j: int, s: int) -> float:
        return pricing.reprefill_seconds(float(self.arrays.ctx[j]), self.slots[s].mu)

    def kv_receive_seconds(self, j: int, s: int) -> float:
        """x_j: receiving j's future prefilled KV on DECODE slot s from a PREFILL slot (across nodes, conservative)."""
        return pricing.kv_receive_seconds(float(self.arrays.P[j]), self.slots[s].cross_node_kv_rate)

    def critical_path(self, j: int, s: int) -> float:
        """CP_js: j's own remaining time on slot s at batch 1 (decode, tools, its prefill)."""
        x, sl = self.arrays, self.slots[s]
        return pricing.critical_path(float(x.Dq[j]), float(x.Wq[j]), float(x.P[j]), sl.a, sl.c, sl.mu)

    def stall_seconds(self, j: int, s: int, role: Role) -> float:
        """e_js: seconds j's own prefill (MIXED: P_j / mu_s) or KV receive (DECODE: x_js) stalls slot s."""
        sl = self.slots[s]
        return pricing.stall_seconds(float(self.arrays.P[j]), role is not Role.DECODE, sl.mu, sl.cross_node_kv_rate)

    def own_path(self, j: int, s: int, role: Role) -> float:
        """Q_js = CP_js - phi (c_s D_j + e_js): j's path on s in ``role`` without the co-running term, which the
        slot adds once as phi (c_s sum_k D_k + sum_k e_ks), so T_s >= st_s + Q_js + that for every j on s."""
        sl = self.slots[s]
        return pricing.own_path(
            self.critical_path(j, s), float(self.arrays.D[j]), self.stall_seconds(j, s, role), self.phi * sl.c, self.phi
        )


def _slot_arrays(slots: Sequence[SlotCoeffs], rsw: float) -> dict[str, np.ndarray]:
    """The per-slot half of ``InstanceArrays`` (O(|S|))."""
    sl = slots
    a = np.array([s.a for s in sl], dtype=float)
    c = np.array([s.c for s in sl], dtype=float)
    mu = np.array([s.mu for s in sl], dtype=float)
    mu_p = np.array([s.mu_p for s in sl], dtype=float)
    kv = np.array([s.kv_capacity for s in sl], dtype=float)
    tau = np.array([s.tau_ref for s in sl], dtype=float)
    same = np.array([s.same_node_kv_rate for s in sl], dtype=float)
    cross = np.array([s.cross_node_kv_rate for s in sl], dtype=float)
    if sl:
        keys = np.stack([a, c, mu, kv, tau, same, cross], axis=1)
        _, rep, type_of = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        type_of = type_of.reshape(-1)
    else:
        rep, type_of = np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    on = np.array([s.on_seconds for s in sl], dtype=float)
    cur = np.array([ROLE_CODE[s.current_role] for s in sl], dtype=int)
    nodes: dict[str, int] = {}
    return {
        "stlb": on + np.where(cur == 0, rsw, 0.0),
        "on": on,
        "a": a,
        "c": c,
        "mu": mu,
        "mu_p": mu_p,
        "kv": kv,
        "tau": tau,
        "same": same,
        "cross": cross,
        "tp": np.array([s.tp for s in sl], dtype=float),
        "deadline": np.array([math.inf if s.deadline is None else s.deadline for s in sl], dtype=float),
        "cur_code": cur,
        "type_of": type_of,
        "rep": rep,
        "node": np.array([nodes.setdefault(s.node, len(nodes)) for s in sl], dtype=np.int64),
    }


def _columns_of(trajs: Sequence[TrajCoeffs]) -> dict[str, Any]:
    """The trajectory columns (``_TRAJ_FIELDS``) of coefficient objects (instances built by hand)."""
    tr = trajs
    return {
        "D": np.array([t.decode for t in tr], dtype=float),
        "P": np.array([t.prefill for t in tr], dtype=float),
        "W": np.array([t.tool for t in tr], dtype=float),
        "kbar": np.array([t.kbar for t in tr], dtype=float),
        "peak": np.array([t.peak_kv for t in tr], dtype=float),
        "ctx": np.array([float(t.context) for t in tr], dtype=float),
        "home": np.array([-1 if t.home is None else t.home for t in tr], dtype=np.int64),
        "kv_lost": np.array([t.kv_lost for t in tr], dtype=bool),
        "Dsd": np.array([t.decode_spread for t in tr], dtype=float),
        "Wsd": np.array([t.tool_spread for t in tr], dtype=float),
        "ids": tuple(t.id for t in tr),
        "groups": tuple(t.group for t in tr),
    }


def _decode_line(perf: PerfModel, kv_tokens: float) -> tuple[float, float]:
    """(a, c) of tau(b) = a + c b through b = 1 and b = BATCH_REF at ``kv_tokens`` per sequence."""
    t1 = perf.decode_step_time(1, kv_tokens)
    tb = perf.decode_step_time(BATCH_REF, kv_tokens)
    c = max((tb - t1) / (BATCH_REF - 1), 1e-9)
    a = max(t1 - c, 0.0)
    return a, c


@dataclass(frozen=True, slots=True)
class _TypeNumbers:
    """What a PerfModel says about one (gpu kind, tp) engine type; computed once per type per instance."""

    a: float
    c: float
    mu: float
    mu_p: float
    kv_capacity: float
    cold: float
    wake: float
    sync: float
    tau_ref: float
    same: float
    cross: float


def mixed_prefill_rate(perf: PerfModel, kv_ref: float, batch_ref: float) -> float:
    """``mu_s`` (Notations): prefill tokens per second a decoding slot adds to its time when its chunks run
    batched with ``batch_ref`` decodes at ``kv_ref`` KV tokens each (the simulator's MIXED steps, priced the
    same way: ``rollplan.sim.engine.FastPerf.overlap``). Never below the prefill-only rate."""
    b = max(1, round(batch_ref))
    chunk = max(PREFILL_CHUNK - b, 1)
    kv = float(kv_ref)
    dec = perf.decode_step_time(b, kv)
    mixed = perf.step_time(chunk, int(kv), b, b * kv)
    added = max(mixed - dec, 1e-12)  # t_chunk - S(b)
    prefill_only = PREFILL_CHUNK / perf.prefill_time([PREFILL_CHUNK], [int(kv)])  # mup_s
    return max(chunk / added, prefill_only)


def _type_numbers(perf: PerfModel, kv_ref: float, mem_util: float) -> _TypeNumbers:
    a, c = _decode_line(perf, kv_ref)
    mu_p = PREFILL_CHUNK / perf.prefill_time([PREFILL_CHUNK], [int(kv_ref)])
    kvcap = float(perf.kv_capacity_tokens(mem_util))
    probe = 1 << 20
    same = probe / max(perf.kv_transfer_time(probe, True) - perf.kv_transfer_time(0, True), 1e-12)
    cross = probe / max(perf.kv_transfer_time(probe, False) - perf.kv_transfer_time(0, False), 1e-12)
    batch_ref = min(BATCH_REF, max(1.0, kvcap / max(kv_ref, 1.0)))
    mu = mixed_prefill_rate(perf, kv_ref, batch_ref)
    return _TypeNumbers(
        a=a,
        c=c,
        mu=mu,
        mu_p=mu_p,
        kv_capacity=kvcap,
        cold=perf.cold_start_time(),
        wake=perf.wake_time(),
        sync=perf.weight_sync_time(),
        tau_ref=a + c * batch_ref,
        same=same,
        cross=cross,
    )


def _slot_coeffs(slot: Slot, nums: _TypeNumbers, snap: ClusterSnapshot) -> SlotCoeffs:
    if slot.engine is EngineState.NONE:
        engine_s, sync_s = nums.cold, 0.0  # a cold start loads the newest weights
    else:
        engine_s = nums.wake if slot.engine is EngineState.SLEEPING else 0.0
        sync_s = nums.sync if slot.weights_version < snap.weights_version else 0.0
    return SlotCoeffs(
        id=slot.id,
        node=slot.node,
        tp=slot.tp,
        gpu=slot.gpu,
        a=nums.a,
        c=nums.c,
        mu=nums.mu,
        mu_p=nums.mu_p,
        kv_capacity=nums.kv_capacity,
        on_seconds=engine_s + sync_s,
        engine_seconds=engine_s,
        sync_seconds=sync_s,
        current_role=slot.role,
        engine=slot.engine,
        deadline=None if slot.return_by is None else slot.return_by - snap.time,
        tau_ref=nums.tau_ref,
        same_node_kv_rate=nums.same,
        cross_node_kv_rate=nums.cross,
    )


def _traj_coeffs(t: Trajectory, home: int | None, max_context: int, snap_time: float) -> TrajCoeffs:
    """One trajectory's coefficients (the scalar form of ``_traj_columns``; kept as the reference)."""
    decode = t.remaining_decode_tokens.mean
    prefill = t.remaining_prefill_tokens.mean
    tool = t.remaining_tool_seconds.mean
    if t.phase is Phase.IN_TOOL and t.tool_until is not None:
        tool = max(tool, t.tool_until - snap_time)
    kv_lost = home is None and t.context_tokens > 0
    if kv_lost:
        prefill += t.context_tokens
    growth = t.remaining_prefill_tokens.mean + decode
    peak = min(t.context_tokens + growth, float(max_context))
    kbar = min(t.context_tokens + growth / 2.0, float(max_context))
    return TrajCoeffs(
        id=t.id,
        group=t.group,
        decode=decode,
        prefill=prefill,
        tool=max(tool, 0.0),
        kbar=max(kbar, 1.0),
        peak_kv=peak,
        context=t.context_tokens,
        home=home,
        kv_lost=kv_lost,
        decode_spread=t.remaining_decode_tokens.spread,
        tool_spread=t.remaining_tool_seconds.spread,
    )


def _traj_columns(
    unfinished: Sequence[Trajectory], slot_pos: dict[Any, int], max_context: int, snap_time: float
) -> dict[str, Any]:
    """The per-trajectory half of ``InstanceArrays``: ``_traj_coeffs`` for every trajectory, vectorised.

    The same IEEE operations in the same order, element by element, so every value is the float
    ``_traj_coeffs`` gives (tests compare the two).
    """
    n = len(unfinished)
    if n == 0:
        empty = np.zeros(0)
        return dict.fromkeys(("D", "P", "W", "kbar", "peak", "ctx", "Dsd", "Wsd"), empty) | {
            "home": np.zeros(0, dtype=np.int64),
            "kv_lost": np.zeros(0, dtype=bool),
            "ids": (),
            "groups": (),
        }
    u = unfinished  # one list comprehension per field: the fastest way to read 10^4 objects
    ids = tuple([t.id for t in u])
    ctx = np.array([t.context_tokens for t in u], dtype=float)
    decode = np.array([t.remaining_decode_tokens.mean for t in u], dtype=float)
    prefill_mean = np.array([t.remaining_prefill_tokens.mean for t in u], dtype=float)
    tool = np.array([t.remaining_tool_seconds.mean for t in u], dtype=float)
    until = [t.tool_until for t in u]
    in_tool = Phase.IN_TOOL
    timed = [i for i, v in enumerate(until) if v is not None and u[i].phase is in_tool]
    if timed:
        left = np.array([until[i] for i in timed], dtype=float) - snap_time
        # max(tool, left): tool unless left is larger (the builtin max keeps its first argument on ties)
        tool[timed] = np.where(left > tool[timed], left, tool[timed])
    get = slot_pos.get
    home = np.array([get(t.slot, -1) for t in u], dtype=np.int64)  # slot None or unknown: -1
    kv_lost = (home < 0) & (ctx > 0)
    prefill = np.where(kv_lost, prefill_mean + ctx, prefill_mean)
    growth = prefill_mean + decode
    cap = float(max_context)
    peak = np.minimum(ctx + growth, cap)
    kbar = np.minimum(ctx + growth / 2.0, cap)
    return {
        "D": decode,
        "P": prefill,
        "W": np.where(tool < 0.0, 0.0, tool),  # max(tool, 0.0)
        "kbar": np.where(kbar < 1.0, 1.0, kbar),  # max(kbar, 1.0)
        "peak": peak,
        "ctx": ctx,
        "home": home,
        "kv_lost": kv_lost,
        "Dsd": np.array([t.remaining_decode_tokens.spread for t in u], dtype=float),
        "Wsd": np.array([t.remaining_tool_seconds.spread for t in u], dtype=float),
        "ids": ids,
        "groups": tuple([t.group for t in u]),
    }


def _unfinished(snapshot: ClusterSnapshot) -> tuple[Trajectory, ...]:
    """``snapshot.unfinished`` (the same tuple), without a Python-level loop over the trajectories."""
    trajs = snapshot.trajectories
    phases = [t.phase for t in trajs]
    return tuple(itertools.compress(trajs, map(operator.is_not, phases, itertools.repeat(Phase.DONE))))


def build_instance(snapshot: ClusterSnapshot, config: PlannerConfig) -> Instance:
    """Turn ``snapshot`` into coefficients. Raises ``InfeasiblePlanError`` when no slot can host some trajectory.

    With ``config.deterministic`` the instance's config carries ``config.stopped_clock`` instead of
    ``config.clock``: every search that reads ``inst.config.clock`` then stops on work caps only.
    """
    if config.deterministic and config.clock is not stopped_clock:
        config = dataclasses.replace(config, clock=stopped_clock)
    spec = model_spec(snapshot.model)
    provider: PerfProvider = config.perf or default_provider(spec.name, calibrated=config.calibrated)
    unfinished = _unfinished(snapshot)
    slot_pos: dict[Any, int] = {s.id: i for i, s in enumerate(snapshot.slots)}
    cols = _traj_columns(unfinished, slot_pos, spec.max_context, snapshot.time)
    kbar: np.ndarray = cols["kbar"]
    # The builtin sum over Python floats, as the per-object code summed them (same rounding).
    kv_ref = sum(kbar.tolist()) / len(unfinished) if unfinished else 1024.0
    type_cache: dict[tuple[str, int], _TypeNumbers] = {}
    slots = []
    for s in snapshot.slots:
        key = (s.gpu, s.tp)
        if key not in type_cache:  # slots of one (gpu, tp) type share every perf-derived number
            type_cache[key] = _type_numbers(provider(s.gpu, s.tp), kv_ref, config.mem_util)
        slots.append(_slot_coeffs(s, type_cache[key], snapshot))
    inst = Instance(
        snapshot=snapshot,
        config=config,
        slots=tuple(slots),
        trajs=TrajTable(cols),
        kv_bytes_per_token=spec.kv_bytes_per_token,
        unfinished=unfinished,
    )
    phi = config.co_running if config.co_running is not None else co_running_share(inst.arrays)
    if phi:
        inst = Instance(inst.snapshot, config, inst.slots, inst.trajs, inst.kv_bytes_per_token, unfinished, phi)
    _check_hostable(inst)
    return inst


CO_RUNNING_TOP = 32
"""Longest trajectories (by critical path) whose decode share estimates phi."""


def co_running_share(x: InstanceArrays) -> float:
    """phi estimated from the instance: the decode share of the ``CO_RUNNING_TOP`` longest critical paths on
    the most common slot type, sum D_j (a + c) / sum CP_j. Reason: the slot that sets the makespan is the one
    of a long trajectory, and its co-residents' tokens slow it only while it decodes (not in tool calls or
    while its own prefill runs), so a decode-bound long trajectory feels them fully and a tool-bound one
    hardly at all. In [0, 1]; 0 without trajectories or slots."""
    if not x.D.size or not x.type_of.size:
        return 0.0
    r = int(x.rep[int(np.bincount(x.type_of).argmax())])
    dec = x.Dq * (x.a[r] + x.c[r])
    cp = pricing.critical_path(x.Dq, x.Wq, x.P, x.a[r], x.c[r], x.mu[r])
    top = np.argsort(-cp, kind="stable")[:CO_RUNNING_TOP]
    total = float(cp[top].sum())
    return min(1.0, max(0.0, float(dec[top].sum()) / total)) if total > 0 else 0.0


def _check_hostable(inst: Instance) -> None:
    reasons: list[str] = []
    n_j = len(inst.trajs)
    if n_j and not inst.slots:
        reasons.append(f"{n_j} unfinished trajectories but no slots")
    usable = [sl for sl in inst.slots if sl.deadline is None or sl.deadline > 0]
    if n_j and inst.slots and not usable:
        reasons.append(f"{n_j} unfinished trajectories but every slot is past its return deadline")
    best = max((sl.kv_capacity for sl in usable), default=0.0)
    if usable and len(reasons) < 5:
        x = inst.arrays
        # fits() is peak_kv <= kv_capacity: the largest usable slot decides
        for j in np.nonzero(x.peak > best)[0][: 5 - len(reasons)].tolist():
            reasons.append(
                f"trajectory {x.ids[j]!r} needs {float(x.peak[j]):.0f} KV tokens but the largest usable slot holds {best:.0f}"
            )
    if reasons:
        raise InfeasiblePlanError(
            reasons, fix="add slots with more GPU memory (or higher tp), or cap the context length of the workload"
        )


def usable_slots(inst: Instance) -> list[int]:
    """Slots that can do any work: no deadline, or a deadline after the slot could start."""
    out = []
    for s, sl in enumerate(inst.slots):
        if sl.deadline is None:
            out.append(s)
            continue
        st = sl.start_seconds(Role.MIXED, inst.config.role_switch_seconds)
        if sl.deadline > st:
            out.append(s)
    return out
