"""Availability traces: real spot/preemptible logs and a synthetic spot process → one ``AvailabilityTrace``.

Every loader turns its file into node-level rows (time, add/remove, node id, file line), then one builder maps
nodes onto slots and emits ``AvailabilityEvent``s (see docs/inputs.md for the formats and every rule):

- each trace node becomes ``gpus_per_node`` slots of GPU kind ``gpu``, tp=1, ids ``f"{node}/g{i}"``,
  source ``PREEMPTIBLE``;
- ``max_gpus`` caps the GPUs live at once: a node whose GPUs do not fit when it arrives waits in a FIFO queue
  (it is "live in the trace but unmapped"); when a mapped node leaves, waiting nodes are mapped in arrival order
  while they fit, and ARRIVE at that instant. A waiting node that leaves is dropped without any event;
- a departure at time T becomes NOTICE at ``max(T - notice_s, time the node was mapped)`` with deadline T, then
  LEAVE at T. ``notice_s == 0``: LEAVE only (no notice, KV lost). A slot is usable until its LEAVE;
- rows at the same instant are applied in file order, then the mapping is updated once (departures, then
  waiting nodes): a node added and removed at one instant is never mapped; adjacent events with the same time,
  kind and deadline are merged into one event.

Out-of-order rows are sorted (stable, by time) with a warning naming the lines; malformed rows raise
``TraceError`` naming file:line. Times in the returned trace are seconds from the trace start.
"""

from __future__ import annotations

import bisect
import csv
import json
import logging
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from rollplan.models.errors import TraceError, UnknownNameError, UserInputError
from rollplan.models.specs import gpu_kind
from rollplan.models.types import AvailabilityEvent, EventKind, Slot, SlotSource

log = logging.getLogger(__name__)

TraceFormat = Literal["auto", "events", "segments", "counts-json", "counts-text"]
TRACE_FORMATS: tuple[str, ...] = ("auto", "events", "segments", "counts-json", "counts-text")


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """Time-ordered availability events of preemptible slots over ``[0, duration_s]``.

    ``events`` are sorted by time (ties keep their causal order: a NOTICE never precedes its node's ARRIVE; a
    LEAVE precedes the ARRIVEs its departure made room for). ``nodes_seen``: distinct trace nodes;
    ``nodes_ignored``: trace nodes never mapped because of ``max_gpus``.
    """

    name: str
    events: tuple[AvailabilityEvent, ...]
    duration_s: float
    gpu: str
    gpus_per_node: int = 1
    max_gpus: int | None = None
    notice_s: float = 30.0
    nodes_seen: int = 0
    nodes_ignored: int = 0

    def events_between(self, t0: float, t1: float) -> tuple[AvailabilityEvent, ...]:
        """Events with ``t0 <= time < t1``."""
        lo = bisect.bisect_left(self.events, t0, key=lambda e: e.time)
        hi = bisect.bisect_left(self.events, t1, key=lambda e: e.time)
        return self.events[lo:hi]

    def live_slot_ids(self, t: float) -> tuple[str, ...]:
        """Slots usable at time ``t`` (after applying every event with ``time <= t``), in arrival order.

        A slot under notice is still live until its LEAVE.
        """
        live: dict[str, None] = {}
        for ev in self.events:
            if ev.time > t:
                break
            if ev.kind is EventKind.ARRIVE:
                live.update(dict.fromkeys(s.id for s in ev.slots))
            elif ev.kind is EventKind.LEAVE:
                for sid in ev.slot_ids:
                    live.pop(sid, None)
        return tuple(live)

    def gpus_at(self, t: float) -> int:
        """Number of live GPUs at time ``t`` (tp=1 slots: one slot per GPU)."""
        return len(self.live_slot_ids(t))

    def gpu_count_series(self) -> tuple[tuple[float, int], ...]:
        """(time, live GPUs after the events at that time), one point per time the count changes, from t=0."""
        points: list[tuple[float, int]] = [(0.0, 0)]
        n = 0
        for ev in self.events:
            if ev.kind is EventKind.ARRIVE:
                n += len(ev.slots)
            elif ev.kind is EventKind.LEAVE:
                n -= len(ev.slot_ids)
            else:
                continue
            if points[-1][0] == ev.time:
                points[-1] = (ev.time, n)
            else:
                points.append((ev.time, n))
        return tuple(points)

    @property
    def peak_gpus(self) -> int:
        return max(n for _, n in self.gpu_count_series())

    @property
    def mean_gpus(self) -> float:
        """Time-weighted mean of live GPUs over ``[0, duration_s]``."""
        if self.duration_s <= 0:
            return float(self.gpus_at(0.0))
        series = self.gpu_count_series()
        area = 0.0
        for (t, n), (t_next, _) in zip(series, [*series[1:], (self.duration_s, 0)], strict=True):
            area += n * max(0.0, min(t_next, self.duration_s) - t)
        return area / self.duration_s

    def summary(self) -> dict[str, Any]:
        """Plain-data statistics (for reports and the CLI)."""
        counts = {k.value: sum(1 for e in self.events if e.kind is k) for k in EventKind}
        return {
            "name": self.name,
            "duration_s": self.duration_s,
            "gpu": self.gpu,
            "gpus_per_node": self.gpus_per_node,
            "max_gpus": self.max_gpus,
            "notice_s": self.notice_s,
            "events": len(self.events),
            "events_by_kind": {k: v for k, v in counts.items() if v},
            "peak_gpus": self.peak_gpus,
            "mean_gpus": round(self.mean_gpus, 3),
            "nodes_seen": self.nodes_seen,
            "nodes_ignored": self.nodes_ignored,
        }


# --- node-level rows and the one builder -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    t: float  # seconds from trace start
    op: str  # "add" | "remove"
    node: str
    line: int | None  # 1-based file line, None for synthesized rows
    expect_live: int | None = None  # trace-level live count the file states after this row (checked)


def _sort_rows(rows: list[_Row], path: str) -> list[_Row]:
    """Stable sort by time; warn naming the lines that were out of order."""
    late: list[int] = []
    latest = -math.inf
    for r in rows:
        if r.t < latest:
            late.append(r.line if r.line is not None else -1)
        latest = max(latest, r.t)
    if not late:
        return rows
    shown = ", ".join(str(x) for x in sorted(set(late))[:20]) + (" ..." if len(set(late)) > 20 else "")
    log.warning("%s: %d row(s) out of time order (lines %s); sorted them by time", path, len(late), shown)
    return sorted(rows, key=lambda r: r.t)


def _build_trace(
    rows: list[_Row],
    *,
    path: str,
    name: str,
    duration_s: float | None,
    gpu: str,
    gpus_per_node: int,
    max_gpus: int | None,
    notice_s: float,
) -> AvailabilityTrace:
    kind = gpu_kind(gpu)
    _check_mapping_args(gpus_per_node, max_gpus, notice_s)
    rows = _sort_rows(rows, path)

    emitted: list[tuple[float, int, AvailabilityEvent]] = []
    seq = 0

    def emit(ev: AvailabilityEvent) -> None:
        nonlocal seq
        emitted.append((ev.time, seq, ev))
        seq += 1

    live: dict[str, int | None] = {}  # trace node -> line it was added on (live in the trace)
    mapped: dict[str, float] = {}  # mapped node -> time it was mapped
    waiting: dict[str, None] = {}  # live but unmapped nodes, FIFO by arrival (dicts keep insertion order)
    ever_mapped: set[str] = set()
    seen: set[str] = set()
    cap = max_gpus if max_gpus is not None else math.inf
    ids_of: dict[str, tuple[str, ...]] = {}  # node -> its slot ids (cache)

    def slot_ids(node: str) -> tuple[str, ...]:
        if node not in ids_of:
            ids_of[node] = tuple(f"{node}/g{i}" for i in range(gpus_per_node))
        return ids_of[node]

    def apply_row(r: _Row) -> None:
        """Validate one row against the trace-level live set (file order within an instant)."""
        if r.op == "add":
            if r.node in live:
                raise TraceError(
                    path, r.line, f"node {r.node!r} is added again while live (added on line {live[r.node]})",
                    fix="remove the duplicate add row, or remove the node before adding it again",
                )
            live[r.node] = r.line
            seen.add(r.node)
            waiting[r.node] = None
        elif r.op == "remove":
            if r.node not in live:
                raise TraceError(
                    path, r.line, f"remove of node {r.node!r}, which is not live at t={r.t:g}s",
                    fix="add the node before removing it (check the node id and the row order)",
                )
            del live[r.node]
            waiting.pop(r.node, None)
        if r.expect_live is not None and r.expect_live != len(live):
            raise TraceError(
                path, r.line,
                f"the row says {r.expect_live} nodes are live after it, the add/remove rows give {len(live)}",
                fix="make available_after match the running count of added minus removed nodes",
            )

    # The mapping is updated once per instant, after all its rows: departures first (they free room), then
    # waiting nodes (older first, then this instant's arrivals in file order) while they fit under the cap.
    # So a node added and removed at the same instant is never mapped, and no slot flaps at one instant.
    i = 0
    while i < len(rows):
        t = rows[i].t
        while i < len(rows) and rows[i].t == t:
            apply_row(rows[i])
            i += 1
        for node in [n for n in mapped if n not in live]:
            t_mapped = mapped.pop(node)
            ids = slot_ids(node)
            if notice_s > 0:
                emit(AvailabilityEvent(time=max(t - notice_s, t_mapped), kind=EventKind.NOTICE,
                                       slot_ids=ids, deadline=t))
            emit(AvailabilityEvent(time=t, kind=EventKind.LEAVE, slot_ids=ids))
        arriving: list[Slot] = []
        while waiting and (len(mapped) + 1) * gpus_per_node <= cap:
            node = next(iter(waiting))
            del waiting[node]
            mapped[node] = t
            ever_mapped.add(node)
            arriving.extend(
                Slot(id=sid, gpu=kind.name, node=node, tp=1, source=SlotSource.PREEMPTIBLE) for sid in slot_ids(node)
            )
        if arriving:
            emit(AvailabilityEvent(time=t, kind=EventKind.ARRIVE, slot_ids=tuple(s.id for s in arriving),
                                   slots=tuple(arriving)))

    emitted.sort(key=lambda x: (x[0], x[1]))
    events = _merge([e for _, _, e in emitted])
    end = max(rows[-1].t if rows else 0.0, events[-1].time if events else 0.0)
    return AvailabilityTrace(
        name=name,
        events=events,
        duration_s=float(max(duration_s if duration_s is not None else end, end)),
        gpu=kind.name,
        gpus_per_node=gpus_per_node,
        max_gpus=max_gpus,
        notice_s=notice_s,
        nodes_seen=len(seen),
        nodes_ignored=len(seen - ever_mapped),
    )


def _merge(events: Sequence[AvailabilityEvent]) -> tuple[AvailabilityEvent, ...]:
    """Merge adjacent events with the same time, kind and deadline (one re-plan per instant, not per node)."""
    out: list[AvailabilityEvent] = []
    for ev in events:
        prev = out[-1] if out else None
        if prev is not None and (prev.time, prev.kind, prev.deadline) == (ev.time, ev.kind, ev.deadline):
            out[-1] = AvailabilityEvent(
                time=ev.time, kind=ev.kind, slot_ids=prev.slot_ids + ev.slot_ids,
                slots=prev.slots + ev.slots, deadline=ev.deadline,
            )
        else:
            out.append(ev)
    return tuple(out)


def _check_mapping_args(gpus_per_node: int, max_gpus: int | None, notice_s: float) -> None:
    if gpus_per_node < 1:
        raise UserInputError(f"gpus_per_node must be >= 1, got {gpus_per_node}", fix="use 1 or more GPUs per node")
    if max_gpus is not None and max_gpus < gpus_per_node:
        raise UserInputError(
            f"max_gpus={max_gpus} is below gpus_per_node={gpus_per_node}: no node would ever be mapped",
            fix="raise max_gpus to at least gpus_per_node, or pass None for no cap",
        )
    if not (notice_s >= 0 and math.isfinite(notice_s)):
        raise UserInputError(f"notice_s must be a finite number >= 0, got {notice_s}", fix="use e.g. 30 (seconds)")


# --- loaders ------------------------------------------------------------------------------------------------


def load_trace(
    path: str | Path,
    format: TraceFormat = "auto",
    segment: str | None = None,
    gpu: str = "h800",
    gpus_per_node: int = 1,
    max_gpus: int | None = None,
    notice_s: float = 30.0,
) -> AvailabilityTrace:
    """Load an availability trace file (see docs/inputs.md for the formats) and map it onto slots.

    ``format="auto"`` picks by content: ``.json`` → counts-json; a ``segment,...`` header → segments;
    ``t,add|remove,node`` rows → events; ``date, time, count`` rows → counts-text. ``segment`` selects one
    segment of a segments file (required when it has several). Raises ``TraceError`` (file:line) on malformed
    input, ``UnknownNameError`` for an unknown segment or GPU kind.
    """
    p = Path(path)
    src = str(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(src, None, "file not found", fix="check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(src, None, f"cannot read the file ({err})", fix="pass a readable UTF-8 text file") from None
    fmt = _detect_format(src, p, text) if format == "auto" else format
    mapping = {"gpu": gpu, "gpus_per_node": gpus_per_node, "max_gpus": max_gpus, "notice_s": notice_s}
    if fmt == "events":
        rows, duration = _parse_events(src, text)
        name = p.stem
    elif fmt == "segments":
        rows, duration, seg = _parse_segments(src, text, segment)
        name = f"{p.stem}:{seg}"
    elif fmt == "counts-json":
        rows, duration = _parse_counts_json(src, text)
        name = p.stem
    elif fmt == "counts-text":
        rows, duration = _parse_counts_text(src, text)
        name = p.stem
    else:
        raise UnknownNameError("trace format", str(fmt), TRACE_FORMATS)
    if segment is not None and fmt != "segments":
        raise UserInputError(f"segment={segment!r} given, but {src} is a {fmt} trace", fix="drop the segment option")
    return _build_trace(rows, path=src, name=name, duration_s=duration, **mapping)


def _data_lines(text: str) -> Iterable[tuple[int, str]]:
    """(1-based line number, stripped line) for non-blank lines that are not ``#`` comments."""
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield i, line


def _detect_format(src: str, p: Path, text: str) -> str:
    if p.suffix.lower() == ".json":
        return "counts-json"
    first = next(iter(_data_lines(text)), None)
    if first is None:
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty trace file")
    lineno, line = first
    if line.startswith("{"):
        return "counts-json"
    fields = [f.strip() for f in line.split(",")]
    if fields[0].lower() == "segment":
        return "segments"
    if len(fields) == 3 and fields[1].lower() in ("add", "remove", "event"):
        return "events"
    if len(fields) == 3 and (_parse_datetime(fields[0], fields[1]) is not None or fields[0].lower() == "date"):
        return "counts-text"
    raise TraceError(
        src, lineno, f"cannot tell the trace format from {line[:60]!r}",
        fix="pass format= one of events, segments, counts-json, counts-text (CLI: --trace-format)",
    )


def _parse_time(src: str, lineno: int, value: str, what: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise TraceError(src, lineno, f"{what} {value!r} is not a number", fix=f"write {what} as a number") from None
    if not math.isfinite(t):
        raise TraceError(src, lineno, f"{what} {value!r} is not finite", fix=f"write {what} as a finite number")
    if t < 0:
        raise TraceError(src, lineno, f"negative time {what}={value}", fix="use times >= 0 from the trace start")
    return t


def _parse_events(src: str, text: str) -> tuple[list[_Row], None]:
    rows: list[_Row] = []
    for lineno, line in _data_lines(text):
        fields = [f.strip() for f in line.split(",")]
        if not rows and [f.lower() for f in fields] == ["t_ms", "event", "node"]:
            continue  # an optional header
        if len(fields) != 3:
            raise TraceError(
                src, lineno, f"expected 3 fields t_ms,event,node, got {len(fields)}: {line[:60]!r}",
                fix="write each row as t_ms,add|remove,node_id",
            )
        t_ms, op, node = fields
        t = _parse_time(src, lineno, t_ms, "t_ms") / 1000.0
        op = op.lower()
        if op not in ("add", "remove"):
            raise TraceError(src, lineno, f"unknown event {fields[1]!r}", fix="use add or remove")
        if not node:
            raise TraceError(src, lineno, "empty node id", fix="name the node in the third field")
        rows.append(_Row(t, op, node, lineno))
    if not rows:
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty trace file")
    return rows, None


_SEGMENT_COLUMNS = ("segment", "t_ms", "event", "n_nodes", "nodes")


def _parse_segments(src: str, text: str, segment: str | None) -> tuple[list[_Row], float | None, str]:
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty trace file")
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in _SEGMENT_COLUMNS if c not in header]
    if missing:
        raise TraceError(src, 1, f"header lacks column(s) {', '.join(missing)}",
                         fix="start the file with: segment,t_ms,event,n_nodes,nodes,available_after,interval_ms")
    by_segment: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for rec in reader:
        lineno = reader.line_num
        row = {k.strip(): (v or "").strip() for k, v in rec.items() if k is not None}
        if None in rec:
            raise TraceError(src, lineno, "more fields than header columns", fix="quote or remove the extra fields")
        if any(v is None for v in rec.values()):
            raise TraceError(src, lineno, f"fewer fields than the {len(header)} header columns",
                             fix="write every column, empty ones as nothing between two commas")
        if not any(row.values()):
            continue
        by_segment.setdefault(row["segment"], []).append((lineno, row))
    if not by_segment:
        raise TraceError(src, None, "the file has a header but no rows", fix="add segment rows")
    if segment is None:
        if len(by_segment) > 1:
            raise TraceError(
                src, None, f"the file has {len(by_segment)} segments ({', '.join(by_segment)}); choose one",
                fix="pass segment=NAME (CLI: --segment NAME)",
            )
        segment = next(iter(by_segment))
    if segment not in by_segment:
        raise UnknownNameError(f"segment of {src}", segment, list(by_segment))
    rows: list[_Row] = []
    end: float | None = None
    for lineno, row in by_segment[segment]:
        t = _parse_time(src, lineno, row["t_ms"], "t_ms") / 1000.0
        interval = row.get("interval_ms", "")
        if interval:
            t_end = t + _parse_time(src, lineno, interval, "interval_ms") / 1000.0
            end = t_end if end is None else max(end, t_end)
        op = row["event"].lower()
        nodes = [n.strip() for n in row["nodes"].split(";") if n.strip()]
        try:
            n_nodes = int(row["n_nodes"] or 0)
        except ValueError:
            raise TraceError(src, lineno, f"n_nodes {row['n_nodes']!r} is not an integer", fix="write a node count") from None
        if n_nodes != len(nodes):
            raise TraceError(src, lineno, f"n_nodes={n_nodes} but {len(nodes)} node id(s) listed",
                             fix="make n_nodes equal the number of ;-separated ids in nodes")
        after = row.get("available_after", "")
        expect: int | None = None
        if after:
            try:
                expect = int(after)
            except ValueError:
                raise TraceError(src, lineno, f"available_after {after!r} is not an integer",
                                 fix="write the live node count") from None
        if op in ("no-op", "migration"):
            # Parcae's own scheduling ticks: no availability change. Still check the running count.
            if expect is not None:
                rows.append(_Row(t, "check", "", lineno, expect))
            continue
        if op not in ("add", "remove"):
            raise TraceError(src, lineno, f"unknown event {row['event']!r}", fix="use add, remove, no-op or migration")
        if not nodes:
            raise TraceError(src, lineno, f"{op} row lists no nodes", fix="list the node ids, ;-separated")
        for k, node in enumerate(nodes):
            rows.append(_Row(t, op, node, lineno, expect if k == len(nodes) - 1 else None))
    return rows, end, segment


def _parse_counts_json(src: str, text: str) -> tuple[list[_Row], float]:
    if not text.strip():
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty trace file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(src, err.lineno, f"not valid JSON ({err.msg})", fix="fix the JSON syntax") from None
    fix = 'write {"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}'
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise TraceError(src, None, "expected an object with a list 'data'", fix=fix)
    meta = doc.get("metadata")
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap <= 0:
        raise TraceError(src, None, f"metadata.gap_seconds must be a number > 0, got {gap!r}", fix=fix)
    counts: list[tuple[float, int, int | None]] = []
    for i, n in enumerate(doc["data"]):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TraceError(src, None, f"data[{i}] = {n!r} is not a node count (integer >= 0)", fix=fix)
        counts.append((i * float(gap), n, None))
    if not counts:
        raise TraceError(src, None, "'data' is empty", fix=fix)
    return _rows_from_counts(counts), len(counts) * float(gap)


def _parse_datetime(date: str, time: str) -> datetime | None:
    try:
        return datetime.fromisoformat(f"{date.strip().replace('/', '-')} {time.strip()}")
    except ValueError:
        return None


def _parse_counts_text(src: str, text: str) -> tuple[list[_Row], float]:
    stamped: list[tuple[datetime, int, int]] = []
    for lineno, line in _data_lines(text):
        fields = [f.strip() for f in line.split(",")]
        if not stamped and fields and fields[0].lower() == "date":
            continue  # an optional header
        fix = "write each line as: YYYY-MM-DD, HH:MM:SS, count"
        if len(fields) != 3:
            raise TraceError(src, lineno, f"expected 3 fields date, time, count, got {len(fields)}", fix=fix)
        when = _parse_datetime(fields[0], fields[1])
        if when is None:
            raise TraceError(src, lineno, f"bad date/time {fields[0]!r}, {fields[1]!r}", fix=fix)
        try:
            n = int(fields[2])
        except ValueError:
            raise TraceError(src, lineno, f"count {fields[2]!r} is not an integer", fix=fix) from None
        if n < 0:
            raise TraceError(src, lineno, f"negative count {n}", fix="use node counts >= 0")
        stamped.append((when, n, lineno))
    if not stamped:
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty trace file")
    t0 = min(w for w, _, _ in stamped)
    timed = [((w - t0).total_seconds(), n, line) for w, n, line in stamped]
    late: list[int] = []
    latest = -math.inf
    for t, _, line in timed:
        if t < latest:
            late.append(line)
        latest = max(latest, t)
    if late:
        log.warning("%s: %d line(s) out of time order (lines %s); sorted them by time",
                    src, len(late), ", ".join(map(str, late[:20])))
        timed.sort(key=lambda x: x[0])
    gaps = sorted(b[0] - a[0] for a, b in pairwise(timed) if b[0] > a[0])
    step = gaps[len(gaps) // 2] if gaps else 0.0
    return _rows_from_counts(timed), timed[-1][0] + step


def _rows_from_counts(counts: Sequence[tuple[float, int, int | None]]) -> list[_Row]:
    """Synthesize node ids for a count series: growth adds new nodes ``n0, n1, ...``; a drop removes the newest."""
    rows: list[_Row] = []
    live: list[str] = []
    next_id = 0
    for t, n, line in counts:
        while len(live) < n:
            node = f"n{next_id}"
            next_id += 1
            live.append(node)
            rows.append(_Row(t, "add", node, line))
        while len(live) > n:
            rows.append(_Row(t, "remove", live.pop(), line))
    return rows


# --- synthetic spot process ---------------------------------------------------------------------------------


def synthetic_spot_trace(
    duration_s: float,
    max_gpus: int,
    seed: int,
    *,
    gpu: str = "h800",
    gpus_per_node: int = 1,
    initial_gpus: int | None = None,
    mean_alloc_gap_s: float = 300.0,
    mean_preempt_gap_s: float = 300.0,
    mean_burst: float = 2.0,
    notice_s: float = 30.0,
) -> AvailabilityTrace:
    """A seeded spot-instance process shaped like the Bamboo/Parcae traces.

    Allocations and preemptions are two Poisson processes (mean gaps ``mean_alloc_gap_s`` /
    ``mean_preempt_gap_s``); each event moves a geometric burst of nodes (mean ``mean_burst``), as the real
    traces add and preempt several instances at once. A preemption hits random live nodes. At most
    ``max_gpus // gpus_per_node`` nodes are live (allocations beyond that are not granted);
    ``initial_gpus`` (default half of ``max_gpus``) are live at t=0. Same arguments → the same trace.
    """
    if duration_s <= 0 or not math.isfinite(duration_s):
        raise UserInputError(f"duration_s must be > 0, got {duration_s}", fix="pass a positive duration")
    _check_mapping_args(gpus_per_node, max_gpus, notice_s)
    rng = random.Random(seed)
    max_nodes = max_gpus // gpus_per_node
    start = max_nodes // 2 if initial_gpus is None else min(max_nodes, initial_gpus // gpus_per_node)
    p_more = 1.0 - 1.0 / max(mean_burst, 1.0)

    def burst() -> int:
        k = 1
        while rng.random() < p_more:
            k += 1
        return k

    rows: list[_Row] = []
    live: list[str] = []
    next_id = 0

    def add(t: float, k: int) -> None:
        nonlocal next_id
        for _ in range(min(k, max_nodes - len(live))):
            node = f"spot{next_id}"
            next_id += 1
            live.append(node)
            rows.append(_Row(t, "add", node, None))

    add(0.0, start)
    t_alloc = rng.expovariate(1.0 / mean_alloc_gap_s)
    t_pre = rng.expovariate(1.0 / mean_preempt_gap_s)
    while min(t_alloc, t_pre) < duration_s:
        if t_alloc <= t_pre:
            add(round(t_alloc, 3), burst())
            t_alloc += rng.expovariate(1.0 / mean_alloc_gap_s)
        else:
            for _ in range(min(burst(), len(live))):
                node = live.pop(rng.randrange(len(live)))
                rows.append(_Row(round(t_pre, 3), "remove", node, None))
            t_pre += rng.expovariate(1.0 / mean_preempt_gap_s)
    return _build_trace(
        rows, path="<synthetic>", name=f"synthetic-spot(seed={seed})", duration_s=duration_s, gpu=gpu,
        gpus_per_node=gpus_per_node, max_gpus=max_gpus, notice_s=notice_s,
    )
