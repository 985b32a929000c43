"""CLI commands of this module (registered through the ``rollplan.cli`` entry-point group).

    rollplan bench executor --json                         # latencies of real vLLM CPU engines (JSON)
    rollplan bench executor --profile-out prof.jsonl       # + measured timings for `rollplan perf fit --profile`
    rollplan bench executor --spec --spec-only --json      # speculative decoding on grouped samples (docs/seer.md)
    rollplan bench fidelity --seeds 0,1,2 --json           # simulator vs real engines, same workload and script

Registration imports nothing heavy: Ray and vLLM load only when the command runs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rollplan.models.errors import SchemaError

ROWS = (
    ("engine start", "engine_start_s"),
    ("wake", "wake_s"),
    ("sleep", "sleep_s"),
    ("weight sync (reload, per engine)", "weight_sync_reload_s"),
    ("weight sync (end to end)", "weight_sync_end_to_end_s"),
    ("role switch (routing)", "role_switch_s"),
    ("first P/D token after a switch", "pd_first_token_after_switch_s"),
    ("migration, KV transfer", "migration_kv_s"),
    ("migration, re-prefill", "migration_reprefill_s"),
)


def _value(out: dict, key: str) -> float | None:
    v = out.get(key)
    return v.get("median") if isinstance(v, dict) else v


def _table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"executor latencies, medians of {out['repeats']} (CPU engines, tiny model)")
    table.add_column("what")
    table.add_column("seconds", justify="right")
    for label, key in ROWS:
        v = _value(out, key)
        table.add_row(label, "-" if v is None else f"{v:.4f}")
    for p in out.get("profile", []):
        table.add_row(f"decode step, batch {p['batch']}", f"{p['decode_step_s']:.4f}")
    if (s := out.get("speculative")) is not None:
        table.add_row(f"speculative ({s['method']}, k={s['num_speculative_tokens']}) speedup", f"{s['speedup']:.2f}x")
        table.add_row("speculative acceptance / lossless", f"{s['acceptance_rate']:.3f} / {s['lossless']}")
    Console(stderr=True).print(table)


def _spec_config(spec: bool, method: str, tokens: int):
    """The ``--spec`` options as a ``SpeculativeConfig`` (None without ``--spec``); its checks give the
    one-line errors (unknown method, draft length <= 0, suffix without its package)."""
    if not spec:
        return None
    from rollplan.executor.config import SpeculativeConfig

    return SpeculativeConfig(method=method, num_speculative_tokens=tokens)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this module's commands to the root app and the ``bench`` sub-app."""

    @bench.command("executor")
    def bench_executor(
        json_out: Annotated[
            bool, typer.Option("--json", help="Print the results as one JSON object.")
        ] = False,
        repeats: Annotated[int, typer.Option(min=1, max=50, help="Repeats per measurement (medians).")] = 5,
        profile_out: Annotated[
            Path | None,
            typer.Option(
                "--profile-out", help="Write measured timings as JSONL for `rollplan perf fit --profile`."
            ),
        ] = None,
        batches: Annotated[
            str, typer.Option(help="Comma-separated decode batch sizes to profile.")
        ] = "1,4,16,32",
        model: Annotated[
            Path | None, typer.Option(help="A local model folder (default: build the tiny model).")
        ] = None,
        policy: Annotated[
            str, typer.Option("--policy", help="The decision core's policy for the final rollout: rollplan | elastic-plus.")
        ] = "rollplan",
        rollout: Annotated[
            int, typer.Option("--rollout", min=0, help="Toy trajectories rolled out at the end under --policy (0: none).")
        ] = 32,
        spec: Annotated[
            bool, typer.Option("--spec", help="Also measure speculative decoding on grouped samples (docs/seer.md).")
        ] = False,
        spec_only: Annotated[
            bool, typer.Option("--spec-only", help="With --spec: skip the other measurements.")
        ] = False,
        spec_method: Annotated[
            str, typer.Option("--spec-method", help="group-ngram | ngram | suffix (needs arctic-inference).")
        ] = "group-ngram",
        spec_tokens: Annotated[int, typer.Option("--spec-tokens", help="Draft length k (>= 1).")] = 8,
    ) -> None:
        """Measure engine start, wake, weight sync, role switch and migration latencies on CPU engines."""
        try:
            sizes = tuple(int(x) for x in batches.split(",") if x.strip())
        except ValueError:
            raise SchemaError(
                "--batches", f"not a list of integers: {batches!r}", fix="e.g. --batches 1,4,16"
            ) from None
        if model is not None and not (model / "config.json").is_file():
            raise SchemaError(
                str(model), "no config.json: not a model folder", fix="pass a Hugging Face model folder"
            )
        from rollplan.executor.bench import run_bench, write_profile
        from rollplan.executor.config import EXECUTOR_POLICIES

        if policy not in EXECUTOR_POLICIES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("executor policy", policy, EXECUTOR_POLICIES)

        def log(msg: str) -> None:
            print(f"[bench executor] {msg}", file=sys.stderr, flush=True)

        spec_cfg = _spec_config(spec, spec_method, spec_tokens)  # bad input fails before any engine starts
        out: dict[str, Any]
        profile: list[dict]
        out, profile = ({"repeats": repeats}, []) if spec and spec_only else run_bench(
            repeats=repeats, batches=sizes, model=model, log=log, policy=policy, rollout_trajectories=rollout)
        if spec_cfg is not None:
            from rollplan.executor.bench import run_spec_bench

            out["speculative"] = run_spec_bench(
                method=spec_cfg.method, num_speculative_tokens=spec_cfg.num_speculative_tokens,
                repeats=repeats, model=model, log=log,
            )
        if profile_out is not None:
            write_profile(profile_out, profile)
            out["profile_out"] = str(profile_out)
        if json_out:
            print(json.dumps(out, indent=2))
        else:
            _table(out)
            print(json.dumps(out))

    @bench.command("fidelity")
    def bench_fidelity(
        json_out: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object.")] = False,
        seeds: Annotated[
            str, typer.Option("--seeds", "--seed", help="Comma-separated workload seeds (one real run per seed and policy).")
        ] = "0,1,2",
        policies: Annotated[
            str, typer.Option("--policies", help="Comma-separated policies: rollplan, elastic-plus.")
        ] = "rollplan,elastic-plus",
        data: Annotated[
            Path, typer.Option("--data", help="The shared data folder (SWE-bench tool-call durations).")
        ] = Path("../shared/data"),
        groups: Annotated[int, typer.Option("--groups", min=1, max=64, help="Prompts per batch (x 4 samples).")] = 24,
        tool_scale: Annotated[
            float, typer.Option("--tool-scale", help="Seconds of tool wait per second in the SWE-bench traces.")
        ] = -1.0,
        also_fold_tool_s: Annotated[
            str, typer.Option("--also-fold-tool-s", help="Comma list of segment foldings the simulator also "
                              "replays each real run with (0: turn by turn); the JSON's 'sim_by_fold'.")
        ] = "",
        kv_cache_mib: Annotated[
            float, typer.Option("--kv-cache-mib", help="Each engine's KV cache in MiB (the tiny model: 1,024 "
                                "tokens a MiB); 64 by default, where the batch never fills it. Smaller puts the "
                                "engines under KV pressure (e.g. 3).")
        ] = 64.0,
    ) -> None:
        """Real vLLM CPU engines under the executor vs the simulator, same workload, script and policy."""
        from rollplan.executor.fidelity import DEFAULT_TOOL_SCALE, FIDELITY_POLICIES, run_fidelity
        from rollplan.models.errors import UnknownNameError

        try:
            seed_list = tuple(int(x) for x in seeds.split(",") if x.strip())
        except ValueError:
            raise SchemaError("--seeds", f"not a list of integers: {seeds!r}", fix="e.g. --seeds 0,1,2") from None
        if not seed_list:
            raise SchemaError("--seeds", "no seed given", fix="e.g. --seeds 0,1,2")
        names = tuple(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
        for p in names:
            if p not in FIDELITY_POLICIES:
                raise UnknownNameError("fidelity policy", p, FIDELITY_POLICIES)
        if not names:
            raise SchemaError("--policies", "no policy given", fix="e.g. --policies rollplan,elastic-plus")
        scale = DEFAULT_TOOL_SCALE if tool_scale < 0 else tool_scale
        try:
            folds = tuple(float(x) for x in also_fold_tool_s.split(",") if x.strip())
        except ValueError:
            raise SchemaError("--also-fold-tool-s", f"not a list of numbers: {also_fold_tool_s!r}",
                              fix="e.g. --also-fold-tool-s 0") from None
        if any(not (math.isfinite(f) and f >= 0.0) for f in folds):
            raise SchemaError("--also-fold-tool-s", f"every folding must be a number of seconds >= 0: {folds}",
                              fix="e.g. --also-fold-tool-s 0")
        if not (math.isfinite(kv_cache_mib) and 1.0 <= kv_cache_mib <= 4096.0):
            raise SchemaError("--kv-cache-mib", f"must be between 1 and 4096 MiB: {kv_cache_mib}",
                              fix="e.g. --kv-cache-mib 3 (KV pressure) or 64 (the default)")
        if not (data / "agent_swebench_tool_calls.csv").is_file():
            raise SchemaError(str(data), "has no agent_swebench_tool_calls.csv",
                              fix="pass --data the shared data folder (../shared/data)")

        def log(msg: str) -> None:
            print(f"[bench fidelity] {msg}", file=sys.stderr, flush=True)

        out = run_fidelity(seeds=seed_list, policies=names, data_dir=data, groups=groups, tool_scale=scale, log=log,
                           also_folds=folds, kv_cache_bytes=int(kv_cache_mib * (1 << 20)))
        if json_out:
            print(json.dumps(out, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="simulator vs real engines (rollout seconds; error = (sim - real) / real)")
        for col in ("seed", "policy", "real s", "sim s", "error", "traj. error p50 / p90",
                    "prefix lost (real) / evictions (sim)", "ranking same"):
            table.add_column(col, justify="right")
        for r in out["runs"]:
            for p, v in r["policies"].items():
                ce = v["completion_error"]
                table.add_row(str(r["seed"]), p, f"{v['real_rollout_s']:.2f}", f"{v['sim_rollout_s']:.2f}",
                              f"{v['error']:+.1%}", f"{ce['median']:.1%} / {ce['p90']:.1%}",
                              f"{v['real_prefix_lost']['turns']} / {v['sim_evictions']}", str(r["ranking"]["same"]))
        Console(stderr=True).print(table)
        print(json.dumps({k: out[k] for k in ("policies", "ranking_preserved", "within_15pct", "bench_seconds")}))
