"""CLI commands of this module (registered through the ``rollplan.cli`` entry-point group).

    rollplan bench executor --json                         # latencies of real vLLM CPU engines (JSON)
    rollplan bench executor --profile-out prof.jsonl       # + measured timings for `rollplan perf fit --profile`
    rollplan bench executor --spec --spec-only --json      # speculative decoding on grouped samples (docs/seer.md)

Registration imports nothing heavy: Ray and vLLM load only when the command runs.
"""

from __future__ import annotations

import json
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
