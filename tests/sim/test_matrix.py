"""``rollplan bench replay --matrix`` (``bench_replay.run_matrix``) on windows cut to a few simulated minutes.

Checked: the matrix has one cell per trace x mode x workload, each with every policy's tokens/s, the ceiling
and the best other policy; the share of what is left and the targets are what a hand computation from the
cell's own numbers gives; a no-history cell starts with an empty length history (and a history cell does
not); the window cut is honoured; the CLI flag prints the matrix and rejects bad input with one line;
``--fold-tool-s`` reaches every cell's simulator (0: more events, turn by turn) and the document records it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollplan.sim.bench_replay import (
    FOLD_TOOL_S,
    MATRIX_MODES,
    MATRIX_WORKLOADS,
    below_best_other,
    matrix_scenario,
    matrix_workload,
    run_matrix,
    share_of_what_is_left,
)
from rollplan.sim.policies import POLICY_NAMES, RollplanPolicy
from rollplan.sim.replay import run_policy, swebench_bases
from rollplan.solver.cli import main

WINDOW_H = 0.05  # 3 simulated minutes: the first batch is still running, every figure exists
TRACES = ("bamboo-p3", "parcae-hh")


@pytest.fixture(scope="module")
def doc(shared_data: Path) -> dict[str, Any]:
    return run_matrix(shared_data, traces=TRACES, window_h=WINDOW_H, jobs=1)


def test_matrix_has_every_cell(doc: dict[str, Any]) -> None:
    cells = doc["matrix"]["cells"]
    want = {(t, m, w.name) for t in TRACES for m in MATRIX_MODES for w in MATRIX_WORKLOADS}
    assert {(c["trace"], c["mode"], c["workload"]) for c in cells} == want
    assert len(cells) == len(want) == doc["matrix"]["summary"]["cells"]
    for c in cells:
        assert set(c["tokens_per_s"]) == set(POLICY_NAMES)
        assert c["window_s"] == pytest.approx(WINDOW_H * 3600.0)
        assert c["throughput_ceiling"] is not None
        assert max(c["tokens_per_s"].values()) <= c["throughput_ceiling"] + 1e-6
        assert c["best_other"]["policy"] != "rollplan"
    shapes = {(c["workload"], c["groups"], c["samples"], c["warmup_batches"], c["dispersion"]) for c in cells}
    assert shapes == {("128x16-history", 128, 16, 3, 0.15), ("32x8-no-history", 32, 8, 0, 0.15),
                      ("dispersion-0.6", 128, 16, 3, 0.6)}
    # the sync 128x16-history cells' rows are the document's bench rows
    assert [r["trace"] for r in doc["traces"]] == list(TRACES)
    assert "first 0.05 h" in doc["matrix"]["window"]["rule"]


def test_share_and_targets_by_hand(doc: dict[str, Any]) -> None:
    seen_share = False
    for c in doc["matrix"]["cells"]:
        tps = c["tokens_per_s"]
        rp = tps["rollplan"]
        others = {k: v for k, v in tps.items() if k != "rollplan"}
        best = max(others, key=lambda k: others[k])
        bo = others[best]
        assert c["best_other"] == {"policy": best, "tokens_per_s": bo}
        ceiling = c["throughput_ceiling"]
        assert c["left_tokens_per_s"] == pytest.approx(ceiling - bo, abs=1e-3)
        if ceiling > bo:
            seen_share = True
            assert c["share_of_what_is_left"] == pytest.approx((rp - bo) / (ceiling - bo), abs=1e-4)
        else:
            assert c["share_of_what_is_left"] is None
        assert c["targets"]["not_below_best_other"] is (rp >= bo)
        half = c["targets"]["half_of_what_is_left"]
        if c["workload"] == "128x16-history":
            share = c["share_of_what_is_left"]
            assert half is ((share >= 0.5) if share is not None else rp >= bo)
        else:
            assert half is None
        assert c["rollplan_vs_best_other"] == pytest.approx(rp / bo, abs=1e-4)
    assert seen_share
    below = {(b["trace"], b["mode"], b["workload"]): b for b in doc["matrix"]["summary"]["below_best_other"]}
    for c in doc["matrix"]["cells"]:
        key = (c["trace"], c["mode"], c["workload"])
        assert (key in below) is (not c["targets"]["not_below_best_other"])
        if key in below:
            gap = c["best_other"]["tokens_per_s"] - c["tokens_per_s"]["rollplan"]
            assert below[key]["ahead"] == c["best_other"]["policy"] and gap > 0
            assert below[key]["by_tokens_per_s"] == pytest.approx(gap, abs=1e-3)


def test_below_best_other_by_hand() -> None:
    def cell(trace: str, rp: float, bo: float) -> dict[str, Any]:
        return {"trace": trace, "mode": "async", "workload": "32x8-no-history",
                "tokens_per_s": {"rollplan": rp, "elastic-plus": bo},
                "best_other": {"policy": "elastic-plus", "tokens_per_s": bo},
                "targets": {"not_below_best_other": rp >= bo}}

    out = below_best_other([cell("a", 1999.6, 2000.0), cell("b", 2000.0, 2000.0), cell("c", 2100.0, 2000.0)])
    assert out == [{"trace": "a", "mode": "async", "workload": "32x8-no-history", "ahead": "elastic-plus",
                    "by_tokens_per_s": 0.4, "by_share": 0.0002}]


def test_share_of_what_is_left_edges() -> None:
    assert share_of_what_is_left(150.0, 100.0, 200.0) == 0.5
    assert share_of_what_is_left(90.0, 100.0, 200.0) == -0.1
    assert share_of_what_is_left(100.0, 100.0, 100.0) is None  # nothing left to take
    assert share_of_what_is_left(100.0, 100.0, 99.0) is None
    assert share_of_what_is_left(None, 100.0, 200.0) is None


class _HistoryProbe(RollplanPolicy):
    """The real rollplan policy, recording where the predictor's estimate of each batch-0 trajectory comes
    from when it is first queued (before any of the batch finishes, so no group statistics yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.estimate_sources: set[str] = set()

    def enqueued(self, sim: Any, j: int) -> None:
        t = sim.trajs[j]
        if t.batch == 0:
            self.estimate_sources.add(self.predictor.total(t.key, t.group)[2])
        super().enqueued(sim, j)


@pytest.mark.parametrize(("workload", "sources"), [("32x8-no-history", {"default"}),
                                                    ("128x16-history", {"history"})])
def test_no_history_cell_starts_with_no_history(shared_data: Path, workload: str, sources: set[str]) -> None:
    bases = swebench_bases(shared_data)
    sc = matrix_scenario(shared_data, "parcae-hh", "sync", matrix_workload(workload), bases=bases, window_h=0.01)
    assert (sc.history() == []) is (workload == "32x8-no-history")
    probe = _HistoryProbe()
    run_policy(sc, probe)
    # "default": the predictor's built-in prior, i.e. no history entry and no observation of any kind
    assert probe.estimate_sources == sources


def test_cli_matrix(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", "--matrix", "--json", "--data", str(shared_data), "--traces", "parcae-hh",
                 "--window-h", "0.02", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    cells = out["matrix"]["cells"]
    assert len(cells) == len(MATRIX_MODES) * len(MATRIX_WORKLOADS)
    assert {c["window_s"] for c in cells} == {72.0}
    assert out["scenario"]["fold_tool_s"] == FOLD_TOOL_S


def test_cli_matrix_fold_tool_s_reaches_every_cell(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--fold-tool-s 0``: every scenario replays turn by turn (more events than the default folding, the same
    cells), and the document says which folding it ran."""
    events = {}
    for fold in ("0", str(FOLD_TOOL_S)):
        assert main(["bench", "replay", "--matrix", "--json", "--data", str(shared_data), "--traces", "parcae-hh",
                     "--window-h", "0.02", "--jobs", "1", "--fold-tool-s", fold]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["scenario"]["fold_tool_s"] == float(fold)
        events[fold] = {(c["mode"], c["workload"]): c["row"]["events"] for c in out["matrix"]["cells"]}
    exact, folded = events["0"], events[str(FOLD_TOOL_S)]
    assert exact.keys() == folded.keys()
    assert all(exact[k] >= folded[k] for k in exact) and sum(exact.values()) > sum(folded.values())


def test_cli_matrix_evicted_return_reaches_every_cell(shared_data: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--evicted-return slot``: every cell's scenario is built with it (the simulator's behaviour is
    ``tests/sim/test_engine.py``'s), and the document says which it ran."""
    import rollplan.sim.bench_replay as br

    seen: list[str] = []
    build = br.matrix_scenario

    def spy(*args: object, **kw: object) -> object:
        sc = build(*args, **kw)  # type: ignore[arg-type]
        seen.append(sc.sim.evicted_return)
        return sc

    monkeypatch.setattr(br, "matrix_scenario", spy)
    assert main(["bench", "replay", "--matrix", "--json", "--data", str(shared_data), "--traces", "parcae-hh",
                 "--window-h", "0.02", "--jobs", "1", "--evicted-return", "slot"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["evicted_return"] == "slot"
    assert seen == ["slot"] * len(out["matrix"]["cells"]) and seen


@pytest.mark.parametrize("args", [
    ["--matrix", "--mode", "async"],
    ["--matrix", "--dispersion", "0.6"],
    ["--matrix", "--first-epoch"],
    ["--matrix", "--spec-tokens", "4"],
    ["--matrix", "--window-h", "0"],
    ["--matrix", "--window-h", "-2"],
    ["--matrix", "--window-h", "inf"],
    ["--window-h", "1"],
    ["--fold-tool-s", "-1"],
    ["--matrix", "--fold-tool-s", "nan"],
    ["--fold-tool-s", "0", "--spec-tokens", "4"],
    ["--evicted-return", "engine"],
    ["--matrix", "--evicted-return", "slot", "--divide-tokens", "256"],
])
def test_cli_matrix_rejects_bad_input(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "To fix" in err, err
