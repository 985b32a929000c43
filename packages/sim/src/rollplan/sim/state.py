"""The simulator's records of slots and trajectories, and the trajectory states.

``SlotState`` and ``TrajState`` are plain mutable records: policies read them, never write them. Each field is
written by one component of the simulator (``rollplan.sim.engine.Simulator`` composes them); the field groups
below name their owner:

- ``rollplan.sim.fleet.Fleet``: presence, role, engine, readiness, deadlines (``present``,
  ``presence``, ``role``, ``engine``, ``weights``, ``ready_at``, ``action_epoch``, ``return_by``).
- ``rollplan.sim.batching.Batching``: the running set and its analytic fast-forward (``V``, ``t_ref``, ``tau``,
  ``version``, ``sched_t``, ``heap``, ``n_run``, ``kv_sum``, ``rho_sum``, ``rtok_sum``, ``acc_sum``,
  ``rho_remote``, ``pool_c``).
- ``rollplan.sim.kv.KvMemory``: KV memory (``reserved``, ``idle``, ``kv_free``, ``residents``, ``n_res``,
  ``groups``; a trajectory's ``slot``, ``reserved``, ``sh``, ``admit_seq``).
- ``rollplan.sim.prefill_pool.PrefillPool``: PREFILL slots' queues (``pf_busy``, ``pf_jobs``; a trajectory's
  ``pf_start``, ``pf_secs``, ``pf_seq``, ``pf_tokens``).
- ``rollplan.sim.accounting.GpuSeconds``: the GPU-second category (``cat``, ``cat_since``).
- ``rollplan.sim.lifecycle.Lifecycle``: everything else of a trajectory (state, epoch, position, segment) and a
  slot's ``waiting`` queue.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rollplan.models.types import Role, Slot
from rollplan.sim.events import EvKind

if TYPE_CHECKING:
    from rollplan.sim.engine import FastPerf, SimTraj

DECODING = frozenset((Role.MIXED, Role.DECODE))
# Trajectory states.
PENDING, TOOL, WAIT, PREFILL, RUN, MOVE, DONE = range(7)
STATE_NAMES = ("pending", "tool", "wait", "prefill", "run", "move", "done")
IN_FLIGHT = frozenset((PREFILL, MOVE))
# Event kinds the hot paths create, as plain ints (``EventQueue.make`` stores ``int(kind)`` either way).
SEG_DONE_K, JOIN_K, TOOL_DONE_K = int(EvKind.SEG_DONE), int(EvKind.JOIN), int(EvKind.TOOL_DONE)


class SlotState:
    """A slot as the simulator tracks it (mutable; policies read it, never write it)."""

    __slots__ = (
        "V",
        "acc_sum",
        "action_epoch",
        "cat",
        "cat_since",
        "engine",
        "gpu",
        "groups",
        "heap",
        "id",
        "idle",
        "idx",
        "kv_cap",
        "kv_free",
        "kv_sum",
        "n_res",
        "n_run",
        "node",
        "perf",
        "pf_busy",
        "pf_jobs",
        "pool_c",
        "presence",
        "present",
        "ready_at",
        "reserved",
        "residents",
        "return_by",
        "rho_remote",
        "rho_sum",
        "role",
        "rtok_sum",
        "sched_t",
        "source",
        "t_ref",
        "tau",
        "tp",
        "version",
        "waiting",
        "watermark",
        "weights",
    )

    def __init__(self, idx: int, slot: Slot, perf: FastPerf, watermark: int = 0) -> None:
        self.idx = idx
        self.id = slot.id
        self.gpu = slot.gpu
        self.node = slot.node
        self.tp = slot.tp
        self.source = slot.source
        self.perf = perf
        self.kv_cap = perf.kv_cap
        self.watermark = watermark  # KV tokens kept free when admitting a new trajectory (SimConfig)
        self.present = False
        self.presence = 0
        self.role = Role.OFF
        self.engine = slot.engine
        self.weights = slot.weights_version
        self.ready_at = 0.0
        self.action_epoch = 0
        self.return_by: float | None = None
        self.V = 0.0
        self.t_ref = 0.0
        self.tau = math.inf
        self.version = 0
        self.sched_t = math.inf  # time of the pending valid SEG_DONE (inf: none)
        self.heap: list[tuple[float, int, int, int]] = []
        self.n_run = 0
        self.kv_sum = 0.0
        self.rho_sum = 0.0
        self.rtok_sum = 0.0  # prefill tokens per decode step its running members need (MIXED batching)
        self.acc_sum = 0.0  # speculative acceptance summed over its running members (SimConfig.spec_*)
        self.reserved = 0
        self.residents: dict[int, None] = {}
        # group -> [its residents, prompt tokens held for it, its residents not in a tool call] (``share_prompt``)
        self.groups: dict[str, list[int]] = {}
        self.idle = 0  # KV tokens reserved by residents in a tool call (kept equal to Simulator._idle_kv)
        # Kept equal to kv_cap - reserved and len(residents) on every change (read by placement scans).
        self.kv_free = self.kv_cap
        self.n_res = 0
        self.waiting: list[int] = []
        self.pf_busy = 0.0
        self.rho_remote = 0.0  # DECODE slot: prefill seconds per decode step its members need from PREFILL slots
        self.pool_c = 0.0  # its current load on the PREFILL pool (prefill-seconds per second)
        self.pf_jobs: dict[int, int] = {}
        self.cat = ""
        self.cat_since = 0.0

    def ready(self, now: float) -> bool:
        return self.present and self.ready_at <= now

    def __repr__(self) -> str:
        return f"SlotState({self.id!r}, role={self.role.value}, present={self.present}, run={self.n_run})"


class TrajState:
    """A trajectory of the current batch as the simulator tracks it.

    ``ctx``: tokens in its context so far (prompt + prefilled + decoded); ``kv_ok``: that context's KV is on
    ``slot``; ``turn``/``dec_done``/``pf_done``: position (turn index, tokens decoded in it, its new tokens
    prefilled). ``seg_*``: the running segment.
    """

    __slots__ = (
        "admit_seq",
        "batch",
        "ctx",
        "dec",
        "dec_done",
        "decoded",
        "epoch",
        "evicted_from",
        "final",
        "group",
        "host",
        "idx",
        "key",
        "kv_ok",
        "move_ready",
        "n",
        "owed_tool",
        "pf",
        "pf_done",
        "pf_owed",
        "pf_owed_tok",
        "pf_rec",
        "pf_secs",
        "pf_seq",
        "pf_start",
        "pf_tokens",
        "preferred",
        "prefilled",
        "pseq",
        "reserved",
        "seg_D",
        "seg_V0",
        "seg_W",
        "seg_ctx0",
        "seg_ctx_end",
        "seg_dec0",
        "seg_k",
        "seg_kv",
        "seg_m",
        "seg_rho",
        "seg_rrho",
        "seg_rtok",
        "seg_run",
        "seg_t0",
        "sh",
        "share",
        "slot",
        "spec",
        "spec_a",
        "state",
        "t_done",
        "t_start",
        "tool",
        "tool_t0",
        "tool_until",
        "turn",
    )

    def __init__(self, idx: int, spec: SimTraj, batch: int, key: str) -> None:
        self.idx = idx
        self.spec = spec
        self.pf = spec.prefill
        self.dec = spec.decode
        self.tool = spec.tool
        self.n = len(spec.decode)
        self.group = spec.group
        self.key = key
        self.batch = batch
        self.state = PENDING
        self.epoch = 0
        self.turn = 0
        self.dec_done = 0.0
        self.pf_done = False
        self.ctx = spec.prompt_tokens
        self.kv_ok = False
        self.slot = -1
        self.reserved = 0  # KV tokens reserved on ``slot`` for j alone (its share of a shared prompt excluded)
        self.share = 0  # its prompt tokens, shareable with siblings on a slot (``SimConfig.share_prompt``; else 0)
        self.sh = 0  # the part of them it shares on ``slot`` now (its reservation leaves them out)
        self.seg_k = self.seg_m = 0
        self.seg_D = self.seg_V0 = self.seg_kv = self.seg_rho = self.seg_W = 0.0
        self.seg_ctx0 = self.seg_ctx_end = 0
        self.seg_dec0 = 0.0
        self.seg_run = 0.0  # decode steps the segment runs on its slot: seg_D, or the chunk when divided
        self.pf_owed = self.pf_owed_tok = 0.0  # first-prefill seconds / tokens a cut chunk left to pay (divided)
        self.pf_rec = -1  # divided: the folded later turns up to this one have their prefill tokens recorded
        self.owed_tool = 0.0
        self.move_ready = 0.0
        self.preferred = -1
        self.evicted_from = -1  # the slot whose engine evicted its KV in a tool call (``SimConfig.evicted_return``)
        self.t_start = -1.0
        self.t_done = -1.0
        self.decoded = 0.0
        self.prefilled = 0.0
        self.final = False
        self.host = False  # its context's KV is in the store (``tool_kv`` "offload"): loaded back, not re-prefilled
        self.admit_seq = 0
        self.tool_until = 0.0
        self.tool_t0 = 0.0  # when its current tool call began (LRU order of evictable KV)
        self.seg_rrho = 0.0  # remote prefill seconds per decode step (DECODE slots with a PREFILL pool)
        self.seg_rtok = 0.0  # prefill tokens per decode step its segment carries on its own slot
        self.seg_t0 = 0.0
        self.pf_start = 0.0
        self.pf_secs = 0.0
        self.pf_seq = 0
        self.pf_tokens = 0
        self.pseq = 0  # > 0 while queued for dispatch (its entry in Simulator.pending)
        self.spec_a = 0.0  # its group's speculative acceptance now (SimConfig.spec_*)

    def remaining_true_decode(self) -> float:
        """True decode tokens left (simulator-side only: never shown to a policy)."""
        return sum(self.dec[self.turn:]) - self.dec_done

    def __repr__(self) -> str:
        return f"TrajState({self.spec.id!r}, {STATE_NAMES[self.state]}, turn={self.turn}, slot={self.slot})"
