"""Workloads: the JSONL format, truncation to a context limit, and the three builders.

Invariants checked with hypothesis (any trajectory, any limit >= 2):
- ``truncate_to_context`` output fits: its final context <= the limit; it keeps >= 1 turn;
- it is a prefix: every kept turn but the last equals the original (turn 0's prefill may be cut);
- a trajectory that already fits is returned unchanged.
Dispersion and first epoch (``with_dispersion``, ``FirstEpochSource``): dispersion 0 gives identical samples of
a prompt, a larger dispersion a larger measured within-group spread, the default is today's variation; a
first-epoch source's prompts (history keys) are disjoint from the warm-up history and between batches.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rollplan.models.errors import TraceError, UserInputError
from rollplan.sim.cli_workload import register_workload
from rollplan.sim.workload import (
    DEFAULT_DISPERSION,
    GroupVariation,
    TrajectorySpec,
    Turn,
    Workload,
    azure_workload,
    load_history,
    load_workload,
    parse_workload,
    save_workload,
    swebench_runs,
    swebench_workload,
    synthetic_workload,
    truncate_to_context,
    vary,
    with_dispersion,
    workload_meta,
    workload_to_jsonl,
)


def traj(prompt: int = 100, turns: tuple[tuple[int, int, float], ...] = ((0, 10, 1.0), (20, 30, 0.0)),
         tid: str = "t0", group: str = "g0") -> TrajectorySpec:
    return TrajectorySpec(tid, group, prompt, tuple(Turn(*t) for t in turns))


def cv_within_and_across(w: Workload) -> tuple[float, float]:
    groups = [[t.decode_tokens for t in ts] for ts in w.groups().values()]
    within = statistics.fmean(statistics.pstdev(g) / statistics.fmean(g) for g in groups)
    means = [statistics.fmean(g) for g in groups]
    return within, statistics.pstdev(means) / statistics.fmean(means)


# --- data model and JSONL ------------------------------------------------------------------------------------


def test_trajectory_totals_and_context() -> None:
    t = traj(100, ((0, 10, 1.0), (20, 30, 2.5), (5, 7, 0.0)))
    assert (t.num_turns, t.decode_tokens, t.prefill_tokens, t.tool_seconds) == (3, 47, 125, 3.5)
    assert [t.context_before(k) for k in range(3)] == [100, 130, 165]
    assert t.final_context == 172
    with pytest.raises(ValueError):
        Turn(0, 0)
    with pytest.raises(ValueError):
        Turn(0, 1, -1.0)
    with pytest.raises(ValueError, match="duplicate"):
        Workload((traj(), traj()))


def test_jsonl_round_trip(tmp_path: Path) -> None:
    w = Workload((traj(), traj(tid="t1", group="g1")), {"builder": "test", "seed": 3})
    p = tmp_path / "w.jsonl"
    save_workload(w, p)
    assert load_workload(p) == w
    assert parse_workload(workload_to_jsonl(Workload(w.trajectories))) == Workload(w.trajectories)
    # hand-written lines: prefill_tokens / tool_seconds default to 0, blank lines are skipped
    text = '\n{"id": "a", "group": "g", "prompt_tokens": 5, "turns": [{"decode_tokens": 3}]}\n\n'
    assert parse_workload(text).trajectories[0].turns == (Turn(0, 3, 0.0),)


GOOD = '{"id": "a", "group": "g", "prompt_tokens": 5, "turns": [{"prefill_tokens": 0, "decode_tokens": 3, "tool_seconds": 1}]}'


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ('{"id": "b", "group": "g", "prompt_tokens": 5, "turns": [{"decode_tokens": 3, "tool_seconds": -2.5}]}',
         r"turns\.0\.tool_seconds: Input should be greater than or equal to 0 \(got -2\.5\)"),
        ('{"id": "b", "group": "g", "prompt_tokens": 5, "turns": [{"prefill_tokens": -1, "decode_tokens": 3}]}',
         r"turns\.0\.prefill_tokens"),
        ('{"id": "b", "group": "g", "prompt_tokens": 5, "turns": [{"decode_tokens": 0}]}', r"turns\.0\.decode_tokens"),
        ('{"id": "b", "group": "g", "prompt_tokens": 5.5, "turns": [{"decode_tokens": 1}]}', "prompt_tokens"),
        ('{"id": "b", "group": "g", "prompt_tokens": 5, "turns": []}', "turns: List should have at least 1 item"),
        ('{"id": "b", "group": "g", "prompt_tokens": 5, "turns": [{"decode_tokens": 1}], "x": 1}', "x: Extra inputs"),
        ('{"id": "b", "prompt_tokens": 5, "turns": [{"decode_tokens": 1}]}', "group: Field required"),
        ('{"id": "a", "group": "g", "prompt_tokens": 5, "turns": [{"decode_tokens": 1}]}', r"duplicate trajectory id 'a' \(first on line 1\)"),
        ('{"id": "b", "group": "g",', "not valid JSON"),
    ],
)
def test_malformed_workload_lines_name_file_and_line(tmp_path: Path, bad: str, problem: str) -> None:
    p = tmp_path / "w.jsonl"
    p.write_text(GOOD + "\n\n" + bad + "\n")
    with pytest.raises(TraceError, match=problem) as err:
        load_workload(p)
    assert str(err.value).startswith(f"{p}:3: ") and "To fix:" in str(err.value)


def test_empty_or_missing_workload_file(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text('{"meta": {"a": 1}}\n\n')
    with pytest.raises(TraceError, match="no trajectories"):
        load_workload(tmp_path / "e.jsonl")
    with pytest.raises(TraceError, match="file not found"):
        load_workload(tmp_path / "nope.jsonl")


# --- truncation ----------------------------------------------------------------------------------------------


def test_truncation_rules() -> None:
    t = traj(100, ((0, 10, 1.0), (20, 30, 2.0), (50, 40, 3.0)))  # contexts: 110, 160, 250
    assert truncate_to_context(t, 250) is t
    cut = truncate_to_context(t, 150)  # turn 1 decodes 30 with room 20: cut, last, no tool
    assert cut.turns == (Turn(0, 10, 1.0), Turn(20, 20, 0.0)) and cut.final_context == 150
    cut = truncate_to_context(t, 200)  # turn 2's 50 new tokens leave no room: dropped, turn 1's tool ran
    assert cut.turns == (Turn(0, 10, 1.0), Turn(20, 30, 2.0))
    long_prompt = truncate_to_context(traj(1000, ((0, 500, 0.0),)), 600)  # prompt cut to 300, then decode 300
    assert (long_prompt.prompt_tokens, long_prompt.turns) == (300, (Turn(0, 300, 0.0),))
    first = truncate_to_context(traj(10, ((100, 5, 0.0),)), 50)  # turn 0 prefill is cut, never dropped
    assert first.turns == (Turn(39, 1, 0.0),) and first.final_context == 50
    with pytest.raises(ValueError):
        truncate_to_context(t, 1)


turn_st = st.builds(Turn, st.integers(0, 3000), st.integers(1, 3000), st.floats(0, 100))


@settings(max_examples=80, deadline=None)
@given(prompt=st.integers(1, 20000), turns=st.lists(turn_st, min_size=1, max_size=12), limit=st.integers(2, 40000))
def test_truncation_invariants(prompt: int, turns: list[Turn], limit: int) -> None:
    t = TrajectorySpec("x", "g", prompt, tuple(turns))
    cut = truncate_to_context(t, limit)
    assert cut.final_context <= limit and cut.num_turns >= 1
    if t.final_context <= limit:
        assert cut is t
    for k, turn in enumerate(cut.turns[:-1]):
        orig = t.turns[k]
        assert (turn.decode_tokens, turn.tool_seconds) == (orig.decode_tokens, orig.tool_seconds)
        assert turn.prefill_tokens == orig.prefill_tokens or k == 0


# --- variation and the synthetic builder ----------------------------------------------------------------------


def test_vary_without_noise_is_identity_but_for_ids() -> None:
    import random

    base = traj(100, ((0, 10, 1.0), (20, 30, 2.0), (5, 7, 0.0)))
    zero = GroupVariation(0.0, 0.0, 0.0, 0.0)
    v = vary(base, random.Random(1), zero, traj_id="g/s0", group="g")
    assert (v.id, v.group, v.prompt_tokens, v.turns) == ("g/s0", "g", 100, base.turns)


def test_synthetic_is_seeded_grouped_and_similar_within_groups() -> None:
    w = synthetic_workload(groups=12, samples=6, seed=5)
    assert w == synthetic_workload(groups=12, samples=6, seed=5)
    assert w != synthetic_workload(groups=12, samples=6, seed=6)
    assert len(w) == 72 and len(w.groups()) == 12 and all(len(g) == 6 for g in w.groups().values())
    for ts in w.groups().values():
        assert len({t.prompt_tokens for t in ts}) == 1  # one prompt per group
    within, across = cv_within_and_across(w)
    assert within < 0.4 * across
    s = w.summary()
    assert s["decode_cv_within_groups"] == pytest.approx(within, abs=1e-3)
    assert s["trajectories"] == 72 and s["turns"]["max"] <= 30 * 1.5
    capped = synthetic_workload(groups=12, samples=6, seed=5, max_context=4000)
    assert max(t.final_context for t in capped) <= 4000 and capped.meta["truncated"] > 0


def test_builders_reject_bad_sizes() -> None:
    with pytest.raises(UserInputError, match="groups >= 1"):
        synthetic_workload(groups=0)
    with pytest.raises(UserInputError, match="max_context"):
        synthetic_workload(max_context=1)


# --- SWE-bench builder on small files ---------------------------------------------------------------------------

LLM_HEADER = ("source,task,attempt,call_idx,is_sidechain,t_prev_event_s,t_first_block_s,t_last_block_s,gap_s,"
              "context_tokens,input_tokens,cache_creation_input_tokens,cache_read_input_tokens,"
              "output_tokens_reported,output_chars,n_tool_use,stop_reason")


def llm_row(src: str, task: str, idx: int, side: int, first: float, ctx: int, out_tok: int, chars: int) -> str:
    return f"{src},{task},attempt_1,{idx},{side},0,{first},{first + 1},1,{ctx},0,0,0,{out_tok},{chars},1,tool_use"


def write_swe(tmp_path: Path) -> tuple[Path, Path]:
    glm, haiku = "glm-4.7-flash-q4(local)", "claude-3.5-haiku(cloud)"
    llm = [
        LLM_HEADER,
        llm_row(glm, "T1", 0, 0, 1.0, 1000, 50, 200),
        llm_row(glm, "T1", 2, 0, 20.0, 1400, 30, 100),  # call_idx order, not file order
        llm_row(glm, "T1", 1, 0, 10.0, 1100, 80, 300),  # growth 1100-1000-50 = 50 new tokens
        llm_row(haiku, "T2", 0, 0, 1.0, 2000, 2, 400),  # haiku: 400 chars / 4 = 100 tokens
        llm_row(haiku, "T2", 1, 1, 3.0, 500, 2, 40),  # sidechain: skipped
        llm_row(haiku, "T2", 2, 0, 9.0, 2150, 2, 41),  # growth 150 - 100 = 50; decode ceil(41/4) = 11
    ]
    tools = [
        "source,task,attempt,tool_idx,tool,t_start_s,duration_s,input_chars",
        f"{glm},T1,attempt_1,0,Read,2.0,3.0,10",
        f"{glm},T1,attempt_1,1,Grep,3.0,1.0,10",  # inside the Read: union, not sum -> 3 s
        f"{glm},T1,attempt_1,2,Bash,11.0,20.0,10",  # runs past the next call (20 s): clipped to 9 s
        f"{haiku},T2,attempt_1,0,Task,2.0,6.0,10",  # the sub-agent's time is the Task tool's time
        f"{haiku},T2,attempt_1,1,Bash,4.0,1.0,10",  # the sub-agent's own tool: inside the Task
    ]
    a, b = tmp_path / "llm.csv", tmp_path / "tools.csv"
    a.write_text("\n".join(llm) + "\n")
    b.write_text("\n".join(tools) + "\n")
    return a, b


def test_swebench_runs_from_small_files(tmp_path: Path) -> None:
    llm, tools = write_swe(tmp_path)
    runs = {r.id: r for r in swebench_runs(llm, tools)}
    assert set(runs) == {"glm:T1:attempt_1", "haiku:T2:attempt_1"}
    glm = runs["glm:T1:attempt_1"]
    assert glm.prompt_tokens == 1000 and glm.group == "T1"
    assert glm.turns == (Turn(0, 50, 3.0), Turn(50, 80, 9.0), Turn(220, 30, 0.0))
    haiku = runs["haiku:T2:attempt_1"]
    assert haiku.turns == (Turn(0, 100, 6.0), Turn(50, 11, 0.0))
    assert [r.id for r in swebench_runs(llm, tools, models=["haiku"])] == ["haiku:T2:attempt_1"]
    assert [r.id for r in swebench_runs(llm, tools, min_turns=3)] == ["glm:T1:attempt_1"]


def test_swebench_batch_from_small_files(tmp_path: Path) -> None:
    llm, tools = write_swe(tmp_path)
    w = swebench_workload(llm, tools, groups=3, samples=4, seed=1)
    assert len(w) == 12 and len(w.groups()) == 3
    assert w == swebench_workload(llm, tools, groups=3, samples=4, seed=1)
    assert len(set(w.meta["runs"][:2])) == 2  # distinct runs before any repeat


@pytest.mark.parametrize(
    ("which", "line", "problem"),
    [
        ("llm", 2, "context_tokens 'many' is not an integer"),
        ("tools", 3, "duration_s = -1 is negative"),
        ("llm", 3, "is_sidechain '2' is not 0 or 1"),
    ],
)
def test_swebench_malformed_rows_name_file_and_line(tmp_path: Path, which: str, line: int, problem: str) -> None:
    llm, tools = write_swe(tmp_path)
    target = llm if which == "llm" else tools
    lines = target.read_text().splitlines()
    if problem.startswith("context"):
        lines[1] = lines[1].replace(",1000,", ",many,")
    elif problem.startswith("duration"):
        lines[2] = lines[2].replace(",1.0,10", ",-1,10")
    else:
        lines[2] = lines[2].replace(",attempt_1,2,0,", ",attempt_1,2,2,")
    target.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=problem) as err:
        swebench_runs(llm, tools)
    assert f"{target}:{line}:" in str(err.value)


def test_swebench_missing_column(tmp_path: Path) -> None:
    llm, tools = write_swe(tmp_path)
    tools.write_text("source,task,attempt,t_start_s\n")
    with pytest.raises(TraceError, match=r"tools.csv:1: header lacks column\(s\) duration_s"):
        swebench_runs(llm, tools)


# --- Azure builder ---------------------------------------------------------------------------------------------


def test_azure_small_file(tmp_path: Path) -> None:
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"t,{100 * k + 1},{k + 5}\n" for k in range(10)))
    w = azure_workload(p, groups=3, samples=4, seed=0)
    assert len(w) == 12 and all(t.num_turns == 1 and t.tool_seconds == 0 for t in w)
    for ts in w.groups().values():
        assert len({t.prompt_tokens for t in ts}) == 1
    c = azure_workload(p, groups=3, samples=4, seed=0, grouping="consecutive")
    prompts = [t.prompt_tokens for t in c]
    assert len(set(prompts)) == 10  # 12 consecutive rows wrap around a 10-row file
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nt,5,0\n")
    with pytest.raises(TraceError, match=r"az.csv:2: GeneratedTokens = 0 is negative"):
        azure_workload(p, groups=1, samples=1, seed=0)


# --- CLI -----------------------------------------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register_workload(app)
    return app


def test_cli_build_synthetic_to_stdout_and_file(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli(), ["workload", "build", "--from", "synthetic", "--groups", "3", "--samples", "2",
                                "--seed", "4", "--max-context", "qwen3-8b"])
    assert res.exit_code == 0, res.output
    w = parse_workload(res.stdout)
    assert w == synthetic_workload(3, 2, 4, max_context=40960)
    out = tmp_path / "w.jsonl"
    res = runner.invoke(cli(), ["workload", "build", "--from", "synthetic", "--out", str(out), "--max-context", "5000"])
    assert res.exit_code == 0 and load_workload(out).meta["max_context"] == 5000
    res = runner.invoke(cli(), ["workload", "summary", str(out)])
    assert json.loads(res.stdout)["trajectories"] == 64


def test_cli_user_errors() -> None:
    runner = CliRunner()
    res = runner.invoke(cli(), ["workload", "build", "--from", "swebench"])
    assert isinstance(res.exception, UserInputError) and "--llm-calls" in str(res.exception)
    res = runner.invoke(cli(), ["workload", "build", "--from", "nope"])
    assert isinstance(res.exception, UserInputError)


# --- the real shared traces ------------------------------------------------------------------------------------------


def test_real_swebench_batch(shared_data: Path) -> None:
    llm, tools = shared_data / "agent_swebench_llm_calls.csv", shared_data / "agent_swebench_tool_calls.csv"
    runs = swebench_runs(llm, tools)
    assert len(runs) == 166  # 55 haiku + 111 GLM tasks, one attempt each
    assert max(r.final_context for r in runs) > 100_000
    w = swebench_workload(llm, tools, groups=16, samples=8, seed=3)
    assert w == swebench_workload(llm, tools, groups=16, samples=8, seed=3)
    within, across = cv_within_and_across(w)
    assert within < 0.3 and within < 0.4 * across
    capped = swebench_workload(llm, tools, groups=16, samples=8, seed=3, max_context=40960)
    assert max(t.final_context for t in capped) <= 40960 and capped.meta["truncated"] > 0
    assert sum(t.tool_seconds for t in w) > 0


def test_real_azure(shared_data: Path) -> None:
    w = azure_workload(shared_data / "azure_llm_inference_2023_code.csv", groups=8, samples=4, seed=0)
    assert len(w) == 32 and w == azure_workload(shared_data / "azure_llm_inference_2023_code.csv",
                                                groups=8, samples=4, seed=0)


# --- dispersion and first epoch --------------------------------------------------------------------------------


def _within_cv(groups: list[list[float]]) -> float:
    return statistics.fmean(statistics.pstdev(g) / statistics.fmean(g) for g in groups)


def test_dispersion_zero_identical_larger_spreads_more_default_unchanged() -> None:
    from rollplan.sim.replay import BatchSource, builtin_bases

    assert with_dispersion(None) == with_dispersion(DEFAULT_DISPERSION) == GroupVariation()
    assert synthetic_workload(4, 4, 1) == synthetic_workload(4, 4, 1, variation=with_dispersion(0.15))
    zero = synthetic_workload(4, 4, 1, variation=with_dispersion(0.0))
    for ts in zero.groups().values():
        assert len({t.turns for t in ts}) == 1  # every sample of a prompt: the same turns
    cvs = [cv_within_and_across(synthetic_workload(12, 8, 1, variation=with_dispersion(x)))[0] for x in (0.15, 0.6)]
    assert 0 < cvs[0] < cvs[1]
    # The replay's batches (numpy draw, bench_replay.workload_options): the same rules.
    from rollplan.sim.bench_replay import workload_options

    src = BatchSource.dataset(builtin_bases(0, prompts=8), groups=8, samples=6, seed=0)
    spread = []
    for x in (0.0, 0.15, 0.6):
        specs, _ = workload_options(src, dispersion=x).batch(1)
        by_group: dict[str, list] = {}
        for sp in specs:
            by_group.setdefault(sp.group, []).append(sp)
        if x == 0:
            assert all(len({(t.prefill, t.decode, t.tool) for t in g}) == 1 for g in by_group.values())
        spread.append(_within_cv([[float(sum(t.decode)) for t in g] for g in by_group.values()]))
    assert spread[0] == 0 < spread[1] < spread[2]
    assert workload_options(src, dispersion=0.15).batch(2) == src.batch(2)  # the default is today's draw


def test_first_epoch_prompts_are_disjoint_from_the_history() -> None:
    from rollplan.sim.bench_replay import FirstEpochSource, workload_options
    from rollplan.sim.replay import BatchSource, Scenario, builtin_bases

    src = BatchSource.dataset(builtin_bases(0, prompts=8), groups=4, samples=2, seed=0)
    first = workload_options(src, first_epoch=True)
    assert isinstance(first, FirstEpochSource)
    plain_hist = {k for _t, k in Scenario("p", src, max_batches=3, warmup_batches=3).history()}
    hist = {k for _t, k in Scenario("f", first, max_batches=3, warmup_batches=3).history()}
    assert plain_hist & set(src.batch(3)[1])  # without it, the window's prompts were seen in the warm-up
    seen = set(hist)
    for k in range(3, 6):
        specs, keys = first.batch(k)
        assert specs == src.batch(k)[0]  # same trajectories, only the prompts' history keys differ
        assert not set(keys) & seen  # never seen: neither in the warm-up nor in an earlier batch
        seen |= set(keys)


def _main_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the rollplan CLI (as tests/sim/test_report_cli.py does): exit 2 and one ``error: ... To fix:`` line."""
    from rollplan.solver.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "To fix:" in err, err
    return err


def test_cli_dispersion_first_epoch_and_bad_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.solver.cli import main

    out = tmp_path / "w.jsonl"
    argv = ["workload", "build", "--from", "synthetic", "--groups", "3", "--samples", "4", "--out", str(out)]
    assert main([*argv, "--dispersion", "0", "--first-epoch"]) == 0
    w = load_workload(out)
    assert all(len({t.turns for t in ts}) == 1 for ts in w.groups().values())
    assert w.meta["first_epoch"] is True and workload_meta(out)["first_epoch"] is True
    assert w.meta["variation"]["sample_sigma"] == 0.0
    for bad in ("-0.1", "nan", "inf"):
        assert "bad dispersion" in _main_one_line([*argv, "--dispersion", bad], capsys)
    small = ["--availability", "none", "--workload", "builtin", "--batches", "1", "--groups", "2", "--samples", "2",
             "--dedicated", "1", "--out", str(tmp_path / "o")]
    assert "bad dispersion" in _main_one_line(["replay", *small, "--dispersion", "-1"], capsys)
    assert "bad dispersion" in _main_one_line(["bench", "replay", "--dispersion", "nan"], capsys)
    assert "unknown policy 'magic'" in _main_one_line(["replay", *small, "--policies", "rollplan,magic"], capsys)


def test_history_file_naming_unknown_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.solver.cli import main

    wl = tmp_path / "w.jsonl"
    save_workload(synthetic_workload(2, 2, 0), wl)  # groups g00, g01
    good = tmp_path / "h.jsonl"
    save_workload(Workload((traj(tid="h0", group="g00"), traj(tid="h1", group="g01"))), good)
    assert [t.id for t in load_history(good, {"g00", "g01"})] == ["h0", "h1"]
    bad = tmp_path / "hbad.jsonl"
    save_workload(Workload((traj(tid="h0", group="g00"), traj(tid="h1", group="other"))), bad)
    with pytest.raises(TraceError, match="names prompt 'other'"):
        load_history(bad, {"g00", "g01"})
    argv = ["replay", "--availability", "none", "--workload", str(wl), "--batches", "1", "--dedicated", "1",
            "--policies", "elastic-plus", "--out", str(tmp_path / "o"), "--json"]
    assert main([*argv, "--history", str(good)]) == 0
    err = _main_one_line([*argv, "--history", str(bad)], capsys)
    assert f"{bad}:2: history trajectory 'h1' names prompt 'other'" in err and "1 of 2" in err


def test_bench_scenario_takes_dispersion_and_first_epoch(shared_data: Path) -> None:
    from rollplan.sim.bench_replay import FirstEpochSource, bench_scenario

    sc = bench_scenario(shared_data, "parcae-hh", bases=(), dispersion=0.6, first_epoch=True)
    assert isinstance(sc.batches, FirstEpochSource) and sc.batches.variation.sample_sigma == 0.6
    plain = bench_scenario(shared_data, "parcae-hh", bases=())
    assert type(plain.batches).__name__ == "BatchSource" and plain.batches.variation == GroupVariation()
