"""A measured performance model for the executor's engines (``PerfModel`` protocol).

The roofline presets describe GPUs; the executor's CPU engines are better described by a few measured
numbers: decode step ``a + c*batch (+ k*kv_tokens)``, prefill ``p0 + p*tokens``, and the switching times
(engine start, wake, weight sync, KV transfer, re-prefill) that ``rollplan bench executor`` measures.
``MeasuredPerfModel`` holds those numbers; ``from_profile`` reads them back from a profile JSONL written by
``rollplan bench executor --profile-out`` (the same file ``rollplan perf fit --profile`` accepts), so the
planner's switching costs for the CPU engines come from measurement.

Defaults: medians measured on the 2-core CI machine with the tiny model (see docs/executor.md).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rollplan.models import GpuKind, ModelSpec, gpu_kind, model_spec
from rollplan.models.perf import PerfModel, PerfProvider
from rollplan.models.perf.base import check_step_args


@dataclass(frozen=True, slots=True)
class MeasuredPerfModel:
    """``PerfModel`` from measured coefficients (seconds). KV capacity = ``kv_cache_bytes`` / KV bytes per token."""

    gpu: GpuKind
    model: ModelSpec
    tp: int = 1
    decode_a: float = 4.5e-3
    decode_c: float = 1.6e-4
    decode_k: float = 0.0
    prefill_fixed: float = 8e-3
    prefill_per_token: float = 7e-5
    kv_cache_bytes: float = float(64 << 20)
    engine_start: float = 35.0
    wake: float = 0.004
    weight_sync: float = 0.1
    kv_transfer_fixed: float = 0.03
    kv_transfer_per_token: float = 1e-4

    def prefill_time(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        n = float(sum(prompt_tokens))
        return 0.0 if n <= 0 else self.prefill_fixed + self.prefill_per_token * n

    def step_time(
        self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float
    ) -> float:
        """A mixed step: the decode step plus the chunk's per-token prefill cost (the fixed per-step cost
        is paid once); decode-only and prefill-only steps equal ``decode_step_time``/``prefill_time``."""
        check_step_args(prefill_tokens, prefill_context, decode_seqs, decode_kv_tokens)
        if decode_seqs <= 0:
            return self.prefill_time([prefill_tokens], [prefill_context])
        decode = self.decode_step_time(decode_seqs, decode_kv_tokens / decode_seqs)
        return decode + (self.prefill_per_token * prefill_tokens if prefill_tokens > 0 else 0.0)

    def decode_step_time(self, batch: int, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        return self.decode_a + self.decode_c * batch + self.decode_k * batch * kv_tokens

    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int:
        return int(self.kv_cache_bytes // self.model.kv_bytes_per_token)

    def kv_capacity_seqs(self, context_tokens: float, mem_util: float = 0.9) -> int:
        return int(self.kv_capacity_tokens(mem_util) // max(context_tokens, 1.0))

    def kv_transfer_time(self, tokens: int, same_node: bool) -> float:
        return self.kv_transfer_fixed + self.kv_transfer_per_token * tokens

    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    def cold_start_time(self) -> float:
        return self.engine_start

    def wake_time(self) -> float:
        return self.wake

    def weight_sync_time(self, same_node: bool = False) -> float:
        return self.weight_sync

    def reprefill_time(self, context_tokens: int) -> float:
        return self.prefill_time([context_tokens]) if context_tokens > 0 else 0.0


def _fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares y = a + b x (b >= 0); a constant when x does not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return my, 0.0
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
    return max(0.0, my - b * mx), b


def from_profile_records(records: Iterable[dict], base: MeasuredPerfModel) -> MeasuredPerfModel:
    """Coefficients fitted to profile records (one dict per JSONL line, see module docstring)."""
    rec = list(records)
    changes: dict[str, float] = {}
    dec = [r for r in rec if r.get("phase") == "decode"]
    if dec:
        a, c = _fit_line([float(r["batch"]) for r in dec], [float(r["seconds"]) for r in dec])
        changes.update(decode_a=a, decode_c=c)
    pre = [r for r in rec if r.get("phase") == "prefill" and not any(r.get("cached_tokens") or [])]
    if pre:
        p0, p = _fit_line([float(sum(r["prompt_tokens"])) for r in pre], [float(r["seconds"]) for r in pre])
        changes.update(prefill_fixed=p0, prefill_per_token=p)
    for phase, name in (("engine_start", "engine_start"), ("wake", "wake"), ("weight_sync", "weight_sync")):
        xs = [float(r["seconds"]) for r in rec if r.get("phase") == phase]
        if xs:
            changes[name] = statistics.median(xs)
    cap = [r for r in rec if r.get("phase") == "kv_capacity" and r.get("tokens")]
    if cap:
        changes["kv_cache_bytes"] = float(cap[-1]["tokens"]) * base.model.kv_bytes_per_token
    kv = [r for r in rec if r.get("phase") == "kv_transfer"]
    if kv:
        f, per = _fit_line([float(r.get("tokens", 0)) for r in kv], [float(r["seconds"]) for r in kv])
        changes.update(kv_transfer_fixed=f, kv_transfer_per_token=per)
    return replace(base, **changes)


def load_profile(path: str | Path) -> list[dict]:
    """The records of a profile JSONL file (blank lines and ``#`` comments skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(json.loads(line))
    return out


def measured_provider(
    model: str = "tiny",
    *,
    profile: str | Path | None = None,
    engine_start: float | None = None,
    kv_cache_bytes: float | None = None,
    **overrides: float,
) -> PerfProvider:
    """A ``PerfProvider`` returning ``MeasuredPerfModel``s (fitted to ``profile`` when given)."""
    cache: dict[tuple[str, int], PerfModel] = {}
    spec = model_spec(model)

    def provide(gpu: str, tp: int) -> PerfModel:
        key = (gpu, tp)
        if key not in cache:
            m = MeasuredPerfModel(gpu_kind(gpu), spec, tp)
            if profile is not None:
                m = from_profile_records(load_profile(profile), m)
            extra: dict[str, float] = dict(overrides)
            if engine_start is not None:
                extra["engine_start"] = engine_start
            if kv_cache_bytes is not None:
                extra["kv_cache_bytes"] = kv_cache_bytes
            cache[key] = replace(m, **extra) if extra else m
        return cache[key]

    return provide
