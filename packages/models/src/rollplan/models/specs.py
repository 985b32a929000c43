"""Hardware and model specifications, with presets.

``GpuKind`` and ``ModelSpec`` are immutable facts; performance models (``rollplan.models.perf``) turn them
into times. Look presets up with ``gpu_kind(name)`` / ``model_spec(name)`` (case-insensitive, ``_`` == ``-``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from rollplan.models.errors import UnknownNameError, UserInputError

GB = 1e9
GiB = 1 << 30
TB = 1e12


@dataclass(frozen=True, slots=True)
class GpuKind:
    """One accelerator type.

    Bandwidths are bytes/s in one direction per GPU; ``bf16_flops`` is dense (no sparsity) peak.
    """

    name: str
    memory_bytes: int
    bf16_flops: float
    hbm_bandwidth: float
    nvlink_bandwidth: float
    network_bandwidth: float


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts.

    ``params`` counts every weight; ``active_params`` those one token touches (== params for dense models).
    For MoE, ``expert_params`` is the size of one expert summed over all MoE layers.
    """

    name: str
    params: float
    active_params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    dtype_bytes: int = 2
    max_context: int = 32768

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def experts_touched(self, batch_tokens: float) -> float:
        """Expected distinct experts per MoE layer hit by ``batch_tokens`` tokens routed uniformly (top-k).

        E * (1 - (1 - k/E)^n): 1 token reads k experts; a large batch reads all E.
        """
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        n = max(batch_tokens, 0.0)
        return e * (1.0 - (1.0 - k / e) ** n)

    def weight_bytes_read(self, batch_tokens: float) -> float:
        """Weight bytes read from HBM by one forward pass over ``batch_tokens`` tokens (MoE reads touched experts)."""
        if not self.is_moe:
            return float(self.weight_bytes)
        shared = self.params - self.num_experts * self.expert_params
        touched = self.experts_touched(batch_tokens)
        return (shared + touched * self.expert_params) * self.dtype_bytes


# --- GPU presets -------------------------------------------------------------------------------------------
# Sources: NVIDIA H100/H800 and H200 datasheets (SXM, dense bf16 989.4 TFLOP/s); A100 datasheet (312 TFLOP/s).
# NVLink: H100/H200 900 GB/s bidirectional = 450 GB/s per direction; H800 400 GB/s bidirectional (export
# variant) = 200 GB/s; A100 600 GB/s = 300 GB/s. Network: one 400 Gb/s ConnectX-7 NIC per GPU = 50 GB/s
# (H100/H800/H200 DGX/HGX), one 200 Gb/s HDR NIC per GPU = 25 GB/s (A100 DGX).
GPU_PRESETS: dict[str, GpuKind] = {
    g.name: g
    for g in (
        GpuKind("h800", 80 * 10**9, 989.4 * TB, 3.35 * TB, 200 * GB, 50 * GB),
        GpuKind("h100", 80 * 10**9, 989.4 * TB, 3.35 * TB, 450 * GB, 50 * GB),
        GpuKind("h200", 141 * 10**9, 989.4 * TB, 4.8 * TB, 450 * GB, 50 * GB),
        GpuKind("a100", 80 * 10**9, 312 * TB, 2.039 * TB, 300 * GB, 25 * GB),
        # The CI machine's CPU running vLLM's CPU backend (float32). Order-of-magnitude figures for a 2-core
        # x86 VM (AVX-512: ~100 GFLOP/s fp32, ~10 GB/s memory); the executor replaces them with measurements.
        GpuKind("cpu", 24 * GiB, 100e9, 10 * GB, 10 * GB, 10 * GB),
    )
}
_GPU_ALIASES = {"a100-80gb": "a100", "a100_80gb": "a100", "h100-sxm": "h100", "h200-sxm": "h200"}

# --- Model presets -----------------------------------------------------------------------------------------
# Figures from each model's Hugging Face config.json (layers, hidden, heads, kv heads, head_dim, vocab,
# intermediate/expert sizes) and model card (parameter counts).
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Qwen/Qwen3-8B: 36 layers, hidden 4096, 32 q heads, 8 kv heads, head_dim 128, vocab 151936, 8.2B params.
        ModelSpec("qwen3-8b", 8.19e9, 8.19e9, 36, 4096, 32, 8, 128, 151936, 12288, max_context=40960),
        # Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 q / 4 kv heads, head_dim 128, 128 experts, top-8,
        # moe_intermediate 768 -> one expert = 3*2048*768 weights per layer * 48 layers = 226.5M; 30.5B total, 3.3B active.
        ModelSpec(
            "qwen3-30b-a3b", 30.5e9, 3.3e9, 48, 2048, 32, 4, 128, 151936, 6144,
            num_experts=128, experts_per_token=8, expert_params=3 * 2048 * 768 * 48, max_context=40960,
        ),
        # meta-llama/Meta-Llama-3-8B: 32 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128, vocab 128256, 8.03B.
        ModelSpec("llama-3-8b", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128256, 14336, max_context=8192),
        # meta-llama/Llama-2-70b-hf: 80 layers, hidden 8192, 64 q / 8 kv heads, head_dim 128, vocab 32000, 69B.
        ModelSpec("llama-2-70b", 68.98e9, 68.98e9, 80, 8192, 64, 8, 128, 32000, 28672, max_context=4096),
        # The tiny CPU test model built by the executor's tests: LlamaForCausalLM, 2 layers, hidden 128,
        # 2 heads, 1 kv head, head_dim 64, vocab 1024, intermediate 256, float32.
        ModelSpec("tiny", 0.56e6, 0.56e6, 2, 128, 2, 1, 64, 1024, 256, dtype_bytes=4, max_context=512),
    )
}
_MODEL_ALIASES = {"qwen3-30b": "qwen3-30b-a3b", "llama3-8b": "llama-3-8b", "llama2-70b": "llama-2-70b"}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def gpu_kind(name: str | GpuKind) -> GpuKind:
    """The preset GPU called ``name``. Raises ``UnknownNameError`` (with the known names) otherwise."""
    if isinstance(name, GpuKind):
        return name
    key = _norm(name)
    key = _GPU_ALIASES.get(key, key)
    try:
        return GPU_PRESETS[key]
    except KeyError:
        raise UnknownNameError("GPU kind", name, list(GPU_PRESETS)) from None


def model_spec(name: str | ModelSpec) -> ModelSpec:
    """The preset model called ``name``. Raises ``UnknownNameError`` (with the known names) otherwise."""
    if isinstance(name, ModelSpec):
        return name
    key = _norm(name)
    key = _MODEL_ALIASES.get(key, key)
    try:
        return MODEL_PRESETS[key]
    except KeyError:
        raise UnknownNameError("model", name, list(MODEL_PRESETS)) from None


def check_tp(model: ModelSpec, tp: object, *, option: str = "tp") -> int:
    """``tp`` as an int if it is a tensor-parallel degree ``model`` can run at, else ``UserInputError`` naming
    ``option``. vLLM's rule: a positive integer that divides the attention heads, and either divides the KV
    heads or is a multiple of them (KV heads are then replicated)."""
    if not isinstance(tp, numbers.Integral) or isinstance(tp, bool) or int(tp) < 1:
        raise UserInputError(f"{option}={tp!r} is not a positive integer", fix=f"pass {option} as 1, 2, 4 or 8 (GPUs per engine)")
    tp = int(tp)
    divisors = ", ".join(str(d) for d in range(1, model.heads + 1) if model.heads % d == 0
                         and (model.kv_heads % d == 0 or d % model.kv_heads == 0))
    if model.heads % tp:
        raise UserInputError(f"{option}={tp} does not divide {model.name}'s {model.heads} attention heads",
                             fix=f"use a TP degree {model.name} can be split over: {divisors}")
    if model.kv_heads % tp and tp % model.kv_heads:
        raise UserInputError(f"{option}={tp} neither divides nor is a multiple of {model.name}'s {model.kv_heads} KV heads",
                             fix=f"use a TP degree {model.name} can be split over: {divisors}")
    return tp
