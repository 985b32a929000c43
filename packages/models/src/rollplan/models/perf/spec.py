"""Decode with speculation: one verify step's cost and the tokens it yields (docs/seer.md).

A speculative decode step drafts ``k`` tokens per sequence and verifies them in one forward pass of ``k + 1``
query tokens per sequence (the drafts plus the token after the last accepted one, which the target model
samples anyway). With i.i.d. acceptance ``a`` per drafted token, a step yields on average

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)      (k + 1 at a = 1)

tokens per sequence, so a sequence's time per token is ``verify_step_time / E(a, k)``.

The verify step is priced by the engine's step-time model (``PerfModel.step_time``): ``batch`` decoding
sequences that read their KV (``batch * kv_tokens``), plus the ``batch * k`` drafted tokens as one extra chunk
on top of one sequence's context. The linear layers then run over exactly ``batch * (k + 1)`` tokens (weights
read once); each sequence's KV is read once (a fused attention kernel serves all of a sequence's queries from
one read); the drafted tokens' attention FLOPs are approximated by one chunk's (slightly high when
``batch * k`` is not small next to ``kv_tokens``). ``k = 0`` is a plain decode step.

Contracts: ``expected_tokens_per_step`` is 1 at ``a = 0``, ``k + 1`` at ``a = 1``, non-decreasing in ``a`` and
``k``. ``speculative_step`` never gets slower per token when acceptance rises; at ``a = 0`` every token costs a
whole verify step. Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rollplan.models.errors import SchemaError
from rollplan.models.perf.base import PerfModel
from rollplan.models.specs import GpuKind, ModelSpec


def _check(acceptance: float, k: int) -> None:
    if not (isinstance(acceptance, int | float) and math.isfinite(acceptance) and 0.0 <= acceptance <= 1.0):
        raise SchemaError("acceptance", f"must be a number in [0, 1], got {acceptance!r}",
                          fix="pass the fraction of drafted tokens accepted, e.g. 0.7")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise SchemaError("draft length k", f"must be an integer >= 0, got {k!r}",
                          fix="pass the number of speculative tokens per step (0: no speculation)")


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """E(a, k) = (1 - a^(k+1)) / (1 - a): tokens a sequence gains per verify step (i.i.d. acceptance)."""
    _check(acceptance, k)
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def verify_step_time(perf: PerfModel, batch: int, kv_tokens: float, k: int) -> float:
    """One verify step of ``batch`` sequences with ``kv_tokens`` KV tokens each and ``k`` drafts each:
    ``k + 1`` query tokens per sequence (module docstring). ``k = 0``: ``perf.decode_step_time``."""
    _check(0.0, k)
    kv_sum = batch * kv_tokens
    if k == 0:
        return perf.step_time(0, 0, batch, kv_sum)
    return perf.step_time(batch * k, round(kv_tokens), batch, kv_sum)


@dataclass(frozen=True, slots=True)
class SpecStep:
    """A speculative decode step: ``step_s`` seconds, ``tokens_per_step`` per sequence (E(a, k)),
    ``seconds_per_token`` per sequence, and ``speedup`` over plain decoding of the same batch (> 1: faster)."""

    k: int
    acceptance: float
    step_s: float
    tokens_per_step: float
    seconds_per_token: float
    speedup: float


def speculative_step(perf: PerfModel, batch: int, kv_tokens: float, acceptance: float, k: int) -> SpecStep:
    """The decode step of ``batch`` sequences with draft length ``k`` at acceptance ``acceptance``."""
    tokens = expected_tokens_per_step(acceptance, k)
    step = verify_step_time(perf, batch, kv_tokens, k)
    plain = perf.step_time(0, 0, batch, batch * kv_tokens)
    per_token = step / tokens
    return SpecStep(k, float(acceptance), step, tokens, per_token, plain / per_token if per_token > 0 else 1.0)


def best_draft_length(perf: PerfModel, batch: int, kv_tokens: float, acceptance: float, k_max: int = 8) -> SpecStep:
    """The draft length in ``0..k_max`` with the least time per token (ties: the shorter draft); ``k = 0``
    (no speculation) wins whenever drafting does not pay, e.g. at low acceptance on a compute-bound batch."""
    steps = [speculative_step(perf, batch, kv_tokens, acceptance, k) for k in range(k_max + 1)]
    return min(steps, key=lambda s: (s.seconds_per_token, s.k))


@dataclass(frozen=True, slots=True)
class SpeculativePerf:
    """``inner`` (a PerfModel) on engines that speculate: decode priced per produced token.

    ``decode_step_time(b, kv)`` is a sequence's seconds per token, ``speculative_step(...).seconds_per_token``
    at ``acceptance`` and the draft length that is fastest per token in ``0..k`` (``best_draft_length``;
    ``adaptive=False``: always ``k``), so k = 0 (the plain step) wherever drafting does not pay. A mixed step
    (``step_time`` with decodes) has its decode part priced the same way: ``inner.step_time(...) -
    inner.decode_step_time(b, kv) + decode_step_time(b, kv)``, so what a prefill chunk adds to a step is the
    inner model's and ``step_time(0, 0, b, b * kv) == decode_step_time(b, kv)`` still holds. Everything else is
    ``inner``'s. Meant for the planner (a ``PerfProvider`` returning it): every decode token it prices is then
    one a speculating engine produces, faster the smaller the batch (memory-bound steps), as the simulator's
    slots decode with ``SimConfig.spec_tokens`` (docs/seer.md). Pure; ``acceptance`` and ``k`` are checked."""

    inner: PerfModel
    acceptance: float
    k: int
    adaptive: bool = True

    def __post_init__(self) -> None:
        _check(self.acceptance, self.k)

    @property
    def gpu(self) -> GpuKind:
        return self.inner.gpu

    @property
    def model(self) -> ModelSpec:
        return self.inner.model

    @property
    def tp(self) -> int:
        return self.inner.tp

    def _step(self, batch: int, kv_tokens: float) -> SpecStep:
        if self.adaptive:
            return best_draft_length(self.inner, batch, kv_tokens, self.acceptance, self.k)
        return speculative_step(self.inner, batch, kv_tokens, self.acceptance, self.k)

    def decode_step_time(self, batch: int, kv_tokens: float) -> float:
        if batch <= 0 or self.k == 0:
            return self.inner.decode_step_time(batch, kv_tokens)
        return self._step(batch, kv_tokens).seconds_per_token

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        base = self.inner.step_time(prefill_tokens, prefill_context, decode_seqs, decode_kv_tokens)
        if decode_seqs <= 0 or self.k == 0:
            return base
        kv = decode_kv_tokens / decode_seqs
        return base - self.inner.decode_step_time(decode_seqs, kv) + self.decode_step_time(decode_seqs, kv)

    def prefill_time(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        return self.inner.prefill_time(prompt_tokens, cached_tokens)

    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int:
        return self.inner.kv_capacity_tokens(mem_util)

    def kv_capacity_seqs(self, context_tokens: float, mem_util: float = 0.9) -> int:
        return self.inner.kv_capacity_seqs(context_tokens, mem_util)

    def kv_transfer_time(self, tokens: int, same_node: bool) -> float:
        return self.inner.kv_transfer_time(tokens, same_node)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()

    def cold_start_time(self) -> float:
        return self.inner.cold_start_time()

    def wake_time(self) -> float:
        return self.inner.wake_time()

    def weight_sync_time(self, same_node: bool = False) -> float:
        return self.inner.weight_sync_time(same_node)

    def reprefill_time(self, context_tokens: int) -> float:
        return self.inner.reprefill_time(context_tokens)
