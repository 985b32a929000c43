"""Metrics of one policy's replay: a mutable ``Recorder`` filled by the simulator and the policy, and
``summarize`` that turns it into plain data for the report.

Definitions (also in docs/simulator.md):

- throughput: decode tokens generated over the whole replay / replay seconds (training steps included);
  trajectories/h: trajectories completed / replay hours.
- batch rollout time: from a batch's start to its last trajectory's completion.
- tail share of a batch: (rollout end - time its ceil(90%)-th trajectory completed) / rollout time: the share
  of rollout time spent on the last 10% of trajectories. Reported per batch and as the mean over batches.
- common tail share (``common_tail_shares``): the mean tail share over the batches that *every* compared
  policy completed. Policies compared by their own means are judged on different batches: a faster policy
  reaches later batches, whose longest trajectories (tool-bound paths of up to ~1,000 s) may give them a long
  tail whatever the schedule, while a slow one is judged on early batches only. Comparisons of tail shares
  between policies use this paired figure.
- GPU-seconds by category: per present slot, time x tp in its role (mixed/prefill/decode), OFF (present but
  unused) or switching (cold start, wake, weight sync, role switch: the slot serves nothing).
- re-plans: count, wall-clock latency of the policy's decision (the only wall-clock figure: excluded from
  ``deterministic_view``), and the gap the planner reports for each plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchRecord:
    index: int
    start: float
    size: int
    done: float | None = None
    completions: list[float] = field(default_factory=list)  # seconds from batch start, in completion order
    # The admission regime at each plan the rollplan policy adopted during the batch: (bound by its bulk,
    # predicted-critical trajectories then). Empty for the baselines (they have no regime).
    regimes: list[tuple[bool, int]] = field(default_factory=list)


@dataclass
class Recorder:
    """Everything measured during one replay (mutable, owned by one simulator)."""

    policy: str
    end_time: float = 0.0
    events: int = 0
    decode_tokens: float = 0.0
    prefill_tokens: float = 0.0
    completed: int = 0
    completed_decode_tokens: int = 0
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    switching_gpu_seconds: float = 0.0
    migration_gpu_seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    batches: list[BatchRecord] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    token_starts: list[float] = field(default_factory=list)
    token_counts: list[float] = field(default_factory=list)
    role_times: list[float] = field(default_factory=list)
    role_counts: list[dict[str, int]] = field(default_factory=list)
    replan_latency: list[float] = field(default_factory=list)
    replan_gap: list[float] = field(default_factory=list)
    replan_status: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    track_rates: bool = False
    spans: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)

    # -- hooks (hot path: keep them trivial) ------------------------------------------------------------------
    def tokens(self, t: float, n: float, t0: float | None = None) -> None:
        """``n`` decode tokens generated evenly over [t0, t] (a segment's decode; t0 None: at t)."""
        self.decode_tokens += n
        self.token_times.append(t)
        self.token_starts.append(t if t0 is None else t0)
        self.token_counts.append(n)

    def prefill(self, t: float, n: float) -> None:
        self.prefill_tokens += n

    def span(self, kind: str, t0: float, t1: float, amount: float) -> None:
        """``amount`` of ``kind`` ("decode" / "prefill" tokens) done evenly over [t0, t1] (rate measurements
        that segments' bulk accounting would otherwise distort). Kept only when ``track_rates``."""
        if self.track_rates and amount > 0:
            self.spans.setdefault(kind, []).append((t0, max(t1, t0), amount))

    def rate(self, kind: str, a: float, b: float) -> float:
        """Measured ``kind`` per second over [a, b] from the spans (older spans are dropped)."""
        if b <= a:
            return 0.0
        spans = self.spans.get(kind, [])
        keep = []
        total = 0.0
        for t0, t1, x in spans:
            if t1 >= a:
                keep.append((t0, t1, x))
            if t1 < a or t0 > b:
                continue
            if t1 <= t0:
                total += x
            else:
                total += x * (min(b, t1) - max(a, t0)) / (t1 - t0)
        self.spans[kind] = keep
        return total / (b - a)

    def traj_done(self, batch: int, t_rel: float, t_abs: float, decode_tokens: int) -> None:
        self.completed += 1
        self.completed_decode_tokens += decode_tokens
        if self.batches and self.batches[-1].index == batch:
            self.batches[-1].completions.append(t_rel)

    def batch_start(self, index: int, t: float, size: int) -> None:
        self.batches.append(BatchRecord(index, t, size))

    def batch_done(self, index: int, t: float) -> None:
        for b in reversed(self.batches):
            if b.index == index:
                b.done = t
                return

    def regime(self, index: int, bulk: bool, critical: int) -> None:
        """The rollplan policy adopted a plan during batch ``index``: its admission regime (``bulk``: bound by its
        bulk) and how many trajectories were predicted-critical then."""
        for b in reversed(self.batches):
            if b.index == index:
                b.regimes.append((bulk, critical))
                return

    def roles(self, t: float, counts: dict[str, int]) -> None:
        if self.role_times and self.role_times[-1] == t:
            self.role_counts[-1] = dict(counts)
        else:
            self.role_times.append(t)
            self.role_counts.append(dict(counts))

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def gpu_seconds_switch(self, x: float) -> None:
        self.switching_gpu_seconds += x

    def gpu_seconds_migrate(self, x: float) -> None:
        self.migration_gpu_seconds += x

    def replan(self, latency_s: float, gap: float | None = None, status: str | None = None) -> None:
        self.replan_latency.append(latency_s)
        if gap is not None and math.isfinite(gap):
            self.replan_gap.append(gap)
        if status:
            self.replan_status[status] = self.replan_status.get(status, 0) + 1


def tail_share(completions: list[float], rollout_s: float) -> float | None:
    """Share of the rollout spent on the last 10% of trajectories (None when not computable)."""
    if not completions or rollout_s <= 0:
        return None
    c = sorted(completions)
    k = max(1, math.ceil(0.9 * len(c)))
    return max(0.0, (rollout_s - c[k - 1]) / rollout_s)


def common_tail_shares(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Tail shares on the batches every policy in ``summaries`` completed: ``{"batches": [indices],
    "mean": {policy: mean tail share over those batches (None when there are none)}}``."""
    per: dict[str, dict[int, float]] = {
        name: {b["index"]: b["tail_share"] for b in s.get("batches", ())
               if b.get("rollout_s") is not None and b.get("tail_share") is not None}
        for name, s in summaries.items()
    }
    common = sorted(set.intersection(*(set(v) for v in per.values()))) if per else []
    return {
        "batches": common,
        "mean": {name: _r(_mean([v[i] for i in common])) for name, v in per.items()},
    }


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def batch_rows(rec: Recorder) -> list[dict[str, Any]]:
    rows = []
    for b in rec.batches:
        rollout = None if b.done is None else b.done - b.start
        rows.append({
            "index": b.index,
            "start_s": _r(b.start, 3),
            "size": b.size,
            "completed": len(b.completions),
            "rollout_s": _r(rollout, 3),
            "tail_share": _r(tail_share(b.completions, rollout) if rollout is not None else None),
            "regime": regime_row(b.regimes),
        })
    return rows


def regime_row(regimes: list[tuple[bool, int]]) -> dict[str, Any] | None:
    """A batch's admission regimes (``BatchRecord.regimes``) as plain data: the first adopted plan's regime
    ("bulk" or "path": bound by its bulk or by its critical path) and predicted-critical count, and how many of
    the batch's plans found it bound by its bulk; None when no plan set a regime (the baselines)."""
    if not regimes:
        return None
    bulk, critical = regimes[0]
    return {"first": "bulk" if bulk else "path", "critical": critical,
            "bulk_plans": sum(1 for b, _c in regimes if b), "plans": len(regimes)}


def summarize(rec: Recorder, *, bins: int = 60) -> dict[str, Any]:
    """Plain-data summary of ``rec`` (see the module docstring for the definitions)."""
    dur = rec.end_time
    rows = batch_rows(rec)
    done_rows = [r for r in rows if r["rollout_s"] is not None]
    tails = [r["tail_share"] for r in done_rows if r["tail_share"] is not None]
    rollouts = [r["rollout_s"] for r in done_rows]
    gpu = {k: round(v, 1) for k, v in sorted(rec.gpu_seconds.items())}
    present = sum(rec.gpu_seconds.values())
    serving = sum(v for k, v in rec.gpu_seconds.items() if k in ("mixed", "prefill", "decode"))
    return {
        "policy": rec.policy,
        "replay_s": round(dur, 3),
        "batches_completed": len(done_rows),
        "batches_started": len(rows),
        "decode_tokens": round(rec.decode_tokens, 1),
        "prefill_tokens": round(rec.prefill_tokens, 1),
        "trajectories_completed": rec.completed,
        "throughput_tokens_per_s": round(rec.decode_tokens / dur, 3) if dur > 0 else None,
        "trajectories_per_h": round(rec.completed / (dur / 3600.0), 3) if dur > 0 else None,
        "rollout_s": {"mean": _r(_mean(rollouts), 3), "p50": _r(_pct(rollouts, 0.5), 3), "max": _r(max(rollouts, default=None), 3)},
        "tail_share": {"mean": _r(_mean(tails)), "p50": _r(_pct(tails, 0.5)), "max": _r(max(tails, default=None))},
        "gpu_seconds": gpu,
        "gpu_seconds_present": round(present, 1),
        "gpu_seconds_serving": round(serving, 1),
        "switching_gpu_seconds": round(rec.switching_gpu_seconds, 1),
        "migration_gpu_seconds": round(rec.migration_gpu_seconds, 3),
        "counters": dict(sorted(rec.counters.items())),
        "replans": {
            "count": len(rec.replan_latency),
            "latency_s": {"mean": _r(_mean(rec.replan_latency), 5), "p50": _r(_pct(rec.replan_latency, 0.5), 5),
                          "max": _r(max(rec.replan_latency, default=None), 5)},
            "gap": {"mean": _r(_mean(rec.replan_gap)), "p50": _r(_pct(rec.replan_gap, 0.5)),
                    "max": _r(max(rec.replan_gap, default=None)), "n": len(rec.replan_gap)},
            "status": dict(sorted(rec.replan_status.items())),
        },
        "events": rec.events,
        "wall_s": round(rec.wall_seconds, 3),
        "cpu_s": round(rec.cpu_seconds, 3),
        "batches": rows,
        "series": series(rec, bins=bins),
    }


def series(rec: Recorder, *, bins: int = 60) -> dict[str, Any]:
    """Time series for the plots: throughput per bin, GPUs per category at change points (thinned), and the
    trajectory completion times (seconds from their batch start, sorted, thinned to <= 500 points)."""
    dur = rec.end_time
    out: dict[str, Any] = {}
    if dur > 0 and bins > 0:
        width = dur / bins
        acc = [0.0] * bins
        for t0, t, n in zip(rec.token_starts, rec.token_times, rec.token_counts, strict=True):
            a, b = min(bins - 1, int(t0 / width)), min(bins - 1, int(t / width))
            if a == b or t <= t0:
                acc[b] += n
                continue
            rate = n / (t - t0)  # spread the segment's tokens over the bins it spans
            for k in range(a, b + 1):
                lo, hi = max(t0, k * width), min(t, (k + 1) * width)
                if hi > lo:
                    acc[k] += rate * (hi - lo)
        out["throughput"] = {"bin_s": round(width, 3), "tokens_per_s": [round(a / width, 2) for a in acc]}
    cats = sorted({k for c in rec.role_counts for k in c})
    step = max(1, len(rec.role_times) // 2000)
    out["roles"] = {
        "t": [round(t, 3) for t in rec.role_times[::step]],
        **{k: [c.get(k, 0) for c in rec.role_counts[::step]] for k in cats},
    }
    comp = sorted(x for b in rec.batches for x in b.completions)
    cstep = max(1, len(comp) // 500)
    out["completion_s"] = [round(x, 3) for x in comp[::cstep]]
    return out


def deterministic_view(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` without its wall-clock fields (what two runs with the same seed must agree on)."""
    out = {k: v for k, v in summary.items() if k not in ("wall_s", "cpu_s")}
    rp = dict(out.get("replans", {}))
    rp.pop("latency_s", None)
    out["replans"] = rp
    return out
