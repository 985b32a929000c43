"""One engine step as a sum of kernels, scaled by the model's shapes.

A forward pass over ``m`` tokens on ``tp`` GPUs (Megatron-style tensor parallelism as in vLLM) runs, per layer:

    attention  (decode: paged attention over each sequence's KV; prefill: causal flash attention)
    GEMMs      qkv (n = (q_heads + 2 kv_heads) head_dim / tp, k = hidden), o (n = hidden, k = q_heads head_dim / tp),
               dense FFN gate_up (n = 2 I / tp, k = hidden) and down (n = hidden, k = I / tp);
               MoE: router (n = experts, k = hidden), then gate_up and down of every expert the batch touches as
               one fused GEMM each (m = tokens * top_k / touched per expert, n spanning the touched experts)
    elementwise two norms, two residual adds, RoPE, activation
    all-reduce two per layer (after o and after down) of m * hidden values, when tp > 1

then the LM head (m = sequences in prefill, batch in decode; n = vocab / tp) and a per-step host overhead.

A *mixed* step (vLLM's chunked prefill: the running decodes and a prefill chunk in one forward pass,
``mixed_step``) runs every GEMM, elementwise op and all-reduce once over the prefill tokens and the decode
tokens together (the weights are read once for both), the prefill attention over the chunk's context and the
decode attention over the decodes' KV, and the LM head over the decodes plus the chunk's last position.
Decode-only and prefill-only steps are its special cases (``decode_step``, ``prefill_step``).
The same composition serves the roofline, the calibrated model and the measured-table reference, so an error
report compares like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollplan.models.perf.kernels import Kernels
from rollplan.models.specs import ModelSpec


@dataclass(frozen=True, slots=True)
class LayerShapes:
    """Per-GPU shapes of one transformer layer of ``model`` under tensor parallelism ``tp``."""

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn_local: int  # dense intermediate per GPU (0 for MoE)
    experts: int
    top_k: int
    expert_ffn_local: int  # one expert's intermediate per GPU
    vocab_local: int
    dtype_bytes: int
    tp: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> LayerShapes:
        tp = max(int(tp), 1)
        if model.is_moe:
            # expert_params = 3 * hidden * I_expert * layers (gate, up, down), see specs.ModelSpec.
            expert_inter = round(model.expert_params / (3 * model.hidden * model.layers))
            ffn_local, expert_local = 0, max(expert_inter // tp, 1)
        else:
            ffn_local, expert_local = max(model.intermediate // tp, 1), 0
        return cls(
            layers=model.layers,
            hidden=model.hidden,
            q_heads=max(model.heads // tp, 1),
            # vLLM replicates KV heads when tp > kv_heads: each GPU keeps at least one.
            kv_heads=max(model.kv_heads // tp, 1),
            head_dim=model.head_dim,
            ffn_local=ffn_local,
            experts=model.num_experts,
            top_k=model.experts_per_token,
            expert_ffn_local=expert_local,
            vocab_local=max(model.vocab // tp, 1),
            dtype_bytes=model.dtype_bytes,
            tp=tp,
        )

    @property
    def qkv_n(self) -> int:
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim

    @property
    def qk_width(self) -> int:
        return (self.q_heads + self.kv_heads) * self.head_dim

    @property
    def ffn_width(self) -> int:
        return self.ffn_local if self.experts == 0 else self.expert_ffn_local * self.top_k

    def experts_touched(self, tokens: float) -> float:
        if self.experts == 0:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** max(tokens, 0.0))


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Seconds per part of one step (all layers summed); ``total`` is their sum."""

    attention: float
    gemm: float
    elementwise: float
    allreduce: float
    lm_head: float
    overhead: float

    @property
    def total(self) -> float:
        return self.attention + self.gemm + self.elementwise + self.allreduce + self.lm_head + self.overhead

    @property
    def kernels_only(self) -> float:
        """The part the measured kernel tables cover: attention, GEMMs, all-reduce, LM head."""
        return self.attention + self.gemm + self.allreduce + self.lm_head


def _layer_gemms(k: Kernels, s: LayerShapes, m: float) -> float:
    dt = s.dtype_bytes
    t = k.gemm(m, s.qkv_n, s.hidden, dt) + k.gemm(m, s.hidden, s.q_heads * s.head_dim, dt)
    if s.experts == 0:
        return t + k.gemm(m, 2 * s.ffn_local, s.hidden, dt) + k.gemm(m, s.hidden, s.ffn_local, dt)
    # vLLM runs all experts of a layer as one fused (grouped) GEMM: modelled as one GEMM whose n spans the
    # touched experts, so weight bytes = touched experts' weights, FLOPs = 2 * m * top_k * n * k, one launch.
    touched = s.experts_touched(m)
    if touched <= 0:
        return t
    per_expert = m * s.top_k / touched
    span = max(round(touched), 1)
    experts = k.gemm(per_expert, span * 2 * s.expert_ffn_local, s.hidden, dt) + k.gemm(per_expert, span * s.hidden, s.expert_ffn_local, dt)
    return t + k.gemm(m, s.experts, s.hidden, dt) + experts


def _rest(k: Kernels, s: LayerShapes, m: float, head_rows: float, seqs: int) -> tuple[float, float, float, float, float]:
    gemm = s.layers * _layer_gemms(k, s, m)
    elementwise = s.layers * k.elementwise(m, s.hidden, s.qk_width, s.ffn_width, s.dtype_bytes)
    allreduce = s.layers * 2 * k.allreduce(m * s.hidden * s.dtype_bytes, s.tp)
    lm_head = k.gemm(head_rows, s.vocab_local, s.hidden, s.dtype_bytes)
    return gemm, elementwise, allreduce, lm_head, k.step_overhead(seqs)


def mixed_step(k: Kernels, s: LayerShapes, new: Sequence[int], cached: Sequence[int], batch: int,
               kv_tokens: float) -> StepBreakdown:
    """One forward pass of a mixed batch: prefill sequence i adds ``new[i]`` tokens after ``cached[i]`` ones, and
    ``batch`` decode sequences holding ``kv_tokens`` KV tokens each (mean) add one token each."""
    tokens = float(sum(new))
    seqs = sum(1 for n in new if n > 0)
    attn = 0.0
    if seqs:
        attn += s.layers * k.attn_prefill(new, cached, s.q_heads, s.kv_heads, s.head_dim, s.dtype_bytes)
    if batch > 0:
        attn += s.layers * k.attn_decode(batch, kv_tokens, s.q_heads, s.kv_heads, s.head_dim, s.dtype_bytes)
    gemm, elementwise, allreduce, lm_head, overhead = _rest(k, s, tokens + batch, float(seqs + batch), seqs + batch)
    return StepBreakdown(attn, gemm, elementwise, allreduce, lm_head, overhead)


def decode_step(k: Kernels, s: LayerShapes, batch: int, kv_tokens: float) -> StepBreakdown:
    """One decode step of ``batch`` sequences each holding ``kv_tokens`` KV tokens (mean)."""
    attn = s.layers * k.attn_decode(batch, kv_tokens, s.q_heads, s.kv_heads, s.head_dim, s.dtype_bytes)
    gemm, elementwise, allreduce, lm_head, overhead = _rest(k, s, float(batch), float(batch), batch)
    return StepBreakdown(attn, gemm, elementwise, allreduce, lm_head, overhead)


def prefill_step(k: Kernels, s: LayerShapes, new: Sequence[int], cached: Sequence[int]) -> StepBreakdown:
    """One prefill forward: sequence i adds ``new[i]`` tokens after ``cached[i]`` tokens already in KV.
    Only the last position of each sequence goes through the LM head."""
    tokens = float(sum(new))
    seqs = sum(1 for n in new if n > 0)
    attn = s.layers * k.attn_prefill(new, cached, s.q_heads, s.kv_heads, s.head_dim, s.dtype_bytes)
    gemm, elementwise, allreduce, lm_head, overhead = _rest(k, s, tokens, float(seqs), seqs)
    return StepBreakdown(attn, gemm, elementwise, allreduce, lm_head, overhead)
