"""Performance (cost) models: the ``PerfModel`` protocol, a roofline model, and calibrated fits."""

from rollplan.models.perf.base import PerfModel, PerfProvider
from rollplan.models.perf.roofline import RooflinePerfModel, SwitchCosts
from rollplan.models.specs import gpu_kind, model_spec


def perf_model(gpu: str, model: str, tp: int = 1, *, calibrated: bool = False) -> PerfModel:
    """The performance model for ``tp`` GPUs of ``gpu`` running ``model`` (roofline unless ``calibrated``)."""
    if calibrated:
        from rollplan.models.perf.calibrated import calibrated_perf_model

        return calibrated_perf_model(gpu, model, tp)
    return RooflinePerfModel(gpu_kind(gpu), model_spec(model), tp)


def default_provider(model: str, *, calibrated: bool = False) -> PerfProvider:
    """A ``PerfProvider`` for ``model`` on preset GPUs (cached per (gpu, tp))."""
    cache: dict[tuple[str, int], PerfModel] = {}

    def provide(gpu: str, tp: int) -> PerfModel:
        key = (gpu, tp)
        if key not in cache:
            cache[key] = perf_model(gpu, model, tp, calibrated=calibrated)
        return cache[key]

    return provide


__all__ = ["PerfModel", "PerfProvider", "RooflinePerfModel", "SwitchCosts", "default_provider", "perf_model"]
