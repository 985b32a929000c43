"""CLI commands of the simulator (registered through the ``rollplan.cli`` entry-point group):
``rollplan replay``, ``rollplan demo``, ``rollplan bench replay`` (and ``rollplan workload ...`` from
``rollplan.sim.cli_workload``)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rollplan.models.errors import UserInputError

DEFAULT_DATA = Path("../shared/data")
ToolKvOption = Annotated[str, typer.Option(
    "--tool-kv", help="KV of trajectories in tool calls, every policy: evictable (vLLM prefix cache: new requests "
                      "may evict it, re-prefill) | pinned (kept) | offload (prefix-matching KV store, reload).")]
SharePromptOption = Annotated[bool, typer.Option(
    "--share-prompt/--no-share-prompt",
    help="Samples of a prompt on one GPU share its prompt's KV and prefill (prefix cache).")]
DispersionOption = Annotated[float | None, typer.Option(
    "--dispersion", help="Within-group lognormal sigma of the samples' lengths (0: identical samples; default 0.15).")]
FirstEpochOption = Annotated[bool, typer.Option(
    "--first-epoch", help="Prompts never seen before: no batch's prompts are in the policies' length history.")]
DivideOption = Annotated[int, typer.Option(
    "--divide-tokens", help="Divided rollout (Seer): a trajectory goes back to the dispatcher every N decode tokens "
                            "and may move (KV transfer or re-prefill, priced); 0: off (docs/seer.md).")]


PerfOption = Annotated[str, typer.Option(
    "--perf", help="Step times: calibrated (the shipped measured fits for H100/H200, H800 derived from H100; the "
                   "roofline for other GPU kinds) | roofline.")]


def perf_is_calibrated(perf: str) -> bool:
    """``--perf`` -> ``Scenario.calibrated``; a one-line error for anything else."""
    if perf not in ("calibrated", "roofline"):
        raise UserInputError(f"unknown --perf {perf!r}", fix="use --perf calibrated or --perf roofline")
    return perf == "calibrated"


def _progress_runner(scenario: Any, policies: list[Any], *, quiet: bool, jobs: int = 1) -> Any:
    """Run the replay under a rich progress bar (on stderr; none when ``quiet``). With ``jobs`` > 1 the
    policies run in worker processes and each bar fills when its policy is done."""
    from rollplan.sim.replay import run_replay

    if quiet:
        return run_replay(scenario, policies, jobs=jobs)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    by_batches = scenario.max_batches is not None
    per = float(scenario.max_batches) if by_batches else scenario.end_time
    unit = "batches" if by_batches else "sim-s"
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} " + unit),
                  TimeElapsedColumn(), console=console, transient=False) as prog:
        tasks: dict[str, Any] = {}

        def start(name: str) -> None:
            tasks[name] = prog.add_task(name, total=per)

        def batch(name: str, k: int, t: float) -> None:
            prog.update(tasks[name], completed=min(per, float(k) if by_batches else t))

        res = run_replay(scenario, policies, on_policy_start=start, on_batch=batch, jobs=jobs)
        for name, tid in tasks.items():
            prog.update(tid, completed=per)
            del name
    return res


def print_table(report: dict[str, Any], *, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from rollplan.sim.report import table_rows

    t = Table(title=title)
    for col in ("policy", "tokens/s", "x static", "traj/h", "batches", "rollout s", "last-10% share",
                "same batches", "switch GPU-s", "re-plans", "gap", "wall s"):
        t.add_column(col, justify="right" if col != "policy" else "left")

    def f(x: Any, nd: int = 1) -> str:
        return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    for r in table_rows(report):
        t.add_row(r["policy"], f(r["tokens_per_s"]), f(r["ratio"], 3), f(r["traj_per_h"]), f(r["batches"]),
                  f(r["rollout_s"]), f(r["tail_share"], 3), f(r.get("tail_share_common"), 3),
                  f(r["switching_gpu_s"], 0), f(r["replans"]),
                  f(r["gap"], 3), f(r["wall_s"], 2))
    Console(width=150).print(t)


def _compact(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its plot series (for --json on stdout)."""
    out = dict(report)
    out["policies"] = {k: {kk: vv for kk, vv in v.items() if kk != "series"} for k, v in report["policies"].items()}
    return out


def check_out_dir(out: Path) -> None:
    """Fail before a replay (not after it) when ``--out`` cannot take the report: create the folder now."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} is a file", fix="pass a folder path (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"--out {out}: cannot create the folder ({err.strerror})",
                             fix="pass a writable folder path") from None


def write_report_or_fail(report: dict[str, Any], out: Path) -> dict[str, str]:
    from rollplan.sim.report import write_report

    try:
        return write_report(report, out)
    except OSError as err:
        raise UserInputError(f"--out {out}: cannot write the report ({err.strerror})",
                             fix="pass a writable folder path") from None


def load_lending_file(path: Path) -> Any:
    """A lending config file (docs/inputs.md, "Training-GPU lending"): JSON (``.json``) or TOML (other), the keys
    at the top level or under ``lending``. Returns a ``LendingConfig``; bad files are one-line user errors."""
    import tomllib

    from rollplan.models.errors import SchemaError
    from rollplan.sim.lending import lending_config_from_dict

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"--lending {path}: file not found", fix="check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"--lending {path}: cannot read the file ({err})", fix="pass a UTF-8 text file") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{path}:{err.lineno}", f"not valid JSON ({err.msg})", fix="fix the JSON syntax") from None
    except tomllib.TOMLDecodeError as err:
        raise SchemaError(str(path), f"not valid TOML ({err})", fix="fix the TOML syntax (or name the file .json)") from None
    if not isinstance(data, dict):
        raise SchemaError(str(path), "expected a mapping of lending keys", fix="see docs/inputs.md for the keys")
    if "lending" in data:
        data = data["lending"]
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: lending", "expected a mapping", fix="see docs/inputs.md for the keys")
    return lending_config_from_dict(data, source=str(path))


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add ``replay``, ``demo`` and ``bench replay`` (and ``workload`` when available)."""
    try:
        from rollplan.sim.cli_workload import register_workload
    except ImportError:  # pragma: no cover - the inputs module is part of the same package
        pass
    else:
        register_workload(app)
    register_pd_crossover(bench)
    register_sensitivity(bench)

    @app.command("replay")
    def replay_cmd(
        availability: Annotated[str, typer.Option("--availability", help="Availability trace file, or 'none'.")],
        workload: Annotated[str, typer.Option(
            "--workload", help="Workload JSONL file, 'builtin' (synthetic SWE-like prompts) or 'swebench' (--data).")],
        trace_format: Annotated[str, typer.Option("--trace-format", help="auto|events|segments|counts-json|counts-text")] = "auto",
        segment: Annotated[str | None, typer.Option("--segment", help="Segment of a segments trace file.")] = None,
        model: Annotated[str, typer.Option("--model", help="Model preset.")] = "qwen3-8b",
        gpu: Annotated[str, typer.Option("--gpu", help="GPU kind of every slot.")] = "h800",
        dedicated: Annotated[int, typer.Option("--dedicated", min=0, help="Dedicated rollout GPUs.")] = 16,
        lent: Annotated[int, typer.Option("--lent", min=0, help="Training GPUs lent between steps.")] = 8,
        max_gpus: Annotated[int, typer.Option("--max-gpus", min=1, help="Cap on preemptible GPUs from the trace.")] = 16,
        notice_s: Annotated[float, typer.Option("--notice-s", min=0.0, help="Preemption notice (0: none, KV lost).")] = 30.0,
        policies: Annotated[str, typer.Option("--policies", help="'all' or a comma list.")] = "all",
        batches: Annotated[int | None, typer.Option("--batches", min=1, help="Stop after N rollouts.")] = None,
        mode: Annotated[str, typer.Option("--mode", help="sync | async (one-step off-policy).")] = "sync",
        train_step_s: Annotated[float, typer.Option("--train-step-s", min=0.0, help="Training step seconds.")] = 120.0,
        lending_file: Annotated[Path | None, typer.Option(
            "--lending", help="Lending config file (JSON or TOML, docs/inputs.md); replaces --lent, --train-step-s, "
                              "--mode.")] = None,
        gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, help="GPUs per trace node.")] = 1,
        jobs: Annotated[int, typer.Option("--jobs", min=1, help="Worker processes (policies in parallel).")] = 1,
        groups: Annotated[int, typer.Option("--groups", min=1, help="Prompts per batch (builtin/swebench).")] = 32,
        samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per prompt (builtin/swebench).")] = 8,
        data: Annotated[Path, typer.Option("--data", help="Shared data folder (for --workload swebench).")] = DEFAULT_DATA,
        backend: Annotated[str, typer.Option("--backend", help="rollplan's planner backend (the executor's default).")] = "milp",
        time_limit: Annotated[float, typer.Option(
            "--time-limit", min=0.001,
            help="rollplan: seconds per plan, a deterministic work budget; each plan takes effect this long after "
                 "the state it was solved on (the solve is charged in simulated time).")] = 1.0,
        replan_interval: Annotated[float, typer.Option("--replan-interval", min=0.0, help="Seconds between re-plans.")] = 120.0,
        pd: Annotated[str, typer.Option("--pd", help="static-disagg P:D split (and formula-pd's start).")] = "1:3",
        fold_tool_s: Annotated[float, typer.Option("--fold-tool-s", min=0.0, help="Simulator segment folding.")] = 30.0,
        tool_kv: ToolKvOption = "evictable",
        share_prompt: SharePromptOption = True,
        out: Annotated[Path, typer.Option("--out", help="Folder for report.json and the plots.")] = Path("replay-out"),
        as_json: Annotated[bool, typer.Option("--json", help="Print the report JSON (no plot series) on stdout.")] = False,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the workload variation.")] = 0,
        dispersion: DispersionOption = None,
        first_epoch: FirstEpochOption = False,
        history: Annotated[Path | None, typer.Option(
            "--history", help="Workload JSONL of trajectories finished before the replay, each naming its prompt by "
                              "its group: the length history rollplan and elastic-plus start from.")] = None,
        perf: PerfOption = "calibrated",
        spec_tokens: Annotated[int, typer.Option(
            "--spec-tokens", help="Grouped speculative decoding on every slot: draft length k (0: off; docs/seer.md).")] = 0,
        spec_acceptance: Annotated[float, typer.Option(
            "--spec-acceptance", help="Acceptance once all of a group's siblings finished (rises linearly with them).")] = 0.7,
        spec_base_acceptance: Annotated[float, typer.Option(
            "--spec-base-acceptance", help="Acceptance before any sibling finished (own-context drafts).")] = 0.0,
        divide_tokens: DivideOption = 0,
    ) -> None:
        """Replay an availability trace with a workload under the policies; report and plots in --out."""
        from rollplan.models.specs import gpu_kind, model_spec
        from rollplan.sim.engine import SimConfig
        from rollplan.sim.lending import LendingConfig, LendMode
        from rollplan.sim.policies import make_policy, parse_pd, parse_policies
        from rollplan.sim.replay import Scenario, batch_source
        from rollplan.sim.report import build_report
        from rollplan.sim.traces import TRACE_FORMATS, load_trace

        model_spec(model)
        gpu_kind(gpu)
        sim_cfg = SimConfig(fold_tool_s=fold_tool_s, tool_kv=tool_kv, share_prompt=share_prompt,
                            spec_tokens=spec_tokens, spec_acceptance=spec_acceptance,
                            spec_base_acceptance=spec_base_acceptance, divide_tokens=divide_tokens)
        if mode not in ("sync", "async"):
            raise UserInputError(f"unknown mode {mode!r}", fix="use --mode sync or --mode async")
        if trace_format not in TRACE_FORMATS:
            raise UserInputError(f"unknown --trace-format {trace_format!r}", fix=f"use one of: {', '.join(TRACE_FORMATS)}")
        names = parse_policies(policies)
        split = parse_pd(pd)
        from rollplan.models.errors import UnknownNameError
        from rollplan.solver import BACKENDS

        if backend not in BACKENDS:  # checked even when rollplan is not among --policies
            raise UnknownNameError("planner backend", backend, BACKENDS)
        lending = (load_lending_file(lending_file) if lending_file is not None
                   else LendingConfig(gpus=lent, gpu=gpu, train_step_s=train_step_s, mode=LendMode(mode)))
        trace = None
        if availability != "none":
            trace = load_trace(availability, format=trace_format, segment=segment, gpu=gpu,  # type: ignore[arg-type]
                               gpus_per_node=gpus_per_node, max_gpus=max_gpus, notice_s=notice_s)
            if not trace.duration_s > 0:
                raise UserInputError(f"{availability}: the trace covers 0 seconds (every row at one time)",
                                     fix="give rows at two or more times (counts: two lines or more)")
        if trace is None and batches is None:
            raise UserInputError("with --availability none the replay needs --batches N", fix="pass --batches N")
        from rollplan.sim.bench_replay import prompt_keys, workload_options
        from rollplan.sim.workload import check_dispersion, load_history, workload_meta

        if dispersion is not None:
            check_dispersion(dispersion)
        check_out_dir(out)
        src = batch_source(workload, model=model, groups=groups, samples=samples, seed=seed, data_dir=data)
        first_epoch = first_epoch or (src.groups <= 0 and workload_meta(workload).get("first_epoch") is True)
        hist = None
        if history is not None:
            from rollplan.sim.engine import SimTraj

            hist = [(SimTraj.from_spec(t), t.group) for t in load_history(history, prompt_keys(src))]
        sc = Scenario(
            name=f"replay:{Path(availability).name if trace else 'none'}",
            batches=workload_options(src, dispersion=dispersion, first_epoch=first_epoch),
            model=model, gpu=gpu, dedicated=dedicated, trace=trace, lending=lending,
            max_batches=batches, seed=seed, sim=sim_cfg, replan_interval_s=replan_interval,
            calibrated=perf_is_calibrated(perf),
        )
        pols = [make_policy(n, pd=split, backend=backend, time_limit=time_limit) for n in names]
        if hist:
            for pol in pols:
                pol.warm_start(hist)  # history-keeping policies learn from it; the others ignore it
        t0 = time.perf_counter()
        result = _progress_runner(sc, pols, quiet=as_json, jobs=jobs)
        report = build_report(result)
        paths = write_report_or_fail(report, out)
        idle = [r.name for r in result.runs if r.summary["batches_completed"] == 0]
        if idle:
            print(f"warning: no batch finished within the replay for {', '.join(idle)} "
                  f"({result.runs[0].summary['replay_s']:.0f} s simulated): use a longer trace, smaller batches "
                  f"(--groups/--samples) or more GPUs", file=sys.stderr)
        if as_json:
            print(json.dumps(_compact(report), indent=1))
            return
        print_table(report, title=f"{sc.name}: {sc.describe()['batch_size']} trajectories/batch, "
                                  f"{result.runs[0].summary['replay_s'] / 3600:.2f} h simulated")
        print(f"report: {paths['report']}\nplots:  {paths['roles']}, {paths['throughput']}, {paths['completion_cdf']}")
        print(f"wall: {time.perf_counter() - t0:.1f} s")

    @app.command("demo")
    def demo_cmd(
        out: Annotated[Path, typer.Option("--out", help="Folder for report.json and the plots.")] = Path("demo-out"),
        seed: Annotated[int, typer.Option("--seed", help="Demo seed.")] = 0,
        batches: Annotated[int, typer.Option("--batches", min=1, help="RL iterations to replay.")] = 5,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report JSON (no plot series).")] = False,
    ) -> None:
        """A built-in seeded replay (no files): 16 dedicated + 8 lent + up to 16 spot H800s, Qwen3-8B, SWE-like batches."""
        from rollplan.sim.demo import demo_scenario
        from rollplan.sim.policies import POLICY_NAMES, make_policy
        from rollplan.sim.report import build_report

        t0 = time.perf_counter()
        check_out_dir(out)
        sc = demo_scenario(seed, batches=batches)
        result = _progress_runner(sc, [make_policy(n) for n in POLICY_NAMES], quiet=as_json)
        report = build_report(result)
        paths = write_report_or_fail(report, out)
        if as_json:
            print(json.dumps(_compact(report), indent=1))
            return
        print_table(report, title=f"rollplan demo (seed {seed}): {sc.describe()['batch_size']} trajectories/batch")
        print(f"report: {paths['report']}\nplots:  {paths['roles']}, {paths['throughput']}, {paths['completion_cdf']}")
        print(f"wall: {time.perf_counter() - t0:.1f} s")

    @bench.command("replay")
    def bench_replay_cmd(
        data: Annotated[Path, typer.Option("--data", help="Shared data folder.")] = DEFAULT_DATA,
        traces: Annotated[str, typer.Option("--traces", help="'all' or a comma list of bench trace names.")] = "all",
        seed: Annotated[int, typer.Option("--seed")] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON only.")] = False,
        jobs: Annotated[int, typer.Option("--jobs", min=0, help="Worker processes per trace (same results); "
                                          "0: one per CPU core, at most one per policy.")] = 0,
        tool_kv: ToolKvOption = "evictable",
        share_prompt: SharePromptOption = True,
        fold_tool_s: Annotated[float | None, typer.Option("--fold-tool-s", help="Simulator segment folding for "
                                                          "every scenario (0: exact turn-level events); default: "
                                                          "the simulator's (30 s).")] = None,
        evicted_return: Annotated[str | None, typer.Option(
            "--evicted-return", help="Where a trajectory whose KV an engine evicted in its tool call goes back "
            "to, for every scenario: policy (the simulator's default: the policy's queue) | slot (the engine "
            "that evicted it, as the executor does).")] = None,
        mode: Annotated[str | None, typer.Option("--mode", help="sync (the bench's, the default: rollout, then the "
                                                 "training step) | async (one-step off-policy, as PEARL).")] = None,
        per_batch: Annotated[bool, typer.Option("--per-batch", help="Add each batch's floor and every policy's "
                                                "rollout seconds and last-10% share to the JSON.")] = False,
        dispersion: DispersionOption = None,
        first_epoch: FirstEpochOption = False,
        regime: Annotated[str, typer.Option("--regime", help="rollplan's admission regime rule: model (the "
                                            "default: the step model decides) | share (the rule it replaced, "
                                            "BULK_SHARE of the longest path), to compare.")] = "model",
        moves: Annotated[str | None, typer.Option("--moves", help="which of its plans' migrations rollplan carries out: "
                                           "all | forced (only off a slot that is leaving or stops decoding); "
                                           "default: the policy's (MOVES).")] = None,
        oracle: Annotated[bool, typer.Option("--oracle", help="Also replay rollplan told every trajectory's true "
                                             "lengths, and rollplan told them once a trajectory has started "
                                             "(references, not policies: the JSON's 'oracle' per row / cell; "
                                             "never the best other).")] = False,
        matrix: Annotated[bool, typer.Option("--matrix", help="Every trace x {sync, async} x {128x16-history, "
                                             "32x8-no-history, dispersion-0.6}: the JSON's 'matrix' (docs/simulator.md).")] = False,
        seeds: Annotated[str | None, typer.Option("--seeds", help="With --matrix: run it once per workload seed "
                                                  "(comma list, e.g. 0,1,2) and report each cell's median, min "
                                                  "and max over them (replaces --seed).")] = None,
        window_h: Annotated[float | None, typer.Option("--window-h", help="With --matrix, --spec-tokens or "
                                                       "--divide-tokens: cut each trace to its first H hours "
                                                       "(default: whole traces).")] = None,
        spec_tokens: Annotated[int, typer.Option("--spec-tokens", help="> 0: replay every trace without and with "
                                                 "grouped speculative decoding (draft length k; docs/seer.md).")] = 0,
        spec_acceptance: Annotated[float, typer.Option("--spec-acceptance", help="With --spec-tokens: acceptance "
                                                       "once a group's siblings all finished.")] = 0.7,
        spec_base_acceptance: Annotated[float, typer.Option("--spec-base-acceptance", help="With --spec-tokens: "
                                                            "acceptance before any sibling finished.")] = 0.0,
        divide_tokens: Annotated[int, typer.Option("--divide-tokens", help="> 0: replay every trace without and with "
                                                   "divided rollout (chunks of N decode tokens; docs/seer.md).")] = 0,
    ) -> None:
        """The replay benchmark on every shared trace: throughput ratios, last-10% shares, p3 replay wall time."""
        from rollplan.sim.bench_replay import BENCH_TRACES, default_jobs, run_bench
        from rollplan.sim.engine import TOOL_KV_MODES

        if tool_kv not in TOOL_KV_MODES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("tool KV mode", tool_kv, TOOL_KV_MODES)

        if mode is not None and mode not in ("sync", "async"):
            raise UserInputError(f"unknown mode {mode!r}", fix="use --mode sync or --mode async")
        from rollplan.sim.policies import REGIMES

        if regime not in REGIMES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("regime", regime, REGIMES)
        if matrix:
            clash = [f for f, on in (("--mode", mode is not None), ("--dispersion", dispersion is not None),
                                     ("--first-epoch", first_epoch), ("--spec-tokens", spec_tokens != 0),
                                     ("--divide-tokens", divide_tokens != 0)) if on]
            if clash:
                raise UserInputError(f"--matrix sets the mode and workload of each cell itself; got {', '.join(clash)}",
                                     fix=f"drop {', '.join(clash)} (or run without --matrix)")
        if seeds is not None and not matrix:
            raise UserInputError("--seeds runs the matrix once per seed", fix="add --matrix, or use --seed N")
        if seeds is not None and seed != 0:
            raise UserInputError("--seeds replaces --seed", fix="drop --seed (list every seed in --seeds)")
        if seeds is not None and per_batch:
            raise UserInputError("--per-batch reports one replay's batches; --seeds reports each cell's spread",
                                 fix="drop --per-batch, or run one seed with --seed N --per-batch")
        seed_list = None
        if seeds is not None:
            from rollplan.sim.bench_seeds import parse_seeds

            seed_list = parse_seeds(seeds)
        if not matrix and window_h is not None and not (spec_tokens or divide_tokens):
            raise UserInputError("--window-h cuts the windows of --matrix, --spec-tokens or --divide-tokens only",
                                 fix="add one of them, or drop --window-h")
        if regime != "model" and (spec_tokens or divide_tokens):
            raise UserInputError("--regime applies to the replay bench and --matrix, not to the lever comparisons",
                                 fix="drop --regime, or --spec-tokens / --divide-tokens")
        from rollplan.sim.policies import MOVE_RULES, MOVES

        if moves is not None and moves not in MOVE_RULES:
            from rollplan.models.errors import UnknownNameError

            raise UnknownNameError("move rule", moves, MOVE_RULES)
        if moves is not None and (spec_tokens or divide_tokens):
            raise UserInputError("--moves applies to the replay bench and --matrix, not to the lever comparisons",
                                 fix="drop --moves, or --spec-tokens / --divide-tokens")
        moves = moves or MOVES
        if oracle and (spec_tokens or divide_tokens):
            raise UserInputError("--oracle applies to the replay bench and --matrix, not to the lever comparisons",
                                 fix="drop --oracle, or --spec-tokens / --divide-tokens")
        if spec_tokens and divide_tokens:
            raise UserInputError("--spec-tokens and --divide-tokens each compare one lever on / off",
                                 fix="run them one at a time")
        if divide_tokens:
            from rollplan.sim.engine import SimConfig

            SimConfig(divide_tokens=divide_tokens)  # a bad value is a one-line error before any replay
        mode = mode or "sync"
        from rollplan.sim.bench_replay import FOLD_TOOL_S

        if fold_tool_s is not None and not (math.isfinite(fold_tool_s) and fold_tool_s >= 0.0):
            raise UserInputError(f"--fold-tool-s must be a number of seconds >= 0, got {fold_tool_s}",
                                 fix="pass e.g. --fold-tool-s 0 (every turn its own segment), or leave it out (30)")
        from rollplan.sim.bench_replay import EVICTED_RETURN
        from rollplan.sim.engine import EVICTED_RETURN_MODES

        if evicted_return is not None and evicted_return not in EVICTED_RETURN_MODES:
            raise UserInputError(f"--evicted-return must be one of {list(EVICTED_RETURN_MODES)}, got {evicted_return!r}",
                                 fix="pass --evicted-return slot (the executor's behaviour), or leave it out (policy)")
        for flag, value in (("--fold-tool-s", fold_tool_s), ("--evicted-return", evicted_return)):
            if value is not None and (spec_tokens or divide_tokens):  # physics of the default bench's scenarios
                raise UserInputError(f"{flag} applies to the default bench and --matrix only",
                                     fix=f"leave out {flag} with --spec-tokens or --divide-tokens")
        fold = FOLD_TOOL_S if fold_tool_s is None else fold_tool_s
        ret = EVICTED_RETURN if evicted_return is None else evicted_return
        if dispersion is not None:
            from rollplan.sim.workload import check_dispersion

            check_dispersion(dispersion)
        names = None if traces == "all" else tuple(t.strip() for t in traces.split(",") if t.strip())
        known = {t[0] for t in BENCH_TRACES}
        for n in names or ():
            if n not in known:
                raise UserInputError(f"unknown bench trace {n!r}", fix=f"use 'all' or some of {sorted(known)}")
        if matrix and seed_list is not None:
            _bench_matrix_seeds(data, names, seeds=seed_list, jobs=jobs or default_jobs(), tool_kv=tool_kv,
                                share_prompt=share_prompt, window_h=window_h, as_json=as_json, regime=regime,
                                moves=moves, oracle=oracle, fold_tool_s=fold, evicted_return=ret)
            return
        if matrix:
            _bench_matrix(data, names, seed=seed, jobs=jobs or default_jobs(), tool_kv=tool_kv,
                          share_prompt=share_prompt, per_batch=per_batch, window_h=window_h, as_json=as_json,
                          regime=regime, moves=moves, oracle=oracle, fold_tool_s=fold, evicted_return=ret)
            return
        if window_h is not None:
            from rollplan.sim.bench_replay import check_window_h

            check_window_h(window_h)
        if spec_tokens:
            from rollplan.sim.bench_replay import run_spec_compare

            print(json.dumps(run_spec_compare(
                data, spec_tokens=spec_tokens, spec_acceptance=spec_acceptance, spec_base_acceptance=spec_base_acceptance,
                traces=names, seed=seed, jobs=jobs or default_jobs(), window_h=window_h,
                on_trace=None if as_json else (lambda n: print(f"replaying {n} with and without speculation ...",
                                                               file=sys.stderr))), indent=1))
            return
        if divide_tokens:
            from rollplan.sim.bench_replay import run_divide_compare

            print(json.dumps(run_divide_compare(
                data, divide_tokens=divide_tokens, traces=names, seed=seed, jobs=jobs or default_jobs(),
                window_h=window_h,
                on_trace=None if as_json else (lambda n: print(f"replaying {n} with and without divided rollout ...",
                                                               file=sys.stderr))), indent=1))
            return
        doc = run_bench(data, traces=names, seed=seed, jobs=jobs or default_jobs(), tool_kv=tool_kv, share_prompt=share_prompt,
                        fold_tool_s=fold, evicted_return=ret, mode=mode, per_batch=per_batch, dispersion=dispersion, first_epoch=first_epoch, regime=regime, moves=moves,
                        oracle=oracle, on_trace=None if as_json else (lambda n: print(f"replaying {n} ...", file=sys.stderr)))
        print(json.dumps(doc, indent=1))
        if as_json:
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title="bench replay: rollplan throughput ratios and last-10% shares")
        for col in ("trace", "h", "vs elastic", "ceiling vs elastic", "vs formula-pd", "vs static", "tail rollplan",
                    "best baseline tail", "vs best other"):
            t.add_column(col, justify="right" if col != "trace" else "left")
        for r in doc["traces"]:
            tails = r["tail_share_common"]
            base = min((v for k, v in tails.items() if k != "rollplan" and v is not None), default=math.nan)
            t.add_row(r["trace"], f"{r['duration_h']:.1f}", str(r["rollplan_vs_elastic"]),
                      str(r["rollplan_vs_elastic_ceiling"]), str(r["rollplan_vs_formula_pd"]),
                      str(r["rollplan_vs_static"]), str(tails.get("rollplan")), f"{base:.4f}",
                      f"{r['rollplan_vs_best_other']} ({r['best_other']['policy']})")
        Console(stderr=True, width=150).print(t)


def _bench_matrix(data: Path, names: tuple[str, ...] | None, *, seed: int, jobs: int, tool_kv: str,
                  share_prompt: bool, per_batch: bool, window_h: float | None, as_json: bool,
                  regime: str, moves: str, fold_tool_s: float, oracle: bool = False,
                  evicted_return: str = "policy") -> None:
    """``bench replay --matrix``: the JSON (``run_matrix``), then, without ``--json``, a table on stderr."""
    from rollplan.sim.bench_replay import check_window_h, run_matrix

    check_window_h(window_h)
    doc = run_matrix(data, traces=names, seed=seed, jobs=jobs, tool_kv=tool_kv, share_prompt=share_prompt,
                     fold_tool_s=fold_tool_s, evicted_return=evicted_return, per_batch=per_batch, window_h=window_h, regime=regime, moves=moves, oracle=oracle,
                     on_cell=None if as_json else (lambda n, m, w: print(f"replaying {n} {m} {w} ...", file=sys.stderr)))
    print(json.dumps(doc, indent=1))
    if as_json:
        return
    from rich.table import Table

    def num(x: Any, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    t = Table(title="bench replay --matrix: tokens/s; share = (rollplan - best other) / (ceiling - best other)")
    cols = ["trace", "mode", "workload", "h", "rollplan", "best other", "ceiling", "vs best other", "share",
            "tail rollplan (lowest other)", "targets"]
    if oracle:
        cols[9:9] = ["oracle share", "started share"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("trace", "mode", "workload", "best other", "targets") else "right")
    for c in doc["matrix"]["cells"]:
        tails = c["tail_share_common"]
        low = min((v for k, v in tails.items() if k != "rollplan" and v is not None), default=None)
        tg = c["targets"]
        marks = ("ok" if tg["not_below_best_other"] else "BELOW") + (
            "" if tg["half_of_what_is_left"] is None else (", half ok" if tg["half_of_what_is_left"] else ", half NO"))
        cells = [c["trace"], c["mode"], c["workload"], f"{c['window_s'] / 3600.0:.1f}",
                 num(c["tokens_per_s"].get("rollplan"), ",.0f"),
                 f"{c['best_other']['policy']} {num(c['best_other']['tokens_per_s'], ',.0f')}",
                 num(c["throughput_ceiling"], ",.0f"), num(c["rollplan_vs_best_other"], ".3f"),
                 num(c["share_of_what_is_left"], ".2f"),
                 f"{num(tails.get('rollplan'), '.3f')} ({num(low, '.3f')})", marks]
        if oracle:
            o = c["oracle"] or {}
            cells[9:9] = [num(o.get("share_of_what_is_left"), ".2f"),
                          num((o.get("started") or {}).get("share_of_what_is_left"), ".2f")]
        t.add_row(*cells)
    sm = doc["matrix"]["summary"]
    _print_table(t, f"cells {sm['cells']}; not below the best other: {sm['not_below_best_other']}; half of what is "
                    f"left (128x16-history): {sm['half_of_what_is_left']}"
                    + (f" (oracle {sm['oracle_half_of_what_is_left']}, started oracle "
                       f"{sm['started_oracle_half_of_what_is_left']})" if oracle else "")
                    + f"; {doc['matrix']['window']['rule']}; wall {doc['wall_s']:.0f} s")


def _print_table(table: Any, summary: str) -> None:
    """A bench table and its one-line summary, on stderr (the JSON went to stdout)."""
    from rich.console import Console

    console = Console(stderr=True, width=170)
    console.print(table)
    console.print(summary)


def _bench_matrix_seeds(data: Path, names: tuple[str, ...] | None, *, seeds: tuple[int, ...], jobs: int,
                        tool_kv: str, share_prompt: bool, window_h: float | None, as_json: bool,
                        regime: str, moves: str, oracle: bool, fold_tool_s: float,
                        evicted_return: str = "policy") -> None:
    """``bench replay --matrix --seeds``: the JSON (``run_matrix_seeds``), then, without ``--json``, a table of
    each cell's spread on stderr."""
    from rollplan.sim.bench_replay import check_window_h
    from rollplan.sim.bench_seeds import run_matrix_seeds

    check_window_h(window_h)
    doc = run_matrix_seeds(
        data, seeds=seeds, traces=names, jobs=jobs, tool_kv=tool_kv, share_prompt=share_prompt, window_h=window_h,
        fold_tool_s=fold_tool_s, evicted_return=evicted_return, regime=regime, moves=moves, oracle=oracle,
        on_seed=None if as_json else (lambda s: print(f"matrix, seed {s} ...", file=sys.stderr)),
        on_cell=None if as_json else (lambda n, m, w: print(f"  replaying {n} {m} {w} ...", file=sys.stderr)))
    print(json.dumps(doc, indent=1))
    if as_json:
        return
    from rich.table import Table

    def rng(sp: dict[str, Any] | None, fmt: str) -> str:
        if sp is None or sp["median"] is None:
            return "-"
        return f"{format(sp['median'], fmt)} ({format(sp['min'], fmt)}-{format(sp['max'], fmt)})"

    t = Table(title=f"bench replay --matrix --seeds {','.join(map(str, seeds))}: median (min-max) over seeds")
    cols = ["trace", "mode", "workload", "rollplan / best other", "share of what is left", "not below", "half"]
    if oracle:
        cols += ["oracle share", "started share", "started / oracle gain"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("trace", "mode", "workload") else "right")
    for c in doc["seeds"]["cells"]:
        row = [c["trace"], c["mode"], c["workload"], rng(c["rollplan_vs_best_other"], ".3f"),
               rng(c["share_of_what_is_left"], ".2f"), c["not_below_best_other"], c["half_of_what_is_left"] or "-"]
        if oracle:
            row += [rng(c["oracle_share_of_what_is_left"], ".2f"), rng(c["started_oracle_share_of_what_is_left"], ".2f"),
                    rng(c["started_oracle_of_oracle_gain"], ".2f")]
        t.add_row(*row)
    sm = doc["seeds"]["summary"]
    _print_table(t, f"cells {sm['cells']}; not below the best other in every seed: "
                    f"{sm['not_below_best_other_every_seed']}; half of what is left in every seed: "
                    f"{sm['half_of_what_is_left_every_seed']}, at the median: {sm['half_of_what_is_left_at_median']}; "
                    f"lowest rollplan / best other: {sm['min_rollplan_vs_best_other']}; wall {doc['wall_s']:.0f} s")


def register_pd_crossover(bench: typer.Typer) -> None:
    """Add ``bench pd-crossover`` (rollplan.sim.bench_pd)."""

    @bench.command("pd-crossover")
    def bench_pd_cmd(
        data: Annotated[Path, typer.Option("--data", help="Shared data folder (SWE-bench agent traces).")] = DEFAULT_DATA,
        seeds: Annotated[str, typer.Option("--seeds", help="Comma list of workload seeds.")] = "0,1,2,3",
        sizes: Annotated[str, typer.Option("--prompts", help="Comma list of prompts per batch (x --samples).")] = "4,12",
        samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per prompt.")] = 8,
        gpus: Annotated[int, typer.Option("--gpus", min=2, help="Dedicated GPUs.")] = 8,
        gpu: Annotated[str, typer.Option("--gpu", help="GPU kind.")] = "h800",
        model: Annotated[str, typer.Option("--model", help="Model preset.")] = "qwen3-8b",
        batches: Annotated[int, typer.Option("--batches", min=1, help="Batches per replay.")] = 3,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON only.")] = False,
        perf: PerfOption = "calibrated",
    ) -> None:
        """Colocated vs disaggregated P/D on dedicated GPUs at two batch sizes, next to PEARL's figures."""
        from rollplan.models.specs import gpu_kind, model_spec
        from rollplan.sim.bench_pd import run_pd_crossover, table_rows

        model_spec(model)
        gpu_kind(gpu)

        def ints(text: str, option: str) -> tuple[int, ...]:
            try:
                vals = tuple(int(x) for x in text.split(",") if x.strip())
            except ValueError:
                raise UserInputError(f"{option} {text!r} is not a comma list of integers", fix=f"e.g. {option} 0,1,2") from None
            if not vals or any(v < 0 for v in vals) or (option == "--prompts" and any(v < 1 for v in vals)):
                raise UserInputError(f"{option} {text!r} needs non-negative integers (prompts >= 1)",
                                     fix=f"e.g. {option} 4,12")
            return vals

        doc = run_pd_crossover(data, sizes=ints(sizes, "--prompts"), samples=samples, seeds=ints(seeds, "--seeds"),
                               gpus=gpus, gpu=gpu, model=model, batches=batches, calibrated=perf_is_calibrated(perf))
        print(json.dumps(doc, indent=1))
        if as_json:
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"bench pd-crossover: {gpus} x {gpu}, {model}, mean rollout s over seeds {seeds}")
        for col in ("trajectories", "colocated s", "best disagg s (P:D)", "colocated / disagg", "faster",
                    "floor s (colocated above)", "any policy at most", "PEARL"):
            t.add_column(col, justify="right")
        for row in table_rows(doc):
            t.add_row(*row)
        Console(stderr=True, width=170).print(t)


def register_sensitivity(bench: typer.Typer) -> None:
    """Add ``bench sensitivity`` (rollplan.sim.bench_sensitivity)."""

    @bench.command("sensitivity")
    def bench_sensitivity_cmd(
        data: Annotated[Path, typer.Option("--data", help="Shared data folder (SWE-bench agent traces).")] = DEFAULT_DATA,
        hours: Annotated[float, typer.Option("--hours", min=0.5, help="Length of each held-out replay.")] = 4.0,
        jobs: Annotated[int, typer.Option("--jobs", min=1, help="Worker processes (same results).")] = 2,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON only.")] = False,
    ) -> None:
        """The rollplan policy's dispatch/admission constants, each moved alone, on held-out scenarios."""
        from rollplan.sim.bench_sensitivity import run_sensitivity, table_rows

        doc = run_sensitivity(data, hours=hours, jobs=jobs)
        print(json.dumps(doc, indent=1))
        if as_json:
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title="bench sensitivity: rollplan tokens/s over its defaults, held-out scenarios")
        for col in ("constant", "default -> value", *doc["setting"]["scenarios"], "median"):
            t.add_column(col, justify="right")
        for row in table_rows(doc):
            t.add_row(*row)
        Console(stderr=True, width=200).print(t)
