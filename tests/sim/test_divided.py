"""Divided rollout in the simulator (SimConfig.divide_tokens, docs/seer.md).

Invariants (every policy, a small random scenario with many chunks): no decode token is lost or duplicated
(each finished trajectory was credited exactly its decode tokens, and the replay's decode tokens are their
sum), every move is a chunk boundary (moves <= chunks), every KV move is priced by the simulator's transfer
price (the migration GPU-seconds are the sum of ``FastPerf.transfer`` over the KV moves the policy asked for);
a division that never cuts a segment changes nothing. Oracles: a lone trajectory's chunks and rollout time by
hand; a trajectory that shares its GPU while another GPU has emptied moves there by KV at its next boundary,
once, at the transfer price of its context then; a segment of folded turns cut into chunks records each
turn's prefill tokens once (as without division). The lever benchmark's rollout ratio is taken on the batches
both runs completed. Bad values are one-line errors.
"""

from __future__ import annotations

import pytest

from rollplan.models.errors import SchemaError
from rollplan.models.perf import perf_model
from rollplan.models.specs import model_spec
from rollplan.sim.engine import FastPerf, SimConfig, SimTraj
from rollplan.sim.policies import POLICY_NAMES, make_policy
from rollplan.sim.replay import BatchSource, Scenario, builtin_bases, run_policy


def _fast() -> FastPerf:
    return FastPerf(perf_model("h800", "qwen3-8b", calibrated=True), 2048, model_spec("qwen3-8b").max_context, 0.9)


def _scenario(specs: list[SimTraj], dedicated: int, divide: int) -> Scenario:
    return Scenario("tiny", BatchSource(tuple(specs)), dedicated=dedicated, max_batches=1,
                    sim=SimConfig(fold_tool_s=0.0, divide_tokens=divide))


def test_lone_trajectory_chunks_and_rollout_by_hand() -> None:
    fp = _fast()
    spec = SimTraj("t0", "g0", 1000, (0,), (3000,), (0.0,))
    run = run_policy(_scenario([spec], 1, 1024), make_policy("static-colocated"))
    c = run.summary["counters"]
    assert c.get("chunks") == 2 and not c.get("chunk_moves_kv") and not c.get("chunk_moves_reprefill")
    # Chunks of 1024, 1024 and 952 tokens, each at the mean context of its own growth; the prompt's prefill is
    # spread over the first chunk's steps, batched with its decodes (the overlap S(1) per chunked step).
    dec = 1024 * fp.decode(1, 1000 + 512) + 1024 * fp.decode(1, 2024 + 512) + 952 * fp.decode(1, (3048 + 4000) / 2)
    expected = fp.prefill(1000, 0) - 1000 / 2047 * fp.overlap(1) + dec
    assert run.summary["batches"][0]["rollout_s"] == pytest.approx(expected, abs=2e-3)
    assert run.summary["decode_tokens"] == pytest.approx(3000)


class _Audited:
    """A real policy whose chunk moves and finished trajectories are recorded (its decisions unchanged)."""

    def __init__(self, name: str) -> None:
        self.inner = make_policy(name)
        self.kv_prices: list[float] = []
        self.credited: list[tuple[float, int]] = []

    def __getattr__(self, attr: str):  # everything else is the policy's own
        return getattr(self.inner, attr)

    def chunk_move(self, sim, j: int):
        move = self.inner.chunk_move(sim, j)
        if move is not None and move[1]:
            t, home, dst = sim.trajs[j], sim.slots[sim.trajs[j].slot], sim.slots[move[0]]
            fits = dst.kv_cap - dst.reserved + sim.prefix_bonus(dst, t) >= t.ctx
            self.kv_prices.append(home.perf.transfer(t.ctx, home.node == dst.node) * home.tp if fits else 0.0)
        return move

    def on_traj_done(self, sim, j: int) -> None:
        t = sim.trajs[j]
        self.credited.append((t.decoded, sum(t.dec)))
        self.inner.on_traj_done(sim, j)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_token_lost_or_duplicated_and_moves_priced(policy: str) -> None:
    src = BatchSource.dataset(builtin_bases(5, prompts=8), groups=4, samples=4, seed=5, max_context=40960)
    sc = Scenario("r5", src, dedicated=3, max_batches=2, sim=SimConfig(divide_tokens=256))
    audit = _Audited(policy)
    run = run_policy(sc, audit)
    s = run.summary
    assert s["trajectories_completed"] == 32
    for got, want in audit.credited:
        assert got == pytest.approx(want, rel=1e-9)
    assert s["decode_tokens"] == pytest.approx(sum(w for _g, w in audit.credited), abs=0.1)
    c = s["counters"]
    moves = c.get("chunk_moves_kv", 0) + c.get("chunk_moves_reprefill", 0)
    assert c["chunks"] > 0 and moves <= c["chunks"]
    assert len([p for p in audit.kv_prices if p > 0]) == c.get("chunk_moves_kv", 0)
    if not c.get("migrations_kv"):  # no plan migration shares the GPU-seconds
        assert s["migration_gpu_seconds"] == pytest.approx(sum(audit.kv_prices), abs=2e-3)


def test_a_trajectory_moves_to_a_freed_gpu_at_its_next_chunk() -> None:
    # FCFS least-loaded on 3 GPUs: L1 -> g0, S1 -> g1, S2 -> g2, then L2 -> g0 (one resident each: the most
    # free KV; S1 and S2 hold longer prompts). The short ones finish before L1's first boundary; L1 then moves
    # to the emptied g1 (same node: by KV), L2 stays alone on g0.
    fp = _fast()
    specs = [SimTraj("L1", "a", 8000, (0,), (4096,), (0.0,)), SimTraj("S1", "b", 13000, (0,), (500,), (0.0,)),
             SimTraj("S2", "c", 13000, (0,), (500,), (0.0,)), SimTraj("L2", "d", 8000, (0,), (4096,), (0.0,))]
    pol = make_policy("static-colocated")
    on = run_policy(_scenario(specs, 3, 1024), pol).summary
    off = run_policy(_scenario(specs, 3, 0), make_policy("static-colocated")).summary
    assert on["counters"].get("chunk_moves_kv") == 1 and not on["counters"].get("chunk_moves_reprefill")
    assert on["migration_gpu_seconds"] == pytest.approx(fp.transfer(8000 + 1024, True), abs=2e-3)
    assert on["batches"][0]["rollout_s"] < off["batches"][0]["rollout_s"]
    assert on["decode_tokens"] == off["decode_tokens"]


@pytest.mark.parametrize("divide", [256, 2048])
def test_folded_turns_prefill_tokens_counted_once(divide: int) -> None:
    # Five turns folded into one segment (5 s tools < fold_tool_s): every chunk's segment re-plans the turns
    # ahead, whose new tokens the first plan already recorded. Measured before the fix: 21,000 at 256.
    spec = SimTraj("t0", "g0", 1000, (0, 500, 500, 500, 500), (1000,) * 5, (5.0,) * 5)

    def run(d: int) -> dict:
        sc = Scenario("fold", BatchSource((spec,)), dedicated=1, max_batches=1, sim=SimConfig(divide_tokens=d))
        return run_policy(sc, make_policy("static-colocated")).summary

    on, off = run(divide), run(0)
    assert on["counters"]["chunks"] >= 2
    assert on["prefill_tokens"] == off["prefill_tokens"] == 1000 + 4 * 500
    assert on["decode_tokens"] == off["decode_tokens"] == 5000
    assert on["batches"][0]["rollout_s"] == pytest.approx(off["batches"][0]["rollout_s"], rel=1e-3)


def test_lever_rollout_ratio_is_on_the_batches_both_runs_completed() -> None:
    from rollplan.sim.bench_replay import common_rollout_s

    def summ(rollouts: list[float | None]) -> dict:
        return {"batches": [{"index": i, "rollout_s": r} for i, r in enumerate(rollouts)]}

    # "on" completes a long fourth batch in the window: its own mean (806.5) would read as slower than off.
    idx, means = common_rollout_s({"off": summ([700.0, 900.0, 760.0, None]), "on": summ([690.0, 880.0, 750.0, 906.0])})
    assert idx == [0, 1, 2]
    assert means == {"off": pytest.approx(786.667, abs=1e-3), "on": pytest.approx(773.333, abs=1e-3)}
    assert common_rollout_s({"off": summ([None]), "on": summ([5.0])}) == ([], {"off": None, "on": None})


def test_division_that_never_cuts_changes_nothing() -> None:
    src = BatchSource.dataset(builtin_bases(2, prompts=6), groups=3, samples=4, seed=2, max_context=40960)

    def summary(divide: int) -> dict:
        sc = Scenario("r2", src, dedicated=2, max_batches=1, sim=SimConfig(divide_tokens=divide))
        s = run_policy(sc, make_policy("rollplan")).summary
        return {k: v for k, v in s.items() if k not in ("wall_s", "cpu_s", "replans")}

    assert summary(10**9) == summary(0)


@pytest.mark.parametrize("value", [-1, 10, 63, True, 2.5])
def test_bad_divide_tokens_is_one_line_with_a_fix(value: object) -> None:
    with pytest.raises(SchemaError, match=r"--divide-tokens.*To fix:"):
        SimConfig(divide_tokens=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [
    ["replay", "--availability", "none", "--workload", "builtin", "--batches", "1", "--divide-tokens", "10"],
    ["bench", "replay", "--divide-tokens", "-1"],
    ["bench", "replay", "--divide-tokens", "2048", "--spec-tokens", "4"],
    ["bench", "replay", "--matrix", "--divide-tokens", "2048"],
    ["bench", "replay", "--divide-tokens", "2048", "--window-h", "0"],
])
def test_cli_bad_divide_input_is_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.solver.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "To fix" in err, err
