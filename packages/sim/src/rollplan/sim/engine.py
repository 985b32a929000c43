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

Policies (``rollplan.sim.policies``) decide roles, placement, order and migrations through the methods in
the "policy API" section; the simulator owns the physics and the true lengths. Metrics go to a
``rollplan.sim.metrics.Recorder``.
"""

from __future__ import annotations

import heapq
import logging
import math
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rollplan.models.errors import SchemaError, UnknownNameError, UserInputError
from rollplan.models.perf import PerfModel
from rollplan.models.types import AvailabilityEvent, EngineState, EventKind, Role, Slot, SlotSource
from rollplan.sim.events import Event, EventQueue, EvKind
from rollplan.sim.metrics import Recorder

if TYPE_CHECKING:
    from rollplan.sim.workload import TrajectorySpec

log = logging.getLogger(__name__)

DECODING = frozenset((Role.MIXED, Role.DECODE))
# Trajectory states.
PENDING, TOOL, WAIT, PREFILL, RUN, MOVE, DONE = range(7)
STATE_NAMES = ("pending", "tool", "wait", "prefill", "run", "move", "done")
IN_FLIGHT = frozenset((PREFILL, MOVE))
# Event kinds the hot paths create, as plain ints (``EventQueue.make`` stores ``int(kind)`` either way).
_SEG_DONE, _JOIN, _TOOL_DONE = int(EvKind.SEG_DONE), int(EvKind.JOIN), int(EvKind.TOOL_DONE)
IDLE_TICKS = 8
"""Interval ticks in a row that found nothing changed since the previous one (no other event handled, no
policy command took effect) and nothing running, after which the simulator stops ticking densely (see the
module docstring). 8 covers two of rollplan's every-4-ticks re-plans; normal replays never get there."""


class NoProgressError(UserInputError):
    """A replay can make no further progress: work is left, but no GPU the policy may use can run it and
    no pending event (arrival, lending, tool return, switch) can change that. Raised instead of looping."""


TOOL_KV_MODES = ("pinned", "evictable", "offload")
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

    def __post_init__(self) -> None:
        if self.tool_kv not in TOOL_KV_MODES:
            raise UnknownNameError("tool KV mode", self.tool_kv, TOOL_KV_MODES)
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


# --- state ------------------------------------------------------------------------------------------------


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
    """One policy's replay. Build, then ``run()``; read ``recorder`` afterwards."""

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
        self.slots: list[SlotState] = []
        self.slot_index: dict[str, int] = {}
        self.trajs: list[TrajState] = []
        self.pending: list[tuple[int, int]] = []  # (pseq, trajectory) in FCFS order; stale entries skipped
        self.n_pending = 0
        self._pseq = 0
        self._phead = 0
        self.batch = -1
        self.batch_start = 0.0
        self.batch_left = 0
        self.batch_active = False
        self.weights_version = 0
        self.availability = tuple(availability)
        self.n_events = 0
        self.stopped = False
        self._dirty = False
        self._admit = 0
        self._dedicated = tuple(dedicated)
        self._tick_pending = False
        self._idle_ticks = 0  # interval ticks in a row that found nothing changed (see _on_replan_tick)
        self._tick_mark: tuple[int, ...] = ()
        self._plans_landed = 0  # PLAN_READY events handled (``_activity_mark``)
        self.cat_counts: dict[str, int] = {}
        self._out: list[Event] = []  # events caused by policy commands; the main loop drains it
        self.live: list[SlotState] = []  # present slots, by index
        self._pf_seq = 0
        self._pool_dirty = False
        self._replan_reason: str | None = None
        self._epoch = 0
        self.pool_load = 0.0  # prefill-seconds per second the DECODE slots' folded turns ask of the pool
        self._pool_key = -1
        self._pool_n = 0
        self._pf_slots_key = -1
        self._pf_slots: list[SlotState] = []
        self.slot_epoch = 0  # bumped whenever a slot's role, readiness, presence or return deadline changes
        self._fold = config.fold_tool_s
        self._evictable = config.tool_kv != "pinned"
        self._offload = config.tool_kv == "offload"
        self._share = config.share_prompt
        self._folds: dict[int, tuple[SimTraj, FoldIndex]] = {}  # id(spec) -> FoldIndex (see _plan_segment)
        self._spec_k = config.spec_tokens
        self._starts: dict[int, int] = {}  # slots cold-starting now -> their action epoch (start_interference)
        self._host_f = 1.0  # step-time factor on every slot while an engine starts (SimConfig.start_interference)
        self._spec_adaptive = config.spec_adaptive
        self._spec_groups: dict[str, list[int]] = {}  # group -> its trajectories in this batch (speculation)
        self._spec_done: dict[str, int] = {}  # group -> its finished trajectories in this batch
        self._divide = config.divide_tokens  # decode tokens per chunk (divided rollout; 0: off)
        self._chunk_move = getattr(policy, "chunk_move", None)

    # -- setup / main loop -------------------------------------------------------------------------------
    def _add_slot(self, slot: Slot) -> SlotState:
        idx = self.slot_index.get(slot.id)
        if idx is None:
            perf = self.perf_for(slot.gpu, slot.tp)
            s = SlotState(len(self.slots), slot, perf, int(self.cfg.admit_watermark * perf.kv_cap))
            self.slots.append(s)
            self.slot_index[slot.id] = s.idx
        else:
            s = self.slots[idx]
        return s

    def _present(self, s: SlotState, engine: EngineState, return_by: float | None) -> None:
        self.slot_epoch += 1
        if s.present:
            s.return_by = return_by
            return
        s.present = True
        s.presence += 1
        s.role = Role.OFF
        s.engine = engine
        s.ready_at = self.now
        s.return_by = return_by
        s.V, s.t_ref, s.tau = 0.0, self.now, math.inf
        s.version += 1
        s.sched_t = math.inf
        s.heap.clear()
        s.n_run, s.kv_sum, s.rho_sum, s.reserved = 0, 0.0, 0.0, 0
        s.rtok_sum = 0.0
        s.residents.clear()
        s.groups.clear()
        s.idle = 0
        s.kv_free, s.n_res = s.kv_cap, 0
        s.waiting.clear()
        s.pf_busy = self.now
        s.rho_remote = 0.0
        s.pool_c = 0.0
        s.pf_jobs.clear()
        s.cat, s.cat_since = "", self.now
        self.live = sorted([*self.live, s], key=lambda x: x.idx)
        self._set_cat(s)

    def run(self) -> Recorder:
        """Replay until the driver stops or ``end_time``; returns the recorder (finalised)."""
        q = self.q
        for d in self._dedicated:
            s = self._add_slot(d)
            self._present(s, d.engine, None)
        for i, ev in enumerate(self.availability):
            q.push(q.make(ev.time, EvKind.AVAIL, i, 0))
        self.policy.attach(self)
        q.push_all(self.driver.start(self))
        by_kind: dict[int, Callable[[Event], list[Event]]] = {
            EvKind.SEG_DONE: self._on_seg_done,
            EvKind.JOIN: self._on_join,
            EvKind.TOOL_DONE: self._on_tool_done,
            EvKind.ACTION_DONE: self._on_action_done,
            EvKind.AVAIL: self._on_avail,
            EvKind.DEADLINE: self._on_deadline,
            EvKind.TRAIN_DONE: self._on_driver,
            EvKind.BATCH_START: self._on_driver,
            EvKind.PLAN_READY: self._on_plan_ready,
            EvKind.REPLAN: self._on_replan_tick,
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
            if self._replan_reason is None and not (self._dirty or self._pool_dirty or self._out):
                continue  # nothing to settle (most instants): skip the call
            for e in self._settle():
                push(heap, e)
        self.n_events = n
        if not self.stopped and not heap and self.batch_active and self.batch_left > 0 and not math.isfinite(end):
            # Nothing left to happen (no interval ticks either) and no end time: the batch can never finish.
            raise self._no_progress_error()
        if not self.stopped and math.isfinite(end):
            # The replay covers its window to the end: the next event lies past it (or none is left), and
            # running segments decode until then. Stopping at the last event instead would shorten the window
            # a throughput is measured over, by however long that policy's last gap between events is.
            self.now = end
        self._finish()
        return self.recorder

    def _new_epoch(self) -> int:
        """A fresh trajectory epoch, unique over the whole replay: a stale event of a finished batch can never
        match a trajectory of the next one (indices are reused across batches)."""
        self._epoch += 1
        return self._epoch

    def _settle(self) -> list[Event]:
        """End of an instant: re-invoke the policy once (however many events asked for it), dispatch pending
        trajectories, re-deal the prefill queue; returns the events that causes."""
        out: list[Event] = []
        if self._replan_reason is not None and not self.stopped:
            reason = self._replan_reason
            self._replan_reason = None
            self.policy.on_replan(self, reason)
            self._dirty = True
        if self._dirty:
            self._dirty = False
            if self.n_pending:
                out += self._dispatch()
        if self._pool_dirty:
            self._pool_dirty = False
            out += self._rebalance_pool()
        if self._out:
            out += self._out
            self._out = []
        return out

    def stop(self) -> None:
        self.stopped = True

    def _finish(self) -> None:
        """Credit partial progress of running segments, flush GPU-second accounting."""
        for s in self.slots:
            if s.present and s.n_run:
                self._rebase(s, self.now)
                for _fv, _seq, j, ep in list(s.heap):
                    t = self.trajs[j]
                    if t.epoch == ep and t.state == RUN:
                        steps = min(t.seg_run, max(0.0, s.V - t.seg_V0))
                        if steps > 0:
                            self.recorder.tokens(self.now, steps, t.seg_t0)
                            t.decoded += steps
            if s.present:
                self._flush_cat(s)
        self.recorder.end_time = self.now
        self.recorder.events = self.n_events

    # -- accounting ---------------------------------------------------------------------------------------
    def _category(self, s: SlotState) -> str:
        if not s.present:
            return ""
        if s.ready_at > self.now:
            return "switching"
        return "off" if s.role is Role.OFF else s.role.value

    def _flush_cat(self, s: SlotState) -> None:
        if s.cat:
            self.recorder.gpu_seconds[s.cat] = self.recorder.gpu_seconds.get(s.cat, 0.0) + (
                self.now - s.cat_since
            ) * s.tp
        s.cat_since = self.now

    def _set_cat(self, s: SlotState) -> None:
        self.slot_epoch += 1  # any change of role, readiness, presence or deadline goes through here
        new = self._category(s)
        if new == s.cat:
            return
        self._flush_cat(s)
        counts = self.cat_counts
        if s.cat:
            counts[s.cat] -= s.tp
        if new:
            counts[new] = counts.get(new, 0) + s.tp
        s.cat = new
        self.recorder.roles(self.now, counts)

    # -- slot batch mechanics -------------------------------------------------------------------------------
    def _rebase(self, s: SlotState, t: float) -> None:
        if t > s.t_ref:
            if s.n_run:
                s.V += (t - s.t_ref) / s.tau
            s.t_ref = t

    def _retau(self, s: SlotState) -> None:
        """Recompute s's decode step time (and its load on the prefill pool) from its running set. Every change
        of ``n_run``/``kv_sum``/``rho_sum``/``rho_remote`` is followed by a call, so a call without such a
        change is a no-op."""
        n = s.n_run
        if n <= 0:
            s.n_run, s.kv_sum, s.rho_sum, s.rho_remote, s.rtok_sum = 0, 0.0, 0.0, 0.0, 0.0
            s.acc_sum = 0.0
            s.tau = math.inf
            c = 0.0
        else:
            perf = s.perf
            dec = perf.decode(n, s.kv_sum / n)
            k = self._spec_k
            if k:  # speculation: seconds per token = verify step / tokens per step (SimConfig docstring)
                a = s.acc_sum / n
                if a > 0.0:
                    best = dec
                    for kk in range(1, k + 1) if self._spec_adaptive else (k,):
                        e = kk + 1.0 if a >= 1.0 else (1.0 - a ** (kk + 1)) / (1.0 - a)
                        t = (dec + perf.verify_extra(n, kk)) / e
                        if t < best or not self._spec_adaptive:
                            best = t
                    dec = best
                elif not self._spec_adaptive:
                    dec += perf.verify_extra(n, k)
            tau = dec + s.rho_sum
            if s.rtok_sum > 0.0:  # batched step physics (module docstring): mixed steps share weight reads
                room = perf.chunk - n
                f = s.rtok_sum / room if room > s.rtok_sum else 1.0
                tau -= f * perf.overlap(n)
                if tau < dec:
                    tau = dec
            if self._host_f != 1.0:
                tau *= self._host_f
            s.tau = tau
            c = s.rho_remote / tau if s.rho_remote > 0 else 0.0
        if c != s.pool_c:
            self.pool_load = max(0.0, self.pool_load + c - s.pool_c)
            s.pool_c = c

    def _pool_free(self) -> float:
        """Share of a PREFILL slot's time left for first prefills after the folded turns' fluid load (the
        pool's load spread over its slots; at least 5%: an overloaded pool queues, it does not stop)."""
        if self._pool_key != self.slot_epoch:
            self._pool_key = self.slot_epoch
            self._pool_n = sum(1 for s in self.live if s.role is Role.PREFILL)
        if self.pool_load <= 0 or not self._pool_n:
            return 1.0
        return max(0.05, 1.0 - self.pool_load / self._pool_n)

    def _reschedule(self, s: SlotState) -> list[Event]:
        """Make sure a SEG_DONE fires no later than the slot's next completion. Lazy: when the scheduled one
        fires no later than needed (a join slowed the batch down), it stays; firing early it just re-checks."""
        h = s.heap
        trajs = self.trajs
        while h:
            e = h[0]  # (finish V, seq, trajectory, epoch)
            t = trajs[e[2]]
            if t.epoch == e[3] and t.state == RUN:
                break
            heapq.heappop(h)
        if not h or not s.n_run:
            s.version += 1
            s.sched_t = math.inf
            return []
        steps = h[0][0] - s.V
        t_next = s.t_ref + (steps if steps > 0.0 else 0.0) * s.tau  # = max(0.0, steps), without the call
        if t_next >= s.sched_t:
            return []
        s.version += 1
        s.sched_t = t_next
        return [self.q.make(t_next, _SEG_DONE, s.idx, s.version)]

    def _stall(self, s: SlotState, seconds: float) -> None:
        """Pause the slot's batch for ``seconds`` from now (switching)."""
        self._rebase(s, self.now)
        s.t_ref = max(s.t_ref, self.now) + seconds

    def _reserve(self, j: TrajState, s: SlotState, tokens: int) -> None:
        """Reserve ``tokens`` of KV (j's whole context) for j on s; a shared prompt is held once per slot."""
        if j.slot == s.idx:
            tokens -= j.sh
            s.reserved += tokens - j.reserved
            if j.state == TOOL:
                s.idle += tokens - j.reserved
        else:
            if j.slot >= 0:
                self._release(j)
            if j.share:
                # The group's prompt is held once: the first sibling's; the others share up to their own.
                # It is evictable (``s.idle``) while every resident of the group is in a tool call.
                g = s.groups.get(j.group)
                if g is None:
                    g = s.groups[j.group] = [0, j.share, 0]
                    s.reserved += j.share
                was_idle = g[0] > 0 and not g[2]
                g[0] += 1
                if j.state != TOOL:
                    g[2] += 1
                if not g[2] and not was_idle:
                    s.idle += g[1]
                elif was_idle and g[2]:
                    s.idle -= g[1]
                j.sh = min(j.share, g[1])
                tokens -= j.sh
            s.reserved += tokens
            if j.state == TOOL:
                s.idle += tokens
            s.residents[j.idx] = None
            s.n_res = len(s.residents)
            j.slot = s.idx
            self._admit += 1
            j.admit_seq = self._admit
        j.reserved = tokens
        s.kv_free = s.kv_cap - s.reserved

    def _release(self, j: TrajState) -> None:
        """Free j's KV reservation on its slot (j keeps nothing there)."""
        if j.slot >= 0:
            s = self.slots[j.slot]
            s.reserved -= j.reserved
            if j.state == TOOL:
                s.idle -= j.reserved
            if j.share:
                g = s.groups[j.group]
                was_idle = not g[2]
                g[0] -= 1
                if j.state != TOOL:
                    g[2] -= 1
                if not g[0]:
                    del s.groups[j.group]
                    s.reserved -= g[1]
                    if was_idle:
                        s.idle -= g[1]
                elif not g[2] and not was_idle:
                    s.idle += g[1]
                j.sh = 0
            s.residents.pop(j.idx, None)
            s.kv_free, s.n_res = s.kv_cap - s.reserved, len(s.residents)
            if j.idx in s.waiting:
                s.waiting.remove(j.idx)
            self._dirty = True
        j.slot = -1
        j.reserved = 0
        j.kv_ok = False

    def _plan_segment(self, j: TrajState, s: SlotState, room: int) -> tuple[int, int, int, int, float, int, int] | None:
        """The segment j would run next on s: (P0, cached, m, D, W_fold, ctx0, ctx_end); None when even its
        next turn does not fit ``room`` KV tokens."""
        pf, dec_, tool = j.pf, j.dec, j.tool
        k = j.turn
        new = 0 if j.pf_done else pf[k]
        if j.kv_ok and j.slot == s.idx:
            cached, p0 = j.ctx, new
        else:
            # Without its own KV: a resident sibling's prompt is reused (prefix cache), the rest prefilled.
            cached = self._sibling_prompt(j, s)
            p0 = j.ctx + new - cached
        ctx0 = j.ctx + new
        dec = dec_[k] - j.dec_done
        ctx_end = ctx0 + math.ceil(dec)
        if ctx_end > room:
            return None
        hit = self._folds.get(id(j.spec)) if j.dec_done == 0.0 else None
        if hit is not None and hit[0] is j.spec:
            # Fast path (a turn not started yet, whose spec was indexed at batch start): the same segment as
            # the walk below, found from prefix sums: the last turn m <= idx.last[k] whose context still fits
            # ``room`` (contexts only grow along the turns); decode tokens summed exactly as integers. Only
            # the folded tool seconds are still added one by one, in the walk's order (float sums).
            idx = hit[1]
            off = idx.off
            grow = idx.grow
            m = idx.last[off + k]
            if m > k:
                limit = room - ctx_end + grow[off + k]  # turns up to m fit while grow[off + m] <= limit
                if grow[off + m] > limit:
                    m = bisect_right(grow, limit, off + k, off + m) - 1 - off
                ctx_end += grow[off + m] - grow[off + k]
            w = 0.0
            for x in tool[k:m]:
                w += x
            return p0, cached, m, idx.cdec[off + m] - idx.cdec[off + k] + dec_[k], w, ctx0, ctx_end
        d = dec
        w = 0.0
        m = k
        fold = self._fold
        n = j.n
        while m + 1 < n and tool[m] <= fold:
            nxt = ctx_end + pf[m + 1] + dec_[m + 1]
            if nxt > room:
                break
            w += tool[m]
            ctx_end = nxt
            d += dec_[m + 1]
            m += 1
        return p0, cached, m, int(d) if d == int(d) else d, w, ctx0, ctx_end  # type: ignore[return-value]

    def _prefill_slot(self, work: float) -> SlotState | None:
        """The PREFILL slot that would finish ``work`` seconds of prefill first (FCFS queue + background)."""
        if self._pf_slots_key != self.slot_epoch:
            # Slots that were PREFILL when the slot epoch last changed, in ``live`` order. A slot only turns
            # PREFILL or joins ``live`` with an epoch bump, so this holds every present PREFILL slot; the
            # role test below drops one that left PREFILL since (its epoch bump may come later).
            self._pf_slots_key = self.slot_epoch
            self._pf_slots = [s for s in self.live if s.role is Role.PREFILL]
        best = None
        best_t = math.inf
        now = self.now
        dt: float | None = None
        for s in self._pf_slots:
            if s.role is Role.PREFILL:
                if dt is None:
                    dt = work / self._pool_free()  # the same for every slot of the loop
                t = now  # max(now, s.pf_busy, s.ready_at) without the call
                if s.pf_busy > t:
                    t = s.pf_busy
                if s.ready_at > t:
                    t = s.ready_at
                t += dt
                if t < best_t:
                    best, best_t = s, t
        return best

    def _try_start(self, j: TrajState, s: SlotState) -> list[Event]:
        """j (ready to run its next turn) on s: join, queue for prefill, or wait for KV."""
        if not s.present or s.role not in DECODING:
            return self._displace(j, lose_kv=True)
        if s.ready_at > self.now:
            if j.slot != s.idx:
                self._reserve(j, s, j.ctx)
            j.state = WAIT
            if j.idx not in s.waiting:
                s.waiting.append(j.idx)
            return []
        own = j.reserved if j.slot == s.idx else 0
        room = s.kv_cap - s.reserved + own + self.prefix_bonus(s, j)
        if j.slot != s.idx:
            room -= s.watermark
        seg = self._plan_segment(j, s, room)
        if seg is None and j.slot != s.idx and self._evictable:
            while seg is None:
                victim = self._idle_victim(s)
                if victim is None:
                    break
                self._evict(self.trajs[victim])
                room = s.kv_cap - s.reserved - s.watermark + self.prefix_bonus(s, j)
                seg = self._plan_segment(j, s, room)
        if seg is not None and j.host and j.slot != s.idx:
            # Its KV is in the host tier: load it (the slot holds the room meanwhile), then run. A prompt a
            # resident sibling holds here is matched on the GPU, so only the rest of the context is loaded.
            load = j.ctx - self._sibling_prompt(j, s)
            self._reserve(j, s, j.ctx)
            j.state = MOVE
            j.epoch = self._new_epoch()
            self.recorder.count("kv_reloads")
            self.recorder.count("kv_reload_tokens", load)
            return [self.q.make(self.now + s.perf.transfer(load, False), EvKind.JOIN, j.idx, j.epoch)]
        while seg is None and j.slot == s.idx:
            victim = self._victim(s, j.idx)
            if victim is None:
                break
            self._evict(self.trajs[victim])
            room = s.kv_cap - s.reserved + j.reserved + self.prefix_bonus(s, j)
            seg = self._plan_segment(j, s, room)
        if seg is None:
            if j.slot != s.idx:  # a new admission that does not fit: back to the policy
                self._enqueue(j)
                return []
            j.state = WAIT
            if j.idx not in s.waiting:
                s.waiting.append(j.idx)
            return []
        if j.idx in s.waiting:
            s.waiting.remove(j.idx)
        return self._start_segment(j, s, seg)

    def _victim(self, s: SlotState, keep: int) -> int | None:
        trajs = self.trajs
        for v in reversed(s.residents):
            if v != keep and trajs[v].state in (TOOL, WAIT):
                return v
        return None

    def _idle_victim(self, s: SlotState) -> int | None:
        """The resident in a tool call whose KV a new admission takes first (``tool_kv`` evictable / offload):
        the least recently used, i.e. the one that went to its tool earliest (an engine does not know when a
        tool call will return)."""
        trajs = self.trajs
        best, best_t = None, math.inf
        for v in s.residents:
            t = trajs[v]
            if t.state == TOOL and t.tool_t0 < best_t:
                best, best_t = v, t.tool_t0
        return best

    def _idle_kv(self, s: SlotState) -> int:
        """KV tokens on ``s`` held by residents in a tool call (evictable unless ``tool_kv`` is "pinned"), by
        a scan: the reference for ``s.idle``, which the simulator keeps up to date (tests compare the two)."""
        trajs = self.trajs
        n = 0
        active: dict[str, int] = {}
        for v in s.residents:
            t = trajs[v]
            if t.state == TOOL:
                n += t.reserved
            if t.share:
                active[t.group] = active.get(t.group, 0) + (t.state != TOOL)
        # A shared prompt is evictable once every resident of its group is in a tool call.
        return n + sum(g[1] for grp, g in s.groups.items() if not active.get(grp, 0))

    def _evict(self, v: TrajState) -> None:
        """Preempt v's KV (recompute later), as vLLM does when memory runs out."""
        self.recorder.count("evictions")
        if v.state == TOOL:
            self._release(v)
            if self._offload:
                v.host = True
        else:
            self._release(v)
            self._enqueue(v)

    def _start_segment(self, j: TrajState, s: SlotState, seg: tuple[int, int, int, int, float, int, int]) -> list[Event]:
        p0, cached, m, d, w, ctx0, ctx_end = seg
        perf = s.perf
        j.seg_rrho = 0.0
        j.seg_rtok = 0.0
        self._reserve(j, s, ctx_end)
        if j.t_start < 0:
            j.t_start = self.now
        k = j.turn
        j.seg_k, j.seg_m, j.seg_D, j.seg_W = k, m, float(d), w
        # Divided rollout: the segment (planned, KV reserved and priced per step as without division) runs at
        # most one chunk here. The part of its first prefill the chunk's steps do not pay is owed to the next
        # segment on this KV (``pf_owed``); the folded later turns' prefill is fluid, as when a move interrupts.
        run = j.seg_run = j.seg_D if not self._divide or j.seg_D <= self._divide else float(self._divide)
        owed, owed_tok = j.pf_owed, j.pf_owed_tok
        if owed:
            j.pf_owed, j.pf_owed_tok = 0.0, 0.0
            if cached != j.ctx or s.role is Role.DECODE:  # prefilled again here (or on the pool): nothing owed
                owed, owed_tok = 0.0, 0.0
        j.seg_ctx0, j.seg_ctx_end, j.seg_dec0 = ctx0, ctx_end, j.dec_done
        # Prefill seconds of the folded later turns' new tokens (over their natural contexts), then of the first
        # prefill before j's next decode step; the common cases from j's memoised turn prices (one lookup).
        prices = None
        if m > k:
            prices = perf.spec_prefill(j.spec)
            cum, cum_tok = prices[1], prices[2]
            later_s, later_tok = cum[m] - cum[k], cum_tok[m] - cum_tok[k]
            # What the recorder counts: a segment after a cut re-plans turns whose tokens the cut segment's plan
            # already recorded (its seconds stay fluid, spread over each plan's steps); each turn counts once.
            rec_tok = later_tok if j.pf_rec <= k else cum_tok[m] - cum_tok[min(m, j.pf_rec)]
            if run < j.seg_D and m > j.pf_rec:
                j.pf_rec = m
        else:
            later_s, later_tok = 0.0, 0
            rec_tok = 0
        if p0 <= 0:
            first = 0.0
        elif cached == 0 and k == 0 and not j.pf_done:
            first = (prices or perf.spec_prefill(j.spec))[0]
        elif cached and k > 0 and not j.pf_done and p0 == j.pf[k]:
            cum = (prices or perf.spec_prefill(j.spec))[1]
            first = cum[k] - cum[k - 1]
        else:
            first = perf.prefill(p0, cached)
        if s.role is Role.DECODE:
            ps = self._prefill_slot(first)
            if ps is not None:
                # The folded later turns' prefill runs on the PREFILL pool while j decodes: a fluid load of
                # ``seg_rrho`` prefill-seconds per decode step (the pool's share of time it takes slows the queue
                # of first prefills); its latency adds to j's wait.
                if later_s > 0:
                    j.seg_rrho = later_s / j.seg_D if j.seg_D > 0 else 0.0
                    j.seg_W += later_s / self._pool_free() + ps.perf.transfer(later_tok, ps.node == s.node)
                    if rec_tok:
                        self.recorder.prefill(self.now, rec_tok)
                        tau = s.tau if s.n_run else perf.decode(1, ctx0)
                        self.recorder.span("prefill", self.now, self.now + j.seg_D * tau + w, rec_tok)
                j.seg_rho = 0.0
                if p0 > 0:
                    j.state = PREFILL
                    j.pf_secs = first
                    j.pf_tokens = p0
                    self._pf_seq += 1
                    j.pf_seq = self._pf_seq
                    self.recorder.prefill(self.now, p0)
                    self.recorder.span("prefill", self.now, self.now, p0)
                    j.prefilled += p0
                    return self._book_prefill(j, ps)
                j.kv_ok = True
                return self._join(j, s)
            # no PREFILL slot: the DECODE slot prefills itself, as a MIXED one
        f = later_s + first
        if owed:
            f += owed
        j.seg_rho = f / j.seg_D if j.seg_D > 0 else 0.0
        j.seg_rtok = (p0 + later_tok + owed_tok) / j.seg_D if j.seg_D > 0 else 0.0
        if run < j.seg_D:
            left = 1.0 - run / j.seg_D
            j.pf_owed, j.pf_owed_tok = (first + owed) * left, (p0 + owed_tok) * left
        if p0 or rec_tok:
            rec = self.recorder
            rec.prefill(self.now, p0 + rec_tok)
            if rec.track_rates:
                rec.span("prefill", self.now, self.now, p0)
                tau = s.tau if s.n_run else perf.decode(1, ctx0)
                rec.span("prefill", self.now, self.now + j.seg_D * tau + w, rec_tok)
            j.prefilled += p0
        j.kv_ok = True
        return self._join(j, s)

    def _join(self, j: TrajState, s: SlotState) -> list[Event]:
        now = self.now
        if now > s.t_ref:  # self._rebase(s, now), inlined (hot)
            if s.n_run:
                s.V += (now - s.t_ref) / s.tau
            s.t_ref = now
        j.pf_done = True
        j.state = RUN
        self._epoch += 1  # self._new_epoch(), inlined
        ep = j.epoch = self._epoch
        v0 = j.seg_V0 = s.V
        j.seg_t0 = now
        if j.seg_run == j.seg_D:
            kv = j.seg_kv = (j.seg_ctx0 + j.seg_ctx_end) * 0.5
        else:  # a chunk of a divided segment: its context grows over the chunk only
            kv = j.seg_kv = j.seg_ctx0 + (j.seg_ctx_end - j.seg_ctx0) * (j.seg_run / j.seg_D) * 0.5
        s.n_run += 1
        s.kv_sum += kv
        s.rho_sum += j.seg_rho
        s.rtok_sum += j.seg_rtok
        s.rho_remote += j.seg_rrho
        s.acc_sum += j.spec_a
        self._retau(s)
        heapq.heappush(s.heap, (v0 + j.seg_run, ep, j.idx, ep))
        return self._reschedule(s)

    def _leave_batch(self, j: TrajState, s: SlotState) -> None:
        s.n_run -= 1
        s.kv_sum -= j.seg_kv
        s.rho_sum -= j.seg_rho
        s.rtok_sum -= j.seg_rtok
        s.acc_sum -= j.spec_a
        j.epoch = self._new_epoch()
        s.rho_remote -= j.seg_rrho

    def _interrupt(self, j: TrajState) -> None:
        """Stop j's running segment now; keep its token progress (KV stays where it is)."""
        s = self.slots[j.slot]
        self._rebase(s, self.now)
        steps = min(j.seg_run, max(0.0, s.V - j.seg_V0))
        self._leave_batch(j, s)
        self._retau(s)
        self._advance(j, steps)
        j.state = WAIT  # caller decides

    def _advance(self, j: TrajState, steps: float) -> None:
        """Credit ``steps`` decode steps of j's running segment (which j has left): its position (turn, tokens
        decoded in it, context), the tool seconds of the folded turns it finished (owed, waited later) and the
        tokens to the recorder; its KV stays where it is."""
        pf, dec, tool = j.pf, j.dec, j.tool
        k, m = j.seg_k, j.seg_m
        first = dec[k] - j.seg_dec0
        ctx = j.seg_ctx0
        owed = 0.0
        if steps < first or k == m:
            j.turn, j.dec_done = k, j.seg_dec0 + min(steps, first)
            ctx += min(steps, first)
        else:
            left = steps - first
            ctx += first
            owed = tool[k]
            i = k + 1
            while True:
                ctx += pf[i]
                n = dec[i]
                if left < n or i == m:
                    j.turn, j.dec_done = i, min(left, n)
                    ctx += min(left, n)
                    break
                left -= n
                ctx += n
                owed += tool[i]
                i += 1
        j.ctx = round(ctx)
        j.pf_done = True
        j.owed_tool += owed
        if steps > 0:
            self.recorder.tokens(self.now, steps, j.seg_t0)
            self.recorder.span("decode", j.seg_t0, self.now, steps)
            j.decoded += steps

    def _displace(self, j: TrajState, *, lose_kv: bool) -> list[Event]:
        """Take j off its slot (KV lost when ``lose_kv``); it continues its tool or goes back to the policy."""
        if j.state == RUN:
            s = self.slots[j.slot]
            self._interrupt(j)
            out = self._reschedule(s)
        else:
            out = []
        if j.state in (PREFILL, MOVE):
            j.epoch = self._new_epoch()
        if lose_kv and j.slot >= 0:
            self.recorder.count("kv_lost")
            self._release(j)
        if j.state == TOOL:
            return out
        if j.owed_tool > 0:
            return out + self._go_tool(j, j.owed_tool)
        self._enqueue(j)
        return out

    def _go_tool(self, j: TrajState, seconds: float) -> list[Event]:
        j.owed_tool = 0.0
        if j.slot >= 0 and j.state != TOOL:
            s = self.slots[j.slot]
            s.idle += j.reserved
            if j.share:
                g = s.groups[j.group]
                g[2] -= 1
                if not g[2]:
                    s.idle += g[1]
        j.state = TOOL
        self._epoch += 1  # self._new_epoch(), inlined
        j.epoch = self._epoch
        j.tool_t0 = self.now
        if self._evictable and j.slot >= 0 and self.n_pending:
            self._dirty = True  # its KV just became evictable: a queued admission may fit now
        until = j.tool_until = self.now + seconds
        return [self.q.make(until, _TOOL_DONE, j.idx, j.epoch)]

    def _complete(self, j: TrajState) -> list[Event]:
        j.state = DONE
        j.t_done = self.now
        self.recorder.traj_done(j.batch, self.now - self.batch_start, self.now, sum(j.dec))
        self.policy.on_traj_done(self, j.idx)
        self.batch_left -= 1
        out = self._spec_sibling_done(j) if self._spec_k else []
        if self.batch_left == 0 and self.batch_active:
            self.batch_active = False
            self.recorder.batch_done(self.batch, self.now)
            return out + self.driver.on_batch_done(self)
        return out

    def _spec_group_acceptance(self, size: int, done: int) -> float:
        cfg = self.cfg
        if size <= 1:
            return cfg.spec_base_acceptance
        return cfg.spec_base_acceptance + (cfg.spec_acceptance - cfg.spec_base_acceptance) * done / (size - 1)

    def _spec_sibling_done(self, j: TrajState) -> list[Event]:
        """j finished: its group's acceptance rises (SimConfig docstring); running siblings' slots re-time."""
        members = self._spec_groups.get(j.group)
        if not members or len(members) <= 1:
            return []
        done = self._spec_done[j.group] = self._spec_done.get(j.group, 0) + 1
        a = self._spec_group_acceptance(len(members), done)
        out: list[Event] = []
        for idx in members:
            t = self.trajs[idx]
            if t.state == DONE or t.spec_a == a:
                continue
            if t.state == RUN and t.slot >= 0:
                s = self.slots[t.slot]
                self._rebase(s, self.now)
                s.acc_sum += a - t.spec_a
                t.spec_a = a
                self._retau(s)
                out += self._reschedule(s)
            else:
                t.spec_a = a
        return out

    def _drain_waiting(self, s: SlotState) -> list[Event]:
        out: list[Event] = []
        if not s.waiting or s.ready_at > self.now:
            return out
        for jdx in list(s.waiting):
            if jdx not in s.waiting:  # evicted by an earlier admission of this loop
                continue
            j = self.trajs[jdx]
            if j.state != WAIT or j.slot != s.idx:
                s.waiting.remove(jdx)
                continue
            out += self._try_start(j, s)
            if j.state == WAIT:
                break  # FIFO: the head waits for memory
        return out

    # -- handlers -------------------------------------------------------------------------------------------
    def _on_seg_done(self, ev: Event) -> list[Event]:
        s = self.slots[ev[3]]  # (time, kind, seq, slot index, slot version)
        if ev[4] != s.version or not s.present:
            return []
        s.sched_t = math.inf
        now = self.now
        if now > s.t_ref:  # self._rebase(s, now), inlined (hot)
            if s.n_run:
                s.V += (now - s.t_ref) / s.tau
            s.t_ref = now
        out: list[Event] = []
        h = s.heap
        trajs = self.trajs
        pop = heapq.heappop
        freed = to_tool = False
        done: list[TrajState] = []
        # Entries within a microsecond of their finish count as done (rounding of V = V0 + dt / tau).
        v = s.V
        horizon = v + (1e-6 / s.tau if s.n_run and s.tau > 0 else 0.0) + 1e-9 * v
        while h:
            e = h[0]  # (finish V, seq, trajectory, epoch)
            j = trajs[e[2]]
            if j.epoch != e[3] or j.state != RUN:
                pop(h)
                continue
            if e[0] > horizon:
                break
            pop(h)
            self._leave_batch(j, s)
            done.append(j)
        if not done:
            # Fired early (a join slowed the slot down since it was scheduled): nothing left the running set,
            # so _retau would be a no-op; only re-arm.
            return self._reschedule(s)
        self._retau(s)
        rec = self.recorder
        for j in done:
            if j.seg_run < j.seg_D:  # a chunk of a divided segment: back to the dispatcher
                out += self._chunk_done(j, s)
                continue
            rec.tokens(self.now, j.seg_D, j.seg_t0)
            if rec.track_rates:
                rec.span("decode", j.seg_t0, self.now, j.seg_D)
            j.decoded += j.seg_D
            m = j.seg_m
            j.turn, j.dec_done, j.pf_done, j.ctx, j.kv_ok = m + 1, 0.0, False, j.seg_ctx_end, True
            wait = j.seg_W + j.tool[m] + j.owed_tool
            j.owed_tool = 0.0
            if j.turn >= j.n:
                self._release(j)
                freed = True
                j.final = True
                out += self._go_tool(j, wait) if wait > 0 else self._complete(j)
            elif wait > 0:
                out += self._go_tool(j, wait)
                to_tool = True
            else:
                j.state = WAIT
                out += self._try_start(j, s)
        out += self._reschedule(s)
        if freed:
            out += self._drain_waiting(s)
            self._dirty = True
        elif to_tool and s.waiting:
            # A resident waiting on a tool may now be evicted for the head of the slot's queue (an engine
            # retries its waiting requests every step; without this the head waited for a completion).
            out += self._drain_waiting(s)
        return out

    def _on_join(self, ev: Event) -> list[Event]:
        j = self.trajs[ev[3]]  # (time, kind, seq, trajectory, epoch)
        if j.epoch != ev[4]:
            return []
        s = self.slots[j.slot] if j.slot >= 0 else None
        if s is None or not s.present:
            return self._displace(j, lose_kv=True)
        if j.state == PREFILL:
            j.kv_ok = True
            if s.ready_at > self.now or not s.role.decodes:
                j.state = WAIT
                return self._try_start(j, s)
            return self._join(j, s)
        if j.state == MOVE:
            j.kv_ok = True
            j.host = False
            if j.owed_tool > 0:
                return self._go_tool(j, j.owed_tool)
            j.state = WAIT
            return self._try_start(j, s)
        return []

    def _on_tool_done(self, ev: Event) -> list[Event]:
        j = self.trajs[ev[3]]  # (time, kind, seq, trajectory, epoch)
        if j.epoch != ev[4] or j.state != TOOL:
            return []
        if j.final:
            return self._complete(j)
        if j.slot >= 0 and (j.kv_ok or j.move_ready > self.now):
            s = self.slots[j.slot]  # it leaves its tool call, keeping its KV
            s.idle -= j.reserved
            if j.share:
                g = s.groups[j.group]
                g[2] += 1
                if g[2] == 1:
                    s.idle -= g[1]
        if j.move_ready > self.now and j.slot >= 0:
            j.state = MOVE
            j.epoch = self._new_epoch()
            return [self.q.make(j.move_ready, EvKind.JOIN, j.idx, j.epoch)]
        if j.slot >= 0 and j.kv_ok:
            j.state = WAIT
            return self._try_start(j, self.slots[j.slot])
        if j.slot >= 0:
            self._release(j)
        self._enqueue(j)
        return []

    def _on_action_done(self, ev: Event) -> list[Event]:
        s = self.slots[ev.a]
        if ev.b != s.action_epoch or not s.present:
            return []
        self._set_cat(s)
        if s.role is Role.PREFILL:
            self._pool_dirty = True
        self._dirty = True
        if self._starts:
            self._host_refresh()
        return self._drain_waiting(s)

    def _host_refresh(self) -> None:
        """Drop finished or cancelled cold starts; when whether any engine starts changed, re-time every running
        batch at the new step-time factor (``SimConfig.start_interference``)."""
        now = self.now
        slots = self.slots
        for idx, epoch in list(self._starts.items()):
            s = slots[idx]
            if not s.present or s.action_epoch != epoch or s.ready_at <= now:
                del self._starts[idx]
        f = 1.0 + self.cfg.start_interference if self._starts else 1.0
        if f == self._host_f:
            return
        for s in self.live:
            self._rebase(s, now)
        self._host_f = f
        for s in self.live:
            if s.n_run:
                self._retau(s)
                self._out_extend(self._reschedule(s))

    def _on_avail(self, ev: Event) -> list[Event]:
        aev = self.availability[ev.a] if ev.a >= 0 else self.driver.lending_event(ev.b)
        out = self.apply_availability(aev)
        out += self._invoke_policy(f"avail:{aev.kind.value}")
        return out

    def apply_availability(self, aev: AvailabilityEvent) -> list[Event]:
        """Apply one availability event to the slots (physics only; the caller re-invokes the policy)."""
        out: list[Event] = []
        kind = aev.kind
        if kind in (EventKind.ARRIVE, EventKind.LEND):
            for sl in aev.slots:
                known = sl.id in self.slot_index
                s = self._add_slot(sl)
                if kind is EventKind.ARRIVE:
                    engine = EngineState.NONE  # a fresh node: cold start
                elif not known:
                    # A colocated engine sleeps on the training GPUs (ROLL/PEARL): wake + weight sync.
                    engine = EngineState.SLEEPING if sl.engine is EngineState.NONE else sl.engine
                else:
                    engine = s.engine
                deadline = aev.deadline if kind is EventKind.LEND else sl.return_by
                self._present(s, engine, deadline)
                if deadline is not None:
                    out.append(self.q.make(deadline, EvKind.DEADLINE, s.idx, s.presence))
        elif kind in (EventKind.NOTICE, EventKind.RECLAIM):
            for sid in aev.slot_ids:
                idx = self.slot_index.get(sid)
                if idx is None or not self.slots[idx].present:
                    continue
                s = self.slots[idx]
                s.return_by = aev.deadline
                self.slot_epoch += 1
                if aev.deadline is not None:
                    if aev.deadline <= self.now:
                        out += self._remove(s, forced=True)
                    else:
                        out.append(self.q.make(aev.deadline, EvKind.DEADLINE, s.idx, s.presence))
        elif kind is EventKind.LEAVE:
            for sid in aev.slot_ids:
                idx = self.slot_index.get(sid)
                if idx is not None and self.slots[idx].present:
                    out += self._remove(self.slots[idx], forced=False)
        self._dirty = True
        return out

    def _on_deadline(self, ev: Event) -> list[Event]:
        s = self.slots[ev.a]
        if s.presence != ev.b or not s.present:
            return []
        out = self._remove(s, forced=True)
        return out + self._invoke_policy("deadline")

    def _remove(self, s: SlotState, *, forced: bool) -> list[Event]:
        """The slot goes away now: everything on it loses its KV (token progress kept)."""
        out: list[Event] = []
        busy = [j for j in s.residents]
        if forced and busy:
            self.recorder.count("deadline_kv_lost", len(busy))
        for jdx in busy:
            out += self._displace(self.trajs[jdx], lose_kv=True)
        out += self._rebook_prefill(s)
        self._set_role_now(s, Role.OFF)
        self._flush_cat(s)
        if s.cat:
            self.cat_counts[s.cat] -= s.tp
            s.cat = ""
            self.recorder.roles(self.now, self.cat_counts)
        self.pool_load = max(0.0, self.pool_load - s.pool_c)
        s.pool_c = 0.0
        s.present = False
        self.slot_epoch += 1
        self.live = [x for x in self.live if x is not s]
        s.presence += 1
        s.version += 1
        s.sched_t = math.inf
        if s.source is SlotSource.LENT_BY_TRAINING and s.engine is not EngineState.NONE:
            s.engine = EngineState.SLEEPING
        self._dirty = True
        return out

    def _book_prefill(self, j: TrajState, ps: SlotState) -> list[Event]:
        """Queue j's first prefill on PREFILL slot ``ps`` (FCFS behind its queue); JOIN when its KV lands."""
        start = max(self.now, ps.pf_busy, ps.ready_at)
        done = start + j.pf_secs / self._pool_free()
        ps.pf_busy = done
        j.epoch = self._new_epoch()
        j.pf_start = start
        ps.pf_jobs[j.idx] = j.epoch
        t_join = done + ps.perf.transfer(j.pf_tokens, ps.node == self.slots[j.slot].node)
        return [self.q.make(t_join, _JOIN, j.idx, j.epoch)]

    def _rebalance_pool(self) -> list[Event]:
        """The PREFILL slots changed: their not-yet-started jobs form one FCFS queue again, re-dealt over the
        current pool (a shared prefill queue: new PREFILL slots take queued work, as a router would)."""
        now = self.now
        pool = [s for s in self.live if s.role is Role.PREFILL]
        if not pool:
            return []
        queued: list[TrajState] = []
        for s in pool:
            busy = max(now, s.ready_at)
            for jdx, ep in list(s.pf_jobs.items()):
                j = self.trajs[jdx]
                if j.epoch != ep or j.state != PREFILL:
                    del s.pf_jobs[jdx]
                elif j.pf_start > now + 1e-9:
                    del s.pf_jobs[jdx]
                    queued.append(j)
                else:  # in service: keeps its slot
                    busy = max(busy, j.pf_start + j.pf_secs / self._pool_free())
            s.pf_busy = busy
        out: list[Event] = []
        queued.sort(key=lambda j: j.pf_seq)
        for j in queued:
            ps = min(pool, key=lambda s: (max(now, s.pf_busy, s.ready_at), s.idx))
            out += self._book_prefill(j, ps)
        return out

    def _rebook_prefill(self, s: SlotState) -> list[Event]:
        out: list[Event] = []
        jobs = list(s.pf_jobs.items())
        s.pf_jobs.clear()
        for jdx, ep in jobs:
            j = self.trajs[jdx]
            if j.epoch == ep and j.state == PREFILL and j.slot >= 0:
                j.epoch = self._new_epoch()
                j.state = WAIT
                out += self._try_start(j, self.slots[j.slot])
        return out

    def _on_driver(self, ev: Event) -> list[Event]:
        return self.driver.on_event(self, ev)

    def call_policy_at(self, delay: float, token: int) -> None:
        """Policy command: call ``policy.on_plan_ready(sim, token)`` ``delay`` seconds from now (a PLAN_READY
        event). A policy whose decision takes time to compute (a solve) computes it on the state at ``now`` and
        applies it then, so the time it took is charged in simulated time while the slots keep running."""
        self._out.append(self.q.make(self.now + max(0.0, delay), EvKind.PLAN_READY, token, 0))

    def _on_plan_ready(self, ev: Event) -> list[Event]:
        """A PLAN_READY event: the policy applies the decision it computed earlier (its commands' events land in
        ``_out``); pending trajectories are re-dispatched at the end of the instant."""
        self._plans_landed += 1
        if not self.stopped:
            self.policy.on_plan_ready(self, ev.a)
            self._dirty = True
        return []

    def _activity_mark(self) -> tuple[int, ...]:
        """Counters that move whenever anything happens: events handled (made minus queued), slot changes
        (role, readiness, presence, deadline), trajectory epochs and admissions, the pending queue, completions,
        the batch. Equal marks one tick apart (the tick itself aside) mean nothing happened in between. A plan
        landing (PLAN_READY) is not counted as an event: what it changes moves the other counters, and one
        that changes nothing is no progress (a policy whose every plan fails would otherwise never idle)."""
        q = self.q
        return (q._seq - len(q._heap) - self._plans_landed, self.slot_epoch, self._epoch, self._admit, self._pseq, self.n_pending,
                self.batch_left, self.batch)

    def _nothing_runs(self) -> bool:
        """No slot decodes and no trajectory is being prefilled or moved: only clocks (tool waits, switches,
        availability) can change the state, and a re-plan would see the same state at every tick."""
        if any(s.n_run for s in self.live):
            return False
        return not any(t.state in IN_FLIGHT for t in self.trajs)

    def _on_replan_tick(self, ev: Event) -> list[Event]:
        self._tick_pending = False
        if not self.batch_active:
            return []
        mark = self._activity_mark()
        # Idle: since the previous tick nothing but this tick was handled and its policy call changed nothing.
        self._idle_ticks = self._idle_ticks + 1 if mark == self._tick_mark else 0
        self._tick_mark = (mark[0] + 1, *mark[1:])  # the mark the next tick sees if nothing happens
        if self._idle_ticks >= IDLE_TICKS and self._nothing_runs():
            return self._skip_idle_ticks()
        out = self._invoke_policy("interval")
        return out + self._schedule_tick()

    def _skip_idle_ticks(self) -> list[Event]:
        """The tick after ``IDLE_TICKS`` idle ones: no policy call; the next tick is the first of the same grid
        at or after the next pending event (or the last one before the end time). Nothing pending, work left
        and no end time: ``NoProgressError``."""
        step = self.replan_interval_s
        heap = self.q._heap
        end = self.end_time
        if heap and heap[0][0] <= end and math.isfinite(heap[0][0]):
            k = max(1, math.ceil((heap[0][0] - self.now) / step))
        elif math.isfinite(end):
            k = math.floor((end - self.now) / step)  # the last tick dense ticking would reach
            if k < 1:
                self.recorder.count("idle_ticks_skipped")
                return []
        else:
            raise self._no_progress_error()
        # Policy calls not made: this tick's and those of the k - 1 ticks not scheduled.
        self.recorder.count("idle_ticks_skipped", k)
        self._tick_pending = True
        return [self.q.make(self.now + k * step, EvKind.REPLAN)]

    def _no_progress_error(self) -> NoProgressError:
        """Why the current batch cannot finish, for the user (see ``NoProgressError``)."""
        name = getattr(self.policy, "name", "?")
        sources = getattr(self.policy, "sources", None)
        left = [t for t in self.trajs if t.state != DONE]
        counts: dict[str, int] = {}
        for t in left:
            counts[STATE_NAMES[t.state]] = counts.get(STATE_NAMES[t.state], 0) + 1
        states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        usable = [s for s in self.live if sources is None or s.source in sources]
        serving = [s for s in usable if s.role in DECODING]
        only = "" if sources is None else " (it uses " + "/".join(sorted(x.value for x in sources)) + " GPUs only)"
        gpus_fix = ("give the policy GPUs it may use: --dedicated N >= 1 (static policies use dedicated GPUs only), "
                    "--lent N, or an availability trace that adds GPUs")
        if not self.live:
            why, fix = "no GPU is present", gpus_fix
        elif not usable:
            why, fix = f"none of the {len(self.live)} present GPUs is one policy {name} may use{only}", gpus_fix
        elif not serving:
            why, fix = f"policy {name} serves on none of the {len(usable)} GPUs it may use", gpus_fix
        else:
            waiting = [t for t in left if t.state in (PENDING, WAIT)]
            need = max((self.need_new(t) for t in waiting), default=0)
            free = max(self.free_for_new(s) for s in serving)
            headroom = max(getattr(self.policy, "kv_headroom", 0.0), getattr(self.policy, "critical_headroom", 0.0))
            keeps = f" (policy {name} keeps up to {headroom:.0%} of a GPU's KV free)" if headroom else ""
            why = (f"the waiting trajectories do not fit: the largest needs {need} KV tokens, the most a serving "
                   f"GPU of policy {name} has free is {free}{keeps}")
            fix = "use a GPU/model pair whose KV memory holds the longest trajectory, or shorten the workload"
        return NoProgressError(
            f"replay cannot progress at t={self.now:.0f} s: batch {self.batch} has {len(left)} of "
            f"{len(self.trajs)} trajectories left ({states}), {why}, and no pending event (arrival, lending, "
            "tool return, switch) can change that",
            fix=fix,
            policy=name, time=self.now, batch=self.batch, left=len(left),
        )

    def _schedule_tick(self) -> list[Event]:
        if self._tick_pending or not math.isfinite(self.replan_interval_s) or self.replan_interval_s <= 0:
            return []
        self._tick_pending = True
        return [self.q.make(self.now + self.replan_interval_s, EvKind.REPLAN)]

    def _invoke_policy(self, reason: str) -> list[Event]:
        """Ask for a policy re-invocation at the end of this instant (several asks at one instant: one call,
        their reasons joined by "+"); its commands' events land in ``_out``."""
        if self._replan_reason is None:
            self._replan_reason = reason
        elif reason not in self._replan_reason.split("+"):
            self._replan_reason += "+" + reason
        self._dirty = True
        return []

    # -- batches (called by the driver) ----------------------------------------------------------------------
    def start_batch(self, index: int, specs: Sequence[SimTraj], keys: Sequence[str], weights_version: int) -> list[Event]:
        """Start rollout batch ``index`` now with new weights: engines sync, trajectories become pending."""
        self.batch = index
        self.batch_start = self.now
        self.batch_active = True
        self.weights_version = weights_version
        self.trajs = [TrajState(i, sp, index, keys[i]) for i, sp in enumerate(specs)]
        if self._spec_k:
            self._spec_groups = {}
            self._spec_done = {}
            for t in self.trajs:
                self._spec_groups.setdefault(t.group, []).append(t.idx)
            for t in self.trajs:
                t.spec_a = self._spec_group_acceptance(len(self._spec_groups[t.group]), 0)
        if self._share:
            for t in self.trajs:
                t.share = t.spec.prompt_tokens
        for perf in {id(s.perf): s.perf for s in self.slots}.values():
            perf.prime(specs)
        if self.slots:
            self._folds = self.slots[0].perf.prime_folds(specs, self._fold)
        self.pending = []
        self.n_pending = 0
        self._phead = 0
        for t in self.trajs:
            self._enqueue(t)
        self.batch_left = len(self.trajs)
        self.recorder.batch_start(index, self.now, len(specs))
        out: list[Event] = []
        for s in self.slots:
            if s.present and s.role is not Role.OFF and s.engine is EngineState.WARM and s.weights < weights_version:
                out += self._action(s, s.perf.sync)
                s.weights = weights_version
        out += self._invoke_policy("batch")
        out += self._schedule_tick()
        if not self.trajs:
            self.batch_active = False
            out += self.driver.on_batch_done(self)
        return out

    # -- policy API ---------------------------------------------------------------------------------------------
    def _action(self, s: SlotState, seconds: float) -> list[Event]:
        if seconds <= 0:
            return []
        if s.n_run:
            self._stall(s, seconds)
        s.ready_at = max(s.ready_at, self.now) + seconds
        s.action_epoch += 1
        self._set_cat(s)
        if s.n_run:
            self._out_extend(self._reschedule(s))
        return [self.q.make(s.ready_at, EvKind.ACTION_DONE, s.idx, s.action_epoch)]

    def _out_extend(self, evs: list[Event]) -> None:
        self._out.extend(evs)

    def switch_seconds(self, s: SlotState, role: Role) -> float:
        """Seconds before ``s`` serves in ``role`` if switched now (0 for OFF or no change)."""
        if role is Role.OFF or (role is s.role and s.engine is EngineState.WARM):
            return 0.0
        sec = 0.0
        if s.engine is EngineState.NONE:
            sec += s.perf.cold_start
        else:
            if s.engine is EngineState.SLEEPING:
                sec += s.perf.wake
            if s.weights < self.weights_version:
                sec += s.perf.sync
        if role is not s.role and s.role is not Role.OFF:
            sec += self.cfg.role_switch_s
        return sec

    def set_role(self, slot: int, role: Role) -> None:
        """Policy command: ``slot`` serves ``role`` (starting/waking/syncing its engine as needed; the slot is
        unusable for that long). Trajectories on a slot whose new role does not decode lose their KV unless
        the policy migrated them first."""
        s = self.slots[slot]
        if not s.present or (role is s.role and (role is Role.OFF or s.engine is EngineState.WARM)):
            return
        self._set_role_now(s, role)

    def _set_role_now(self, s: SlotState, role: Role) -> None:
        sec = self.switch_seconds(s, role)
        cold = s.engine is EngineState.NONE and role is not Role.OFF
        old = s.role
        if Role.PREFILL in (old, role):
            self._pool_dirty = True
        if role is not Role.OFF:
            if s.engine is EngineState.NONE:
                s.weights = self.weights_version
            s.engine = EngineState.WARM
            s.weights = max(s.weights, self.weights_version)
        if not role.decodes and s.residents:
            for jdx in list(s.residents):
                self._out_extend(self._displace(self.trajs[jdx], lose_kv=True))
        if old is Role.PREFILL and role is not Role.PREFILL:
            s.role = role
            self._out_extend(self._rebook_prefill(s))
        s.role = role
        if role is Role.OFF:
            if s.engine is EngineState.WARM:
                s.engine = EngineState.SLEEPING
            if s.ready_at > self.now:
                s.ready_at = self.now
                s.action_epoch += 1
            if s.idx in self._starts:  # a start cut short (the slot left, or turned off)
                self._host_refresh()
        else:
            self.recorder.gpu_seconds_switch(sec * s.tp)
            self._out_extend(self._action(s, sec))
            if cold and sec > 0 and self.cfg.start_interference > 0:
                self._starts[s.idx] = s.action_epoch
                self._host_refresh()
        if role is Role.PREFILL:
            s.pf_busy = max(s.pf_busy, s.ready_at)
        self._set_cat(s)
        self._dirty = True

    def migrate(self, j: int, target: int, *, by_kv: bool) -> bool:
        """Policy command: move trajectory ``j`` to slot ``target``, by KV transfer or by re-prefill there.

        Returns False (nothing done) when j has no KV anywhere (then it is only marked ``preferred``), is
        in flight (prefill/transfer), or the target cannot take its KV now."""
        t = self.trajs[j]
        dst = self.slots[target]
        if t.state == DONE or not dst.present or not dst.role.decodes:
            return False
        t.preferred = target
        if t.slot == target or t.slot < 0 or not t.kv_ok or t.state in (PREFILL, MOVE):
            return False
        if by_kv:
            return self._move_kv(t, dst, "migrations_kv")
        self.recorder.count("migrations_reprefill")
        src = self.slots[t.slot]
        self._out_extend(self._displace(t, lose_kv=True))
        self._out_extend(self._drain_waiting(src))
        return True

    def _move_kv(self, t: TrajState, dst: SlotState, counter: str) -> bool:
        """Move t's KV (on its slot, ``kv_ok``) to ``dst`` by transfer: ``FastPerf.transfer`` seconds over the
        link between the two (same node or not), during which t is in MOVE (or keeps its tool call); the
        room is held on ``dst`` from now. False (nothing done) when ``dst`` cannot hold t's context now.
        Counted as ``counter``; its GPU-seconds as migration GPU-seconds. Events go to ``_out``."""
        if dst.kv_cap - dst.reserved + self.prefix_bonus(dst, t) < t.ctx:
            return False
        src = self.slots[t.slot]
        if t.state == RUN:
            self._interrupt(t)
            self._out_extend(self._reschedule(src))
        self._dequeue(t)
        xfer = src.perf.transfer(t.ctx, src.node == dst.node)
        was_tool = t.state == TOOL
        self._release(t)
        self._reserve(t, dst, t.ctx)
        self.recorder.count(counter)
        self.recorder.gpu_seconds_migrate(xfer * src.tp)
        self._out_extend(self._drain_waiting(src))
        if was_tool:
            t.kv_ok = True
            t.move_ready = self.now + xfer
            return True
        t.state = MOVE
        t.epoch = self._new_epoch()
        self._out_extend([self.q.make(self.now + xfer, EvKind.JOIN, t.idx, t.epoch)])
        return True

    def _chunk_done(self, j: TrajState, s: SlotState) -> list[Event]:
        """j decoded a whole chunk on s (divided rollout; it has left s's batch): credit it, then ask the
        policy where its next chunk runs (``chunk_move``): on s with its KV (no cost), or moved by KV transfer
        (``_move_kv``, migrate's path) or by re-prefill on the new slot (its KV here dropped)."""
        self._advance(j, j.seg_run)
        j.state = WAIT
        self.recorder.count("chunks")
        move = self._chunk_move(self, j.idx) if self._chunk_move is not None else None
        if move is None or move[0] == s.idx:
            return self._try_start(j, s)
        dst = self.slots[move[0]]
        if move[1]:
            # As for a new request, the engine may evict the KV of residents in tool calls to take it in.
            while self._evictable and dst.kv_cap - dst.reserved + self.prefix_bonus(dst, j) < j.ctx:
                victim = self._idle_victim(dst)
                if victim is None:
                    break
                self._evict(self.trajs[victim])
            if self._move_kv(j, dst, "chunk_moves_kv"):
                return []
        self.recorder.count("chunk_moves_reprefill")
        self._release(j)
        out = self._drain_waiting(s)
        j.state = WAIT
        return out + self._try_start(j, dst)

    def _enqueue(self, j: TrajState) -> None:
        """j waits for the policy to place it (FCFS position = now)."""
        j.state = PENDING
        if j.pseq:
            return
        self._pseq += 1
        j.pseq = self._pseq
        self.pending.append((j.pseq, j.idx))
        self.n_pending += 1
        self._dirty = True
        self.policy.enqueued(self, j.idx)

    def _dequeue(self, j: TrajState) -> None:
        if j.pseq:
            j.pseq = 0
            self.n_pending -= 1

    def iter_pending(self) -> Iterator[int]:
        """Pending trajectories in FCFS order (those queued during the iteration are not included)."""
        trajs = self.trajs
        pend = self.pending
        head = self._phead
        n = len(pend)
        while head < n and trajs[pend[head][1]].pseq != pend[head][0]:
            head += 1  # entries before the first valid one are stale for good (FCFS only appends)
        self._phead = head
        for i in range(head, n):
            seq, jdx = pend[i]
            if trajs[jdx].pseq == seq:
                yield jdx

    def pending_ids(self) -> list[int]:
        return list(self.iter_pending())

    def _dispatch(self) -> list[Event]:
        """Place pending trajectories: in the policy's order, each on the slot the policy picks, until one
        finds no slot (the queue's head blocks, as in an engine's FCFS admission)."""
        out: list[Event] = []
        trajs = self.trajs
        choose = self.policy.choose_slot
        for jdx in self.policy.order(self):
            j = trajs[jdx]
            if not j.pseq:
                continue
            sidx = choose(self, jdx)
            if sidx is None:
                break
            self._dequeue(j)
            j.state = WAIT
            out += self._try_start(j, self.slots[sidx])
            if j.pseq:  # did not fit after all: queued again
                break
        if len(self.pending) > 2 * self.n_pending + 64:
            self.pending = [e for e in self.pending if trajs[e[1]].pseq == e[0]]
            self._phead = 0
        return out

    # -- queries for policies ---------------------------------------------------------------------------------
    def need_new(self, j: TrajState) -> int:
        """KV tokens pending ``j``'s next turn takes (a slot admits it when its free KV minus the admission
        watermark covers this)."""
        k = j.turn
        return j.ctx + (0 if j.pf_done else j.pf[k]) + math.ceil(j.dec[k] - j.dec_done)

    def fits_new(self, s: SlotState, j: TrajState) -> bool:
        """Whether pending ``j`` could start its next turn on ``s`` now (KV, with the admission watermark)."""
        return self.free_for_new(s) + self.prefix_bonus(s, j) >= self.need_new(j)

    def prefix_bonus(self, s: SlotState, j: TrajState) -> int:
        """KV tokens of j's context already held on ``s`` for its group (``share_prompt``): the group's prompt
        (up to j's own) when any resident of its group is there, j itself included (held once per slot)."""
        if not j.share:
            return 0
        g = s.groups.get(j.group)
        return min(j.share, g[1]) if g is not None else 0

    def _sibling_prompt(self, j: TrajState, s: SlotState) -> int:
        """Prompt tokens j can take from a resident sibling's KV on ``s`` (0 unless ``share_prompt``)."""
        if not j.share:
            return 0
        g = s.groups.get(j.group)
        if g is None or g[0] - (1 if j.slot == s.idx else 0) <= 0:
            return 0
        return min(j.share, g[1])

    def free_for_new(self, s: SlotState) -> int:
        """KV tokens a new admission may take on ``s`` (free KV minus the admission watermark)."""
        if self._evictable:
            return s.kv_cap - s.reserved - s.watermark + s.idle
        return s.kv_cap - s.reserved - s.watermark

    def decode_slots(self) -> list[SlotState]:
        """Present slots whose role decodes and that are usable now."""
        now = self.now
        return [s for s in self.live if s.role in DECODING and s.ready_at <= now]

    def progress(self, j: TrajState) -> tuple[float, int, float, int]:
        """(tokens decoded so far, turns finished, tool seconds of finished turns, context now) of j, as an
        observer sees it (for RUN: the part of its segment done by now)."""
        if j.state != RUN:
            done_turns = j.turn
            return j.decoded, done_turns, sum(j.tool[:done_turns]), j.ctx
        s = self.slots[j.slot]
        v = s.V + (max(0.0, self.now - s.t_ref) / s.tau if s.n_run else 0.0)
        steps = min(j.seg_run, max(0.0, v - j.seg_V0))
        k, m = j.seg_k, j.seg_m
        left = steps - (j.dec[k] - j.seg_dec0)
        turns = k
        ctx = j.seg_ctx0 + steps
        while left >= 0 and turns < m:
            turns += 1
            ctx += j.pf[turns]
            left -= j.dec[turns]
        return j.decoded + steps, turns, sum(j.tool[:turns]), int(ctx)

    def info(self) -> dict[str, Any]:
        return {"events": self.n_events, "now": self.now, "slots": len(self.slots)}
