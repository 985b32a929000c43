"""The event-driven rollout simulator: engines on slots, multi-turn trajectories, availability, switching.

Model (the contract every policy is measured against; docs/simulator.md explains each choice):

- A *slot* runs one engine (``tp`` GPUs). Roles: MIXED (continuous batching with chunked prefill), DECODE
  (decode only; prefill done by PREFILL slots, KV shipped over), PREFILL (a FCFS prefill server), OFF.
  Switching (cold start, wake, weight sync, role switch) takes the PerfModel's time; the slot serves
  nothing meanwhile and its running batch is paused.
- KV memory: a trajectory holds its context in the KV of its slot from admission until it finishes; during
  its tool calls that KV may be taken by new admissions (``SimConfig.tool_kv``), and the samples of a prompt
  share its KV on a slot (``SimConfig.share_prompt``). Admission of the next turn needs room for that turn's
  growth; when it does not fit, the youngest trajectory of the slot that is not decoding is preempted
  (vLLM-style recompute: its KV is dropped, its token progress kept; it must re-prefill its whole context
  wherever it runs next).
- Analytic fast-forward: between events a slot's decoding set is fixed, so its mean step time ``tau`` is
  fixed and the slot's virtual step counter ``V`` grows linearly in time; a trajectory that joined at ``V0``
  with ``D`` decode tokens to go finishes at ``V0 + D``, so the next completion time is computed, never
  stepped.
- Batched step physics (MIXED slots, vLLM's chunked prefill): every step runs the ``b`` running decodes, and
  while prefill is pending it also runs a chunk of ``B - b`` prefill tokens (``B`` = ``prefill_chunk``, the
  token budget) in the same forward pass, priced by ``PerfModel.step_time``: the weights are read once for
  both, so a mixed step costs ``t_mix = t_dec + t_chunk - S(b)`` with ``S(b)`` the overlap (the shared weight
  reads and per-step overhead). Trajectory j needs ``r_j = P_j / D_j`` prefill tokens per decode step
  (``P_j`` its segment's prefill tokens) at a price of ``rho_j`` seconds per step when run alone
  (context-aware, from the prefill tables); a fraction ``f = min(1, sum_j r_j / (B - b))`` of the steps
  carries a chunk, so ``tau = t_dec(b, mean KV) + sum_j rho_j - f * S(b)`` (never below ``t_dec``): the mean
  of decode-only and mixed steps. The co-running decodes feel every chunk (the critical path stretches by
  ``f * (t_mix - t_dec)``); DECODE slots run decode-only steps (``tau = t_dec``), their prefill on PREFILL
  slots and the KV shipped over the link.
- Segments: consecutive turns of one trajectory whose tool waits are <= ``fold_tool_s`` are simulated as one
  segment: the trajectory decodes the segment's tokens, then waits the folded tool seconds plus the
  segment's last tool call (its KV stays pinned). ``fold_tool_s = 0`` gives one segment per turn (exact
  turn-level events); larger values trade the position of short tool waits inside a segment for speed. Token
  counts, prefill work and tool seconds are exact either way.
- Availability: ARRIVE adds preemptible slots (no engine: cold start), LEND adds lent slots (sleeping
  engine: wake + sync), NOTICE/RECLAIM set a return deadline, LEAVE (and a passed deadline) remove a slot:
  its KV is lost, token progress kept, re-prefill needed.
- Termination: interval re-plan ticks stop being scheduled densely once ``IDLE_TICKS`` ticks in a row found
  nothing changed and nothing runs (e.g. every unfinished trajectory is in a long tool wait): the next tick
  is the first one of the same grid after the next pending event. When no event is pending at all and work
  is left, no progress is possible: with no end time the replay raises ``NoProgressError`` instead of
  ticking forever (with an end time it ends there, as ticking to it would).

Policies (``rollplan.sim.policies``) decide roles, placement, order and migrations through the policy API
(``Simulator``'s commands and queries); the simulator owns the physics and the true lengths. Metrics go to a
``rollplan.sim.metrics.Recorder``.

Structure: ``Simulator`` is a thin coordinator (clock, event queue, end-of-instant settling) over components
that own their state, each in its module: ``fleet`` (slots, availability, engines), ``batching`` (running
batches, step physics, fast-forward), ``kv`` (KV memory), ``prefill_pool`` (PREFILL slots' queues),
``dispatch`` (the pending queue), ``lifecycle`` (trajectories), ``accounting`` (GPU-seconds by category),
``ticks`` (re-plan ticks); records and trajectory states in ``state``. Every event handler returns the events
it causes (Vidur's ``handle_event`` style); the event order is ``rollplan.sim.events``'.
"""

from __future__ import annotations

import heapq
import logging
import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rollplan.models.errors import SchemaError, UnknownNameError, UserInputError
from rollplan.models.perf import PerfModel
from rollplan.models.types import AvailabilityEvent, Role, Slot
from rollplan.sim.accounting import GpuSeconds
from rollplan.sim.batching import Batching
from rollplan.sim.dispatch import PendingQueue
from rollplan.sim.events import Event, EventQueue, EvKind
from rollplan.sim.fleet import Fleet
from rollplan.sim.kv import KvMemory
from rollplan.sim.lifecycle import Lifecycle
from rollplan.sim.metrics import Recorder
from rollplan.sim.prefill_pool import PrefillPool

# The simulator's records and trajectory states live in rollplan.sim.state; importable from here as before.
from rollplan.sim.state import (
    DECODING,
    DONE,
    IN_FLIGHT,
    MOVE,
    PENDING,
    PREFILL,
    RUN,
    STATE_NAMES,
    TOOL,
    WAIT,
    SlotState,
    TrajState,
)
from rollplan.sim.ticks import IDLE_TICKS, ReplanTicks

if TYPE_CHECKING:
    from rollplan.sim.workload import TrajectorySpec

log = logging.getLogger(__name__)



class NoProgressError(UserInputError):
    """A replay can make no further progress: work is left, but no GPU the policy may use can run it and
    no pending event (arrival, lending, tool return, switch) can change that. Raised instead of looping."""


TOOL_KV_MODES = ("pinned", "evictable", "offload")
EVICTED_RETURN_MODES = ("policy", "slot")
MIN_DIVIDE_TOKENS = 64
"""The shortest chunk ``SimConfig.divide_tokens`` accepts: every chunk is a dispatch decision and two events, so
a chunk of a few tokens would step long decodes token by token (Seer's chunks are thousands of tokens)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulator physics knobs (not policy choices).

    ``fold_tool_s``: tool waits up to this many seconds stay inside a segment (see module docstring).
    ``prefill_chunk``: tokens per prefill chunk (vLLM's default budget). ``admit_watermark``: share of a slot's
    KV kept free when admitting a *new* trajectory (vLLM's watermark). ``role_switch_s``: seconds to switch a
    warm engine's role (routing change of a kv_both engine; same default as the planner).
    ``tool_kv``: what happens to the KV of a trajectory waiting on a tool call (``TOOL_KV_MODES``), the same for
    every policy. "evictable" (default): vLLM's behaviour (the executor's engines too: their file connector
    matches whole prompts only, so a later turn reuses only the GPU prefix cache), where a finished turn's blocks
    stay in the prefix cache and a new admission may evict them (least recently used first); the trajectory then
    re-prefills its whole context when it comes back. "pinned": it stays reserved on its slot until the
    trajectory finishes or a returning resident of that slot needs the room. "offload": as "evictable", but every
    finished turn's KV is also in a store that matches prefixes (LMCache / Mooncake style), so an evicted
    trajectory's context is loaded back (``FastPerf.transfer`` across nodes) instead of re-prefilled.
    ``share_prompt`` (default on): samples of one prompt (a group) on one slot share its prompt's KV and prefill
    (vLLM's prefix caching): the prompt's KV is held once per slot while any of them is resident, and a sample
    admitted where a sibling is resident prefills only what follows the prompt.
    ``spec_tokens`` (k > 0: on) / ``spec_acceptance`` (A) / ``spec_base_acceptance`` (A0): grouped speculative
    decoding on every slot (docs/seer.md). A trajectory's acceptance is its group's: ``A0 + (A - A0) * d / (G -
    1)`` with ``d`` of its ``G`` samples finished in this batch (a group of one: A0), so it rises as siblings
    finish and their outputs become drafts. A slot's batch yields ``E(a, k) = (1 - a^(k+1)) / (1 - a)`` tokens
    per sequence per verify step at ``a`` = its running members' mean acceptance, and a verify step costs the
    decode step plus ``FastPerf.verify_extra`` (the ``b * k`` drafted tokens through the linear layers).
    ``spec_adaptive`` (default): each slot drafts the length in 0..k that is fastest per token for its batch
    and acceptance now (vLLM's dynamic speculative decoding takes a draft length per batch-size range), so large
    compute-bound batches stop drafting and the small batches of the tail draft the most; off: always k.
    ``divide_tokens`` (N > 0: on; Seer's divided rollout, docs/seer.md): a segment (planned as without division:
    the same folding, the same KV reserved) decodes at most N tokens on its slot, then the trajectory is back at
    the dispatcher with its KV still at home: the policy (``chunk_move``) lets it continue there at no cost or
    moves it, by KV transfer (``migrate``'s pricing and path; the engine may evict tool-call KV to take it in,
    as for a new request) or by re-prefill of its context on the new slot. Tool seconds of folded turns it
    finished in the chunk are owed and waited at the end of its next whole segment (exact in total; folding
    moves short waits too). 0 (default): no division, every replay unchanged.
    ``evicted_return``: where a trajectory whose KV was evicted during its tool call (``tool_kv`` "evictable")
    goes when the tool returns. "policy" (default): back to the policy's pending queue, which may place it on
    any slot. "slot": to the engine that evicted it, where it waits for KV and re-prefills its context, as with
    the executor, which sends each turn to the trajectory's placement and never learns of an engine's eviction
    (``rollplan bench replay --evicted-return``). "slot" applies with ``tool_kv`` "evictable" (the engines'
    behaviour); with "pinned" or "offload" an evicted trajectory goes back to the policy (a reload from the
    store is a placement).
    ``start_interference`` (x >= 0; default 0): while any engine cold-starts, every serving slot's step time is
    ``(1 + x)`` times its own: engines that share one host's CPU cores (the executor's CPU test bed, where a
    start's imports and build take CPU from the serving engines; ``rollplan bench fidelity`` measures x). 0: the
    slots are separate GPU nodes, whose starts do not slow each other.
    """

    fold_tool_s: float = 30.0
    mem_util: float = 0.9
    prefill_chunk: int = 2048
    admit_watermark: float = 0.01
    role_switch_s: float = 0.05
    max_num_seqs: int = 256
    tool_kv: str = "evictable"
    share_prompt: bool = True
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    spec_base_acceptance: float = 0.0
    spec_adaptive: bool = True
    divide_tokens: int = 0
    start_interference: float = 0.0
    evicted_return: str = "policy"

    def __post_init__(self) -> None:
        if self.tool_kv not in TOOL_KV_MODES:
            raise UnknownNameError("tool KV mode", self.tool_kv, TOOL_KV_MODES)
        if self.evicted_return not in EVICTED_RETURN_MODES:
            raise UnknownNameError("evicted return", self.evicted_return, EVICTED_RETURN_MODES)
        if isinstance(self.spec_tokens, bool) or not isinstance(self.spec_tokens, int) or self.spec_tokens < 0:
            raise SchemaError("--spec-tokens", f"must be an integer >= 0, got {self.spec_tokens!r}",
                              fix="pass the draft length k (0: no speculation), e.g. --spec-tokens 4")
        for name in ("spec_acceptance", "spec_base_acceptance"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
                raise SchemaError(f"--{name.replace('_', '-')}", f"must be in [0, 1], got {v!r}",
                                  fix="pass the fraction of drafted tokens accepted, e.g. --spec-acceptance 0.7")
        x = self.start_interference
        if isinstance(x, bool) or not isinstance(x, int | float) or not (0.0 <= x < math.inf):
            raise SchemaError("start_interference", f"must be a number >= 0, got {x!r}",
                              fix="pass the serving engines' step-time stretch during a start, e.g. 0.3 (0: none)")
        d = self.divide_tokens
        if isinstance(d, bool) or not isinstance(d, int) or (d != 0 and d < MIN_DIVIDE_TOKENS):
            raise SchemaError("--divide-tokens", f"must be 0 (off) or an integer >= {MIN_DIVIDE_TOKENS}, got {d!r}",
                              fix="pass the chunk length in decode tokens, e.g. --divide-tokens 2048, or 0 for no "
                                  "division")


@dataclass(frozen=True, slots=True)
class SimTraj:
    """A trajectory's true course as the simulator consumes it: per-turn arrays instead of ``Turn`` objects
    (batches of tens of thousands of trajectories are built per replay). Same meaning as
    ``rollplan.sim.workload.TrajectorySpec``: turn k prefills ``prefill[k]`` new tokens (turn 0: on top of
    the ``prompt_tokens``), decodes ``decode[k]`` tokens, then waits ``tool[k]`` seconds."""

    id: str
    group: str
    prompt_tokens: int
    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    tool: tuple[float, ...]
    source: str = ""

    @classmethod
    def from_spec(cls, spec: TrajectorySpec) -> SimTraj:
        return cls(
            spec.id, spec.group, spec.prompt_tokens, tuple(t.prefill_tokens for t in spec.turns),
            tuple(t.decode_tokens for t in spec.turns), tuple(t.tool_seconds for t in spec.turns), spec.source,
        )

    @property
    def num_turns(self) -> int:
        return len(self.decode)

    @property
    def decode_tokens(self) -> int:
        return sum(self.decode)

    @property
    def tool_seconds(self) -> float:
        return sum(self.tool)


# --- fast, memoised access to a PerfModel -----------------------------------------------------------------


def _flat(specs: Sequence[SimTraj], field: str, dtype: Any, total: int) -> np.ndarray:
    """``field`` (a per-turn tuple) of every spec, one after the other, as one array of ``total`` entries."""
    return np.fromiter(chain.from_iterable(map(attrgetter(field), specs)), dtype, total)


class FoldIndex(NamedTuple):
    """Where a spec's segments can end, for one ``fold_tool_s`` (``FastPerf.prime_folds``). Flat arrays over a
    batch; the spec's turn k is at ``off + k``. ``last``: the last turn a segment starting at turn k can fold in
    (the first turn from k on whose tool wait exceeds the fold, or the spec's last turn), relative to the spec;
    ``grow``/``cdec``: prefix sums over the spec's turns 0..k of new + decoded tokens / decoded tokens."""

    last: array[int]
    grow: array[int]
    cdec: array[int]
    off: int


class FastPerf:
    """A PerfModel behind tables, so the hot loop does not call it per event.

    ``decode(b, kv)``: ``decode_step_time(b, kv)`` memoised per (b, kv bucket of ``KV_STEP`` tokens) and
    interpolated linearly in kv between bucket edges. ``prefill(P, cached)``: the chunked prefill of ``P`` new
    tokens over ``cached`` tokens = sum over chunks of ``prefill_time([chunk], [cached + offset])``, each chunk
    from a table over (chunk tokens, cached tokens) interpolated bilinearly. Both stay within 1% of the model
    (tested). Everything else forwards to the model.
    """

    KV_STEP = 512
    P_STEP = 16
    C_STEP = 1024

    def __init__(self, perf: PerfModel, chunk: int, max_context: int, mem_util: float) -> None:
        self.perf = perf
        self.chunk = chunk
        self._dec: dict[tuple[int, int], float] = {}
        self._dec_lin: dict[tuple[int, int], tuple[float, float]] = {}
        self._pf: dict[tuple[int, int], float] = {}
        self._overlap: dict[int, float] = {}
        self._verify: dict[tuple[int, int], float] = {}
        self._spec: dict[int, tuple[Any, tuple[float, list[float], list[int]]]] = {}
        self._folds: dict[float, dict[int, tuple[SimTraj, FoldIndex]]] = {}
        self._grid: list[list[float]] | None = None
        self._empty_sums = [0.0]  # see _from_empty
        self._grid_np: np.ndarray | None = None
        self.kv_cap = int(perf.kv_capacity_tokens(mem_util))
        self.max_context = max_context
        self.cold_start = perf.cold_start_time()
        self.wake = perf.wake_time()
        self.sync = perf.weight_sync_time()
        self._xfer_fixed = (perf.kv_transfer_time(0, True), perf.kv_transfer_time(0, False))
        probe = 1 << 20
        self._xfer_rate = (
            (perf.kv_transfer_time(probe, True) - self._xfer_fixed[0]) / probe,
            (perf.kv_transfer_time(probe, False) - self._xfer_fixed[1]) / probe,
        )

    def _dec_at(self, b: int, bucket: int) -> float:
        key = (b, bucket)
        v = self._dec.get(key)
        if v is None:
            v = self._dec[key] = self.perf.decode_step_time(b, float(bucket * self.KV_STEP))
        return v

    def decode(self, b: int, kv: float) -> float:
        if b <= 0:
            return 0.0
        x = kv / self.KV_STEP
        i = int(x)
        # Hot (once per batch change of every slot): one memo lookup of the bucket's (low edge, rise).
        lin = self._dec_lin.get((b, i))
        if lin is None:
            lo = self._dec_at(b, i)
            lin = self._dec_lin[(b, i)] = (lo, self._dec_at(b, i + 1) - lo)
        return lin[0] + lin[1] * (x - i)

    def _pf_at(self, pi: int, ci: int) -> float:
        key = (pi, ci)
        v = self._pf.get(key)
        if v is None:
            if pi == 0:  # the per-call intercept: one token's cost
                v = self.perf.prefill_time([1], [ci * self.C_STEP])
            else:
                v = self.perf.prefill_time([pi * self.P_STEP], [ci * self.C_STEP])
            self._pf[key] = v
        return v

    def _chunk(self, p: float, c: float) -> float:
        x, y = p / self.P_STEP, c / self.C_STEP
        i, k = int(x), int(y)
        fx, fy = x - i, y - k
        a = self._pf_at(i, k)
        b = self._pf_at(i + 1, k)
        c0 = self._pf_at(i, k + 1)
        d = self._pf_at(i + 1, k + 1)
        top = a + (b - a) * fx
        bot = c0 + (d - c0) * fx
        return top + (bot - top) * fy

    def _table(self) -> list[list[float]]:
        """The full (chunk tokens x cached tokens) grid, built once (~1.5k model calls)."""
        if self._grid is None:
            n_p = self.chunk // self.P_STEP + 2
            n_c = (self.max_context + 4 * self.chunk) // self.C_STEP + 2
            # Row 0 is the per-call intercept, so a small last chunk keeps its fixed cost.
            self._grid = [[self._pf_at(i, k) for k in range(n_c)] for i in range(n_p)]
        return self._grid

    def prefill(self, tokens: float, cached: float) -> float:
        """Seconds of the chunked prefill of ``tokens`` new tokens on top of ``cached`` tokens."""
        if tokens <= 0:
            return 0.0
        g = self._grid or self._table()
        ps, cs, ch = self.P_STEP, self.C_STEP, self.chunk
        last = len(g[0]) - 2
        total = 0.0
        done = 0.0
        if cached == 0 and tokens > ch and isinstance(tokens, int):
            # A whole context from an empty cache (a re-prefill): every chunk but the last is a full chunk at a
            # context that depends on its position only, so their running sum (the loop's own additions, in
            # its order) is memoised; the loop below adds the last chunk.
            q = (tokens - 1) // ch
            total = self._from_empty(q)
            done = float(q * ch)
        while done < tokens:
            n = min(ch, tokens - done)
            c = cached + done
            y = c / cs
            k = int(y)
            if k >= last:
                total += self._chunk(n, c)
            else:
                x = n / ps
                i = int(x)
                fx, fy = x - i, y - k
                r0, r1 = g[i], g[i + 1]
                top = r0[k] + (r1[k] - r0[k]) * fx
                bot = r0[k + 1] + (r1[k + 1] - r0[k + 1]) * fx
                total += top + (bot - top) * fy
            done += n
        return total

    def _from_empty(self, q: int) -> float:
        """What ``prefill``'s loop has added after its first ``q`` chunks when ``cached`` is 0 and more than
        ``q`` chunks follow: each chunk full (``chunk`` tokens) at context (its index) x ``chunk``. Memoised."""
        sums = self._empty_sums
        while len(sums) <= q:
            # One iteration of prefill's loop body for the chunk at index len(sums) - 1 (n = chunk).
            c = float((len(sums) - 1) * self.chunk)
            n = self.chunk
            g = self._grid or self._table()
            y = c / self.C_STEP
            k = int(y)
            if k >= len(g[0]) - 2:
                sums.append(sums[-1] + self._chunk(n, c))
            else:
                x = n / self.P_STEP
                i = int(x)
                fx, fy = x - i, y - k
                r0, r1 = g[i], g[i + 1]
                top = r0[k] + (r1[k] - r0[k]) * fx
                bot = r0[k + 1] + (r1[k + 1] - r0[k + 1]) * fx
                sums.append(sums[-1] + (top + (bot - top) * fy))
        return sums[q]

    def overlap(self, b: int) -> float:
        """``S(b)``: seconds a mixed step of ``b`` decodes and a ``chunk - b``-token prefill chunk saves against
        the decode step and the chunk run apart (``PerfModel.step_time``; the weights are read once). The
        attention terms are the same either way, so it is priced at no context. Memoised per ``b``."""
        v = self._overlap.get(b)
        if v is None:
            c = max(self.chunk - b, 1)
            p = self.perf
            v = p.decode_step_time(b, 0.0) + p.prefill_time([c], [0]) - p.step_time(c, 0, b, 0.0)
            v = self._overlap[b] = max(0.0, v)
        return v

    def verify_extra(self, b: int, k: int) -> float:
        """Seconds a verify step of ``b`` sequences with ``k`` drafts each costs over their decode step: the
        ``b * k`` drafted tokens through the linear layers (``PerfModel.step_time``, weights read once); priced
        at no context like ``overlap`` (each sequence's KV is read once either way). Memoised per (b, k)."""
        key = (b, k)
        v = self._verify.get(key)
        if v is None:
            p = self.perf
            v = self._verify[key] = max(0.0, p.step_time(b * k, 0, b, 0.0) - p.decode_step_time(b, 0.0))
        return v

    def transfer(self, tokens: float, same_node: bool) -> float:
        i = 0 if same_node else 1
        return self._xfer_fixed[i] + tokens * self._xfer_rate[i]

    def _chunks_many(self, tokens: np.ndarray, cached: np.ndarray) -> np.ndarray:
        """Vectorised ``prefill`` over arrays: every entry split into chunks, each priced from the table."""
        out = np.zeros(len(tokens))
        pos = np.nonzero(tokens > 0)[0]
        if not len(pos):
            return out
        g = self._grid_np
        if g is None:
            g = self._grid_np = np.asarray(self._table())
        ch = self.chunk
        tok = tokens[pos].astype(float)
        n_chunks = np.ceil(tok / ch).astype(int)
        owner = np.repeat(np.arange(len(pos)), n_chunks)
        first = np.cumsum(n_chunks) - n_chunks
        k_in = np.arange(len(owner)) - np.repeat(first, n_chunks)
        offset = k_in * float(ch)
        size = np.minimum(float(ch), tok[owner] - offset)
        c = cached[pos][owner] + offset
        y = c / self.C_STEP
        k = y.astype(int)
        inside = k < g.shape[1] - 2
        x = size / self.P_STEP
        i = x.astype(int)
        kk = np.where(inside, k, 0)
        fx, fy = x - i, y - kk
        top = g[i, kk] + (g[i + 1, kk] - g[i, kk]) * fx
        bot = g[i, kk + 1] + (g[i + 1, kk + 1] - g[i, kk + 1]) * fx
        sec = top + (bot - top) * fy
        for q in np.nonzero(~inside)[0]:  # beyond the table (longer than any model context): exact
            sec[q] = self._chunk(float(size[q]), float(c[q]))
        out[pos] = np.bincount(owner, weights=sec, minlength=len(pos))
        return out

    def prime(self, specs: Sequence[SimTraj]) -> None:
        """Price every turn of ``specs`` at once (vectorised ``spec_prefill`` for a whole batch)."""
        todo = [sp for sp in specs if id(sp) not in self._spec]
        if not todo:
            return
        lens = [len(sp.decode) for sp in todo]
        pf = _flat(todo, "prefill", float, sum(lens))
        dec = _flat(todo, "decode", float, sum(lens))
        lens_a = np.asarray(lens, dtype=np.intp)
        starts = np.cumsum(lens_a) - lens_a
        grow = pf + dec
        cum = np.cumsum(grow)
        before = cum - grow - np.repeat(cum[starts] - grow[starts], lens)  # sum of earlier turns' growth
        prompt = np.repeat(np.array([sp.prompt_tokens for sp in todo], dtype=float), lens)
        ctx = prompt + before  # context before each turn's new tokens
        is_first = np.zeros(len(pf), dtype=bool)
        is_first[starts] = True
        sec = self._chunks_many(np.where(is_first, 0.0, pf), ctx)
        first = self._chunks_many(prompt[starts] + pf[starts], np.zeros(len(todo)))
        tok = np.where(is_first, 0.0, pf)
        csec = np.cumsum(sec)
        ctok = np.cumsum(tok)
        base_s = np.repeat(csec[starts] - sec[starts], lens)
        base_t = np.repeat(ctok[starts] - tok[starts], lens)
        rel_s = (csec - base_s).tolist()
        rel_t = (ctok - base_t).astype(int).tolist()
        memo = self._spec
        for sp, f, a, n in zip(todo, first.tolist(), starts.tolist(), lens, strict=True):
            memo[id(sp)] = (sp, (f, rel_s[a:a + n], rel_t[a:a + n]))

    def prime_folds(self, specs: Sequence[SimTraj], fold: float) -> dict[int, tuple[SimTraj, FoldIndex]]:
        """``FoldIndex`` of every spec of ``specs`` for segments folding tool waits <= ``fold`` (vectorised over
        the batch); returns the memo, keyed by ``id(spec)``, entries (spec, index). Not about performance, but
        kept here for the same reason as ``spec_prefill``: shared by every policy of a replay."""
        memo = self._folds.setdefault(fold, {})
        todo = [sp for sp in specs if id(sp) not in memo]
        if not todo:
            return memo
        lens = [len(sp.decode) for sp in todo]
        total = sum(lens)
        pf = _flat(todo, "prefill", np.int64, total)
        dec = _flat(todo, "decode", np.int64, total)
        tool = _flat(todo, "tool", float, total)
        lens_a = np.asarray(lens, dtype=np.intp)
        starts = np.cumsum(lens_a) - lens_a
        base = np.repeat(starts, lens_a)
        is_end = tool > fold
        is_end[starts + lens_a - 1] = True
        ends = np.nonzero(is_end)[0]
        last = ends[np.searchsorted(ends, np.arange(total))] - base  # first turn from k on ending a segment
        grow = np.cumsum(pf + dec)  # integer prefix sums: exact
        grow -= np.repeat(grow[starts] - (pf + dec)[starts], lens_a)
        cdec = np.cumsum(dec)
        cdec -= np.repeat(cdec[starts] - dec[starts], lens_a)
        la, ga, ca = (array("q", x.astype(np.int64).tobytes()) for x in (last, grow, cdec))
        for sp, a in zip(todo, starts.tolist(), strict=True):
            memo[id(sp)] = (sp, FoldIndex(la, ga, ca, a))
        return memo

    def spec_prefill(self, spec: SimTraj) -> tuple[float, list[float], list[int]]:
        """(first prefill seconds, cum seconds, cum tokens) of ``spec`` on this engine, memoised.

        first = prompt + turn 0's new tokens from nothing; ``cum[i]`` = seconds of turns 1..i's new tokens,
        each over its natural context (``cum[0] = 0``), likewise ``cum_tokens``. Shared by every policy of a
        replay (the same spec objects), so each turn is priced once.
        """
        hit = self._spec.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        pf, dec = spec.prefill, spec.decode
        ctx = spec.prompt_tokens + pf[0]
        first = self.prefill(ctx, 0)
        ctx += dec[0]
        cum = [0.0]
        cum_tok = [0]
        sec = tok = 0
        prefill = self.prefill
        for i in range(1, len(dec)):
            p = pf[i]
            if p:
                sec += prefill(p, ctx)
                tok += p
            cum.append(sec)
            cum_tok.append(tok)
            ctx += p + dec[i]
        out = (first, cum, cum_tok)
        self._spec[id(spec)] = (spec, out)
        return out


# --- state: rollplan.sim.state ---------------------------------------------------------------------------


class Policy(Protocol):
    """What the simulator needs from a policy (see ``rollplan.sim.policies``)."""

    name: str

    def attach(self, sim: Simulator) -> None: ...
    def on_replan(self, sim: Simulator, reason: str) -> None: ...
    def on_plan_ready(self, sim: Simulator, token: int) -> None: ...
    def order(self, sim: Simulator) -> Iterable[int]: ...
    def enqueued(self, sim: Simulator, j: int) -> None: ...
    def choose_slot(self, sim: Simulator, j: int) -> int | None: ...
    def on_traj_done(self, sim: Simulator, j: int) -> None: ...
    def warm_start(self, history: Sequence[tuple[SimTraj, str]]) -> None: ...


class Driver(Protocol):
    """The RL loop around the simulator (``rollplan.sim.replay``): batches, training steps, lending."""

    def start(self, sim: Simulator) -> list[Event]: ...
    def on_event(self, sim: Simulator, ev: Event) -> list[Event]: ...
    def on_batch_done(self, sim: Simulator) -> list[Event]: ...
    def lending_event(self, index: int) -> AvailabilityEvent: ...


# --- the simulator -----------------------------------------------------------------------------------------

_new_tuple = tuple.__new__


class _Queue(EventQueue):
    """``EventQueue`` whose ``make`` builds the ``Event`` without the named tuple's Python-level constructor
    (a replay makes over a million events): the same events, the same ``seq`` counter."""

    __slots__ = ()

    def make(self, time: float, kind: EvKind | int, a: int = 0, b: int = 0) -> Event:
        self._seq += 1
        return _new_tuple(Event, (time, int(kind), self._seq, a, b))


class Simulator:
    """One policy's replay. Build, then ``run()``; read ``recorder`` afterwards.

    The coordinator of components that each own their state (``rollplan.sim.state`` lists which record fields
    each one writes) and whose event handlers return the events they cause; the main loop pushes them:

    - ``fleet`` (``rollplan.sim.fleet.Fleet``): the slots, their availability (AVAIL, DEADLINE) and engines
      (roles, switches: ACTION_DONE).
    - ``batching`` (``rollplan.sim.batching.Batching``): each slot's running batch, step time, fast-forward.
    - ``kv`` (``rollplan.sim.kv.KvMemory``): KV reservations, evictions, shared prompts.
    - ``prefill_pool`` (``rollplan.sim.prefill_pool.PrefillPool``): first prefills queued on PREFILL slots.
    - ``queue`` (``rollplan.sim.dispatch.PendingQueue``): trajectories waiting for the policy, dispatch.
    - ``lifecycle`` (``rollplan.sim.lifecycle.Lifecycle``): the batch and each trajectory's course (SEG_DONE,
      JOIN, TOOL_DONE).
    - ``accounting`` (``rollplan.sim.accounting.GpuSeconds``): GPU-seconds by category.
    - ``ticks`` (``rollplan.sim.ticks.ReplanTicks``): interval re-plans (REPLAN) and idle detection.

    The coordinator itself owns the clock (``now``), the event queue (``q``, order: ``rollplan.sim.events``),
    the recorder, the driver's and the policy's plumbing (TRAIN_DONE, BATCH_START, PLAN_READY) and what the end
    of an instant settles (``_settle``): a policy call asked
    for (``replan_reason``), a dispatch (``dirty``), a re-deal of the prefill queue (``pool_dirty``) and the
    events of policy commands (``out``). The policy API (commands and queries) is bound to the components'
    methods; the attributes policies read are properties over the components' state.
    """

    # The policy API, bound to the owning component's methods in ``__init__`` (no call layer in between).
    apply_availability: Callable[[AvailabilityEvent], list[Event]]
    switch_seconds: Callable[[SlotState, Role], float]
    set_role: Callable[[int, Role], None]
    migrate: Callable[..., bool]
    iter_pending: Callable[[], Iterator[int]]
    pending_ids: Callable[[], list[int]]
    need_new: Callable[[TrajState], int]
    fits_new: Callable[[SlotState, TrajState], bool]
    prefix_bonus: Callable[[SlotState, TrajState], int]
    free_for_new: Callable[[SlotState], int]
    decode_slots: Callable[[], list[SlotState]]
    progress: Callable[[TrajState], tuple[float, int, float, int]]

    def __init__(
        self,
        *,
        model: str,
        perf_for: Callable[[str, int], FastPerf],
        policy: Policy,
        driver: Driver,
        availability: Sequence[AvailabilityEvent] = (),
        dedicated: Sequence[Slot] = (),
        config: SimConfig = SimConfig(),
        replan_interval_s: float = 120.0,
        end_time: float = math.inf,
        recorder: Recorder | None = None,
    ) -> None:
        self.model = model
        self.cfg = config
        self.policy = policy
        self.driver = driver
        self.perf_for = perf_for
        self.q = _Queue()
        self.now = 0.0
        self.end_time = end_time
        self.replan_interval_s = replan_interval_s
        self.recorder = recorder or Recorder(policy.name)
        self.n_events = 0
        self.stopped = False
        # What the end of the current instant settles (see the class docstring).
        self.dirty = False
        self.pool_dirty = False
        self.out: list[Event] = []
        self.replan_reason: str | None = None
        fleet = self.fleet = Fleet(self, availability, dedicated)
        self.accounting = GpuSeconds(self)
        self.batching = Batching(self)
        kv = self.kv = KvMemory(self)
        self.prefill_pool = PrefillPool(self)
        queue = self.queue = PendingQueue(self)
        life = self.lifecycle = Lifecycle(self)
        self.ticks = ReplanTicks(self)
        for c in (fleet, self.batching, kv, self.prefill_pool, queue, life):
            c.wire()
        self.apply_availability = fleet.apply
        self.switch_seconds = fleet.switch_seconds
        self.set_role = fleet.set_role
        self.decode_slots = fleet.decode_slots
        self.migrate = life.migrate
        self.progress = life.progress
        self.iter_pending = queue.iter_pending
        self.pending_ids = queue.pending_ids
        self.need_new = kv.need_new
        self.fits_new = kv.fits_new
        self.prefix_bonus = kv.prefix_bonus
        self.free_for_new = kv.free_for_new
        self._idle_kv = kv.idle_kv  # the scan ``SlotState.idle`` is kept equal to (tests)

    # -- the components' state, as policies and the driver read it ---------------------------------------------
    @property
    def slots(self) -> list[SlotState]:
        return self.fleet.slots

    @property
    def slot_index(self) -> dict[str, int]:
        return self.fleet.slot_index

    @property
    def live(self) -> list[SlotState]:
        """Present slots, by index."""
        return self.fleet.live

    @property
    def slot_epoch(self) -> int:
        """Bumped whenever a slot's role, readiness, presence or return deadline changes."""
        return self.fleet.slot_epoch

    @property
    def availability(self) -> tuple[AvailabilityEvent, ...]:
        return self.fleet.events

    @property
    def weights_version(self) -> int:
        return self.fleet.weights_version

    @property
    def trajs(self) -> list[TrajState]:
        return self.lifecycle.trajs

    @property
    def batch(self) -> int:
        return self.lifecycle.batch

    @property
    def batch_start(self) -> float:
        return self.lifecycle.batch_start

    @property
    def batch_left(self) -> int:
        return self.lifecycle.batch_left

    @property
    def batch_active(self) -> bool:
        return self.lifecycle.batch_active

    @property
    def pending(self) -> list[tuple[int, int]]:
        return self.queue.pending

    @property
    def n_pending(self) -> int:
        return self.queue.n_pending

    @property
    def cat_counts(self) -> dict[str, int]:
        return self.accounting.cat_counts

    @property
    def pool_load(self) -> float:
        return self.batching.pool_load

    # -- main loop --------------------------------------------------------------------------------------------
    def run(self) -> Recorder:
        """Replay until the driver stops or ``end_time``; returns the recorder (finalised)."""
        q = self.q
        q.push_all(self.fleet.start())
        self.policy.attach(self)
        q.push_all(self.driver.start(self))
        fleet, life = self.fleet, self.lifecycle
        by_kind: dict[int, Callable[[Event], list[Event]]] = {
            EvKind.SEG_DONE: life.on_seg_done,
            EvKind.JOIN: life.on_join,
            EvKind.TOOL_DONE: life.on_tool_done,
            EvKind.ACTION_DONE: fleet.on_action_done,
            EvKind.AVAIL: fleet.on_avail,
            EvKind.DEADLINE: fleet.on_deadline,
            EvKind.TRAIN_DONE: self._on_driver,
            EvKind.BATCH_START: self._on_driver,
            EvKind.PLAN_READY: self._on_plan_ready,
            EvKind.REPLAN: self.ticks.on_tick,
        }
        handlers = [by_kind[k] for k in sorted(by_kind)]  # indexed by kind (the values are 0..9)
        end = self.end_time
        heap = q._heap
        pop = heapq.heappop
        push = heapq.heappush
        n = 0
        while heap and not self.stopped:
            ev = heap[0]
            t = ev[0]  # Event fields by position in this loop: (time, kind, seq, a, b)
            if t > end:
                break
            pop(heap)
            self.now = t
            for e in handlers[ev[1]](ev):
                push(heap, e)
            n += 1
            if heap and heap[0][0] <= t:
                continue  # more at this instant: settle once, after all of them
            if self.replan_reason is None and not (self.dirty or self.pool_dirty or self.out):
                continue  # nothing to settle (most instants): skip the call
            for e in self._settle():
                push(heap, e)
        self.n_events = n
        if not self.stopped and not heap and life.batch_active and life.batch_left > 0 and not math.isfinite(end):
            # Nothing left to happen (no interval ticks either) and no end time: the batch can never finish.
            raise self.no_progress_error()
        if not self.stopped and math.isfinite(end):
            # The replay covers its window to the end: the next event lies past it (or none is left), and
            # running segments decode until then. Stopping at the last event instead would shorten the window
            # a throughput is measured over, by however long that policy's last gap between events is.
            self.now = end
        self._finish()
        return self.recorder

    def _settle(self) -> list[Event]:
        """End of an instant: re-invoke the policy once (however many events asked for it), dispatch pending
        trajectories, re-deal the prefill queue; returns the events that causes."""
        out: list[Event] = []
        if self.replan_reason is not None and not self.stopped:
            reason = self.replan_reason
            self.replan_reason = None
            self.policy.on_replan(self, reason)
            self.dirty = True
        if self.dirty:
            self.dirty = False
            if self.queue.n_pending:
                out += self.queue.dispatch()
        if self.pool_dirty:
            self.pool_dirty = False
            out += self.prefill_pool.rebalance()
        if self.out:
            out += self.out
            self.out = []
        return out

    def stop(self) -> None:
        self.stopped = True

    def _finish(self) -> None:
        """Credit partial progress of running segments, flush GPU-second accounting."""
        self.lifecycle.credit_running()
        for s in self.fleet.slots:
            if s.present:
                self.accounting.flush(s)
        self.recorder.end_time = self.now
        self.recorder.events = self.n_events

    # -- the policy and the driver ---------------------------------------------------------------------------
    def invoke_policy(self, reason: str) -> list[Event]:
        """Ask for a policy re-invocation at the end of this instant (several asks at one instant: one call,
        their reasons joined by "+"); its commands' events land in ``out``."""
        if self.replan_reason is None:
            self.replan_reason = reason
        elif reason not in self.replan_reason.split("+"):
            self.replan_reason += "+" + reason
        self.dirty = True
        return []

    def _on_driver(self, ev: Event) -> list[Event]:
        return self.driver.on_event(self, ev)

    def call_policy_at(self, delay: float, token: int) -> None:
        """Policy command: call ``policy.on_plan_ready(sim, token)`` ``delay`` seconds from now (a PLAN_READY
        event). A policy whose decision takes time to compute (a solve) computes it on the state at ``now`` and
        applies it then, so the time it took is charged in simulated time while the slots keep running."""
        self.out.append(self.q.make(self.now + max(0.0, delay), EvKind.PLAN_READY, token, 0))

    def _on_plan_ready(self, ev: Event) -> list[Event]:
        """A PLAN_READY event: the policy applies the decision it computed earlier (its commands' events land in
        ``out``); pending trajectories are re-dispatched at the end of the instant."""
        self.ticks.plans_landed += 1
        if not self.stopped:
            self.policy.on_plan_ready(self, ev.a)
            self.dirty = True
        return []

    def start_batch(self, index: int, specs: Sequence[SimTraj], keys: Sequence[str], weights_version: int) -> list[Event]:
        """Start rollout batch ``index`` now with new weights: engines sync, trajectories become pending."""
        self.fleet.weights_version = weights_version
        life = self.lifecycle
        life.start_batch(index, specs, keys)
        self.recorder.batch_start(index, self.now, len(specs))
        out = self.fleet.sync_weights(weights_version)
        out += self.invoke_policy("batch")
        out += self.ticks.schedule()
        if not life.trajs:
            life.batch_active = False
            out += self.driver.on_batch_done(self)
        return out

    # -- diagnosis -------------------------------------------------------------------------------------------
    def no_progress_error(self) -> NoProgressError:
        """Why the current batch cannot finish, for the user (see ``NoProgressError``)."""
        name = getattr(self.policy, "name", "?")
        sources = getattr(self.policy, "sources", None)
        trajs = self.lifecycle.trajs
        live = self.fleet.live
        left = [t for t in trajs if t.state != DONE]
        counts: dict[str, int] = {}
        for t in left:
            counts[STATE_NAMES[t.state]] = counts.get(STATE_NAMES[t.state], 0) + 1
        states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        usable = [s for s in live if sources is None or s.source in sources]
        serving = [s for s in usable if s.role in DECODING]
        only = "" if sources is None else " (it uses " + "/".join(sorted(x.value for x in sources)) + " GPUs only)"
        gpus_fix = ("give the policy GPUs it may use: --dedicated N >= 1 (static policies use dedicated GPUs only), "
                    "--lent N, or an availability trace that adds GPUs")
        if not live:
            why, fix = "no GPU is present", gpus_fix
        elif not usable:
            why, fix = f"none of the {len(live)} present GPUs is one policy {name} may use{only}", gpus_fix
        elif not serving:
            why, fix = f"policy {name} serves on none of the {len(usable)} GPUs it may use", gpus_fix
        else:
            waiting = [t for t in left if t.state in (PENDING, WAIT)]
            need = max((self.kv.need_new(t) for t in waiting), default=0)
            free = max(self.kv.free_for_new(s) for s in serving)
            headroom = max(getattr(self.policy, "kv_headroom", 0.0), getattr(self.policy, "critical_headroom", 0.0))
            keeps = f" (policy {name} keeps up to {headroom:.0%} of a GPU's KV free)" if headroom else ""
            why = (f"the waiting trajectories do not fit: the largest needs {need} KV tokens, the most a serving "
                   f"GPU of policy {name} has free is {free}{keeps}")
            fix = "use a GPU/model pair whose KV memory holds the longest trajectory, or shorten the workload"
        return NoProgressError(
            f"replay cannot progress at t={self.now:.0f} s: batch {self.batch} has {len(left)} of "
            f"{len(trajs)} trajectories left ({states}), {why}, and no pending event (arrival, lending, "
            "tool return, switch) can change that",
            fix=fix,
            policy=name, time=self.now, batch=self.batch, left=len(left),
        )

    def info(self) -> dict[str, Any]:
        return {"events": self.n_events, "now": self.now, "slots": len(self.slots)}


__all__ = [
    "DECODING",
    "DONE",
    "IDLE_TICKS",
    "IN_FLIGHT",
    "MIN_DIVIDE_TOKENS",
    "MOVE",
    "PENDING",
    "PREFILL",
    "RUN",
    "STATE_NAMES",
    "TOOL",
    "TOOL_KV_MODES",
    "WAIT",
    "Driver",
    "FastPerf",
    "FoldIndex",
    "NoProgressError",
    "Policy",
    "SimConfig",
    "SimTraj",
    "Simulator",
    "SlotState",
    "TrajState",
]
