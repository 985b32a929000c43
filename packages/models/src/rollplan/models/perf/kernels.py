"""Kernel-level time models: one forward pass is a sum of kernels (see ``compose``).

A ``Kernels`` object answers "how long does this one kernel take": a GEMM ``(m, n, k)``, one layer's
attention in a decode step or a prefill, one layer's elementwise ops, a tensor-parallel all-reduce, and the
fixed per-step overhead outside the GPU kernels. Three implementations share the ``compose`` functions:

- ``RooflineKernels``: max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth) per kernel, from ``GpuKind``.
- ``FittedKernels`` (built by ``CalibratedPerfModel``): fitted forms below, falling back to the roofline
  kernel for every term the calibration did not measure.
- the measured-table reference in ``rollplan.models.perf.fit`` (only for reporting errors).

Every fitted form is ``launch + smooth_max(term_1, term_2, ...)`` with each term a non-negative rate times a
size that grows with ``m``, ``n``, ``k``, batch or context: so every kernel time is monotone non-decreasing in
every size (physics: more work never takes less time), by construction rather than by check.
All functions here are pure Python (no numpy) so the planner and simulator can call them in tight loops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollplan.models.specs import GpuKind


def smooth_max(terms: Sequence[float], p: float) -> float:
    """The p-norm of non-negative ``terms``: ``max`` as p -> inf, the sum at p = 1 (a smooth roofline knee)."""
    if p <= 1.0:
        return float(sum(terms))
    top = max(terms)
    if top <= 0.0:
        return 0.0
    return top * sum((t / top) ** p for t in terms) ** (1.0 / p)


def causal_tile_pairs(new: float, cached: float, tile: float) -> float:
    """Attention tiles (``tile`` x ``tile`` query/key blocks) a causal flash-attention kernel computes for one
    sequence adding ``new`` tokens after ``cached`` ones: every new query block sees all cached key blocks and
    the causal triangle of new key blocks. Partly empty tiles cost a full tile, hence the ceilings."""
    if new <= 0:
        return 0.0
    nq = math.ceil(new / tile)
    nc = math.ceil(cached / tile) if cached > 0 else 0
    return nq * nc + nq * (nq + 1) / 2.0


class Kernels(Protocol):
    """Per-kernel times in seconds. Sizes: ``m`` tokens, ``n`` x ``k`` weight matrix; heads are per GPU."""

    def gemm(self, m: float, n: int, k: int, dtype_bytes: int) -> float: ...

    def attn_decode(
        self, batch: int, kv_tokens: float, q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float: ...

    def attn_prefill(
        self, new: Sequence[int], cached: Sequence[int], q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float: ...

    def elementwise(self, tokens: float, hidden: int, qk_width: int, ffn_width: int, dtype_bytes: int) -> float: ...

    def allreduce(self, nbytes: float, tp: int) -> float: ...

    def step_overhead(self, batch: int) -> float: ...


# --- roofline -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RooflineKernels:
    """First-principles kernel times: max(compute, memory) per kernel plus a launch latency.

    ``mfu``/``mbu``: achieved fractions of peak FLOP/s and HBM bandwidth (typical vLLM on Hopper; the
    calibrated fits measured about 0.8 and 0.85 on H100, see docs/perf.md). ``overhead_s`` and
    ``overhead_per_seq_s``: scheduler, sampling and host-side work per engine step.
    """

    gpu: GpuKind
    mfu: float = 0.6
    mbu: float = 0.8
    launch_s: float = 4e-6
    overhead_s: float = 2.0e-3
    overhead_per_seq_s: float = 0.0
    allreduce_latency_s: float = 8e-6

    def _roof(self, flops: float, nbytes: float) -> float:
        return self.launch_s + max(flops / (self.gpu.bf16_flops * self.mfu), nbytes / (self.gpu.hbm_bandwidth * self.mbu))

    def gemm(self, m: float, n: int, k: int, dtype_bytes: int) -> float:
        return self._roof(2.0 * m * n * k, (n * k + m * k + m * n) * dtype_bytes)

    def attn_decode(
        self, batch: int, kv_tokens: float, q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float:
        ctx = kv_tokens + 1.0
        flops = 4.0 * batch * q_heads * head_dim * ctx
        nbytes = batch * ctx * 2 * kv_heads * head_dim * dtype_bytes
        return self._roof(flops, nbytes)

    def attn_prefill(
        self, new: Sequence[int], cached: Sequence[int], q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float:
        flops = sum(4.0 * q_heads * head_dim * n * (c + n / 2.0) for n, c in zip(new, cached, strict=True))
        nbytes = sum((n * (q_heads + 2 * kv_heads) + c * 2 * kv_heads) * head_dim for n, c in zip(new, cached, strict=True))
        return self._roof(flops, nbytes * dtype_bytes)

    def elementwise(self, tokens: float, hidden: int, qk_width: int, ffn_width: int, dtype_bytes: int) -> float:
        # Two RMSNorms and two residual adds (read+write hidden), RoPE on q and k, SiLU*mul on the FFN.
        nbytes = tokens * dtype_bytes * (8 * hidden + 2 * qk_width + 3 * ffn_width)
        return 5 * self.launch_s + nbytes / (self.gpu.hbm_bandwidth * self.mbu)

    def allreduce(self, nbytes: float, tp: int) -> float:
        if tp <= 1:
            return 0.0
        return self.allreduce_latency_s + 2.0 * (tp - 1) / tp * nbytes / self.gpu.nvlink_bandwidth

    def step_overhead(self, batch: int) -> float:
        return self.overhead_s + self.overhead_per_seq_s * batch


# --- fitted forms (stored in calibration JSON) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GemmFit:
    """``launch + smooth_max(weight bytes / weight_bw + activation bytes / act_bw, 2mnk / flops, p)``."""

    launch_s: float
    flops_per_s: float
    weight_bytes_per_s: float
    act_bytes_per_s: float
    p: float

    def time(self, m: float, n: int, k: int, dtype_bytes: int) -> float:
        memory = n * k * dtype_bytes / self.weight_bytes_per_s + m * (n + k) * dtype_bytes / self.act_bytes_per_s
        return self.launch_s + smooth_max((memory, 2.0 * m * n * k / self.flops_per_s), self.p)


@dataclass(frozen=True, slots=True)
class DecodeAttnFit:
    """One layer of paged decode attention: ``launch + smooth_max(batch * q_heads * per_seq_head_s,
    KV bytes read / kv_bytes_per_s, p)``."""

    launch_s: float
    per_seq_head_s: float
    kv_bytes_per_s: float
    p: float

    def time(self, batch: int, kv_tokens: float, q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> float:
        kv_bytes = batch * (kv_tokens + 1.0) * 2 * kv_heads * head_dim * dtype_bytes
        return self.launch_s + smooth_max((batch * q_heads * self.per_seq_head_s, kv_bytes / self.kv_bytes_per_s), self.p)


@dataclass(frozen=True, slots=True)
class PrefillAttnFit:
    """One layer of causal flash attention over a prefill batch: ``launch + smooth_max(tile FLOPs / flops,
    q/k/v bytes / io_bw, sequences * per_seq_s, p)`` with tile FLOPs = 4 * heads * head_dim * tile^2 *
    ``causal_tile_pairs`` (short sequences waste most of a tile, which is why small prompts run slowly)."""

    launch_s: float
    flops_per_s: float
    io_bytes_per_s: float
    per_seq_s: float
    tile: int
    p: float

    def time(
        self, new: Sequence[int], cached: Sequence[int], q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float:
        t2 = float(self.tile * self.tile)
        flops = sum(4.0 * q_heads * head_dim * t2 * causal_tile_pairs(n, c, self.tile) for n, c in zip(new, cached, strict=True))
        io = sum((n * (q_heads + 2 * kv_heads) + c * 2 * kv_heads) * head_dim for n, c in zip(new, cached, strict=True))
        seqs = sum(1 for n in new if n > 0)
        terms = (flops / self.flops_per_s, io * dtype_bytes / self.io_bytes_per_s, seqs * self.per_seq_s)
        return self.launch_s + smooth_max(terms, self.p)


@dataclass(frozen=True, slots=True)
class ElementwiseFit:
    """One layer's norms, residual adds, RoPE and activation: ``launch + tokens * (hidden * hidden_s +
    qk_width * qk_s + ffn_width * ffn_s)`` (memory-bound, linear in tokens; coefficients >= 0)."""

    launch_s: float
    hidden_s: float
    qk_s: float
    ffn_s: float

    def time(self, tokens: float, hidden: int, qk_width: int, ffn_width: int) -> float:
        return self.launch_s + tokens * (hidden * self.hidden_s + qk_width * self.qk_s + ffn_width * self.ffn_s)


@dataclass(frozen=True, slots=True)
class Curve:
    """A monotone non-decreasing piecewise-linear curve in log-log space through (x, y) knots.

    Below the first knot: y[0] (a latency floor). Above the last: linear in x with the last segment's slope
    in linear space (bandwidth-bound transfers grow linearly with size).
    """

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.x or len(self.x) != len(self.y):
            raise ValueError("a curve needs as many y as x values, at least one")
        if any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)) or self.x[0] <= 0:
            raise ValueError("curve x values must be positive and strictly increasing")
        if any(b < a for a, b in zip(self.y, self.y[1:], strict=False)) or self.y[0] <= 0:
            raise ValueError("curve y values must be positive and non-decreasing")

    def __call__(self, x: float) -> float:
        xs, ys = self.x, self.y
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            if len(xs) < 2:
                return ys[-1]
            dx = xs[-1] - xs[-2]
            slope = max((ys[-1] - ys[-2]) / dx, 0.0) if dx > 0 else 0.0
            return ys[-1] + slope * (x - xs[-1])
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if xs[mid] <= x:
                lo = mid
            else:
                hi = mid
        span = math.log(xs[hi]) - math.log(xs[lo])
        if span <= 0.0:
            return ys[hi]
        f = (math.log(x) - math.log(xs[lo])) / span
        return math.exp(math.log(ys[lo]) + f * (math.log(ys[hi]) - math.log(ys[lo])))


@dataclass(frozen=True, slots=True)
class FittedKernels:
    """``Kernels`` from fitted forms; any form that is ``None`` (not measured) falls back to ``roofline``."""

    roofline: RooflineKernels
    gemm_fit: GemmFit | None = None
    decode_fit: DecodeAttnFit | None = None
    prefill_fit: PrefillAttnFit | None = None
    elementwise_fit: ElementwiseFit | None = None
    allreduce_curves: tuple[tuple[int, Curve], ...] = ()
    overhead_s: float | None = None
    overhead_per_seq_s: float | None = None

    def gemm(self, m: float, n: int, k: int, dtype_bytes: int) -> float:
        if self.gemm_fit is None:
            return self.roofline.gemm(m, n, k, dtype_bytes)
        return self.gemm_fit.time(m, n, k, dtype_bytes)

    def attn_decode(
        self, batch: int, kv_tokens: float, q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float:
        if self.decode_fit is None:
            return self.roofline.attn_decode(batch, kv_tokens, q_heads, kv_heads, head_dim, dtype_bytes)
        return self.decode_fit.time(batch, kv_tokens, q_heads, kv_heads, head_dim, dtype_bytes)

    def attn_prefill(
        self, new: Sequence[int], cached: Sequence[int], q_heads: int, kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> float:
        if self.prefill_fit is None:
            return self.roofline.attn_prefill(new, cached, q_heads, kv_heads, head_dim, dtype_bytes)
        return self.prefill_fit.time(new, cached, q_heads, kv_heads, head_dim, dtype_bytes)

    def elementwise(self, tokens: float, hidden: int, qk_width: int, ffn_width: int, dtype_bytes: int) -> float:
        if self.elementwise_fit is None:
            return self.roofline.elementwise(tokens, hidden, qk_width, ffn_width, dtype_bytes)
        return self.elementwise_fit.time(tokens, hidden, qk_width, ffn_width)

    def allreduce(self, nbytes: float, tp: int) -> float:
        if tp <= 1:
            return 0.0
        for t, curve in self.allreduce_curves:
            if t == tp:
                return curve(nbytes)
        return self.roofline.allreduce(nbytes, tp)

    def step_overhead(self, batch: int) -> float:
        fixed = self.roofline.overhead_s if self.overhead_s is None else self.overhead_s
        per_seq = self.roofline.overhead_per_seq_s if self.overhead_per_seq_s is None else self.overhead_per_seq_s
        return fixed + per_seq * batch
