"""rollplan.sim: the trace-replay adapter. Trace loaders, workload builders, training-GPU lending (inputs), and
the event simulator and baselines. May do file I/O; never imports ray, vllm or torch."""

from rollplan.sim.bench_replay import run_bench
from rollplan.sim.demo import demo_scenario
from rollplan.sim.engine import NoProgressError, SimConfig, SimTraj, Simulator
from rollplan.sim.lending import (
    LendingConfig,
    LendingSchedule,
    LendMode,
    LendWindow,
    TrainStep,
    lending_config_from_dict,
)
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.predict import Predictor
from rollplan.sim.replay import BatchSource, Scenario, run_policy, run_replay
from rollplan.sim.report import build_report, write_report
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
    "POLICY_NAMES",
    "TRACE_FORMATS",
    "AvailabilityTrace",
    "BatchSource",
    "GroupVariation",
    "LendMode",
    "LendWindow",
    "LendingConfig",
    "LendingSchedule",
    "NoProgressError",
    "Predictor",
    "Scenario",
    "SimConfig",
    "SimTraj",
    "Simulator",
    "TrainStep",
    "TrajectorySpec",
    "Turn",
    "Workload",
    "azure_workload",
    "build_report",
    "demo_scenario",
    "lending_config_from_dict",
    "load_trace",
    "load_workload",
    "make_policy",
    "parse_workload",
    "run_bench",
    "run_policy",
    "run_replay",
    "save_workload",
    "swebench_runs",
    "swebench_workload",
    "synthetic_spot_trace",
    "synthetic_workload",
    "truncate_to_context",
    "vary",
    "workload_to_jsonl",
    "write_report",
]
