"""`rollplan bench sensitivity`: how much the rollplan policy's dispatch and admission constants matter, on
scenarios that were not used to choose them.

The constants of ``rollplan.policy.dispatch`` (``KV_HEADROOM``, ``BULK_HEADROOM``, ``CRITICAL_HEADROOM``,
``CRITICAL_SHARE``, ``DISPATCH_Z``) were chosen on the replay bench's traces (Bamboo p3 / g4dn, the bench's
SWE-bench workload at seed 0); the policy's ``PATH_Z`` (0, the planner's critical paths at the means) is
checked here against 1 and 1.77, and its regime rule (``REGIME`` "model": ``bulk_regime_pays``, from the step
model) against the share rule it replaced (``BULK_SHARE`` 0.8 of the longest path, chosen on the bench). This bench moves each one alone to a value below and above its
default, and also turns the headroom rule off (``kv_headroom=0``: the engine's watermark alone), on held-out
scenarios: synthetic preemptible-GPU traces (``synthetic_spot_trace``, seeds never used by the bench) over
dedicated and lent GPUs, SWE-bench-built batches at other workload seeds, with a cross-batch history, for
prompts never seen (``--first-epoch``) and with a wide within-group spread (``dispersion`` 0.6). Per variant
and scenario it reports rollplan's throughput over the default's (> 1: the variant is better there), the
median over the scenarios, and the best other policy's throughput over the default rollplan's, so a
constant's effect can be read against rollplan's lead. Deterministic (seeded workloads and traces, the
planner in deterministic mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from rollplan.policy.dispatch import (
    BULK_HEADROOM,
    CRITICAL_HEADROOM,
    CRITICAL_SHARE,
    DISPATCH_Z,
    KV_HEADROOM,
)
from rollplan.sim.bench_replay import check_bench_data, workload_options
from rollplan.sim.lending import LendingConfig, LendMode
from rollplan.sim.policies import MOVES, PATH_Z, REGIME, make_policy
from rollplan.sim.replay import BatchSource, Scenario, run_replay, swebench_bases
from rollplan.sim.traces import synthetic_spot_trace


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One held-out scenario: the spot trace's seed, the workload's seed and options."""

    name: str
    trace_seed: int
    workload_seed: int
    first_epoch: bool = False
    dispersion: float | None = None


HELD_OUT: tuple[HeldOut, ...] = (
    HeldOut("spot11-history", 11, 3),
    HeldOut("spot12-first-epoch", 12, 4, first_epoch=True),
    HeldOut("spot13-dispersion0.6", 13, 5, dispersion=0.6),
    HeldOut("spot14-history", 14, 6),
    HeldOut("spot15-first-epoch-dispersion0.6", 15, 7, first_epoch=True, dispersion=0.6),
)
"""The scenarios: none of these trace or workload seeds is used by ``rollplan bench replay``."""

VARIANTS: tuple[tuple[str, str, float | str], ...] = (
    ("kv_headroom", "KV_HEADROOM", 0.0),
    ("kv_headroom", "KV_HEADROOM", 0.2),
    ("kv_headroom", "KV_HEADROOM", 0.4),
    ("bulk_headroom", "BULK_HEADROOM", 0.0),
    ("bulk_headroom", "BULK_HEADROOM", 0.2),
    ("critical_headroom", "CRITICAL_HEADROOM", 0.7),
    ("critical_headroom", "CRITICAL_HEADROOM", 0.95),
    ("regime", "REGIME", "share"),
    ("moves", "MOVES", "forced" if MOVES == "all" else "all"),
    ("critical_share", "CRITICAL_SHARE", 0.7),
    ("critical_share", "CRITICAL_SHARE", 0.95),
    ("dispatch_z", "DISPATCH_Z", 0.0),
    ("dispatch_z", "DISPATCH_Z", 3.0),
    ("path_z", "PATH_Z", 1.0),
    ("path_z", "PATH_Z", 1.77),
)
"""(``RollplanPolicy`` option, constant, value): each moved alone from its default. ``kv_headroom`` 0 turns the
whole headroom rule off (no headroom anywhere); ``dispatch_z`` 0 dispatches by the predicted mean; ``path_z``
prices the planner's critical paths at that many spreads above the predictions (``PlannerConfig.path_z``);
``regime`` "share": the batch counts as bound by its bulk when the plan's work bound reaches ``BULK_SHARE`` of
the longest pessimistic path (``is_bulk_bound``), instead of the step model's comparison; ``moves``: the other
rule for the plans' migrations (``MOVES``; its row names the value moved to, so it is the rule not in force
when ``MOVES`` changes)."""

DEFAULTS = {"KV_HEADROOM": KV_HEADROOM, "BULK_HEADROOM": BULK_HEADROOM, "CRITICAL_HEADROOM": CRITICAL_HEADROOM,
            "CRITICAL_SHARE": CRITICAL_SHARE, "DISPATCH_Z": DISPATCH_Z, "PATH_Z": PATH_Z, "REGIME": REGIME,
            "MOVES": MOVES}

OTHERS = ("elastic-colocated", "elastic-plus")
"""The policies the default rollplan is compared with (the strongest baselines of ``rollplan bench replay``)."""


def held_out_scenario(data_dir: Path, h: HeldOut, *, hours: float = 4.0, bases: Any = None) -> Scenario:
    """``h`` as a Scenario: 8 dedicated H800s, up to 8 preemptible ones from a synthetic spot trace (30 s
    notices), 4 training GPUs lent between 120 s training steps (sync), 32 prompts x 8 samples per batch, two
    warm-up batches of history (none when ``first_epoch``), re-planned every 120 s, ``hours`` long."""
    trace = synthetic_spot_trace(hours * 3600.0, 8, h.trace_seed, initial_gpus=4, notice_s=30.0)
    bases = bases if bases is not None else swebench_bases(data_dir)
    src = BatchSource.dataset(bases, groups=32, samples=8, seed=h.workload_seed, max_context=40960)
    return Scenario(
        name=f"sensitivity:{h.name}",
        batches=workload_options(src, dispersion=h.dispersion, first_epoch=h.first_epoch),
        model="qwen3-8b", gpu="h800", dedicated=8, trace=trace,
        lending=LendingConfig(gpus=4, gpu="h800", train_step_s=120.0, mode=LendMode.SYNC),
        seed=h.workload_seed, replan_interval_s=120.0, warmup_batches=0 if h.first_epoch else 2,
    )


def run_sensitivity(data_dir: Path, *, scenarios: tuple[HeldOut, ...] = HELD_OUT, hours: float = 4.0,
                    jobs: int = 2, variants: tuple[tuple[str, str, float | str], ...] = VARIANTS) -> dict[str, Any]:
    """Every variant (``VARIANTS``) and the baselines on every held-out scenario; see the module docstring."""
    check_bench_data(data_dir)
    bases = swebench_bases(data_dir)
    per: dict[str, dict[str, Any]] = {}
    for h in scenarios:
        sc = held_out_scenario(data_dir, h, hours=hours, bases=bases)
        pols = [make_policy("rollplan")] + [make_policy("rollplan", **{opt: v}) for opt, _c, v in variants]
        pols += [make_policy(n) for n in OTHERS]
        res = run_replay(sc, pols, jobs=jobs)
        tps = [float(r.summary["throughput_tokens_per_s"]) for r in res.runs]
        base = tps[0]
        n = len(variants)
        per[h.name] = {
            "default_tokens_per_s": round(base, 1),
            "variants": [round(v / base, 4) for v in tps[1:1 + n]],
            "others": {name: round(v / base, 4) for name, v in zip(OTHERS, tps[1 + n:], strict=True)},
        }
    rows = []
    for i, (opt, const, v) in enumerate(variants):
        ratios = {k: c["variants"][i] for k, c in per.items()}
        rows.append({"constant": const, "option": opt, "default": DEFAULTS[const], "value": v,
                     "over_default": ratios, "median": round(median(ratios.values()), 4),
                     "max": max(ratios.values())})
    best_other = {k: max(c["others"].values()) for k, c in per.items()}
    return {
        "benchmark": "sensitivity",
        "setting": {"hours": hours, "scenarios": [h.name for h in scenarios], "others": list(OTHERS),
                    "rollplan": "make_policy('rollplan') defaults (milp, 1 s, solve charged)"},
        "scenarios": per,
        "rows": rows,
        "best_other_over_default": best_other,
    }


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """One row per variant (and one for the best other policy) for the CLI table."""
    names = doc["setting"]["scenarios"]
    def fmt(v: Any) -> str:
        return f"{v:g}" if isinstance(v, int | float) else str(v)

    out = [[r["constant"], f"{fmt(r['default'])} -> {fmt(r['value'])}", *(f"{r['over_default'][n]:.3f}" for n in names),
            f"{r['median']:.3f}"] for r in doc["rows"]]
    b = doc["best_other_over_default"]
    out.append(["best other policy", "-", *(f"{b[n]:.3f}" for n in names), f"{median(b.values()):.3f}"])
    return out
