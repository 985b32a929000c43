"""`rollplan bench pd-crossover`: colocated against disaggregated prefill/decode on dedicated GPUs.

PEARL (elastic P/D for agentic RL) measured, on 8 GPUs with Qwen3-8B, that disaggregating prefill and decode
makes rollout 9.7% faster at 32 trajectories per batch and colocation 6.1% faster at 96. This bench replays
the same setting in the simulator: ``gpus`` dedicated GPUs, no availability trace and no lending
(``--availability none --lent 0``), SWE-bench-built batches of ``prompts x samples`` trajectories, and
``static-colocated`` against ``static-disagg`` at each P:D split of ``PD_SPLITS``, over several workload
seeds. Per batch size it reports each policy's mean rollout seconds per seed and in total, disaggregation's
best split (chosen by its total over the seeds, as an operator who tunes the split once would), and the
ratio ``colocated / best disaggregated`` (> 1: disaggregation is faster), next to PEARL's figure.

It also reports what any policy could gain at all: each batch's floor (``bench_replay.batch_floors``: its
longest trajectory's decode tokens at batch 1, the fastest step there is, plus all its tool seconds; prefill
and queueing left out, so the floor is loose but holds for every policy and P:D split), the share of the
colocated rollout above it, and ``colocated / floor``, the most any policy can be faster than colocation.
Where that is below PEARL's 1 + 9.7%, no P/D split can reproduce PEARL's small-batch result on this workload:
its batches are bound by their longest trajectory's tool waits, not by the GPUs.

The same numbers come out of ``rollplan replay --availability none --workload swebench --dedicated 8 --lent 0
--policies static-colocated,static-disagg --pd P:D --groups G --samples 8 --batches N --seed S`` (that is how
a reader checks a cell); this module calls the same ``Scenario`` and ``run_replay``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from rollplan.models.errors import UserInputError
from rollplan.sim.bench_replay import batch_floors, role_shares
from rollplan.sim.engine import SimConfig
from rollplan.sim.lending import LendingConfig
from rollplan.sim.policies import make_policy
from rollplan.sim.replay import Scenario, batch_source, run_replay

PD_SPLITS: tuple[tuple[int, int], ...] = ((1, 7), (1, 3), (3, 5))
"""The P:D ratios the issue names (on 8 GPUs: 1, 2 and 3 prefill GPUs): static-disagg is run at each and
reported at its best, so disaggregation is not handicapped by one fixed split."""

PEARL = {32: {"faster": "disaggregated", "by": 0.097}, 96: {"faster": "colocated", "by": 0.061}}
"""PEARL's published figures on 8 GPUs, Qwen3-8B: the faster mode and by how much, per batch size."""


def _scenario(data_dir: Path, *, prompts: int, samples: int, seed: int, gpus: int, gpu: str, model: str,
              batches: int, calibrated: bool = True) -> Scenario:
    return Scenario(
        name=f"pd-crossover:{prompts}x{samples}:seed{seed}",
        batches=batch_source("swebench", model=model, groups=prompts, samples=samples, seed=seed, data_dir=data_dir),
        model=model, gpu=gpu, dedicated=gpus, trace=None,
        lending=LendingConfig(gpus=0, gpu=gpu), max_batches=batches, seed=seed, sim=SimConfig(), calibrated=calibrated,
    )


def _rollout_s(summary: dict[str, Any]) -> float:
    return float(summary["rollout_s"]["mean"])


def run_pd_crossover(
    data_dir: Path,
    *,
    sizes: Sequence[int] = (4, 12),
    samples: int = 8,
    seeds: Sequence[int] = (0, 1, 2, 3),
    gpus: int = 8,
    gpu: str = "h800",
    model: str = "qwen3-8b",
    batches: int = 3,
    splits: Sequence[tuple[int, int]] = PD_SPLITS,
    calibrated: bool = True,
) -> dict[str, Any]:
    """Replay every (batch size, seed) under static-colocated and static-disagg at each split; see the module
    docstring for what is reported. Deterministic (the simulator and the workload are seeded)."""
    if not (data_dir / "agent_swebench_llm_calls.csv").is_file():
        raise UserInputError(f"{data_dir}: the SWE-bench agent traces are not there",
                             fix="pass --data with the shared data folder (../shared/data)")
    rows: list[dict[str, Any]] = []
    for prompts in sizes:
        per_seed: list[dict[str, Any]] = []
        for seed in seeds:
            sc = _scenario(data_dir, prompts=prompts, samples=samples, seed=seed, gpus=gpus, gpu=gpu, model=model,
                           batches=batches, calibrated=calibrated)
            pols = [make_policy("static-colocated")]
            pols += [make_policy("static-disagg", pd=s) for s in splits]
            res = run_replay(sc, pols, jobs=1)
            runs = res.runs
            n_batches = len(runs[0].summary["batches"])
            floors = batch_floors(sc, range(n_batches))
            cell = {"seed": seed, "colocated_s": _rollout_s(runs[0].summary),
                    "floor_s": sum(floors.values()) / max(1, n_batches),
                    "colocated_roles": role_shares(runs[0].summary),
                    "disagg_s": {f"{p}:{d}": _rollout_s(r.summary) for (p, d), r in zip(splits, runs[1:], strict=True)},
                    "disagg_roles": {f"{p}:{d}": role_shares(r.summary) for (p, d), r in zip(splits, runs[1:], strict=True)}}
            per_seed.append(cell)
        coloc = mean(c["colocated_s"] for c in per_seed)
        by_split = {k: mean(c["disagg_s"][k] for c in per_seed) for k in per_seed[0]["disagg_s"]}
        best = min(by_split, key=lambda k: by_split[k])
        ratio = coloc / by_split[best]
        floor = mean(c["floor_s"] for c in per_seed)
        n = prompts * samples
        rows.append({
            "trajectories": n, "prompts": prompts, "samples": samples,
            "colocated_rollout_s": round(coloc, 2),
            "disagg_rollout_s": {k: round(v, 2) for k, v in by_split.items()},
            "best_split": best,
            "colocated_over_best_disagg": round(ratio, 4),
            "faster": "disaggregated" if ratio > 1.0 else "colocated",
            "by": round(abs(ratio - 1.0) if ratio > 1.0 else 1.0 - ratio, 4),
            "per_seed_ratio": [round(c["colocated_s"] / c["disagg_s"][best], 4) for c in per_seed],
            # What any policy could gain over colocation: its rollout cannot go below the batches' floors.
            "floor_s": round(floor, 2),
            "colocated_above_floor": round(1.0 - floor / coloc, 4) if coloc > 0 else None,
            "most_any_policy_is_faster": round(coloc / floor, 4) if floor > 0 else None,
            "pearl": PEARL.get(n),
            "pearl_reachable": _reachable(PEARL.get(n), coloc, floor),
            "seeds": per_seed,
        })
    return {
        "setting": {"gpus": gpus, "gpu": gpu, "model": model, "samples": samples, "seeds": list(seeds),
                    "perf": "calibrated" if calibrated else "roofline",
                    "batches": batches, "splits": [f"{p}:{d}" for p, d in splits], "workload": "swebench"},
        "rows": rows,
    }


def _reachable(pearl: dict[str, Any] | None, coloc: float, floor: float) -> bool | None:
    """Whether PEARL's figure can be met at all here: a disaggregation win of ``by`` needs colocated / floor
    >= 1 + by (a colocation win is always within reach of the floor); None without a PEARL figure."""
    if pearl is None:
        return None
    if pearl["faster"] != "disaggregated":
        return True
    return floor > 0 and coloc / floor >= 1.0 + pearl["by"]


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per batch size for the CLI table."""
    out = []
    for r in report["rows"]:
        pearl = r["pearl"]
        out.append([str(r["trajectories"]), f"{r['colocated_rollout_s']:.1f}",
                    f"{r['disagg_rollout_s'][r['best_split']]:.1f} ({r['best_split']})",
                    f"{r['colocated_over_best_disagg']:.3f}", f"{r['faster']} by {100 * r['by']:.1f}%",
                    f"{r['floor_s']:.1f} ({100 * r['colocated_above_floor']:.1f}%)",
                    f"{r['most_any_policy_is_faster']:.3f}",
                    f"{pearl['faster']} by {100 * pearl['by']:.1f}%" if pearl else "-"])
    return out
