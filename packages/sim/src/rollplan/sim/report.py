"""Replay report: ``report.json`` (scenario, per-policy metrics, ratios to the baseline) and PNG plots.

Plots (matplotlib, Agg backend, written only by ``write_report``):
- ``roles.png``: GPUs per category (mixed / prefill / decode / switching / off) over time, one panel per policy;
- ``throughput.png``: decode tokens/s over time, one line per policy;
- ``completion_cdf.png``: CDF of trajectory completion times (seconds from their batch start), per policy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rollplan.sim.metrics import common_tail_shares, deterministic_view
from rollplan.sim.replay import ReplayResult

log = logging.getLogger(__name__)

BASELINE = "static-colocated"
REPORT_VERSION = 1
CATEGORY_COLORS = {"mixed": "#4C72B0", "decode": "#55A868", "prefill": "#C44E52", "switching": "#8172B2", "off": "#CCCCCC"}


def ratios(summaries: dict[str, dict[str, Any]], baseline: str = BASELINE) -> dict[str, dict[str, float | None]]:
    """Each policy's throughput (tokens/s, trajectories/h) relative to ``baseline`` (None if absent/zero)."""
    base = summaries.get(baseline)
    out: dict[str, dict[str, float | None]] = {}
    for name, s in summaries.items():
        row: dict[str, float | None] = {}
        for key in ("throughput_tokens_per_s", "trajectories_per_h"):
            b = base.get(key) if base else None
            v = s.get(key)
            row[key] = round(v / b, 4) if (b and v is not None) else None
        out[name] = row
    return out


def build_report(result: ReplayResult, *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report as plain data (what ``report.json`` holds)."""
    summaries = {r.name: r.summary for r in result.runs}
    return {
        "version": REPORT_VERSION,
        "scenario": result.scenario.describe(),
        "baseline": BASELINE,
        "policies": summaries,
        "ratio_to_baseline": ratios(summaries),
        "tail_share_common": common_tail_shares(summaries),
        "wall_s": round(result.wall_s, 3),
        "cpu_s": round(result.cpu_s, 3),
        **(extra or {}),
    }


def deterministic_report(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` without wall-clock fields (two runs with the same seed must produce exactly this)."""
    out = {k: v for k, v in report.items() if k not in ("wall_s", "cpu_s")}
    out["policies"] = {k: deterministic_view(v) for k, v in report["policies"].items()}
    return out


def table_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per policy for the comparison table."""
    rows = []
    common = report.get("tail_share_common", {}).get("mean", {})
    for name, s in report["policies"].items():
        r = report["ratio_to_baseline"].get(name, {})
        rows.append({
            "policy": name,
            "tokens_per_s": s["throughput_tokens_per_s"],
            "ratio": r.get("throughput_tokens_per_s"),
            "traj_per_h": s["trajectories_per_h"],
            "batches": s["batches_completed"],
            "rollout_s": s["rollout_s"]["mean"],
            "tail_share": s["tail_share"]["mean"],
            "tail_share_common": common.get(name),
            "switching_gpu_s": s["switching_gpu_seconds"],
            "replans": s["replans"]["count"],
            "gap": s["replans"]["gap"]["mean"],
            "wall_s": s["wall_s"],
        })
    return rows


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``report.json`` and the plots into ``out_dir`` (created). Returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": str(out / "report.json")}
    (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    paths.update(write_plots(report, out))
    return paths


def write_plots(report: dict[str, Any], out: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = report["policies"]
    names = list(pols)
    paths: dict[str, str] = {}

    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.9 * max(1, len(names))), sharex=True, squeeze=False)
    seen: list[str] = []
    for ax, name in zip(axes[:, 0], names, strict=True):
        roles = pols[name]["series"]["roles"]
        t = roles.get("t", [])
        cats = [c for c in ("decode", "mixed", "prefill", "switching", "off") if c in roles]
        if t and cats:
            ax.stackplot([x / 3600 for x in t], *[roles[c] for c in cats], step="post",
                         colors=[CATEGORY_COLORS[c] for c in cats])
            seen.extend(c for c in cats if c not in seen)
        ax.set_ylabel("GPUs")
        ax.set_title(name, fontsize=9, loc="left")
    order = [c for c in CATEGORY_COLORS if c in seen]
    axes[0, 0].legend([Patch(color=CATEGORY_COLORS[c]) for c in order], order, loc="upper right", fontsize=7,
                      ncol=len(order))
    axes[-1, 0].set_xlabel("time (h)")
    fig.tight_layout()
    fig.savefig(out / "roles.png", dpi=110)
    plt.close(fig)
    paths["roles"] = str(out / "roles.png")

    fig, ax = plt.subplots(figsize=(10, 4))
    for name in names:
        th = pols[name]["series"].get("throughput")
        if not th:
            continue
        w = th["bin_s"]
        ax.plot([(i + 0.5) * w / 3600 for i in range(len(th["tokens_per_s"]))], th["tokens_per_s"], label=name)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("decode tokens/s")
    if ax.get_legend_handles_labels()[0]:  # a replay too short for any bin has nothing to label
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    paths["throughput"] = str(out / "throughput.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    for name in names:
        comp = pols[name]["series"].get("completion_s", [])
        if comp:
            n = len(comp)
            ax.plot(comp, [(i + 1) / n for i in range(n)], label=name)
    ax.set_xlabel("completion time from batch start (s)")
    ax.set_ylabel("share of trajectories")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "completion_cdf.png", dpi=110)
    plt.close(fig)
    paths["completion_cdf"] = str(out / "completion_cdf.png")
    return paths
