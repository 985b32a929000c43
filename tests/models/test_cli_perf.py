"""`rollplan perf predict` / `rollplan perf fit`, run in-process through the CLI main.

User errors (unknown names, non-positive token counts, malformed query or profile lines) print one line to
stderr naming the option, field or file:line with a "To fix:" hint, and exit with code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollplan.solver.cli import main


def shipped_file(gpu: str) -> str:
    from importlib import resources

    return str(resources.files("rollplan.models").joinpath("data", f"calibrated_{gpu}.json"))

PREDICT = ["perf", "predict", "--gpu", "h100", "--model", "llama-3-8b", "--tp", "1"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*PREDICT, "--prompt-tokens", "2048", "--batch", "4"], capsys)
    assert code == 0
    for label in ("prefill time", "decode step", "tokens/s", "KV capacity", "weight bytes"):
        assert label in out


def test_predict_json_decode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*PREDICT, "--batch", "64", "--context", "2048", "--calibrated", "--json"], capsys)
    assert code == 0
    res = json.loads(out)
    assert res["perf_model"] == "CalibratedPerfModel" and res["batch"] == 64 and res["decode_kv_tokens"] == 2048
    assert res["prefill_s"] is None
    assert 0.005 < res["decode_step_s"] < 0.05
    assert res["decode_tokens_per_s"] == pytest.approx(64 / res["decode_step_s"])
    assert res["kv_capacity_tokens"] > 100_000 and res["kv_capacity_seqs"] == res["kv_capacity_tokens"] // 2048
    assert res["weight_bytes"] == 16_060_000_000


def test_predict_prompt_after_cached_context(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*PREDICT, "--prompt-tokens", "512", "--context", "4096", "--json"], capsys)
    assert code == 0
    res = json.loads(out)
    assert res["decode_kv_tokens"] == 4608 and res["prefill_s"] > 0


def test_predict_queries_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.jsonl"
    q.write_text(
        '{"gpu": "h100", "model": "llama-3-8b", "prompt_tokens": 1024}\n'
        "\n"
        '{"gpu": "h200", "model": "qwen3-30b-a3b", "tp": 2, "batch": 32, "context": 8000, "calibrated": true}\n'
        '{"model": "qwen3-8b", "batch": 8, "context": 100}\n'
    )
    code, out, _ = run(["perf", "predict", "--gpu", "h100", "--queries", str(q)], capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["model"] for r in rows] == ["llama-3-8b", "qwen3-30b-a3b", "qwen3-8b"]
    assert rows[1]["gpu"] == "h200" and rows[1]["tp"] == 2 and rows[1]["perf_model"] == "CalibratedPerfModel"
    assert rows[2]["gpu"] == "h100"  # --gpu is the default for lines without one


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "h900", "--model", "llama-3-8b", "--prompt-tokens", "5"], "unknown GPU kind 'h900'"),
        (["--gpu", "h100", "--model", "gpt-9", "--prompt-tokens", "5"], "unknown model 'gpt-9'"),
        ([*PREDICT[2:], "--prompt-tokens", "0"], "--prompt-tokens: Input should be greater than 0"),
        ([*PREDICT[2:], "--prompt-tokens", "-5"], "--prompt-tokens: Input should be greater than 0"),
        ([*PREDICT[2:], "--batch", "0", "--context", "10"], "--batch: Input should be greater than 0"),
        ([*PREDICT[2:], "--batch", "4", "--context", "-1"], "--context: Input should be greater than 0"),
        (["--gpu", "h100", "--model", "llama-3-8b", "--tp", "0", "--prompt-tokens", "5"], "--tp: Input should be greater"),
        ([*PREDICT[2:], "--batch", "4"], "give --prompt-tokens (prefill) or --context (decode)"),
        (["--model", "llama-3-8b", "--prompt-tokens", "5"], "missing option --gpu"),
        (["--gpu", "a100", "--model", "llama-3-8b", "--prompt-tokens", "5", "--calibrated"], "no calibration is shipped"),
        ([*PREDICT[2:], "--prompt-tokens", "5", "--mem-util", "1.5"], "--mem-util: Input should be less than or equal to 1"),
    ],
)
def test_predict_user_errors(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["perf", "predict", *args], capsys)
    assert code == 2, err
    assert needle in err and "To fix:" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{bad json", "q.jsonl:2: not valid JSON"),
        ('{"model": "llama-3-8b", "prompt_tokens": 0}', "q.jsonl:2: field 'prompt_tokens': Input should be greater than 0"),
        ('{"model": "llama-3-8b", "prompt_tokens": "12"}', "q.jsonl:2: field 'prompt_tokens'"),
        ('{"model": "llama-3-8b", "prompt_tokens": 12, "colour": 1}', "q.jsonl:2: field 'colour': Extra inputs"),
        ('{"model": "gpt-9", "prompt_tokens": 12}', "q.jsonl:2: field 'model': unknown model 'gpt-9'"),
        ('{"gpu": "h900", "model": "qwen3-8b", "prompt_tokens": 12}', "q.jsonl:2: field 'gpu': unknown GPU kind 'h900'"),
        ('{"model": "llama-3-8b", "batch": 3}', 'q.jsonl:2: give "prompt_tokens" (prefill) or "context" (decode)'),
        ("[1]", "q.jsonl:2: expected a JSON object"),
        ('{"gpu": "a100", "model": "qwen3-8b", "context": 9, "calibrated": true}', "q.jsonl:2: no calibration is shipped"),
    ],
)
def test_queries_errors_name_file_and_line(line: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.jsonl"
    q.write_text('{"model": "llama-3-8b", "prompt_tokens": 12}\n' + line + "\n")
    code, out, err = run(["perf", "predict", "--gpu", "h100", "--queries", str(q)], capsys)
    assert code == 2 and out == ""
    assert needle in err and "To fix:" in err and len(err.strip().splitlines()) == 1


def test_queries_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["perf", "predict", "--queries", str(tmp_path / "none.jsonl")], capsys)
    assert code == 2 and "cannot read queries file" in err


PROFILE = """\
{"phase": "decode", "batch": 1, "kv_tokens": 10, "seconds": 0.0051}
{"phase": "decode", "batch": 8, "kv_tokens": 300, "seconds": 0.0112}
{"phase": "decode", "batch": 4, "kv_tokens": 100, "seconds": 0.0072}
{"phase": "decode", "batch": 16, "kv_tokens": 50, "seconds": 0.0135}
{"phase": "prefill", "prompt_tokens": [64], "seconds": 0.009}
{"phase": "prefill", "prompt_tokens": [128, 64], "seconds": 0.016}
{"phase": "prefill", "prompt_tokens": [256], "seconds": 0.021}
{"phase": "prefill", "prompt_tokens": [32, 32, 32, 32], "seconds": 0.013}
{"phase": "engine_start", "seconds": 1.8}
{"phase": "wake", "seconds": 0.05}
{"phase": "weight_sync", "seconds": 0.03}
{"phase": "role_switch", "seconds": 0.02}
"""


def test_fit_profile_then_predict_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "profile.jsonl"
    prof.write_text(PROFILE)
    out_file = tmp_path / "cal" / "cpu_tiny.json"
    code, out, err = run(["perf", "fit", "--profile", str(prof), "--gpu", "cpu", "--model", "tiny", "--out", str(out_file),
                          "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["records"]["decode"] == 4 and rep["mape"]["decode_step"] < 0.05 and rep["mape"]["prefill"] < 0.05
    assert out_file.is_file()
    code, out, err = run(["perf", "predict", "--gpu", "cpu", "--model", "tiny", "--batch", "8", "--context", "300",
                          "--calibration", str(out_file), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["decode_step_s"] == pytest.approx(0.0112, rel=0.05)
    code, out, _ = run(["perf", "fit", "--profile", str(prof), "--gpu", "cpu", "--model", "tiny"], capsys)
    assert code == 0 and "profile fit" in out and "decode" in out


def test_fit_profile_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "profile.jsonl"
    prof.write_text(PROFILE + '{"phase": "decode", "batch": -1, "kv_tokens": 3, "seconds": 0.1}\n')
    code, _, err = run(["perf", "fit", "--profile", str(prof), "--gpu", "cpu", "--model", "tiny"], capsys)
    assert code == 2 and f"{prof}:13: decode needs batch >= 1" in err and "To fix:" in err
    code, _, err = run(["perf", "fit", "--profile", str(prof), "--gpu", "cpu"], capsys)
    assert code == 2 and "--profile needs --model" in err
    code, _, err = run(["perf", "fit", "--gpu", "cpu"], capsys)
    assert code == 2 and "nothing to fit" in err
    code, _, err = run(["perf", "fit", "--gpu", "tpu9", "--data", str(tmp_path)], capsys)
    assert code == 2 and "unknown GPU kind 'tpu9'" in err


def test_fit_tables_json(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "calibrated_h100.json"
    code, out, err = run(["perf", "fit", "--data", str(shared_data), "--gpu", "h100", "--out", str(out_file), "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["mape"]["decode_step"]["mape"] <= 0.05 and rep["mape"]["prefill"]["mape"] <= 0.05
    assert rep["mape"]["mixed_step"]["mape"] <= 0.05
    assert rep["tpot"]["max_abs_error_batch_ge_20"] <= 0.10 and all(rep["pass"].values())
    assert [r["tp"] for r in rep["per_tp"]["rows"]] == [1, 2, 4, 8]
    assert json.loads(out_file.read_text())["gpu"] == "h100"
    code, out, _ = run([*PREDICT, "--batch", "32", "--context", "1000", "--calibration", str(out_file), "--json"], capsys)
    assert code == 0 and json.loads(out)["perf_model"] == "CalibratedPerfModel"


def test_fit_tables_prints_the_per_tp_table(shared_data: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps to the terminal width
    code, out, err = run(["perf", "fit", "--data", str(shared_data), "--gpu", "h100"], capsys)
    assert code == 0, err
    assert "TP predicted vs measured" in out and "mixed_step MAPE" in out and "Vidur" in out
    rows = [line for line in out.splitlines() if "512-token chunk + 32 seqs x 2047 KV" in line]
    assert len(rows) == 4  # one mixed-step example per TP degree 1/2/4/8


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tp", "3"], "--tp=3 does not divide qwen3-8b's 32 attention heads"),
        (["--tp", "64"], "--tp=64 does not divide qwen3-8b's 32 attention heads"),
        (["--tp", "1.5"], "Invalid value for '--tp'"),
        (["--tp", "-2"], "--tp: Input should be greater than or equal to 1"),
        (["--gpu", "h200", "--calibration", "H100"], "calibration field 'gpu' is 'h100'"),
        (["--calibration", "NO_GPU"], "gpu: Field required"),
        (["--calibration", "NEG_RATE"], "gemm.flops_per_s: must be a finite number > 0, got -1.0"),
    ],
)
def test_predict_tp_and_calibration_errors(args: list[str], needle: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    shipped = json.loads(Path(shipped_file("h100")).read_text())
    files = {"H100": shipped, "NO_GPU": {k: v for k, v in shipped.items() if k != "gpu"},
             "NEG_RATE": {**shipped, "gemm": {**shipped["gemm"], "flops_per_s": -1.0}}}
    for name, doc in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    args = [str(tmp_path / f"{a}.json") if a in files else a for a in args]
    code, _, err = run(["perf", "predict", "--gpu", "h100", "--model", "qwen3-8b", "--prompt-tokens", "5", *args], capsys)
    assert code == 2, err
    assert needle in err and "To fix:" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_queries_tp_error_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.jsonl"
    q.write_text('{"model": "qwen3-8b", "prompt_tokens": 12}\n{"model": "qwen3-8b", "tp": 6, "prompt_tokens": 12}\n')
    code, out, err = run(["perf", "predict", "--gpu", "h100", "--queries", str(q)], capsys)
    assert code == 2 and out == ""
    assert 'q.jsonl:2: "tp"=6 does not divide' in err and "To fix:" in err and len(err.strip().splitlines()) == 1


def test_fit_profile_tp_must_divide_the_heads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "profile.jsonl"
    prof.write_text(PROFILE)
    code, _, err = run(["perf", "fit", "--profile", str(prof), "--gpu", "cpu", "--model", "tiny", "--tp", "4"], capsys)
    assert code == 2 and "--tp=4 does not divide tiny's 2 attention heads" in err and len(err.strip().splitlines()) == 1
