"""The performance-model protocol: per-phase time estimators for one (GPU kind, model, TP degree).

Callers: the planner (once per distinct slot type per solve), the simulator (on every batch change), the CLI.
All methods are pure and fast (no I/O); times are seconds, sizes bytes or tokens.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from rollplan.models.errors import UserInputError
from rollplan.models.specs import GpuKind, ModelSpec


@runtime_checkable
class PerfModel(Protocol):
    """Per-phase estimators for one engine: ``tp`` GPUs of ``gpu`` running ``model``."""

    @property
    def gpu(self) -> GpuKind: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def tp(self) -> int: ...

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        """One forward pass of a mixed batch (vLLM chunked prefill): a prefill chunk of ``prefill_tokens`` new
        tokens on top of ``prefill_context`` tokens already in KV, batched with ``decode_seqs`` decoding
        sequences that read ``decode_kv_tokens`` KV tokens in all (summed over them). The linear layers run
        once over ``prefill_tokens + decode_seqs`` tokens, so a mixed step costs less than a decode step plus
        a prefill chunk, but a large chunk makes it compute-bound and stretches every co-running decode.
        ``step_time(0, 0, b, b * kv) == decode_step_time(b, kv)`` and ``step_time(p, c, 0, 0) ==
        prefill_time([p], [c])``. Raises ``UserInputError`` on negative or non-integer counts.

        Callers: the simulator (memoised tables, once per batch change of a slot), the planner (a few points
        per slot type per solve, to linearise), ``rollplan perf``."""
        ...

    def prefill_time(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        """One prefill forward over a batch: sequence i adds ``prompt_tokens[i]`` new tokens on top of
        ``cached_tokens[i]`` tokens already in KV (causal attention over both)."""
        ...

    def decode_step_time(self, batch: int, kv_tokens: float) -> float:
        """One decode step of ``batch`` sequences holding ``kv_tokens`` KV tokens each (mean)."""
        ...

    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int:
        """KV tokens that fit the engine's memory after weights and activations, at ``mem_util``."""
        ...

    def kv_capacity_seqs(self, context_tokens: float, mem_util: float = 0.9) -> int:
        """Concurrent sequences of ``context_tokens`` each that fit the KV cache."""
        ...

    def kv_transfer_time(self, tokens: int, same_node: bool) -> float:
        """Moving ``tokens`` tokens of KV to another engine (NVLink when ``same_node``, else the network)."""
        ...

    def weight_bytes(self) -> int:
        """Bytes of weights one engine holds (all TP ranks together)."""
        ...

    def cold_start_time(self) -> float:
        """Starting an engine from nothing (process, load weights, allocate KV, warm-up)."""
        ...

    def wake_time(self) -> float:
        """Waking a sleeping engine (weights back to device memory)."""
        ...

    def weight_sync_time(self, same_node: bool = False) -> float:
        """Installing a new weights version on a running engine (bytes / link bandwidth + fixed overhead)."""
        ...

    def reprefill_time(self, context_tokens: int) -> float:
        """Recomputing a trajectory's KV from scratch on a new engine (prefill of its whole context)."""
        ...


PerfProvider = Callable[[str, int], PerfModel]
"""Maps (GPU kind name, TP degree) to the PerfModel of the snapshot's model on it."""


def check_step_args(prefill_tokens: object, prefill_context: object, decode_seqs: object, decode_kv_tokens: object) -> None:
    """Raise ``UserInputError`` naming the first argument of ``step_time`` that is not a valid count.

    Counts (``prefill_tokens``, ``prefill_context``, ``decode_seqs``) must be finite, non-negative and
    integral (``3`` and ``3.0`` pass, ``2.5`` does not); ``decode_kv_tokens`` finite and non-negative. Any
    real number type passes (numpy scalars included); bools, strings, NaN and infinities do not."""
    for name, value, integral in (("prefill_tokens", prefill_tokens, True), ("prefill_context", prefill_context, True),
                                  ("decode_seqs", decode_seqs, True), ("decode_kv_tokens", decode_kv_tokens, False)):
        ok = False
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            x = float(value)
            ok = math.isfinite(x) and x >= 0 and (not integral or x.is_integer())
        if not ok:
            kind = "a non-negative integer" if integral else "a finite non-negative number"
            raise UserInputError(f"step_time: {name}={value!r} is not {kind}",
                                 fix=f"pass {name} as {kind} (token or sequence counts)")
