"""Batched step physics in the simulator, and the P/D crossover bench.

The simulator prices a MIXED slot's steps with ``PerfModel.step_time`` (a prefill chunk and the running
decodes in one forward pass). Checked by swapping the step model under the same replay (three real step
models that differ only in how a mixed step combines its parts):
- "added" (decode step + prefill chunk, the old pricing) >= the batched model >= "overlapped" (the slower of
  the two parts alone), and the batched model is strictly faster than "added" on a prefill-heavy colocated
  replay: the simulator really reads ``step_time``;
- DECODE slots run decode-only steps: with a PREFILL slot serving them, the three step models give the same
  disaggregated replay.
The bench: ``rollplan bench pd-crossover`` reports, cell for cell, what ``rollplan replay`` prints for the
same setting (that is how a reader checks it), a floor no policy's rollout goes below (and so the most any
policy can gain over colocation), and bad options give one-line errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollplan.models.perf import RooflinePerfModel, perf_model
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj
from rollplan.sim.policies import make_policy
from rollplan.sim.replay import BatchSource, Scenario, run_policy
from rollplan.solver.cli import main


@dataclass(frozen=True)
class _Combined:
    """The roofline model with another rule for a mixed step: ``"added"`` (decode + prefill chunk) or
    ``"overlapped"`` (the slower of the two). Every other method is the roofline model's."""

    base: RooflinePerfModel
    rule: str

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        dec = self.base.decode_step_time(decode_seqs, decode_kv_tokens / decode_seqs) if decode_seqs else 0.0
        pre = self.base.prefill_time([prefill_tokens], [prefill_context]) if prefill_tokens else 0.0
        return dec + pre if self.rule == "added" else max(dec, pre)

    def __getattr__(self, name: str):
        return getattr(self.base, name)


def _perf_for(rule: str | None, config: SimConfig):
    base = perf_model("h800", "qwen3-8b")
    assert isinstance(base, RooflinePerfModel)
    perf = base if rule is None else _Combined(base, rule)
    fast = FastPerf(perf, config.prefill_chunk, 40960, config.mem_util)  # type: ignore[arg-type]
    return lambda gpu, tp: fast


def _prefill_heavy(n: int = 12) -> tuple[SimTraj, ...]:
    # Agent-like turns: a large observation to prefill, a short answer to decode, a short tool call.
    return tuple(
        SimTraj(f"t{i}", f"g{i}", 4000 + 500 * i, (0, 6000, 6000, 6000), (300, 200, 200, 400 + 40 * i),
                (1.0, 1.0, 1.0, 0.0))
        for i in range(n)
    )


def _rollout(policy: str, rule: str | None, *, dedicated: int, pd: tuple[int, int] = (1, 3)) -> float:
    cfg = SimConfig(fold_tool_s=0.0)
    sc = Scenario("physics", BatchSource(_prefill_heavy()), dedicated=dedicated, max_batches=1, sim=cfg)
    pol = make_policy(policy, pd=pd) if policy == "static-disagg" else make_policy(policy)
    run = run_policy(sc, pol, perf_for=_perf_for(rule, cfg))
    assert run.summary["trajectories_completed"] == 12
    return run.summary["batches"][0]["rollout_s"]


def test_mixed_steps_are_priced_by_step_time() -> None:
    added = _rollout("static-colocated", "added", dedicated=2)
    batched = _rollout("static-colocated", None, dedicated=2)
    overlapped = _rollout("static-colocated", "overlapped", dedicated=2)
    assert overlapped <= batched + 1e-9 <= added + 2e-9
    assert batched < added * 0.995  # the weight reads a mixed step shares are a visible saving here


def test_decode_slots_run_decode_only_steps() -> None:
    runs = {rule: _rollout("static-disagg", rule, dedicated=4, pd=(1, 3)) for rule in ("added", None, "overlapped")}
    assert runs["added"] == pytest.approx(runs[None], rel=1e-9)
    assert runs["overlapped"] == pytest.approx(runs[None], rel=1e-9)


@pytest.mark.slow
def test_pd_crossover_cells_match_rollplan_replay(shared_data: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pd-crossover", "--data", str(shared_data), "--seeds", "1", "--prompts", "4",
                 "--batches", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["trajectories"] == 32 and row["best_split"] in row["disagg_rollout_s"]
    ratio = row["colocated_rollout_s"] / row["disagg_rollout_s"][row["best_split"]]
    assert row["colocated_over_best_disagg"] == pytest.approx(ratio, abs=1e-3)
    assert row["faster"] == ("disaggregated" if ratio > 1 else "colocated")
    # The floor holds for every policy and split (it is what no policy can beat), and the reported most any
    # policy could gain over colocation is colocated / floor.
    floor = row["floor_s"]
    assert 0 < floor <= min(row["colocated_rollout_s"], *row["disagg_rollout_s"].values()) + 1e-6
    assert row["most_any_policy_is_faster"] == pytest.approx(row["colocated_rollout_s"] / floor, abs=1e-3)
    assert row["pearl_reachable"] == (row["most_any_policy_is_faster"] >= 1.097)
    for split in ("1:7", "3:5"):
        assert main(["replay", "--availability", "none", "--workload", "swebench", "--data", str(shared_data),
                     "--dedicated", "8", "--lent", "0", "--policies", "static-colocated,static-disagg", "--pd", split,
                     "--groups", "4", "--samples", "8", "--batches", "2", "--seed", "1", "--json",
                     "--out", str(tmp_path / split.replace(":", "-"))]) == 0
        rep = json.loads(capsys.readouterr().out)["policies"]
        assert rep["static-colocated"]["rollout_s"]["mean"] == pytest.approx(row["colocated_rollout_s"], abs=0.01)
        assert rep["static-disagg"]["rollout_s"]["mean"] == pytest.approx(row["disagg_rollout_s"][split], abs=0.01)
        roles = row["seeds"][0]["disagg_roles"][split]
        assert roles["prefill"] > 0 and roles["decode"] > roles["prefill"]  # a P:D split really runs


def test_pd_crossover_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "pd-crossover", "--seeds", "a,b"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["bench", "pd-crossover", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "To fix:" in err and "SWE-bench" in err
