"""The planning instance: a snapshot turned into the numbers the formulation uses.

Called once per ``plan()``; every backend (MILP, CP-SAT, greedy, exhaustive), the bounds and
``evaluate()`` read the same ``Instance``, so they all price a decision identically.

Notations (times in seconds relative to the snapshot time, tokens in tokens):

  s in S        slots in the snapshot;  j in J  unfinished trajectories
  r in R        roles {OFF, MIXED, PREFILL, DECODE}
  a_s, c_s      decode step time tau_s(b) = a_s + c_s * b (linearised at the representative KV length)
  mu_s          prefill throughput of slot s (tokens/s, chunk of ``PREFILL_CHUNK`` at the representative context)
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

Per-slot completion time for decision (role r_s, placed set J_s), see ``evaluate``:
  MIXED:   T_s = st_s + c_s sum D_j + a_s max(max D_j, sum O_j w_js) + sum P_j / mu_s + sum m_js
  DECODE:  T_s = st_s + c_s sum D_j + a_s max(max D_j, sum O_j w_js) + sum x_j + sum m_js
           (x_j = KV receive time of j's new prefill tokens from a PREFILL slot)
  both:    T_s >= st_s + CP_js,  CP_js = D_j (a_s + c_s) + W_j + P_j / mu_s  (j's own critical path)
  PREFILL: T_p = st_p + L_p / mu_p, where sum_p L_p = sum of P_j over trajectories on DECODE slots
  st_s = on_s + sw_s(r_s)  when r_s != OFF
Objective: C + lam * SW + penalty * sum overrun_s, with C >= T_s for all s and T_s <= d_s + overrun_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollplan.models.errors import InfeasiblePlanError
from rollplan.models.perf import PerfModel, PerfProvider, default_provider
from rollplan.models.specs import model_spec
from rollplan.models.types import ClusterSnapshot, EngineState, Phase, Role, Slot, Trajectory
from rollplan.solver.config import PlannerConfig

PREFILL_CHUNK = 2048
"""Tokens per prefill forward used to rate a slot's prefill throughput (vLLM's default chunk size)."""
MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``: concurrent sequences per engine."""
BATCH_REF = 64
"""Second batch size at which the decode step time is sampled to linearise tau(b) = a + c b."""

ROLES: tuple[Role, ...] = (Role.OFF, Role.MIXED, Role.PREFILL, Role.DECODE)


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


@dataclass(frozen=True, slots=True)
class Instance:
    """Everything a backend needs, derived from one snapshot and one config. Immutable."""

    snapshot: ClusterSnapshot
    config: PlannerConfig
    slots: tuple[SlotCoeffs, ...]
    trajs: tuple[TrajCoeffs, ...]
    kv_bytes_per_token: int

    @property
    def lam(self) -> float:
        return self.config.switch_weight

    def slot_index(self, slot_id: str) -> int:
        for i, s in enumerate(self.slots):
            if s.id == slot_id:
                return i
        raise KeyError(slot_id)

    # -- per (j, s) quantities, computed on demand (|J| x |S| can be 16M at the largest scale) ---------------
    def share(self, j: int, s: int) -> float:
        """w_js: fraction of slot s's KV/sequence budget one occupancy step of j takes."""
        t, sl = self.trajs[j], self.slots[s]
        return max(t.kbar / sl.kv_capacity if sl.kv_capacity > 0 else math.inf, 1.0 / MAX_NUM_SEQS)

    def occupancy(self, j: int, s: int) -> float:
        """O_j on slot s, in decode steps."""
        t, sl = self.trajs[j], self.slots[s]
        return t.decode + (t.tool / sl.tau_ref if sl.tau_ref > 0 else 0.0)

    def fits(self, j: int, s: int) -> bool:
        """Whether j's peak KV fits slot s at all."""
        return self.trajs[j].peak_kv <= self.slots[s].kv_capacity

    def move_seconds(self, j: int, s: int) -> float:
        """m_js: seconds to move j's KV to s (0 at home or when the KV is already lost)."""
        t = self.trajs[j]
        if t.home is None or t.home == s:
            return 0.0
        return min(self.kv_transfer_seconds(j, s), self.reprefill_seconds(j, s))

    def move_by_kv(self, j: int, s: int) -> bool:
        """True when moving j to s is cheaper by KV transfer than by re-prefill."""
        return self.kv_transfer_seconds(j, s) <= self.reprefill_seconds(j, s)

    def kv_transfer_seconds(self, j: int, s: int) -> float:
        t = self.trajs[j]
        if t.home is None:
            return math.inf
        src, dst = self.slots[t.home], self.slots[s]
        rate = dst.same_node_kv_rate if src.node == dst.node else dst.cross_node_kv_rate
        return 1e-3 + t.context / rate

    def reprefill_seconds(self, j: int, s: int) -> float:
        return self.trajs[j].context / self.slots[s].mu

    def kv_receive_seconds(self, j: int, s: int) -> float:
        """x_j: receiving j's future prefilled KV on DECODE slot s from a PREFILL slot (across nodes, conservative)."""
        return self.trajs[j].prefill / self.slots[s].cross_node_kv_rate

    def critical_path(self, j: int, s: int) -> float:
        """CP_js: j's own remaining time on slot s at batch 1 (decode, tools, its prefill)."""
        t, sl = self.trajs[j], self.slots[s]
        return t.decode * (sl.a + sl.c) + t.tool + t.prefill / sl.mu


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
    kv_capacity: float
    cold: float
    wake: float
    sync: float
    tau_ref: float
    same: float
    cross: float


def _type_numbers(perf: PerfModel, kv_ref: float, mem_util: float) -> _TypeNumbers:
    a, c = _decode_line(perf, kv_ref)
    mu = PREFILL_CHUNK / perf.prefill_time([PREFILL_CHUNK], [int(kv_ref)])
    kvcap = float(perf.kv_capacity_tokens(mem_util))
    probe = 1 << 20
    same = probe / max(perf.kv_transfer_time(probe, True) - perf.kv_transfer_time(0, True), 1e-12)
    cross = probe / max(perf.kv_transfer_time(probe, False) - perf.kv_transfer_time(0, False), 1e-12)
    batch_ref = min(BATCH_REF, max(1.0, kvcap / max(kv_ref, 1.0)))
    return _TypeNumbers(
        a=a,
        c=c,
        mu=mu,
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
    )


def build_instance(snapshot: ClusterSnapshot, config: PlannerConfig) -> Instance:
    """Turn ``snapshot`` into coefficients. Raises ``InfeasiblePlanError`` when no slot can host some trajectory."""
    spec = model_spec(snapshot.model)
    provider: PerfProvider = config.perf or default_provider(spec.name, calibrated=config.calibrated)
    unfinished = snapshot.unfinished
    slot_pos = {s.id: i for i, s in enumerate(snapshot.slots)}
    raw = [
        _traj_coeffs(t, slot_pos.get(t.slot) if t.slot is not None else None, spec.max_context, snapshot.time)
        for t in unfinished
    ]
    kv_ref = sum(t.kbar for t in raw) / len(raw) if raw else 1024.0
    type_cache: dict[tuple[str, int], _TypeNumbers] = {}
    slots = []
    for s in snapshot.slots:
        key = (s.gpu, s.tp)
        if key not in type_cache:  # slots of one (gpu, tp) type share every perf-derived number
            type_cache[key] = _type_numbers(provider(s.gpu, s.tp), kv_ref, config.mem_util)
        slots.append(_slot_coeffs(s, type_cache[key], snapshot))
    inst = Instance(
        snapshot=snapshot, config=config, slots=tuple(slots), trajs=tuple(raw), kv_bytes_per_token=spec.kv_bytes_per_token
    )
    _check_hostable(inst)
    return inst


def _check_hostable(inst: Instance) -> None:
    reasons: list[str] = []
    if inst.trajs and not inst.slots:
        reasons.append(f"{len(inst.trajs)} unfinished trajectories but no slots")
    usable = [sl for sl in inst.slots if sl.deadline is None or sl.deadline > 0]
    if inst.trajs and inst.slots and not usable:
        reasons.append(f"{len(inst.trajs)} unfinished trajectories but every slot is past its return deadline")
    best = max((sl.kv_capacity for sl in usable), default=0.0)
    for t in inst.trajs:
        if usable and t.peak_kv > best:  # fits() is peak_kv <= kv_capacity: the largest usable slot decides
            reasons.append(f"trajectory {t.id!r} needs {t.peak_kv:.0f} KV tokens but the largest usable slot holds {best:.0f}")
        if len(reasons) >= 5:
            break
    if reasons:
        raise InfeasiblePlanError(
            reasons, fix="add slots with more GPU memory (or higher tp), or cap the context length of the workload"
        )
