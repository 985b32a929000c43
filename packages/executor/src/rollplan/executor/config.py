"""Executor configuration: one frozen dataclass for the engines, one for the executor.

CPU defaults follow ../shared/notes/REAL_ENGINES_ON_CPU.md (float32, in-process engine core, eager mode,
64 MiB of KV cache, no OMP core binding). ``EngineConfig.engine_kwargs()`` turns the config into vLLM
``AsyncEngineArgs`` keyword arguments; ``EngineConfig.env()`` the environment an engine process needs
before ``import vllm``. Nothing here imports vLLM or Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollplan.models.perf import PerfProvider
from rollplan.policy.dispatch import MOVE_RULES, MOVES

WORKER_EXTENSION = "rollplan.executor.worker_ext.WeightSyncExtension"

SPEC_METHODS = ("group-ngram", "ngram", "suffix")
"""Speculative methods ``SpeculativeConfig`` accepts (docs/seer.md): "group-ngram" (rollplan's prompt lookup
over the request's own tokens and its group siblings' outputs on the same engine, a vLLM ``custom_class``
proposer: ``rollplan.executor.spec.GroupNgramProposer``), "ngram" (vLLM's prompt lookup over the request's
own prompt and output), "suffix" (vLLM's suffix decoding: a suffix tree per prompt plus one over every cached
response on the engine; needs ``arctic-inference``)."""

GROUP_NGRAM_PROPOSER = "rollplan.executor.spec.GroupNgramProposer"
GROUP_NGRAM_ENV = "ROLLPLAN_GROUP_NGRAM"


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding on every engine (vLLM ``speculative_config``); lossless under greedy decoding.

    ``method``: one of ``SPEC_METHODS``. ``num_speculative_tokens``: draft length k (>= 1): each decode step
    verifies up to k drafted tokens per sequence. ``prompt_lookup_min``/``prompt_lookup_max``: n-gram sizes
    matched against the lookup context (ngram, group-ngram). ``group_pool``: finished siblings' outputs kept
    per group for group-ngram (the running siblings are always searched). Invalid values raise
    ``SchemaError`` (one line, with the fix) when the config is built, before any engine starts.
    """

    method: str = "group-ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    group_pool: int = 8

    def __post_init__(self) -> None:
        from rollplan.models.errors import SchemaError, UnknownNameError

        if self.method not in SPEC_METHODS:
            raise UnknownNameError("speculative method", self.method, SPEC_METHODS)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "group_pool"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SchemaError(
                    f"speculative {name}",
                    f"must be a positive integer, got {value!r}",
                    fix=f"set {name} >= 1 (e.g. --spec-tokens 4), or turn speculation off",
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SchemaError(
                "speculative prompt_lookup_min",
                f"{self.prompt_lookup_min} is above prompt_lookup_max {self.prompt_lookup_max}",
                fix="set prompt_lookup_min <= prompt_lookup_max",
            )
        if self.method == "suffix":
            import importlib.util

            if importlib.util.find_spec("arctic_inference") is None:
                raise SchemaError(
                    "speculative method 'suffix'",
                    "needs the arctic-inference package, which is not installed",
                    fix="pip install 'rollplan-executor[spec]' (arctic-inference==0.1.1), "
                    "or use method 'group-ngram' or 'ngram'",
                )

    def vllm_kwargs(self) -> dict[str, Any]:
        """``speculative_config`` for vLLM's engine arguments."""
        k = self.num_speculative_tokens
        if self.method == "ngram":
            return {
                "method": "ngram",
                "num_speculative_tokens": k,
                "prompt_lookup_min": self.prompt_lookup_min,
                "prompt_lookup_max": self.prompt_lookup_max,
            }
        if self.method == "suffix":
            return {"method": "suffix", "num_speculative_tokens": k}
        # vLLM overwrites the prompt lookup sizes of a custom proposer: they travel in the environment.
        return {"method": "custom_class", "model": GROUP_NGRAM_PROPOSER, "num_speculative_tokens": k}

    def env_vars(self) -> dict[str, str]:
        if self.method != "group-ngram":
            return {}
        return {GROUP_NGRAM_ENV: f"{self.prompt_lookup_min},{self.prompt_lookup_max},{self.group_pool}"}


@dataclass(frozen=True, slots=True)
class KVConnectorConfig:
    """How KV moves between engines (prefill -> decode, migrations).

    ``kind``: "example" (vLLM's file-based ``ExampleConnector`` made safe for concurrent engines:
    ``rollplan.executor.kv_store.AtomicFileConnector``; ``storage_path`` is the shared folder every engine
    reads and writes; works on CPU), "nixl" (``NixlConnector``; needs the nixl wheel) or "none"
    (every move re-prefills). All engines use ``kv_role="kv_both"``, so a role switch is only routing.
    ``storage_path`` None: the executor makes a private temporary folder and deletes it at shutdown. A
    given folder must be private to one executor and one model: entries are keyed by token ids only.
    """

    kind: str = "example"
    storage_path: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def vllm_kwargs(self) -> dict[str, Any] | None:
        """``KVTransferConfig`` keyword arguments, or None when no connector is configured."""
        if self.kind == "none":
            return None
        if self.kind == "example":
            if self.storage_path is None:
                raise ValueError("the example KV connector needs a storage_path (the executor sets one)")
            extra = {"shared_storage_path": self.storage_path, **self.extra}
            return {
                # vLLM's ExampleConnector file layout, with atomic writes and a completion marker so
                # engines sharing the store never load a half-written entry (rollplan.executor.kv_store).
                "kv_connector": "AtomicFileConnector",
                "kv_connector_module_path": "rollplan.executor.kv_store",
                "kv_role": "kv_both",
                "kv_connector_extra_config": extra,
            }
        if self.kind == "nixl":
            return {
                "kv_connector": "NixlConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": dict(self.extra),
            }
        raise ValueError(f"unknown KV connector kind {self.kind!r} (use example, nixl or none)")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of every vLLM engine the executor starts.

    ``model``: a local model folder (or hub name on machines with access). ``kv_cache_memory_bytes``: KV
    cache per engine (CPU: set this, ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only). ``block_size``: KV
    block tokens; 32 on CPU so prefix caching and the file connector work on short contexts (vLLM's CPU
    default is 128). ``sleep_mode``: ask vLLM for sleep mode where the platform supports it (CUDA/ROCm);
    on CPU the executor's SLEEPING state only stops routing to the engine (weights stay in memory).
    ``cpu_threads``: torch threads per engine process (None: leave torch's default); several engines
    share the CPU cores, so 1 avoids oversubscription. ``env``: extra environment for engine processes.
    ``speculative``: speculative decoding (``SpeculativeConfig``; None: off); with it on, every request's
    result carries its drafted / accepted token counts (vLLM's per-request spec-decode metrics).
    ``start_nice``: on hosts whose engines share CPU cores (the CPU build), start each engine at this CPU
    niceness (1..19) and go back to the normal priority once it serves, so a start (two vLLM imports and the
    engine's build: tens of CPU-seconds) takes idle CPU instead of slowing the engines that serve beside it,
    as a start on another GPU node would not. Measured in docs/simulator.md ("Fidelity"). None: off.
    """

    model: str
    dtype: str = "float32"
    max_model_len: int = 512
    enforce_eager: bool = True
    kv_cache_memory_bytes: int | None = 64 << 20
    gpu_memory_utilization: float = 0.9
    block_size: int | None = 32
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    seed: int = 0
    sleep_mode: bool = False
    connector: KVConnectorConfig = KVConnectorConfig()
    cpu_threads: int | None = 1
    max_num_seqs: int = 128
    env: Mapping[str, str] = field(default_factory=dict)
    speculative: SpeculativeConfig | None = None
    start_nice: int | None = None

    def env_vars(self) -> dict[str, str]:
        """Environment an engine process sets before importing vLLM."""
        base = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "WARNING",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        if self.cpu_threads is not None:
            base["OMP_NUM_THREADS"] = str(self.cpu_threads)
        if self.speculative is not None:
            base.update(self.speculative.env_vars())
        base.update(self.env)
        return base

    def engine_kwargs(self, *, sleep_mode_available: bool) -> dict[str, Any]:
        """Keyword arguments for ``vllm.AsyncEngineArgs`` (the KV connector as a plain dict)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "seed": self.seed,
            "max_num_seqs": self.max_num_seqs,
            "worker_extension_cls": WORKER_EXTENSION,
            "disable_log_stats": True,
            "enable_sleep_mode": self.sleep_mode and sleep_mode_available,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.block_size is not None:
            kwargs["block_size"] = self.block_size
        kv = self.connector.vllm_kwargs()
        if kv is not None:
            kwargs["kv_transfer_config"] = kv
        if self.speculative is not None:
            kwargs["speculative_config"] = self.speculative.vllm_kwargs()
            kwargs["per_request_spec_decode_metrics"] = "summary"
        return kwargs


EXECUTOR_POLICIES = ("rollplan", "elastic-plus")
"""The decision core's policies the executor runs (``ExecutorConfig.policy``)."""


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """Settings of a ``RolloutExecutor``.

    ``slot_resource``: the Ray custom resource that marks one slot (one engine's GPUs) on a node; every
    alive node carrying it contributes ``int(amount)`` slots of kind ``gpu_kind``. ``lend_resource``: the
    resource that marks slots training can lend (used only between ``lend`` and ``reclaim``).
    ``poll_interval``: seconds between Ray membership polls. ``replan_interval``: seconds between
    periodic re-plans while trajectories run (stragglers). ``planner_backend``/``planner_time_limit``: passed
    to ``PlannerConfig``. ``perf``: PerfProvider for the planner; None = the roofline model of
    ``model_name`` on ``gpu_kind`` with the measured CPU switching costs below. ``clock``: wall clock for
    snapshot times and deadlines (absolute seconds, same clock as ``lend(until=...)``).
    ``drain_margin``: seconds before a deadline at which the executor forces a slot empty regardless of the
    plan. ``max_replans_per_event``: bound on chained re-plans after failed actions.
    ``keep_lent_engines``: a lent slot given back keeps its engine asleep instead of stopping it (vLLM
    sleep mode where the platform has it: weights offloaded, KV freed, the GPU's memory back to training;
    on CPU the engine only stops being routed to), so the next ``lend`` of that slot costs a wake and a
    weight sync instead of a cold start. Off by default: a stopped engine frees everything.
    ``policy``: the decision core's policy the controller runs (``EXECUTOR_POLICIES``): "rollplan" (the
    planner's roles, placement and moves; new trajectories admitted longest-predicted-first under the core's
    headrooms) or "elastic-plus" (no planner: every slot MIXED, least-loaded placement, the same
    longest-first order, vLLM's default admission), the simulator's policies of the same names.
    ``admission``: new trajectories wait in the core's dispatch queue until a slot's KV admits them (off: every
    trajectory is routed at once and the engines queue what they cannot fit). ``moves``: which of a plan's
    migrations the controller carries out (``rollplan.policy.dispatch.carries_out_move``: "all", or "forced":
    only off a slot that is leaving or stops decoding), as the simulator's rollplan policy does.
    """

    engine: EngineConfig
    slot_resource: str = "rollplan_slot"
    lend_resource: str = "rollplan_lent_slot"
    gpu_kind: str = "cpu"
    model_name: str = "tiny"
    poll_interval: float = 0.5
    replan_interval: float = 5.0
    planner_backend: str = "milp"
    planner_time_limit: float = 1.0
    switch_weight: float = 0.01
    perf: PerfProvider | None = None
    calibration: str | None = None
    # Measured on the 2-core CI machine (rollplan bench executor, docs/executor.md); used by the default
    # perf model (``perf=None``) and passed to the planner as its role-switch time.
    engine_start_seconds: float = 35.0
    wake_seconds: float = 0.004
    weight_sync_seconds: float = 0.1
    role_switch_seconds: float = 0.01
    drain_margin: float = 1.0
    max_replans_per_event: int = 3
    keep_lent_engines: bool = False
    prediction_prior_tokens: float = 64.0
    policy: str = "rollplan"
    admission: bool = True
    moves: str = MOVES
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if self.policy not in EXECUTOR_POLICIES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("executor policy", self.policy, EXECUTOR_POLICIES)
        if self.moves not in MOVE_RULES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("move rule", self.moves, MOVE_RULES)
