"""Roofline performance model from GpuKind x ModelSpec.

Each step is composed per kernel (``rollplan.models.perf.compose``): every GEMM and attention kernel costs
max(FLOPs / achieved FLOP/s, bytes / achieved HBM bandwidth) plus a launch latency, so a decode step is
bandwidth-bound on the weights and the KV cache while a long prefill is compute-bound. MoE models read only
the experts the batch touches (``ModelSpec.experts_touched``). Tensor parallelism splits heads, FFN and vocab
across ``tp`` GPUs and adds two all-reduces per layer over NVLink. A fixed per-step host overhead covers
scheduling and sampling. Achieved fractions of peak (``mfu``, ``mbu``) are typical values; the
``CalibratedPerfModel`` replaces every kernel it has measurements for.

Switching times follow ``SwitchCosts``: fixed overheads plus bytes over the relevant bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rollplan.models.perf.base import check_step_args
from rollplan.models.perf.compose import LayerShapes, StepBreakdown, decode_step, mixed_step, prefill_step
from rollplan.models.perf.kernels import RooflineKernels
from rollplan.models.specs import GpuKind, ModelSpec, check_tp


@dataclass(frozen=True, slots=True)
class SwitchCosts:
    """Fixed parts of switching times (seconds) and the rates they scale with.

    Defaults follow ../shared/DESIGN.md: cold vLLM start 60-350 s, wake 0.1-0.4 s, weight sync 5-30 s end
    to end in today's frameworks (0.1-0.4 s on the wire).
    """

    cold_start_fixed: float = 45.0
    load_bandwidth: float = 1e9  # bytes/s from storage at cold start
    wake_fixed: float = 0.1
    host_to_device_bandwidth: float = 64e9  # bytes/s per GPU (PCIe Gen5 x16)
    weight_sync_fixed: float = 2.0
    link_latency: float = 1e-3
    role_switch_fixed: float = 0.1  # drain in-flight steps and re-route (no weights move)


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV bytes one token occupies on each GPU of a TP group (KV heads are replicated when tp > kv_heads)."""
    kv_local = max(model.kv_heads // max(tp, 1), 1)
    return 2 * model.layers * kv_local * model.head_dim * model.dtype_bytes


def kv_capacity_tokens(gpu: GpuKind, model: ModelSpec, tp: int, mem_util: float, activation_reserve: float) -> int:
    """Tokens of KV an engine holds: per GPU, ``mem_util`` of memory minus its weight shard and an activation
    reserve, divided by the KV bytes a token takes on that GPU (vLLM's ``gpu_memory_utilization`` rule)."""
    tp = max(tp, 1)
    free = gpu.memory_bytes * mem_util - model.weight_bytes / tp - activation_reserve
    return max(0, int(free // kv_bytes_per_token_per_gpu(model, tp)))


@dataclass(frozen=True, slots=True)
class RooflinePerfModel:
    """``PerfModel`` from first principles. See the module docstring."""

    gpu: GpuKind
    model: ModelSpec
    tp: int = 1
    mfu: float = 0.6
    mbu: float = 0.8
    step_overhead: float = 2.0e-3
    activation_reserve_bytes: float = 2e9
    switch: SwitchCosts = SwitchCosts()
    # Derived once (the simulator calls the step functions in loops).
    _kernels: RooflineKernels = field(init=False, repr=False, compare=False)
    _shapes: LayerShapes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", check_tp(self.model, self.tp))
        object.__setattr__(self, "_kernels", RooflineKernels(self.gpu, mfu=self.mfu, mbu=self.mbu, overhead_s=self.step_overhead))
        object.__setattr__(self, "_shapes", LayerShapes.of(self.model, self.tp))

    @property
    def kernels(self) -> RooflineKernels:
        return self._kernels

    @property
    def shapes(self) -> LayerShapes:
        return self._shapes

    # -- steps --------------------------------------------------------------------------------------------------
    def decode_breakdown(self, batch: int, kv_tokens: float) -> StepBreakdown:
        return decode_step(self.kernels, self.shapes, batch, kv_tokens)

    def prefill_breakdown(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> StepBreakdown:
        cached = list(cached_tokens) if cached_tokens is not None else [0] * len(prompt_tokens)
        return prefill_step(self.kernels, self.shapes, list(prompt_tokens), cached)

    def mixed_breakdown(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> StepBreakdown:
        new, cached = ([int(prefill_tokens)], [int(prefill_context)]) if prefill_tokens > 0 else ([], [])
        kv = decode_kv_tokens / decode_seqs if decode_seqs > 0 else 0.0
        return mixed_step(self.kernels, self.shapes, new, cached, int(decode_seqs), kv)

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        check_step_args(prefill_tokens, prefill_context, decode_seqs, decode_kv_tokens)
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        return self.mixed_breakdown(prefill_tokens, prefill_context, decode_seqs, decode_kv_tokens).total

    def prefill_time(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        if sum(prompt_tokens) <= 0:
            return 0.0
        return self.prefill_breakdown(prompt_tokens, cached_tokens).total

    def decode_step_time(self, batch: int, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return self.decode_breakdown(batch, max(kv_tokens, 0.0)).total

    # -- memory -------------------------------------------------------------------------------------------------
    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int:
        return kv_capacity_tokens(self.gpu, self.model, self.tp, mem_util, self.activation_reserve_bytes)

    def kv_capacity_seqs(self, context_tokens: float, mem_util: float = 0.9) -> int:
        return int(self.kv_capacity_tokens(mem_util) // max(context_tokens, 1.0))

    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    # -- switching ----------------------------------------------------------------------------------------------
    def kv_transfer_time(self, tokens: int, same_node: bool) -> float:
        # Each TP rank moves its own KV shard over its own link, in parallel.
        bw = self.gpu.nvlink_bandwidth if same_node else self.gpu.network_bandwidth
        return self.switch.link_latency + max(tokens, 0) * kv_bytes_per_token_per_gpu(self.model, self.tp) / bw

    def cold_start_time(self) -> float:
        return self.switch.cold_start_fixed + self.model.weight_bytes / self.switch.load_bandwidth

    def wake_time(self) -> float:
        return self.switch.wake_fixed + self.model.weight_bytes / (self.tp * self.switch.host_to_device_bandwidth)

    def weight_sync_time(self, same_node: bool = False) -> float:
        bw = self.gpu.nvlink_bandwidth if same_node else self.gpu.network_bandwidth
        return self.switch.weight_sync_fixed + self.model.weight_bytes / (self.tp * bw)

    def role_switch_time(self) -> float:
        """Changing an engine's role (mixed / prefill / decode) without moving weights."""
        return self.switch.role_switch_fixed

    def reprefill_time(self, context_tokens: int) -> float:
        return self.prefill_time([context_tokens]) if context_tokens > 0 else 0.0
