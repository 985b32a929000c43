"""``rollplan bench replay --matrix --seeds`` (``rollplan.sim.bench_seeds``).

Checked:
- ``parse_seeds`` takes a comma list of distinct non-negative integers and refuses anything else with one line;
- ``seed_spread`` on hand-built matrices: each cell's per-seed figures, median, min and max, in how many seeds
  each target holds, and the matrix-wide counts; runs whose cells differ are refused;
- invariants (hypothesis, random per-seed figures): min <= median <= max; a cell at half of what is left in
  every seed is at half at the median, so that count never exceeds the median's; a cell not below the best
  other in every seed has every seed's ratio >= 1 (the cells' targets built as ``matrix_cell`` builds them);
- the started oracle's figures (``oracle_row``'s ``started``) spread per cell and counted at the median;
- on real replays (a tiny matrix: one trace, one mode, one workload, a cut window), each seed's figures are
  exactly those of ``run_matrix`` run alone with that seed, and different seeds draw different workloads;
- the CLI flag's bad input gives one line; the CLI prints the spread document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.errors import UserInputError
from rollplan.sim.bench_replay import HALF_TARGET, run_matrix
from rollplan.sim.bench_seeds import parse_seeds, run_matrix_seeds, seed_spread, spread
from rollplan.solver.cli import main


def _cell(trace: str = "t", mode: str = "sync", workload: str = "128x16-history", *, vs: float = 1.01,
          share: float | None = 0.4, target: bool = True, best: str = "elastic-plus",
          oracle_share: float | None = None, at_most: float | None = None) -> dict[str, Any]:
    """A matrix cell with the fields ``seed_spread`` reads, its targets derived as ``matrix_cell`` does."""
    not_below = vs >= 1.0
    half = ((share >= HALF_TARGET) if share is not None else not_below) if target else None
    return {"trace": trace, "mode": mode, "workload": workload, "best_other": {"policy": best},
            "rollplan_vs_best_other": vs, "share_of_what_is_left": share,
            "targets": {"not_below_best_other": not_below, "half_of_what_is_left": half},
            "oracle": None if oracle_share is None else {"share_of_what_is_left": oracle_share,
                                                         "rollplan_share_at_most": at_most}}


def _doc(cells: list[dict[str, Any]]) -> dict[str, Any]:
    vs = [c["rollplan_vs_best_other"] for c in cells]
    half = [c["targets"]["half_of_what_is_left"] for c in cells if c["targets"]["half_of_what_is_left"] is not None]
    return {"matrix": {"cells": cells, "summary": {
        "not_below_best_other": sum(c["targets"]["not_below_best_other"] for c in cells),
        "half_of_what_is_left": f"{sum(half)}/{len(half)}", "min_rollplan_vs_best_other": min(vs)}}}


@pytest.mark.parametrize(("text", "want"), [("0,1,2", (0, 1, 2)), (" 3 , 1 ", (3, 1)), ("7", (7,)), ("0,1,", (0, 1))])
def test_parse_seeds(text: str, want: tuple[int, ...]) -> None:
    assert parse_seeds(text) == want


@pytest.mark.parametrize("text", ["", ",", "a,b", "1.5", "-1,2", "0,1,0"])
def test_parse_seeds_rejects(text: str) -> None:
    with pytest.raises(UserInputError) as e:
        parse_seeds(text)
    assert "\n" not in str(e.value) and "--seeds" in str(e.value)


def test_seed_spread_by_hand() -> None:
    a = ("p3", "sync", "128x16-history")
    b = ("p3", "async", "32x8-no-history")
    runs = [
        (0, _doc([_cell(*a, vs=1.035, share=0.44), _cell(*b, vs=1.0, share=None, target=False)])),
        (1, _doc([_cell(*a, vs=1.028, share=0.52, oracle_share=0.7), _cell(*b, vs=0.9996, share=-0.3, target=False,
                                                                       best="elastic-colocated")])),
        (2, _doc([_cell(*a, vs=1.041, share=0.61), _cell(*b, vs=1.002, share=0.1, target=False)])),
    ]
    out = seed_spread(runs)
    assert out["seeds"] == [0, 1, 2]
    ca, cb = out["cells"]
    assert (ca["trace"], ca["mode"], ca["workload"]) == a
    assert ca["rollplan_vs_best_other"] == {"per_seed": [1.035, 1.028, 1.041], "median": 1.035, "min": 1.028,
                                            "max": 1.041}
    assert ca["share_of_what_is_left"]["median"] == 0.52
    assert ca["half_of_what_is_left"] == "2/3" and ca["half_at_median"] is True
    assert ca["not_below_best_other"] == "3/3"
    assert ca["oracle_share_of_what_is_left"]["per_seed"] == [None, 0.7, None]
    assert cb["best_other"] == ["elastic-plus", "elastic-colocated", "elastic-plus"]
    assert cb["not_below_best_other"] == "2/3"
    assert cb["half_of_what_is_left"] is None and cb["oracle_share_of_what_is_left"] is None
    assert cb["share_of_what_is_left"] == {"per_seed": [None, -0.3, 0.1], "median": -0.1, "min": -0.3, "max": 0.1}
    assert ca["left_tokens_per_s"]["per_seed"] == [None, None, None]  # the hand-built cells carry none
    sm = out["summary"]
    assert sm["not_below_best_other_every_seed"] == 1
    assert sm["half_of_what_is_left_every_seed"] == "0/1"
    assert sm["half_of_what_is_left_at_median"] == "1/1"
    assert sm["min_rollplan_vs_best_other"] == 0.9996
    assert [p["not_below_best_other"] for p in sm["per_seed"]] == [2, 1, 2]
    assert ca["rollplan_share_at_most"]["per_seed"] == [None, None, None]
    assert sm["half_reachable_by_any_ceiling_at_median"] == "0/1"


def test_reachable_by_any_ceiling_over_seeds() -> None:
    """The target cells whose median rollplan_share_at_most is >= 0.5: one cell at 0.6 / 0.4 / 0.7 (median
    0.6: reachable), one at 0.3 / 0.45 / 0.9 (median 0.45: not), a no-target cell left out."""
    a, b, c = ("p3", "sync", "128x16-history"), ("g4dn", "async", "128x16-history"), ("p3", "sync", "32x8-no-history")
    runs = [(s, _doc([_cell(*a, oracle_share=0.7, at_most=x), _cell(*b, oracle_share=0.5, at_most=y),
                      _cell(*c, target=False, oracle_share=0.1, at_most=0.1)]))
            for s, x, y in ((0, 0.6, 0.3), (1, 0.4, 0.45), (2, 0.7, 0.9))]
    out = seed_spread(runs)
    ca, cb, _cc = out["cells"]
    assert ca["rollplan_share_at_most"] == {"per_seed": [0.6, 0.4, 0.7], "median": 0.6, "min": 0.4, "max": 0.7}
    assert cb["rollplan_share_at_most"]["median"] == 0.45
    assert out["summary"]["half_reachable_by_any_ceiling_at_median"] == "1/2"


def test_started_oracle_over_seeds() -> None:
    """The started oracle's share and part of the oracle's gain, per seed and at the median: one target cell
    at 0.55 / 0.3 / 0.6 (median 0.55: half), one at 0.2 / 0.1 / 0.3 (not), a no-target cell left out."""
    a, b, c = ("p3", "sync", "128x16-history"), ("g4dn", "async", "128x16-history"), ("p3", "sync", "32x8-no-history")

    def cell(key: tuple[str, str, str], share: float, gain: float, target: bool = True) -> dict[str, Any]:
        out = _cell(*key, target=target, oracle_share=0.7, at_most=0.6)
        out["oracle"]["started"] = {"share_of_what_is_left": share, "of_oracle_gain": gain}
        return out

    runs = [(s, _doc([cell(a, x, g), cell(b, y, g), cell(c, 0.9, 0.9, target=False)]))
            for s, x, y, g in ((0, 0.55, 0.2, 0.3), (1, 0.3, 0.1, 0.2), (2, 0.6, 0.3, 0.25))]
    out = seed_spread(runs)
    ca, cb, _cc = out["cells"]
    assert ca["started_oracle_share_of_what_is_left"] == {"per_seed": [0.55, 0.3, 0.6], "median": 0.55,
                                                          "min": 0.3, "max": 0.6}
    assert ca["started_oracle_of_oracle_gain"]["median"] == 0.25
    assert cb["started_oracle_share_of_what_is_left"]["median"] == 0.2
    assert out["summary"]["started_oracle_half_at_median"] == "1/2"
    # Without the references: no started figures anywhere.
    plain = seed_spread([(0, _doc([_cell(*a)]))])
    assert plain["cells"][0]["started_oracle_share_of_what_is_left"] is None
    assert plain["summary"]["started_oracle_half_at_median"] is None


def test_seed_spread_refuses_different_matrices() -> None:
    one = _doc([_cell("p3")])
    other = _doc([_cell("g4dn")])
    with pytest.raises(ValueError, match="seed 5"):
        seed_spread([(0, one), (5, other)])
    with pytest.raises(ValueError):
        seed_spread([])


_ratio = st.floats(min_value=0.95, max_value=1.1, allow_nan=False)
_share = st.one_of(st.none(), st.floats(min_value=-1.0, max_value=1.0, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(_ratio, _share), min_size=3, max_size=3), min_size=1, max_size=5))
def test_seed_spread_invariants(per_seed: list[list[tuple[float, float | None]]]) -> None:
    keys = [("a", "sync", "128x16-history"), ("b", "async", "128x16-history"), ("c", "sync", "dispersion-0.6")]
    runs = [(s, _doc([_cell(*k, vs=v, share=q, target=k[2] == "128x16-history") for k, (v, q) in zip(keys, cells, strict=True)]))
            for s, cells in enumerate(per_seed)]
    out = seed_spread(runs)
    n = len(per_seed)
    for c in out["cells"]:
        for name in ("rollplan_vs_best_other", "share_of_what_is_left"):
            sp = c[name]
            if sp["median"] is not None:
                assert sp["min"] <= sp["median"] + 1e-9 and sp["median"] <= sp["max"] + 1e-9
        if c["not_below_best_other"] == f"{n}/{n}":
            assert all(v >= 1.0 for v in c["rollplan_vs_best_other"]["per_seed"])
        if c["half_of_what_is_left"] == f"{n}/{n}" and c["share_of_what_is_left"]["median"] is not None:
            assert c["half_at_median"]
    sm = out["summary"]
    every, at_median = (int(sm[k].split("/")[0]) for k in ("half_of_what_is_left_every_seed",
                                                               "half_of_what_is_left_at_median"))
    shares_known = all(q is not None for cells in per_seed for _v, q in cells[:2])
    if shares_known:
        assert every <= at_median
    assert sm["min_rollplan_vs_best_other"] == min(v for cells in per_seed for v, _q in cells)


def test_spread_of_nothing() -> None:
    assert spread([None, None]) == {"per_seed": [None, None], "median": None, "min": None, "max": None}


TINY = {"traces": ("parcae-hh",), "modes": ("sync",), "workloads": ("32x8-no-history",), "window_h": 0.05, "jobs": 1}


def test_each_seed_is_its_own_matrix(shared_data: Path) -> None:
    doc = run_matrix_seeds(shared_data, seeds=(0, 3), **TINY)
    assert doc["scenario"]["seed"] == [0, 3]
    per_seed = doc["seeds"]["cells"][0]["rollplan_vs_best_other"]["per_seed"]
    for k, s in enumerate((0, 3)):
        alone = run_matrix(shared_data, seed=s, **TINY)["matrix"]["cells"][0]
        run_cell = doc["runs"][k]["cells"][0]
        assert run_cell["tokens_per_s"] == alone["tokens_per_s"]
        assert per_seed[k] == alone["rollplan_vs_best_other"]
        assert doc["seeds"]["cells"][0]["left_tokens_per_s"]["per_seed"][k] == alone["left_tokens_per_s"]
        assert "row" not in run_cell
    # different seeds draw different workloads: the two runs' figures differ
    assert doc["runs"][0]["cells"][0]["tokens_per_s"] != doc["runs"][1]["cells"][0]["tokens_per_s"]


@pytest.mark.parametrize("args", [
    ["--seeds", "0,1"],
    ["--matrix", "--seeds", "0,x"],
    ["--matrix", "--seeds", "1,1"],
    ["--matrix", "--seeds", "0,1", "--seed", "2"],
    ["--matrix", "--seeds", "0,1", "--per-batch"],
])
def test_cli_seeds_rejects_bad_input(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "To fix" in err, err


def test_cli_seeds(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "replay", "--matrix", "--seeds", "0,1", "--data", str(shared_data),
                 "--traces", "parcae-hh", "--window-h", "0.01", "--jobs", "1"]) == 0
    got = capsys.readouterr()
    out = json.loads(got.out)
    assert out["benchmark"] == "replay-matrix-seeds" and out["seeds"]["seeds"] == [0, 1]
    assert out["seeds"]["summary"]["cells"] == len(out["runs"][0]["cells"]) == 6
    # without --json: the spread table and its summary line on stderr
    sm = out["seeds"]["summary"]
    assert f"at the median: {sm['half_of_what_is_left_at_median']}" in got.err
    assert "matrix, seed 1" in got.err
