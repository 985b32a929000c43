"""``rollplan perf``: predict step times with a performance model, and fit calibrations.

``rollplan perf predict --gpu h100 --model llama-3-8b --tp 1 (--prompt-tokens N [--batch B] | --batch B --context C)
[--calibrated | --calibration FILE] [--json]`` prints prefill time, decode step time, tokens/s, KV capacity and
weight bytes; ``--queries FILE.jsonl`` answers one query object per line (same fields, options act as defaults)
as JSON lines.

``rollplan perf fit --data ../shared/data --gpu h100 [--out FILE] [--json]`` fits a calibration to the shared
measured tables and prints its per-phase MAPE; ``--profile FILE.jsonl --gpu cpu --model tiny`` fits the project's
own profiler output (both may be given: the profile then refines the table fit). See docs/perf.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.table import Table

from rollplan.models.errors import SchemaError, TraceError, UnknownNameError, UserInputError
from rollplan.models.perf import PerfModel, load_calibration, perf_model, save_calibration
from rollplan.models.perf.calibrated import Calibration
from rollplan.models.specs import check_tp, gpu_kind, model_spec

_OPTION = {  # query field -> CLI option, for error messages
    "gpu": "--gpu",
    "model": "--model",
    "tp": "--tp",
    "prompt_tokens": "--prompt-tokens",
    "batch": "--batch",
    "context": "--context",
    "calibrated": "--calibrated",
    "mem_util": "--mem-util",
}


class PerfQuery(BaseModel):
    """One prediction request (a ``--queries`` line, or the command-line options)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    gpu: str
    model: str
    tp: int = Field(1, ge=1)
    prompt_tokens: int | None = Field(None, gt=0)
    batch: int | None = Field(None, gt=0)
    context: int | None = Field(None, gt=0)
    calibrated: bool = False
    mem_util: float = Field(0.9, gt=0.0, le=1.0)


def _validation_problem(err: ValidationError) -> tuple[str, str]:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(line)"
    return field, first["msg"]


def _check_query(q: PerfQuery, where: str, field_name: Callable[[str], str]) -> None:
    """Semantic checks beyond types: known names, and which token counts make sense together."""
    gpu_kind(q.gpu)
    check_tp(model_spec(q.model), q.tp, option=field_name("tp"))
    if q.prompt_tokens is None and q.context is None:
        raise SchemaError(where, f"give {field_name('prompt_tokens')} (prefill) or {field_name('context')} (decode)",
                          fix=f"e.g. {field_name('prompt_tokens')} 512, or {field_name('batch')} 32 {field_name('context')} 2048")


def _predict(q: PerfQuery, calibration: Calibration | None) -> dict[str, Any]:
    perf: PerfModel = perf_model(q.gpu, q.model, q.tp, calibrated=q.calibrated, calibration=calibration)
    batch = q.batch or 1
    cached = q.context or 0
    out: dict[str, Any] = {
        "gpu": perf.gpu.name,
        "model": perf.model.name,
        "tp": q.tp,
        "perf_model": type(perf).__name__,
        "batch": batch,
        "prompt_tokens": q.prompt_tokens,
        "context": q.context,
    }
    if q.prompt_tokens is not None:
        prefill = perf.prefill_time([q.prompt_tokens] * batch, [cached] * batch)
        out["prefill_s"] = prefill
        out["prefill_tokens_per_s"] = batch * q.prompt_tokens / prefill
        kv = cached + q.prompt_tokens
    else:
        out["prefill_s"] = None
        out["prefill_tokens_per_s"] = None
        kv = cached
    decode = perf.decode_step_time(batch, kv)
    out["decode_kv_tokens"] = kv
    out["decode_step_s"] = decode
    out["decode_tokens_per_s"] = batch / decode
    out["kv_capacity_tokens"] = perf.kv_capacity_tokens(q.mem_util)
    out["kv_capacity_seqs"] = perf.kv_capacity_seqs(kv, q.mem_util)
    out["fits_in_memory"] = out["kv_capacity_seqs"] >= batch
    out["weight_bytes"] = perf.weight_bytes()
    out["mem_util"] = q.mem_util
    return out


def _print_table(res: dict[str, Any]) -> None:
    table = Table(title=f"{res['model']} on {res['tp']} x {res['gpu']} ({res['perf_model']})")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    b = res["batch"]
    if res["prefill_s"] is not None:
        ctx = f" after {res['context']} cached" if res["context"] else ""
        table.add_row(f"prefill time ({b} x {res['prompt_tokens']} tokens{ctx})", f"{res['prefill_s'] * 1e3:.3f} ms")
        table.add_row("prefill throughput", f"{res['prefill_tokens_per_s']:,.0f} tokens/s")
    table.add_row(f"decode step ({b} seqs x {res['decode_kv_tokens']} KV tokens)", f"{res['decode_step_s'] * 1e3:.3f} ms")
    table.add_row("decode throughput", f"{res['decode_tokens_per_s']:,.0f} tokens/s")
    table.add_row(f"KV capacity (mem util {res['mem_util']})", f"{res['kv_capacity_tokens']:,} tokens")
    table.add_row(f"  sequences of {res['decode_kv_tokens']} tokens", f"{res['kv_capacity_seqs']:,}")
    if not res["fits_in_memory"]:
        table.add_row(f"  [bold red]{b} sequences do not fit[/]: raise --tp or --mem-util", "")
    table.add_row("weight bytes", f"{res['weight_bytes'] / 1e9:.2f} GB")
    Console().print(table)


def _read_queries(path: Path, defaults: dict[str, Any]) -> list[tuple[int, PerfQuery]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise UserInputError(f"cannot read queries file {str(path)!r}: {err.strerror}",
                             fix="pass an existing JSONL file, one query object per line") from None
    example = '{"gpu": "h100", "model": "llama-3-8b", "tp": 1, "batch": 32, "context": 2048}'
    queries = []
    for i, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(str(path), i, f"not valid JSON ({err.msg})", fix=f"write one JSON object per line, e.g. {example}") from None
        if not isinstance(obj, dict):
            raise TraceError(str(path), i, "expected a JSON object", fix=f"write one JSON object per line, e.g. {example}")
        try:
            q = PerfQuery.model_validate({**{k: v for k, v in defaults.items() if v is not None}, **obj})
        except ValidationError as err:
            field, msg = _validation_problem(err)
            raise TraceError(str(path), i, f"field {field!r}: {msg}", fix=f"fix that field; a valid line: {example}") from None
        try:
            _check_query(q, f"{path}:{i}", lambda f: f'"{f}"')
        except UnknownNameError as err:
            field = "gpu" if err.values["what"] == "GPU kind" else "model"
            raise TraceError(str(path), i, f"field {field!r}: {err.message}", fix=err.fix) from None
        except SchemaError:
            raise
        except UserInputError as err:  # e.g. a TP degree the model cannot be split over
            raise TraceError(str(path), i, err.message, fix=err.fix) from None
        queries.append((i, q))
    if not queries:
        raise TraceError(str(path), None, "no queries in the file", fix=f"write one JSON object per line, e.g. {example}")
    return queries


def predict(
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU kind: h100, h200, h800, a100, cpu.")] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model: llama-3-8b, qwen3-8b, qwen3-30b-a3b, llama-2-70b, tiny.")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree (GPUs per engine).")] = 1,
    prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", help="Prompt tokens per sequence to prefill.")] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="Sequences in the batch (default 1).")] = None,
    context: Annotated[
        int | None, typer.Option("--context", help="KV tokens per sequence (decode), or cached tokens before the prompt.")
    ] = None,
    calibrated: Annotated[bool, typer.Option("--calibrated", help="Use the shipped calibrated model (h100, h200).")] = False,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help="Use this calibration JSON (from `rollplan perf fit`).")
    ] = None,
    mem_util: Annotated[
        float, typer.Option("--mem-util", help="GPU memory fraction for weights + KV (vLLM gpu_memory_utilization).")
    ] = 0.9,
    queries: Annotated[
        Path | None, typer.Option("--queries", help="JSONL file: one query object per line; prints JSON lines.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Predict prefill time, decode step time, tokens/s, KV capacity and weight bytes."""
    cal = load_calibration(calibration) if calibration is not None else None
    defaults = {"gpu": gpu, "model": model, "tp": tp, "prompt_tokens": prompt_tokens, "batch": batch,
                "context": context, "calibrated": calibrated, "mem_util": mem_util}
    if queries is not None:
        qs = _read_queries(queries, {"gpu": gpu, "model": model, "tp": tp, "calibrated": calibrated, "mem_util": mem_util})
        answers = []
        for line, q in qs:  # answer every line before printing any, so an error leaves no partial output
            try:
                answers.append(_predict(q, cal))
            except UserInputError as err:
                raise TraceError(str(queries), line, err.message, fix=err.fix) from None
        for a in answers:
            print(json.dumps(a))
        return
    for name in ("gpu", "model"):
        if defaults[name] is None:
            raise UserInputError(f"missing option {_OPTION[name]}", fix=f"pass {_OPTION[name]} (e.g. --gpu h100 --model llama-3-8b)")
    try:
        q = PerfQuery.model_validate(defaults)
    except ValidationError as err:
        field, msg = _validation_problem(err)
        opt = _OPTION.get(field, field)
        raise UserInputError(f"{opt}: {msg}", fix=f"pass a valid {opt} (token counts, batch and --tp are positive integers)") from None
    _check_query(q, "command line", lambda f: _OPTION[f])
    res = _predict(q, cal)
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        _print_table(res)


def fit(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU kind (tables: h100, h200, a100; profile: any preset, e.g. cpu).")],
    data: Annotated[Path | None, typer.Option("--data", help="Shared measured tables folder (../shared/data).")] = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Profiler JSONL (docs/perf.md): whole-step and switching times.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model the profile was measured on (with --profile).")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree the profile was measured at.")] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="Write the calibration JSON here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit report as JSON.")] = False,
) -> None:
    """Fit a calibration and print its per-phase MAPE."""
    from rollplan.models.perf import fit as fitting  # numpy-heavy: only when fitting

    gpu_name = gpu_kind(gpu).name
    if data is None and profile is None:
        raise UserInputError("nothing to fit", fix="pass --data ../shared/data and/or --profile FILE.jsonl")
    if tp < 1:
        raise UserInputError(f"--tp: must be a positive integer, got {tp}", fix="pass --tp 1 or more")
    cal: Calibration | None = None
    report: dict[str, Any] = {}
    if data is not None:
        cal = fitting.fit_tables(data, gpu_name, source=f"rollplan perf fit --data {data} --gpu {gpu_name}")
        report["tables"] = cal.report
    if profile is not None:
        if model is None:
            raise UserInputError("--profile needs --model", fix="pass the model the profile was measured on, e.g. --model tiny")
        spec = model_spec(model)
        check_tp(spec, tp, option="--tp")
        records = fitting.read_profile(profile)
        src = f"rollplan perf fit --profile {profile.name} --gpu {gpu_name} --model {spec.name} --tp {tp}"
        cal = fitting.fit_profile(records, gpu_name, spec.name, tp, source=src, base=cal)
        report["profile"] = cal.report
        if "tables" in report:
            cal = replace(cal, report=report)
    assert cal is not None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_calibration(cal, out)
    final = report if len(report) > 1 else next(iter(report.values()))
    if as_json:
        print(json.dumps({**final, "out": str(out) if out else None}, indent=2))
        return
    _print_fit(report, out)


def _print_fit(report: dict[str, Any], out: Path | None) -> None:
    console = Console()
    tables = report.get("tables")
    if tables:
        t = Table(title=f"calibrated vs measured: {tables['gpu']}, {tables['model_shapes']} shapes, TP {tables['tp']}")
        t.add_column("phase")
        t.add_column("error", justify="right")
        t.add_column("detail", justify="right")
        t.add_column("target", justify="right")
        for phase in ("decode_step", "prefill", "mixed_step"):
            m = tables["mape"].get(phase)
            if m is None:
                continue
            by = " ".join(f"tp{k} {v:.1%}" for k, v in m["by_tp"].items())
            roof = f"; roofline {m['roofline_mape']:.1%}" if "roofline_mape" in m else ""
            t.add_row(f"{phase} MAPE", f"{m['mape']:.1%}", f"{by}{roof}", f"<= {tables['targets']['step_mape_max']:.0%}")
        for r in tables.get("tpot", {}).get("rows", []):
            t.add_row(f"median TPOT, {r['num_prompts']} prompts", f"{r['error']:+.1%}",
                      f"{r['predicted_median_tpot_ms']:.2f} vs {r['measured_median_tpot_ms']:.2f} ms",
                      f"<= {tables['targets']['tpot_error_max']:.0%}" if r["num_prompts"] >= 20 else "")
        console.print(t)
        if tables.get("per_tp"):
            console.print(_per_tp_table(tables))
        if tables.get("vidur_linear_by_tp"):
            console.print(_vidur_table(tables["vidur_linear_by_tp"]))
        kernels = ", ".join(
            f"{name} {v:.1%}" if not isinstance(v, dict) else f"{name} " + "/".join(f"{x:.1%}" for x in v.values())
            for name, v in tables["mape"]["kernels"].items()
        )
        console.print(f"kernel fit MAPE: {kernels}")
        console.print("pass: " + ", ".join(f"{k}={v}" for k, v in tables["pass"].items()))
    prof = report.get("profile")
    if prof:
        t = Table(title=f"profile fit: {prof['model']} on {prof['gpu']} (tp {prof['tp']})")
        t.add_column("phase")
        t.add_column("records", justify="right")
        t.add_column("MAPE (in-sample)", justify="right")
        for phase, n in prof["records"].items():
            key = "decode_step" if phase == "decode" else phase
            m = prof["mape"].get(key, prof["mape"].get(f"{phase}_same_node"))
            t.add_row(phase, str(n), "" if m is None else f"{m:.1%}")
        console.print(t)
    if out is not None:
        console.print(f"wrote {out}")


def _point(phase: str, p: dict[str, int]) -> str:
    if phase == "decode":
        return f"{p['batch']} seqs x {p['kv_tokens']} KV"
    if phase == "prefill":
        return f"{p['batch']} x {p['prompt_tokens']} tokens"
    return f"{p['chunk']}-token chunk + {p['batch']} seqs x {p['kv_tokens']} KV"


def _per_tp_table(tables: dict[str, Any]) -> Table:
    """Predicted vs measured step per TP degree (``report["per_tp"]``, see ``fit.per_tp_report``)."""
    t = Table(title=f"TP predicted vs measured: {tables['gpu']}, {tables['per_tp']['model_shapes']} shapes, kernels "
                    "only (calibrated composition vs the same composition of the measured tables)")
    for col in ("TP", "step", "MAPE", "max", "roofline", "example", "predicted", "measured", "of it all-reduce"):
        t.add_column(col, justify="left" if col in ("step", "example") else "right")
    for row in tables["per_tp"]["rows"]:
        for phase in ("decode", "prefill", "mixed"):
            m = row.get(phase)
            if m is None:
                continue
            ex = m["example"]
            t.add_row(str(row["tp"]), phase, f"{m['mape']:.1%}", f"{m['max_ape']:.1%}", f"{m['roofline_mape']:.1%}",
                      _point(phase, ex["point"]), f"{ex['predicted_ms']:.2f} ms", f"{ex['measured_ms']:.2f} ms",
                      f"{ex['measured_allreduce_ms']:.2f} ms")
    return t


def _vidur_table(v: dict[str, Any]) -> Table:
    t = Table(title=f"cross-check, not fitted: GEMMs vs Vidur's H100 linear ops ({v['model_shapes']}), by TP")
    for col in ("TP", "MAPE", "mean error", "512 tokens: predicted", "measured", "4096 tokens: predicted", "measured"):
        t.add_column(col, justify="right")
    for r in v["rows"]:
        at = r["at_tokens"]
        cells = [f"{at[k][q]:.3f} ms" if k in at else "" for k in ("512", "4096") for q in ("predicted_ms", "measured_ms")]
        t.add_row(str(r["tp"]), f"{r['mape']:.1%}", f"{r['mean_error']:+.1%}", *cells)
    return t


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add the ``perf`` sub-app (``predict``, ``fit``) to the root app. Idempotent."""
    if any(info.name == "perf" for info in app.registered_groups):
        return
    perf = typer.Typer(help="Performance models: predict step times, fit calibrations.", no_args_is_help=True)
    perf.command("predict")(predict)
    perf.command("fit")(fit)
    app.add_typer(perf, name="perf")

