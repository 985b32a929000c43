"""Performance (cost) models: the ``PerfModel`` protocol, a roofline model, and calibrated fits.

``perf_model(gpu, model, tp)`` gives the roofline model; ``calibrated=True`` the shipped H100/H200 fits;
``calibration=PATH_OR_OBJECT`` a fit of your own (e.g. from profiler output, see docs/perf.md).
Fitting code lives in ``rollplan.models.perf.fit`` (imported on demand: it needs numpy).
"""

from __future__ import annotations

from pathlib import Path

from rollplan.models.perf.base import PerfModel, PerfProvider
from rollplan.models.perf.calibrated import (
    CalibratedPerfModel,
    Calibration,
    calibrated_perf_model,
    load_calibrated,
    load_calibration,
    save_calibration,
    shipped_calibration,
)
from rollplan.models.perf.roofline import RooflinePerfModel, SwitchCosts
from rollplan.models.specs import gpu_kind, model_spec


def perf_model(
    gpu: str,
    model: str,
    tp: int = 1,
    *,
    calibrated: bool = False,
    calibration: Calibration | str | Path | None = None,
) -> PerfModel:
    """The performance model for ``tp`` GPUs of ``gpu`` running ``model``.

    Roofline unless ``calibrated`` (shipped fits for h100/h200) or ``calibration`` (a ``Calibration`` or the
    path of a calibration JSON) is given. Unknown names raise ``UnknownNameError``.
    """
    if calibrated or calibration is not None:
        return calibrated_perf_model(gpu, model, tp, calibration=calibration)
    return RooflinePerfModel(gpu_kind(gpu), model_spec(model), tp)


def default_provider(
    model: str, *, calibrated: bool = False, calibration: Calibration | str | Path | None = None
) -> PerfProvider:
    """A ``PerfProvider`` for ``model`` on preset GPUs (cached per (gpu, tp)).

    A calibration file is read once, when the provider is made, not per call.
    """
    cal = load_calibration(calibration) if isinstance(calibration, str | Path) else calibration
    cache: dict[tuple[str, int], PerfModel] = {}

    def provide(gpu: str, tp: int) -> PerfModel:
        key = (gpu, tp)
        if key not in cache:
            cache[key] = perf_model(gpu, model, tp, calibrated=calibrated, calibration=cal)
        return cache[key]

    return provide


__all__ = [
    "CalibratedPerfModel",
    "Calibration",
    "PerfModel",
    "PerfProvider",
    "RooflinePerfModel",
    "SwitchCosts",
    "calibrated_perf_model",
    "default_provider",
    "load_calibrated",
    "load_calibration",
    "perf_model",
    "save_calibration",
    "shipped_calibration",
]
