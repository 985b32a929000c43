"""rollplan.executor: applies rollplan's plans to vLLM engines on a Ray cluster (see docs/executor.md).

Importing this package is cheap (Ray and vLLM load on first use); the main names are re-exported lazily:
``RolloutExecutor``, ``ExecutorConfig``, ``EngineConfig``, ``KVConnectorConfig``, ``RolloutItem``,
``SamplingConfig``, ``Observation``, ``TurnOutput``, ``TrajectoryResult``, ``build_tiny_model``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time the names load lazily (below)
    from rollplan.executor.agent import Observation, RolloutItem, SamplingConfig, TrajectoryResult, TurnOutput
    from rollplan.executor.config import EngineConfig, ExecutorConfig, KVConnectorConfig
    from rollplan.executor.executor import RolloutExecutor
    from rollplan.executor.tiny_model import build_tiny_model

_EXPORTS = {
    "RolloutExecutor": "rollplan.executor.executor",
    "ExecutorConfig": "rollplan.executor.config",
    "EngineConfig": "rollplan.executor.config",
    "KVConnectorConfig": "rollplan.executor.config",
    "RolloutItem": "rollplan.executor.agent",
    "SamplingConfig": "rollplan.executor.agent",
    "Observation": "rollplan.executor.agent",
    "TurnOutput": "rollplan.executor.agent",
    "TrajectoryResult": "rollplan.executor.agent",
    "build_tiny_model": "rollplan.executor.tiny_model",
}

__all__ = [
    "EngineConfig",
    "ExecutorConfig",
    "KVConnectorConfig",
    "Observation",
    "RolloutExecutor",
    "RolloutItem",
    "SamplingConfig",
    "TrajectoryResult",
    "TurnOutput",
    "build_tiny_model",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rollplan.executor' has no attribute {name!r}")
