"""``rollplan workload build`` / ``rollplan workload summary``: build rollout workloads as JSONL.

Registered by ``rollplan.sim.cli`` through ``register_workload(app)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from rollplan.models.errors import UserInputError
from rollplan.models.specs import model_spec
from rollplan.sim.workload import (
    DEFAULT_DISPERSION,
    Workload,
    azure_workload,
    check_dispersion,
    load_workload,
    swebench_workload,
    synthetic_workload,
    with_dispersion,
    workload_to_jsonl,
)

SOURCES = ("swebench", "azure", "synthetic")


def _max_context(value: str | None) -> int | None:
    """``--max-context``: a token count, or a model preset name meaning that model's ``max_context``."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return model_spec(value).max_context  # unknown name -> UnknownNameError (exit 2)


def _need(path: Path | None, option: str, source: str) -> Path:
    if path is None:
        raise UserInputError(f"--from {source} needs {option} FILE",
                             fix=f"pass {option} (the shared data is in ../shared/data)")
    return path


def build_workload(
    source: str,
    *,
    llm_calls: Path | None = None,
    tool_calls: Path | None = None,
    azure: Path | None = None,
    groups: int = 8,
    samples: int = 8,
    seed: int = 0,
    max_context: int | None = None,
    agent_model: str = "all",
    min_turns: int = 1,
    dispersion: float | None = None,
    first_epoch: bool = False,
) -> Workload:
    """The workload the ``build`` command writes (a function so tests and the simulator CLI can share it).

    ``dispersion``: the within-group sigma (``rollplan.sim.workload.with_dispersion``); None: the builder's
    default (``DEFAULT_DISPERSION`` for swebench and synthetic, 0.2 for azure's single-turn samples).
    ``first_epoch``: the file's meta says ``"first_epoch": true``, and a replay of it keys its prompts per
    batch, so no batch finds them in the length history (the decision and its reason: the module docstring
    of ``rollplan.sim.workload``). The trajectories are the same as without it."""
    if dispersion is not None:
        check_dispersion(dispersion)  # before any file is read
    if source == "swebench":
        models = None if agent_model == "all" else [agent_model]
        w = swebench_workload(
            _need(llm_calls, "--llm-calls", source), _need(tool_calls, "--tool-calls", source),
            groups=groups, samples=samples, seed=seed, max_context=max_context, models=models, min_turns=min_turns,
            variation=with_dispersion(dispersion),
        )
    elif source == "azure":
        w = azure_workload(_need(azure, "--azure", source), groups=groups, samples=samples, seed=seed,
                           max_context=max_context, sample_sigma=0.2 if dispersion is None else dispersion)
    elif source == "synthetic":
        w = synthetic_workload(groups, samples, seed, max_context=max_context, variation=with_dispersion(dispersion))
    else:
        raise UserInputError(f"unknown workload source {source!r}", fix=f"use one of: {', '.join(SOURCES)}")
    if first_epoch:
        w = Workload(w.trajectories, {**w.meta, "first_epoch": True})
    return w


def register_workload(app: typer.Typer) -> None:
    """Add the ``workload`` sub-app (``build``, ``summary``) to ``app``."""
    wl = typer.Typer(help="Build and inspect rollout workloads (JSONL, see docs/inputs.md).", no_args_is_help=True)

    @wl.command("build")
    def build(
        source: Annotated[str, typer.Option("--from", help="swebench | azure | synthetic")],
        llm_calls: Annotated[Path | None, typer.Option("--llm-calls", help="agent_swebench_llm_calls.csv")] = None,
        tool_calls: Annotated[Path | None, typer.Option("--tool-calls", help="agent_swebench_tool_calls.csv")] = None,
        azure: Annotated[Path | None, typer.Option("--azure", help="azure_llm_inference_2023_code.csv")] = None,
        groups: Annotated[int, typer.Option("--groups", help="G groups (prompts) in the batch")] = 8,
        samples: Annotated[int, typer.Option("--samples", help="n samples per group")] = 8,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        max_context: Annotated[str | None, typer.Option(
            "--max-context", help="cut trajectories to N tokens of context, or to a model's (e.g. qwen3-8b)"
        )] = None,
        agent_model: Annotated[str, typer.Option("--agent-model", help="swebench: all | glm | haiku")] = "all",
        min_turns: Annotated[int, typer.Option("--min-turns", help="swebench: skip runs with fewer turns")] = 1,
        dispersion: Annotated[float | None, typer.Option(
            "--dispersion", help=f"within-group lognormal sigma of lengths (0: identical samples; default "
                                 f"{DEFAULT_DISPERSION}, azure 0.2)")] = None,
        first_epoch: Annotated[bool, typer.Option(
            "--first-epoch", help="prompts never seen before: a replay of the file keys its prompts per batch, "
                                  "so no length history applies to them")] = False,
        out: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
        summary: Annotated[bool, typer.Option("--summary", help="also print the summary JSON to stderr")] = False,
    ) -> None:
        """Build a G x n rollout batch and write it as JSONL (stdout unless --out)."""
        if out is not None and (out.is_dir() or not out.parent.is_dir()):
            raise UserInputError(f"--out {out}: {'is a folder' if out.is_dir() else 'its folder does not exist'}",
                                 fix="pass a file path in an existing folder")
        w = build_workload(
            source, llm_calls=llm_calls, tool_calls=tool_calls, azure=azure, groups=groups, samples=samples,
            seed=seed, max_context=_max_context(max_context), agent_model=agent_model, min_turns=min_turns,
            dispersion=dispersion, first_epoch=first_epoch,
        )
        text = workload_to_jsonl(w)
        if out is None:
            sys.stdout.write(text)
        else:
            try:
                out.write_text(text, encoding="utf-8")
            except OSError as err:
                raise UserInputError(f"--out {out}: cannot write ({err.strerror})", fix="pass a writable path") from None
            print(f"wrote {len(w)} trajectories in {len(w.groups())} groups to {out}", file=sys.stderr)
        if summary:
            print(json.dumps(w.summary(), indent=2), file=sys.stderr)

    @wl.command("summary")
    def summarize(path: Annotated[Path, typer.Argument(help="a workload JSONL file")]) -> None:
        """Print a workload's statistics as JSON."""
        print(json.dumps(load_workload(path).summary(), indent=2))

    app.add_typer(wl, name="workload")
