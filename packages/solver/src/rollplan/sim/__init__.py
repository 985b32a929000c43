"""rollplan.sim: the trace-replay adapter. Trace loaders, workload builders, training-GPU lending (inputs), and
the event simulator and baselines. May do file I/O; never imports ray, vllm or torch."""

from rollplan.sim.lending import (
    LendingConfig,
    LendingSchedule,
    LendMode,
    LendWindow,
    TrainStep,
    lending_config_from_dict,
)
from rollplan.sim.traces import TRACE_FORMATS, AvailabilityTrace, load_trace, synthetic_spot_trace
from rollplan.sim.workload import (
    GroupVariation,
    TrajectorySpec,
    Turn,
    Workload,
    azure_workload,
    load_workload,
    parse_workload,
    save_workload,
    swebench_runs,
    swebench_workload,
    synthetic_workload,
    truncate_to_context,
    vary,
    workload_to_jsonl,
)

__all__ = [
    "TRACE_FORMATS",
    "AvailabilityTrace",
    "GroupVariation",
    "LendMode",
    "LendWindow",
    "LendingConfig",
    "LendingSchedule",
    "TrainStep",
    "TrajectorySpec",
    "Turn",
    "Workload",
    "azure_workload",
    "lending_config_from_dict",
    "load_trace",
    "load_workload",
    "parse_workload",
    "save_workload",
    "swebench_runs",
    "swebench_workload",
    "synthetic_spot_trace",
    "synthetic_workload",
    "truncate_to_context",
    "vary",
    "workload_to_jsonl",
]
