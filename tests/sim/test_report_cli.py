"""Report files, the CLI commands (replay, demo, bench replay argument checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollplan.sim.demo import demo_scenario
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.replay import run_replay
from rollplan.sim.report import build_report, write_report
from rollplan.solver.cli import main


@pytest.mark.slow
def test_demo_runs_and_writes_report(tmp_path: Path) -> None:
    res = run_replay(demo_scenario(0), [make_policy(n) for n in POLICY_NAMES])
    report = build_report(res)
    paths = write_report(report, tmp_path)
    for key in ("report", "roles", "throughput", "completion_cdf"):
        assert Path(paths[key]).stat().st_size > 1000
    doc = json.loads(Path(paths["report"]).read_text())
    assert set(doc["policies"]) == set(POLICY_NAMES)
    assert doc["ratio_to_baseline"]["static-colocated"]["throughput_tokens_per_s"] == 1.0
    for s in doc["policies"].values():
        assert s["batches_completed"] == 5
        assert s["series"]["completion_s"]


def test_replay_cli_builtin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["replay", "--availability", "none", "--workload", "builtin", "--batches", "1", "--groups", "4",
               "--samples", "2", "--dedicated", "2", "--lent", "0", "--policies", "static-colocated,rollplan",
               "--out", str(tmp_path), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["policies"]) == {"static-colocated", "rollplan"}
    assert "series" not in doc["policies"]["rollplan"]
    assert (tmp_path / "report.json").is_file() and (tmp_path / "roles.png").is_file()


def test_replay_cli_trace_file_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,n1\n0,add,n2\n600000,remove,n1\n")
    rc = main(["replay", "--availability", str(trace), "--workload", "builtin", "--batches", "1", "--groups", "2",
               "--samples", "2", "--dedicated", "1", "--policies", "elastic-colocated", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "elastic-colocated" in out and "report:" in out
    assert main(["replay", "--availability", "none", "--workload", "builtin", "--out", str(tmp_path)]) == 2
    assert "--batches" in capsys.readouterr().err
    assert main(["replay", "--availability", "none", "--workload", "builtin", "--batches", "1",
                 "--policies", "nope", "--out", str(tmp_path)]) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,n1\nxx,add,n2\n")
    assert main(["replay", "--availability", str(bad), "--workload", "builtin", "--out", str(tmp_path)]) == 2
    assert "bad.csv:2" in capsys.readouterr().err


def test_bench_replay_rejects_unknown_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", "--traces", "nope"]) == 2
    assert "unknown bench trace" in capsys.readouterr().err


SMALL = ["--workload", "builtin", "--batches", "1", "--groups", "4", "--samples", "2", "--dedicated", "2"]


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "To fix:" in err, err
    return err


def test_bad_out_paths_fail_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["demo", "--out", str(afile)]) == 2  # fails at once, not after a 20 s replay
    assert "is a file" in _one_line_error(capsys)
    assert main(["replay", "--availability", "none", *SMALL, "--out", str(afile)]) == 2
    assert "is a file" in _one_line_error(capsys)
    assert main(["workload", "build", "--from", "synthetic", "--out", str(tmp_path / "no" / "w.jsonl")]) == 2
    assert "folder does not exist" in _one_line_error(capsys)


def test_replay_rejects_a_zero_length_trace_and_unknown_format(tmp_path: Path, capsys) -> None:
    one = tmp_path / "one.txt"
    one.write_text("2024-01-01, 00:00:00, 3\n")
    assert main(["replay", "--availability", str(one), *SMALL, "--out", str(tmp_path / "o")]) == 2
    assert f"{one}: the trace covers 0 seconds" in _one_line_error(capsys)
    assert main(["replay", "--availability", "none", *SMALL, "--trace-format", "xml"]) == 2
    assert "--trace-format 'xml'" in _one_line_error(capsys)


def test_replay_reads_a_lending_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "lend.toml"
    cfg.write_text('[lending]\ngpus = 2\ntrain_step_s = 30\nmode = "async"\nreclaim_notice_s = 5\n')
    argv = ["replay", "--availability", "none", *SMALL, "--policies", "static-colocated", "--out", str(tmp_path / "o")]
    assert main([*argv, "--lending", str(cfg), "--json"]) == 0
    sc = json.loads(capsys.readouterr().out)["scenario"]
    assert (sc["lent_gpus"], sc["train_step_s"], sc["mode"]) == (2, 30.0, "async")
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": 2, "bogus": 1}')
    assert main([*argv, "--lending", str(bad)]) == 2
    assert f"{bad}: lending.bogus" in _one_line_error(capsys)


def test_replay_tool_kv_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--availability", "none", *SMALL, "--policies", "static-colocated", "--out", str(tmp_path / "o")]
    assert main([*argv, "--tool-kv", "offload", "--share-prompt", "--json"]) == 0
    sc = json.loads(capsys.readouterr().out)["scenario"]
    assert (sc["tool_kv"], sc["share_prompt"]) == ("offload", True)
    assert main([*argv, "--tool-kv", "lru"]) == 2
    assert "unknown tool KV mode 'lru'" in _one_line_error(capsys)
    assert main(["bench", "replay", "--tool-kv", "lru"]) == 2
    assert "unknown tool KV mode 'lru'" in _one_line_error(capsys)


def test_bench_replay_mode_and_jobs(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.sim.bench_replay import bench_scenario, default_jobs
    from rollplan.sim.lending import LendMode
    from rollplan.sim.policies import POLICY_NAMES

    assert main(["bench", "replay", "--mode", "offpolicy"]) == 2
    assert "unknown mode 'offpolicy'" in _one_line_error(capsys)
    assert bench_scenario(shared_data, "parcae-hh", bases=(), mode="async").lending.mode is LendMode.ASYNC
    assert bench_scenario(shared_data, "parcae-hh", bases=()).lending.mode is LendMode.SYNC
    assert 1 <= default_jobs() <= len(POLICY_NAMES)
    # --regime: rollplan's admission regime rule (model, or the share rule to compare); anything else is a
    # one-line error, and the lever comparisons do not take it.
    assert main(["bench", "replay", "--regime", "shares"]) == 2
    assert "unknown regime 'shares'" in _one_line_error(capsys)
    assert main(["bench", "replay", "--regime", "share", "--divide-tokens", "2048"]) == 2
    assert "--regime applies to the replay bench" in _one_line_error(capsys)
    # --moves: which of its plans' migrations rollplan carries out (forced, or all to compare); the same errors.
    assert main(["bench", "replay", "--moves", "none"]) == 2
    assert "unknown move rule 'none'" in _one_line_error(capsys)
    assert main(["bench", "replay", "--moves", "all", "--spec-tokens", "2"]) == 2
    assert "--moves applies to the replay bench" in _one_line_error(capsys)
