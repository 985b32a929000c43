"""Calibrated performance model: fitted coefficients (a small JSON document) composed with model shapes.

A ``Calibration`` is per GPU kind. It holds
- kernel fits (GEMM, decode attention, prefill attention, elementwise, all-reduce curves per TP degree), which
  ``compose`` scales by any model's shapes (layers, heads, hidden, intermediate, experts, vocab): fitted on
  Llama-3-8B-shaped kernels, they apply to Qwen3-8B, Qwen3-30B-A3B or Llama-2-70B on the same GPU;
- per-step host overhead;
- optional whole-step fits for one (model, TP) measured end to end by the project's profiler (``StepFit``);
  these take precedence over the kernel composition for that model and TP;
- switching times where measured: KV transfer per byte (GPU-wide, ``switch``); engine start, wake, weight sync
  and role switch with the model they were measured on (``StepFit.switch``);
- the fit's error report (MAPE per phase) and the command that produced it.

Any term a calibration does not have falls back to the roofline model. Load with ``load_calibration(path)``
(or ``load_calibrated(path)`` for a ready ``PerfModel``); the shipped H100/H200 files live in
``rollplan/models/data/calibrated_<gpu>.json``. The format is documented in docs/perf.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from rollplan.models.errors import SchemaError, UserInputError
from rollplan.models.io import from_jsonable, to_jsonable
from rollplan.models.perf.base import check_step_args
from rollplan.models.perf.compose import LayerShapes, StepBreakdown, decode_step, mixed_step, prefill_step
from rollplan.models.perf.kernels import (
    Curve,
    DecodeAttnFit,
    ElementwiseFit,
    FittedKernels,
    GemmFit,
    PrefillAttnFit,
)
from rollplan.models.perf.roofline import RooflinePerfModel, kv_bytes_per_token_per_gpu
from rollplan.models.specs import GpuKind, ModelSpec, check_tp, gpu_kind, model_spec

SCHEMA = "rollplan.perf.calibration/1"
SHIPPED_GPUS = ("h100", "h200", "h800")
DERIVED_FROM = {"h800": "h100"}
"""GPU kinds whose calibration is derived from another kind's measured one. The H800 SXM is the H100 SXM with
NVLink capped at 400 GB/s (bidirectional, against 900) for export: the same die, clocks and HBM3, so every
kernel the H100 tables measured (GEMM, attention, elementwise, per-step host overhead) runs the same. What
rides on NVLink is not carried over: the TP all-reduce curves and the same-node KV transfer fall back to the
roofline with the H800's own link bandwidth (``GpuKind.nvlink_bandwidth``)."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """Time to move ``nbytes`` over one link: ``curve(nbytes)`` if measured as a curve, else
    ``fixed_s + nbytes / bytes_per_s``."""

    fixed_s: float = 0.0
    bytes_per_s: float | None = None
    curve: Curve | None = None

    def time(self, nbytes: float) -> float:
        if self.curve is not None:
            return self.curve(nbytes)
        return self.fixed_s + (nbytes / self.bytes_per_s if self.bytes_per_s else 0.0)


@dataclass(frozen=True, slots=True)
class SwitchFit:
    """Measured switching times (seconds); ``None`` = not measured (roofline fallback).

    ``weight_sync`` scales with the model's weight bytes when it has a bandwidth, else it is a constant.
    ``kv_same_node`` / ``kv_cross_node`` take the KV bytes one GPU of the TP group sends.
    """

    engine_start_s: float | None = None
    wake_s: float | None = None
    role_switch_s: float | None = None
    weight_sync: Transfer | None = None
    kv_same_node: Transfer | None = None
    kv_cross_node: Transfer | None = None


@dataclass(frozen=True, slots=True)
class StepFit:
    """Whole-step fits for one model at one TP degree (from profiler output), seconds.

    decode step = ``decode[0] + decode[1] * batch + decode[2] * batch * kv_tokens``;
    prefill = ``prefill[0] + prefill[1] * tokens + prefill[2] * sum(n * (cached + n / 2)) + prefill[3] * seqs``;
    mixed step (a chunk of ``new`` tokens after ``cached`` ones, batched with ``batch`` decodes reading
    ``kv_total`` KV tokens in all) = ``mixed[0] + mixed[1] * (new + batch) + mixed[2] * new * (cached + new / 2)
    + mixed[3] * kv_total``, fitted on measured mixed steps (``None``: not measured; older files have no such
    field). All coefficients are >= 0, so every form is monotone in every argument. ``switch`` holds switching
    times measured with this model; they take precedence over the calibration-wide ``switch``.
    """

    model: str
    tp: int
    decode: tuple[float, float, float] | None = None
    prefill: tuple[float, float, float, float] | None = None
    kv_capacity_tokens: int | None = None  # as the engine reported it (e.g. vLLM CPU's VLLM_CPU_KVCACHE_SPACE)
    switch: SwitchFit | None = None  # switching measured on this model (engine start, wake, sync, role switch)
    mixed: tuple[float, float, float, float] | None = None  # last, so older positional constructions still work

    def decode_time(self, batch: int, kv_tokens: float) -> float:
        assert self.decode is not None
        a, b, c = self.decode
        return a + b * batch + c * batch * kv_tokens

    def prefill_time(self, new: Sequence[int], cached: Sequence[int]) -> float:
        assert self.prefill is not None
        a, b, c, d = self.prefill
        work = sum(n * (k + n / 2.0) for n, k in zip(new, cached, strict=True))
        return a + b * sum(new) + c * work + d * sum(1 for n in new if n > 0)

    def mixed_time(self, new: int, cached: int, batch: int, kv_total: float) -> float:
        """A prefill chunk of ``new`` tokens over ``cached`` batched with ``batch`` decodes reading ``kv_total``
        KV tokens: the decode step plus the chunk, the per-step intercept counted once (the larger of the two)."""
        assert self.decode is not None and self.prefill is not None
        dec = self.decode_time(batch, kv_total / batch if batch > 0 else 0.0)
        pre = self.prefill_time([new], [cached])
        return dec + pre - min(self.decode[0], self.prefill[0])

    def mixed_fit_time(self, new: int, cached: int, batch: int, kv_total: float) -> float:
        """The fitted mixed-step form (see the class docstring); needs ``mixed``."""
        assert self.mixed is not None
        a, b, c, d = self.mixed
        return a + b * (new + batch) + c * new * (cached + new / 2.0) + d * kv_total


@dataclass(frozen=True, slots=True)
class Calibration:
    """Fitted coefficients for one GPU kind. See the module docstring; ``report`` holds the fit's errors."""

    gpu: str
    schema: str = SCHEMA
    source: str = ""
    gemm: GemmFit | None = None
    attn_decode: DecodeAttnFit | None = None
    attn_prefill: PrefillAttnFit | None = None
    elementwise: ElementwiseFit | None = None
    allreduce: dict[int, Curve] = field(default_factory=dict)
    step_overhead_s: float | None = None
    step_overhead_per_seq_s: float | None = None
    steps: tuple[StepFit, ...] = ()
    switch: SwitchFit = SwitchFit()
    report: dict[str, Any] = field(default_factory=dict)

    def step_fit(self, model: str, tp: int) -> StepFit | None:
        for s in self.steps:
            if s.model == model and s.tp == tp:
                return s
        return None

    def kernels(self, roofline: RooflinePerfModel) -> FittedKernels:
        return FittedKernels(
            roofline=roofline.kernels,
            gemm_fit=self.gemm,
            decode_fit=self.attn_decode,
            prefill_fit=self.attn_prefill,
            elementwise_fit=self.elementwise,
            allreduce_curves=tuple(sorted(self.allreduce.items())),
            overhead_s=self.step_overhead_s,
            overhead_per_seq_s=self.step_overhead_per_seq_s,
        )

    def perf_model(self, model: str | ModelSpec, tp: int = 1, *, gpu: GpuKind | None = None) -> CalibratedPerfModel:
        """The ``CalibratedPerfModel`` of ``model`` at ``tp`` on this calibration's GPU (``gpu`` overrides the
        preset lookup, e.g. for a GPU kind that is not a preset)."""
        return CalibratedPerfModel(gpu or gpu_kind(self.gpu), model_spec(model), tp, self)


@dataclass(frozen=True, slots=True)
class CalibratedPerfModel:
    """``PerfModel`` from a ``Calibration``; every unmeasured term comes from ``RooflinePerfModel``."""

    gpu: GpuKind
    model: ModelSpec
    tp: int
    calibration: Calibration
    # Derived once (the simulator calls the step functions in loops).
    roofline: RooflinePerfModel = field(init=False, repr=False, compare=False)
    _kernels: FittedKernels = field(init=False, repr=False, compare=False)
    _shapes: LayerShapes = field(init=False, repr=False, compare=False)
    _step: StepFit | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", check_tp(self.model, self.tp))
        roofline = RooflinePerfModel(self.gpu, self.model, self.tp)
        object.__setattr__(self, "roofline", roofline)
        object.__setattr__(self, "_kernels", self.calibration.kernels(roofline))
        object.__setattr__(self, "_shapes", LayerShapes.of(self.model, self.tp))
        object.__setattr__(self, "_step", self.calibration.step_fit(self.model.name, self.tp))

    @property
    def kernels(self) -> FittedKernels:
        return self._kernels

    # -- steps --------------------------------------------------------------------------------------------------
    def decode_breakdown(self, batch: int, kv_tokens: float) -> StepBreakdown:
        """Kernel composition (ignores a whole-step profile fit; see ``decode_step_time``)."""
        return decode_step(self._kernels, self._shapes, batch, kv_tokens)

    def prefill_breakdown(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> StepBreakdown:
        """Kernel composition (ignores a whole-step profile fit; see ``prefill_time``)."""
        cached = list(cached_tokens) if cached_tokens is not None else [0] * len(prompt_tokens)
        return prefill_step(self._kernels, self._shapes, list(prompt_tokens), cached)

    def prefill_time(self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        if sum(prompt_tokens) <= 0:
            return 0.0
        step = self._step
        if step is not None and step.prefill is not None:
            cached = list(cached_tokens) if cached_tokens is not None else [0] * len(prompt_tokens)
            return step.prefill_time(list(prompt_tokens), cached)
        return self.prefill_breakdown(prompt_tokens, cached_tokens).total

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        """See ``PerfModel.step_time``. With a whole-step profile fit for this model and TP: the decode step
        plus the prefill chunk (each from the profile where it measured that phase, else from the kernels) less
        the smaller of their fixed per-step parts (the step's fixed host work is paid once; equals
        ``StepFit.mixed_time`` when both phases were profiled); otherwise the kernel composition (``mixed_step``).
        A profile that measured mixed steps (``StepFit.mixed``) prices the step by that fit instead, kept between
        the larger part and the sum of the parts (so the special cases, monotonicity and
        ``max(decode, chunk) <= step <= decode + chunk`` hold on every path)."""
        check_step_args(prefill_tokens, prefill_context, decode_seqs, decode_kv_tokens)
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        if prefill_tokens <= 0:
            return self.decode_step_time(int(decode_seqs), decode_kv_tokens / decode_seqs)
        if decode_seqs <= 0:
            return self.prefill_time([int(prefill_tokens)], [int(prefill_context)])
        step = self._step
        if step is not None and (step.decode is not None or step.prefill is not None or step.mixed is not None):
            # Each part from where its single-phase time comes from (profile fit, else kernels), the fixed
            # per-step work paid once: the smaller fixed part is dropped, which keeps max(parts) <= step <= sum.
            dec = self.decode_step_time(int(decode_seqs), decode_kv_tokens / decode_seqs)
            pre = self.prefill_time([int(prefill_tokens)], [int(prefill_context)])
            fixed = self._kernels.step_overhead(0)
            fixed_dec = step.decode[0] if step.decode is not None else fixed
            fixed_pre = step.prefill[0] if step.prefill is not None else fixed
            if step.mixed is not None:
                # Clamping a monotone fit between two monotone bounds (max <= sum) keeps it monotone.
                fitted = step.mixed_fit_time(int(prefill_tokens), int(prefill_context), int(decode_seqs),
                                             float(decode_kv_tokens))
                return min(max(fitted, dec, pre), dec + pre)
            return dec + pre - min(fixed_dec, fixed_pre)
        kv = decode_kv_tokens / decode_seqs
        return mixed_step(self._kernels, self._shapes, [int(prefill_tokens)], [int(prefill_context)], int(decode_seqs), kv).total

    def decode_step_time(self, batch: int, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        kv_tokens = max(kv_tokens, 0.0)
        step = self._step
        if step is not None and step.decode is not None:
            return step.decode_time(batch, kv_tokens)
        return self.decode_breakdown(batch, kv_tokens).total

    # -- memory: measured by a profile, else arithmetic ---------------------------------------------------------
    def kv_capacity_tokens(self, mem_util: float = 0.9) -> int:
        step = self._step
        if step is not None and step.kv_capacity_tokens is not None:
            return step.kv_capacity_tokens
        return self.roofline.kv_capacity_tokens(mem_util)

    def kv_capacity_seqs(self, context_tokens: float, mem_util: float = 0.9) -> int:
        return int(self.kv_capacity_tokens(mem_util) // max(context_tokens, 1.0))

    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    # -- switching: this model's measurements, then the GPU-wide ones, then the roofline -------------------------
    def _switch(self, name: str) -> Any:
        for sw in (self._step.switch if self._step is not None else None, self.calibration.switch):
            value = getattr(sw, name) if sw is not None else None
            if value is not None:
                return value
        return None

    def kv_transfer_time(self, tokens: int, same_node: bool) -> float:
        link = self._switch("kv_same_node" if same_node else "kv_cross_node")
        if link is None:
            return self.roofline.kv_transfer_time(tokens, same_node)
        return link.time(max(tokens, 0) * kv_bytes_per_token_per_gpu(self.model, self.tp))

    def cold_start_time(self) -> float:
        s = self._switch("engine_start_s")
        return self.roofline.cold_start_time() if s is None else s

    def wake_time(self) -> float:
        s = self._switch("wake_s")
        return self.roofline.wake_time() if s is None else s

    def weight_sync_time(self, same_node: bool = False) -> float:
        ws = self._switch("weight_sync")
        if ws is None:
            return self.roofline.weight_sync_time(same_node)
        return ws.time(self.model.weight_bytes / self.tp)

    def role_switch_time(self) -> float:
        s = self._switch("role_switch_s")
        return self.roofline.role_switch_time() if s is None else s

    def reprefill_time(self, context_tokens: int) -> float:
        return self.prefill_time([context_tokens]) if context_tokens > 0 else 0.0


# --- load / save ------------------------------------------------------------------------------------------------


def _check_values(obj: Any, where: str, source: str) -> None:
    """Every number of a parsed calibration is finite and >= 0; rates (``*_per_s``) are > 0, smooth-max
    exponents ``p`` >= 1 and tiles >= 1 (so every fitted time is positive, finite and monotone). Raises
    ``SchemaError`` naming the field (``source: gemm.flops_per_s``)."""
    fix = "regenerate it with `rollplan perf fit` (format: docs/perf.md)"
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, int | float):
        name = where.rsplit(".", 1)[-1]
        floor, strict = (1.0, False) if name in ("p", "tile") else (0.0, name.endswith("_per_s"))
        if not math.isfinite(obj) or obj < floor or (strict and obj <= 0):
            want = "> 0" if strict else f">= {floor:g}"
            raise SchemaError(f"{source}: {where}", f"must be a finite number {want}, got {obj!r}", fix=fix)
        return
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _check_values(v, f"{where}.{k}" if where else str(k), source)
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            _check_values(v, f"{where}.{i}", source)
    elif hasattr(obj, "__dataclass_fields__"):
        for f in fields(obj):
            if f.name != "report":  # the fit's error report is informational (signed errors are fine)
                _check_values(getattr(obj, f.name), f"{where}.{f.name}" if where else f.name, source)


def calibration_from_dict(data: Mapping[str, Any], *, source: str = "<calibration>") -> Calibration:
    """Validate a parsed calibration document. Raises ``SchemaError`` naming the field."""
    if not isinstance(data, Mapping):
        raise SchemaError(source, "a calibration must be a JSON object", fix="regenerate it with `rollplan perf fit`")
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise SchemaError(f"{source}: schema", f"unsupported calibration schema {schema!r} (expected {SCHEMA!r})",
                          fix="regenerate it with `rollplan perf fit`")
    try:
        cal = from_jsonable(Calibration, dict(data), source=source)
    except SchemaError as err:
        raise SchemaError(err.values["where"], err.values["problem"],
                          fix="regenerate it with `rollplan perf fit` (format: docs/perf.md)") from None
    _check_values(cal, "", source)
    for tp in cal.allreduce:
        if tp < 2:
            raise SchemaError(f"{source}: allreduce.{tp}", "all-reduce curves are keyed by a TP degree >= 2",
                              fix="regenerate it with `rollplan perf fit` (format: docs/perf.md)")
    return cal


def calibration_to_dict(cal: Calibration) -> dict[str, Any]:
    return to_jsonable(cal)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file (explicit I/O). Raises ``UserInputError`` subclasses on a bad file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise UserInputError(f"cannot read calibration file {str(p)!r}: {err.strerror}",
                             fix="pass an existing file written by `rollplan perf fit --out`") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{p}:{err.lineno}", f"not valid JSON ({err.msg})", fix="regenerate it with `rollplan perf fit`") from None
    return calibration_from_dict(data, source=str(p))


def save_calibration(cal: Calibration, path: str | Path) -> None:
    """Write ``cal`` as indented JSON (explicit I/O)."""
    Path(path).write_text(json.dumps(calibration_to_dict(cal), indent=1, sort_keys=False) + "\n")


def derived_calibration(gpu: str, base: Calibration) -> Calibration:
    """``base`` (another GPU kind's measured calibration) as ``gpu``'s, by ``DERIVED_FROM``'s rule: the kernel
    fits kept, everything NVLink-bound (all-reduce curves, same-node KV transfer) left to the roofline."""
    report = {"derived_from": base.gpu,
              "rule": "same die and HBM; NVLink-bound terms (all-reduce, same-node KV transfer) from the roofline",
              "base_report": base.report}
    return replace(base, gpu=gpu, source=f"derived from the {base.gpu} calibration ({base.source})",
                   allreduce={}, switch=replace(base.switch, kv_same_node=None), report=report)


@cache
def shipped_calibration(gpu: str) -> Calibration:
    """The calibration shipped for ``gpu``: package data for H100 and H200, derived for H800
    (``DERIVED_FROM``). Raises ``UserInputError`` for other kinds."""
    key = gpu_kind(gpu).name
    if key in DERIVED_FROM:
        return derived_calibration(key, shipped_calibration(DERIVED_FROM[key]))
    if key not in SHIPPED_GPUS:
        raise UserInputError(
            f"no calibration is shipped for GPU kind {key!r} (shipped: {', '.join(SHIPPED_GPUS)})",
            fix="fit one with `rollplan perf fit` and pass it as calibration=PATH (CLI: --calibration PATH), "
            "or use the roofline model",
        )
    res = resources.files("rollplan.models").joinpath("data", f"calibrated_{key}.json")
    try:
        text = res.read_text()
    except OSError:
        raise UserInputError(f"the shipped calibration for {key} is missing from the installed package",
                             fix="run `make calibrate` (needs ../shared/data) or reinstall rollplan-models") from None
    return calibration_from_dict(json.loads(text), source=f"calibrated_{key}.json")


def calibrated_perf_model(
    gpu: str | GpuKind, model: str | ModelSpec, tp: int = 1, *, calibration: Calibration | str | Path | None = None
) -> CalibratedPerfModel:
    """A ``CalibratedPerfModel``: from ``calibration`` (object or file path) if given, else the shipped one."""
    g = gpu_kind(gpu)
    if calibration is None:
        cal = shipped_calibration(g.name)
    elif isinstance(calibration, Calibration):
        cal = calibration
    else:
        cal = load_calibration(calibration)
    if gpu_kind(cal.gpu).name != g.name:
        # Kernel rates, overheads and link curves are per GPU kind: another kind's fits would price it silently wrong.
        where = f"{calibration}: " if isinstance(calibration, str | Path) else ""
        raise UserInputError(f"{where}calibration field 'gpu' is {cal.gpu!r}: it was fitted for another GPU kind than {g.name!r}",
                             fix=f"ask for GPU kind {cal.gpu!r} (CLI: --gpu {cal.gpu}), or fit one for {g.name} "
                                 f"(`rollplan perf fit --gpu {g.name} ...`)")
    return CalibratedPerfModel(g, model_spec(model), tp, cal)


def load_calibrated(path: str | Path, model: str | ModelSpec | None = None, tp: int | None = None) -> CalibratedPerfModel:
    """Load a calibration file and return its ``PerfModel``. ``model``/``tp`` default to the file's only
    whole-step fit (a profiler calibration); a kernel-level calibration needs ``model``."""
    cal = load_calibration(path)
    if model is None:
        if len(cal.steps) != 1:
            raise UserInputError(f"{path}: say which model to use (the file has {len(cal.steps)} model-specific fits)",
                                 fix="pass model= (and tp=) to load_calibrated")
        model, tp = cal.steps[0].model, cal.steps[0].tp if tp is None else tp
    return cal.perf_model(model, tp or 1)
