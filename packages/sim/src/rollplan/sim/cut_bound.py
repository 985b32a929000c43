"""A bound on the tokens of the batch a window's end cuts, coupling each trajectory's speed to the GPUs' time
and KV (``throughput_ceiling``'s last batch).

``bench_replay.traj_tokens_by`` bounds each trajectory of the cut batch alone: every one of them decodes at
batch 1 from the batch's earliest start. Summed over a batch of 2,048 trajectories that is ~170k tokens/s,
while the 24-40 GPUs of the bench decode ~10-20k. This module adds what that sum leaves out, for the same
simulator physics (``rollplan.sim.engine``): a GPU runs one step at a time; a decode step of ``b`` sequences
takes at least ``f + sum_j (m0 + kappa kv_j)`` (``StepEnvelope``, a lower envelope of the step table the
simulator uses); the prefill a segment carries is charged to its steps (``PrefillEnvelope``); each trajectory
decodes one token per step it is in, and holds its KV while it decodes.

Notations (one cut batch; tokens, seconds):

  W             the window: window end minus the batch's earliest start
  B_gpu         GPU-seconds any policy can have in the window (``window_gpu_seconds``)
  B_kv          KV-token-seconds: B_gpu times a GPU's KV capacity
  f, m0, kappa  ``StepEnvelope``: fixed seconds per step, per sequence, per sequence and KV token
  u             the least a co-running sequence adds to a step: m0 + kappa * (the batch's shortest prompt)
  P_i, G        trajectory i's prompt tokens; the samples per prompt (siblings on one GPU share the prompt)
  tau_i(n)      the second i's n-th token is decoded along its fastest course priced by the envelope at batch 1
                (``CourseGroup``s: each fold group's tokens at f + m0 + kappa c0, then its tool seconds)
  X_i           sum over the steps i decodes in of (b_s - 1): how many co-runners it waited on, step by step
  M_i(n)        sum over its first n tokens of m0 + kappa (c0 + c1) / 2 (what they add to their steps; c0
                the fold group's starting context, c1 the token's turn's end context) plus, per token, its
                fold group's share of the group's prefill (the simulator spreads a segment's prefill over its
                decode steps; the prompt counted 1/G per sample). A segment adds m0 + kappa times the mean of
                its start and end contexts to every step it is in (``rollplan.sim.batching.Batching.add``),
                and a segment holding a token of a turn starts at c0 or later and ends at c1 or later.
  K_i(n)        sum over its first n tokens of (f + m0 + kappa c0) * k_tok, k_tok = c1 - P_i + P_i / G with
                c1 the context the token's turn ends with: the KV-seconds its own step time holds (a segment
                reserves the context it ends with from its start, and ends no earlier than the turn it is
                in; the prompt's KV counted once per GPU, so 1/G of it each)
  k1_i          the least KV i holds while decoding: P_i / G plus its first turn's prefill and decode

Constraints every schedule meets, per trajectory i that decodes n_i tokens by the window's end:

  time:  tau_i(n_i) + u X_i <= W                         (its steps and tool waits are sequential)
         X_i <= (min(N, b_max) - 1) n_i                  (per step, the batch's other N - 1 trajectories at
                                                        most, and no more than a GPU's KV holds: ``max_batch``;
                                                        no other batch runs beside the cut one)
  GPU:   sum_i [f n_i^2 / (n_i + X_i) + M_i(n_i)] <= B_gpu (a step's fixed part split over its b_s members;
                                                        sum_s 1/b_s >= n^2 / sum_s b_s, Cauchy-Schwarz)
  KV:    sum_i [K_i(n_i) + u k1_i X_i] <= B_kv          (i's KV over its steps' time)
  GPU':  sum_i [f W_i(n_i) / C + M_i(n_i)] <= B_gpu       (a step's fixed part split by its members' KV, which
                                                        sums to at most C: f >= sum_j f w_j / C)

with C a GPU's KV capacity and W_i(n) the sum over i's first n tokens of w, the KV the token's turn ends with
(c1 - P_i + P_i / G, as in K_i), and ``n_i <= traj_tokens_by`` (the per-trajectory bound). Relaxing the GPU and KV rows with prices
``lam``, ``mu`` >= 0 gives, for every such pair, an upper bound on sum_i n_i (weak duality):

  lam B_gpu + mu B_kv + sum_i max_{n, X} [n - lam (f n^2 / (n + X) + M_i(n)) - mu (K_i(n) + u k1_i X)]

The inner maximum over X has a closed form; over n it is taken on a grid, each cell bounded by its top n
and the cost at its bottom (the cost rises with n), so the grid can only loosen the bound.
``cut_batch_bound`` returns the least such bound over a grid of prices, never more than the
per-trajectory sum (which is the bound at ``lam = mu = 0``), nor than the GPU' row alone: a fractional knapsack
of every turn's tokens (within each trajectory's per-trajectory bound) by their cost per token
``f w / C + M'`` (``_occupancy_bound``; taking tokens out of order only loosens it). The GPU and KV rows price
a co-runner at the least any sequence adds and at the first turn's KV, so they let a GPU's step be shared by
more sequences than its KV holds; the GPU' row charges the step's fixed part as a full GPU shares it, which is
what a GPU whose KV is full of long contexts gives each of them (``tests/sim/test_cut_bound.py``: exact on
identical trajectories).

Left out, so the bound stays valid and loose: re-prefill after eviction or a move, KV held during tool
waits, engine starts and switching, and the slowdown mixed prefill chunks add to co-running decodes. The
physics it assumes are the default simulator's: one GPU kind at tp 1, no speculative decoding (a step yields
one token per sequence) and no divided rollout; ``bench_replay.coupled_cut_bound_applies`` says when a
scenario differs, and the ceiling falls back to the per-trajectory bound there. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollplan.sim.engine import SimTraj

DecodeStep = Callable[[int, float], float]
PrefillTime = Callable[[float, float], float]

ENVELOPE_MAX_BATCH = 1024
"""The most co-running sequences the envelopes are built for. The simulator does not cap a slot's running set
at ``max_num_seqs`` (the policies do), but KV does (``max_batch``): the bench's batches allow ~400."""
N_GRID = 32
"""Points of each trajectory's token grid (0 to its per-trajectory bound); finer only tightens the bound."""
FINE_GRID = 256
"""Points of the grid the prices found on the ``N_GRID`` one are searched again on: each trajectory's cell is
then 1/255 of its range (the bound is within 1.6% of the closed form of ``tests/sim/test_cut_bound.py``'s 64
identical trajectories, ~1.3 s for a 2,048-trajectory batch here)."""
LAM_GRID = np.geomspace(1.0, 1e6, 25)
MU_GRID = np.concatenate(([0.0], np.geomspace(1e-8, 1e-1, 15)))
"""The prices tried (tokens per GPU-second, tokens per KV-token-second). Any pair gives a valid bound; the
least over these is reported, then refined around the best pair (``_refine``)."""


@dataclass(frozen=True, slots=True)
class StepEnvelope:
    """``fixed + b * per_seq + per_kv * b * kv_mean <= decode(b, kv_mean)`` on every batch size to
    ``ENVELOPE_MAX_BATCH`` and every KV bucket edge to ``max_context`` (the step table interpolates linearly
    between edges, so the edges suffice): the least a decode step of ``b`` sequences can take."""

    fixed: float
    per_seq: float
    per_kv: float

    def alone(self, ctx: float) -> float:
        """Seconds per token of one sequence at context ``ctx`` decoding alone (batch 1)."""
        return self.fixed + self.per_seq + self.per_kv * ctx

    def co_runner(self, ctx: float) -> float:
        """The least one more sequence at context >= ``ctx`` adds to a step."""
        return self.per_seq + self.per_kv * ctx


def step_envelope(decode: DecodeStep, max_context: int, kv_step: int = 512,
                  max_batch: int = ENVELOPE_MAX_BATCH) -> StepEnvelope:
    """The ``StepEnvelope`` of ``decode`` (the simulator's ``FastPerf.decode``), valid at every grid point by
    construction: the per-KV slope is the least rise per sequence-KV-token between neighbouring KV edges
    above the first bucket (the first bucket's rise is lower, and the intercepts absorb it); given it, the
    per-sequence slope is the least rise per added sequence of the residual ``decode - per_kv * b * kv``
    (at its least over the KV edges), and the fixed part the least residual left. Called once per ceiling;
    ~80k step-table lookups."""
    edges = np.arange(0, max_context + kv_step, kv_step, dtype=float)
    bs = np.arange(1, max_batch + 1)
    table = np.array([[decode(int(b), float(kv)) for kv in edges] for b in bs])
    local = (table[:, 2:] - table[:, 1:-1]) / (bs[:, None] * kv_step)
    per_kv = max(0.0, float(np.min(local))) if local.size else 0.0
    resid = (table - per_kv * bs[:, None] * edges[None, :]).min(axis=1)
    per_seq = float(np.min((resid[1:] - resid[0]) / (bs[1:] - 1))) if len(bs) > 1 else 0.0
    fixed = float(np.min(resid - bs * per_seq))
    return StepEnvelope(fixed, per_seq, per_kv)


@dataclass(frozen=True, slots=True)
class PrefillEnvelope:
    """``tokens * (per_token + per_ctx * cached) - tokens * overlap`` <= the GPU-seconds a prefill of ``tokens``
    over ``cached`` adds to the steps that carry it: ``per_token``, ``per_ctx`` a lower envelope of the chunk
    table (each chunk at least its tokens times ``per_token + per_ctx`` its cached context); ``overlap`` the
    most a mixed step saves per prefill token (``FastPerf.overlap(b) / (chunk - b)``, over the batch sizes a
    GPU's KV allows). A step is never cheaper than its decode alone, so the saving never exceeds that."""

    per_token: float
    per_ctx: float
    overlap: float

    def cost(self, tokens: float, cached: float) -> float:
        return max(0.0, tokens * (self.per_token + self.per_ctx * cached - self.overlap))


def prefill_envelope(prefill: PrefillTime, overlap: Callable[[int], float], chunk: int, max_context: int,
                     max_batch: int, p_step: int = 16, c_step: int = 1024) -> PrefillEnvelope:
    """The ``PrefillEnvelope`` of the simulator's ``FastPerf.prefill`` / ``overlap``: chunk sizes on the
    table's edges (``p_step``) to ``chunk``, cached contexts on its edges (``c_step``) to ``max_context`` plus
    the chunks after it; the table interpolates bilinearly between edges, so a bilinear envelope that holds at
    the edges holds between them. ~6k table lookups."""
    sizes = np.array(sorted(set(range(1, p_step)) | set(range(p_step, chunk + 1, p_step))), dtype=float)
    ctxs = np.arange(0, max_context + 4 * chunk + c_step, c_step, dtype=float)
    table = np.array([[prefill(float(n), float(c)) for c in ctxs] for n in sizes])
    per_ctx = max(0.0, float(np.min((table[:, 1:] - table[:, :-1]) / (sizes[:, None] * c_step))))
    per_token = max(0.0, float(np.min((table - per_ctx * sizes[:, None] * ctxs[None, :]) / sizes[:, None])))
    room = [(overlap(b), chunk - b) for b in range(1, min(max_batch, chunk - 1) + 1)]
    return PrefillEnvelope(per_token, per_ctx, max((s / r for s, r in room), default=0.0))


@dataclass(frozen=True, slots=True)
class CourseGroup:
    """One fold group of a trajectory's fastest course (``bench_replay.fastest_course``): its context when its
    first turn starts decoding (``ctx0``: prompt, every earlier token, that turn's new prefill), its decode
    tokens, decoded back to back, and the tool seconds waited after them."""

    ctx0: float
    tokens: int
    tool_s: float
    prefill: tuple[tuple[int, float], ...] = ()
    """(new tokens, cached context) of each turn's prefill in the group (the first group's first turn over its
    prompt; the prompt itself is ``_trajectory``'s)."""


def course_groups(spec: SimTraj, fold_s: float = 0.0) -> tuple[CourseGroup, ...]:
    """``spec``'s turns folded as the simulator folds them into segments: a group runs from a turn to the
    first whose tool wait exceeds ``fold_s``, or the last turn (see ``bench_replay.fastest_course``)."""
    pf, dec, tool = spec.prefill, spec.decode, spec.tool
    n = len(dec)
    ctx = float(spec.prompt_tokens)
    out: list[CourseGroup] = []
    k = 0
    while k < n:
        e = k
        while e < n - 1 and tool[e] <= fold_s:
            e += 1
        c0 = ctx + pf[k]
        tokens = 0
        pre: list[tuple[int, float]] = []
        for i in range(k, e + 1):
            pre.append((pf[i], ctx))
            ctx += pf[i] + dec[i]
            tokens += dec[i]
        out.append(CourseGroup(c0, tokens, float(sum(tool[k:e + 1])), tuple(pre)))
        k = e + 1
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Course:
    """One trajectory's course as the notations price it: per fold group its start second (``starts``), its
    seconds per token alone (``spt``), what each token adds to the GPU's time (``mc``: its co-runner part and
    its share of the group's prefill) and to KV-seconds (``kc``), and the cumulative tokens (``cum``)."""

    cum: np.ndarray
    starts: np.ndarray
    spt: np.ndarray
    mc: np.ndarray
    kc: np.ndarray
    k1: float
    kv: np.ndarray
    """Per turn: the KV each of its tokens holds (w in the notations; ``kc`` is it times ``spt``)."""

    def at(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tau, M, K) at token counts ``n``."""
        g = len(self.spt)
        idx = np.clip(np.searchsorted(self.cum, n, side="left") - 1, 0, g - 1)
        within = n - self.cum[idx]
        toks = np.diff(self.cum)
        m_cum = np.concatenate(([0.0], np.cumsum(toks * self.mc)))
        k_cum = np.concatenate(([0.0], np.cumsum(toks * self.kc)))
        return (self.starts[idx] + within * self.spt[idx], m_cum[idx] + within * self.mc[idx],
                k_cum[idx] + within * self.kc[idx])


def _course(spec: SimTraj, groups: Sequence[CourseGroup], env: StepEnvelope, pre: PrefillEnvelope | None,
            share: int) -> _Course:
    """``spec``'s ``_Course`` (see the notations), one entry per turn: a turn's tokens are priced at its fold
    group's seconds per token (``spt``) and its share of the group's prefill, add to their steps at least the
    co-runner cost at the mean of the group's starting context and the turn's end context (``mc``), and each
    holds, while it decodes, at least the context its turn ends with (``kc``): a segment reserves the context it
    ends with when it starts (``rollplan.sim.lifecycle.Lifecycle.start_segment``), and every segment holds at
    least its first turn."""
    p = float(spec.prompt_tokens)
    starts, spt, mc, kc, kv, toks = [], [], [], [], [], []
    t = 0.0
    turn = 0
    ctx = p
    for g in groups:
        a = env.alone(g.ctx0)
        charge = 0.0
        if pre is not None and g.tokens > 0:
            # the simulator charges a segment's prefill over its decode steps: per token, its share
            charge = sum(pre.cost(n, c) for n, c in g.prefill) + (pre.cost(p / share, 0.0) if not mc else 0.0)
        pre_share = charge / g.tokens if g.tokens > 0 else 0.0
        for _ in g.prefill:  # one entry per turn of the group, in order
            d = spec.decode[turn]
            ctx += spec.prefill[turn] + d
            starts.append(t)
            spt.append(a)
            mc.append(env.co_runner((g.ctx0 + ctx) / 2.0) + pre_share)
            kv.append(ctx - p + p / share)
            kc.append(a * kv[-1])
            toks.append(float(d))
            t += d * a
            turn += 1
        t += g.tool_s
    cum = np.concatenate(([0.0], np.cumsum(toks)))
    first = (spec.prefill[0] + spec.decode[0]) if len(spec.decode) else 0.0
    return _Course(cum, np.array(starts), np.array(spt), np.array(mc), np.array(kc), p / share + first,
                   np.array(kv))


@dataclass(frozen=True, slots=True)
class _Stacked:
    n: np.ndarray  # (trajectories, points), each row rising
    slack: np.ndarray  # max X at each n: min((W - tau) / u, co_max n), >= 0
    m: np.ndarray
    k: np.ndarray
    k1: np.ndarray  # (trajectories, 1)


def _token_costs(courses: Sequence[_Course], caps: Sequence[float], fixed: float,
                 kv_capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per turn of every course, within its trajectory's cap: (tokens, GPU-seconds per token of work, prefill
    and co-runner cost ``M'``, GPU-seconds per token of fixed step time by KV occupancy ``fixed * w / C``)."""
    toks, work, occ = [], [], []
    for c, cap in zip(courses, caps, strict=True):
        toks.append(np.clip(cap - c.cum[:-1], 0.0, np.diff(c.cum)))
        work.append(c.mc)
        occ.append(fixed * c.kv / kv_capacity)
    if not toks:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    return np.concatenate(toks), np.concatenate(work), np.concatenate(occ)


def _occupancy_bound(n: np.ndarray, k: np.ndarray, gpu_seconds: float) -> float:
    """The GPU' row alone (module docstring): the most of the tokens ``n``, at ``k`` GPU-seconds each
    (``_token_costs``' work plus fixed part), that fit in ``gpu_seconds``, taken cheapest first (a fractional
    knapsack)."""
    if not len(n):
        return 0.0
    order = np.argsort(k, kind="stable")
    n, k = n[order], k[order]
    spent = np.cumsum(n * k)
    full = int(np.searchsorted(spent, gpu_seconds, side="right"))
    got = float(n[:full].sum())
    if full < len(n) and k[full] > 0.0:
        got += min(float(n[full]), (gpu_seconds - (float(spent[full - 1]) if full else 0.0)) / float(k[full]))
    elif full < len(n):
        got += float(n[full:].sum())
    return got


def _stack(courses: Sequence[_Course], n: np.ndarray, window_s: float, u: float, co_max: float) -> _Stacked:
    rows = [c.at(row) for c, row in zip(courses, n, strict=True)]
    tau = np.stack([r[0] for r in rows])
    return _Stacked(n, np.minimum(np.maximum(window_s - tau, 0.0) / u, co_max * n), np.stack([r[1] for r in rows]),
                    np.stack([r[2] for r in rows]), np.array([[c.k1] for c in courses]))


def _cells(st: _Stacked, env: StepEnvelope, u: float, lam: float, mu: float) -> np.ndarray:
    """Per trajectory and grid cell [n_a, n_b], an upper bound on n - (its least priced cost) over the cell:
    n_b - cost(n_a), the cost rising with n (see the module docstring)."""
    n, f = st.n, env.fixed
    if lam > 0.0 and mu > 0.0:
        ratio = np.sqrt(lam * f / (mu * u * np.maximum(st.k1, 1e-12)))
        x = np.clip(n * ratio - n, 0.0, st.slack)
    elif lam > 0.0:
        x = st.slack
    else:
        x = np.zeros_like(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        fixed_part = np.where(n > 0.0, f * n * n / np.maximum(n + x, 1e-300), 0.0)
    cost = lam * (fixed_part + st.m) + mu * (st.k + u * st.k1 * x)
    return n[:, 1:] - cost[:, :-1]


def _dual(st: _Stacked, env: StepEnvelope, u: float, b_gpu: float, b_kv: float, lam: float, mu: float) -> float:
    """The bound at prices (``lam``, ``mu``): see the module docstring (n = 0 gives 0)."""
    best = np.maximum(_cells(st, env, u, lam, mu).max(axis=1), 0.0)
    return float(lam * b_gpu + mu * b_kv + best.sum())


def max_batch(specs: Sequence[SimTraj], kv_capacity: float, share: int) -> int:
    """The most of ``specs`` one GPU of ``kv_capacity`` KV tokens can hold at once: each holds at least its
    first turn's context beyond the prompt, and its group's prompt is held once per GPU, so at least
    ``1/share`` of it each (``rollplan.sim.kv``)."""
    least = min((sp.prompt_tokens / max(share, 1) + (sp.prefill[0] if len(sp.prefill) else 0) for sp in specs),
                default=0.0)
    return max(1, int(kv_capacity // least)) if least > 0 else 1 << 30


@dataclass(frozen=True, slots=True)
class CutBatchBound:
    """``cut_batch_bound``'s result: the bound on the cut batch's decode tokens (``tokens``), the per-trajectory
    count it never exceeds (``alone``), the window's GPU-seconds (``gpu_seconds``), and what decoding every
    token the per-trajectory count allows would cost under the GPU' row: work, prefill and co-runner cost
    (``work_gpu_s``) and fixed step time split by KV occupancy (``fixed_gpu_s``). Their sum above
    ``gpu_seconds`` says the GPUs bind; below it, only the per-trajectory courses and the other rows can."""

    tokens: float
    alone: float
    gpu_seconds: float
    work_gpu_s: float
    fixed_gpu_s: float


def cut_batch_tokens_bound(specs: Sequence[SimTraj], per_traj_cap: Sequence[float], env: StepEnvelope, *,
                           window_s: float, gpu_seconds: float, kv_capacity: float, share: int,
                           prefill: PrefillEnvelope | None = None, fold_s: float = 0.0,
                           points: int = N_GRID) -> float:
    """``cut_batch_bound``'s tokens."""
    return cut_batch_bound(specs, per_traj_cap, env, window_s=window_s, gpu_seconds=gpu_seconds,
                           kv_capacity=kv_capacity, share=share, prefill=prefill, fold_s=fold_s, points=points).tokens


def cut_batch_bound(specs: Sequence[SimTraj], per_traj_cap: Sequence[float], env: StepEnvelope, *,
                    window_s: float, gpu_seconds: float, kv_capacity: float, share: int,
                    prefill: PrefillEnvelope | None = None, fold_s: float = 0.0,
                    points: int = N_GRID) -> CutBatchBound:
    """An upper bound on the decode tokens any policy gets from the cut batch ``specs`` in the ``window_s``
    seconds from its earliest start (module docstring), with ``gpu_seconds`` of GPUs of ``kv_capacity`` KV
    tokens each in that window; ``per_traj_cap``: each trajectory's ``traj_tokens_by``; ``share``: samples
    per prompt sharing its KV on a GPU (1 without prompt sharing). Never more than ``sum(per_traj_cap)``.
    Callers: ``bench_replay.cut_batch_bound``, once per ceiling whose window cuts a batch (~1-2 s for a batch
    of 2,048 trajectories here)."""
    whole = float(sum(per_traj_cap))
    if not specs or window_s <= 0.0:
        return CutBatchBound(0.0 if window_s <= 0.0 else whole, whole, gpu_seconds, 0.0, 0.0)
    u = max(env.co_runner(float(min(sp.prompt_tokens for sp in specs))), 1e-12)
    courses = [_course(sp, course_groups(sp, fold_s), env, prefill, max(share, 1)) for sp in specs]
    # Co-runners per step: the batch's other trajectories that fit on a GPU with it (no other batch runs then).
    co_max = float(max(0, min(len(specs), max_batch(specs, kv_capacity, max(share, 1))) - 1))
    st = _stack(courses, np.linspace(0.0, np.asarray(per_traj_cap, dtype=float), points, axis=1), window_s, u,
                co_max)
    b_gpu, b_kv = gpu_seconds, gpu_seconds * kv_capacity
    n_tok, work, occ = _token_costs(courses, per_traj_cap, env.fixed, kv_capacity)
    occupancy = _occupancy_bound(n_tok, work + occ, b_gpu)
    best, lam, mu = whole, 0.0, 0.0
    for lam_try in LAM_GRID:
        for mu_try in MU_GRID:
            v = _dual(st, env, u, b_gpu, b_kv, float(lam_try), float(mu_try))
            if v < best:
                best, lam, mu = v, float(lam_try), float(mu_try)
    if lam > 0.0:
        lam, mu, best = _refine(st, env, u, b_gpu, b_kv, lam, mu, best)
        st = _stack(courses, np.linspace(0.0, np.asarray(per_traj_cap, dtype=float), FINE_GRID, axis=1), window_s, u,
                    co_max)
        lam, mu, v = _refine(st, env, u, b_gpu, b_kv, lam, mu, _dual(st, env, u, b_gpu, b_kv, lam, mu))
        best = min(best, v)
    return CutBatchBound(min(best, whole, occupancy), whole, gpu_seconds, float(n_tok @ work), float(n_tok @ occ))


def _refine(st: _Stacked, env: StepEnvelope, u: float, b_gpu: float, b_kv: float, lam: float, mu: float,
            value: float) -> tuple[float, float, float]:
    """A shrinking multiplicative pattern search from the best grid pair; returns the best pair found and its
    bound (every pair tried gives a valid bound, so the least one found is)."""
    step = 2.0
    for _ in range(40):
        improved = False
        for dl, dm in ((step, 1.0), (1.0 / step, 1.0), (1.0, step), (1.0, 1.0 / step)):
            cand_l, cand_m = lam * dl, mu * dm
            v = _dual(st, env, u, b_gpu, b_kv, cand_l, cand_m)
            if v < value:
                lam, mu, value, improved = cand_l, cand_m, v, True
        if not improved:
            step = math.sqrt(step)
            if step < 1.01:
                break
    return lam, mu, value
