"""Availability trace loaders and the node → slot mapping.

Invariants checked with hypothesis (any valid add/remove sequence, any cap, any notice):
- events are sorted by time;
- live GPUs never exceed ``max_gpus``;
- per slot: ARRIVE, then (if notice > 0) NOTICE with deadline == its LEAVE time and time <= deadline, then LEAVE;
  never a NOTICE/LEAVE for a slot that is not live;
- without a cap, the live GPUs after the last event == live trace nodes x gpus_per_node.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.models.errors import TraceError, UnknownNameError, UserInputError
from rollplan.models.types import EventKind, SlotSource
from rollplan.sim.traces import AvailabilityTrace, load_trace, synthetic_spot_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def kinds(trace: AvailabilityTrace) -> list[tuple[float, str, tuple[str, ...]]]:
    return [(e.time, e.kind.value, e.slot_ids) for e in trace.events]


def check_invariants(trace: AvailabilityTrace) -> None:
    times = [e.time for e in trace.events]
    assert times == sorted(times)
    live: set[str] = set()
    noticed: dict[str, float] = {}
    for e in trace.events:
        if e.kind is EventKind.ARRIVE:
            assert {s.id for s in e.slots} == set(e.slot_ids)
            assert not live & set(e.slot_ids)
            live |= set(e.slot_ids)
        elif e.kind is EventKind.NOTICE:
            assert set(e.slot_ids) <= live
            assert e.deadline is not None and e.time <= e.deadline
            noticed.update(dict.fromkeys(e.slot_ids, e.deadline))
        elif e.kind is EventKind.LEAVE:
            assert set(e.slot_ids) <= live
            for sid in e.slot_ids:
                if trace.notice_s > 0:
                    assert noticed.pop(sid) == e.time
            live -= set(e.slot_ids)
        if trace.max_gpus is not None:
            assert len(live) <= trace.max_gpus


# --- events format ------------------------------------------------------------------------------------------


def test_events_map_nodes_to_slots_with_notice(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "0,add,a\n0,add,b\n60000,remove,a\n90000,add,c\n120000,remove,b\n")
    tr = load_trace(p, gpu="h100", gpus_per_node=2, notice_s=30)
    assert kinds(tr) == [
        (0.0, "arrive", ("a/g0", "a/g1", "b/g0", "b/g1")),
        (30.0, "notice", ("a/g0", "a/g1")),
        (60.0, "leave", ("a/g0", "a/g1")),
        (90.0, "arrive", ("c/g0", "c/g1")),  # same instant: events keep the order they were produced in
        (90.0, "notice", ("b/g0", "b/g1")),
        (120.0, "leave", ("b/g0", "b/g1")),
    ]
    slot = tr.events[0].slots[0]
    assert (slot.gpu, slot.node, slot.tp, slot.source) == ("h100", "a", 1, SlotSource.PREEMPTIBLE)
    assert tr.events[1].deadline == 60.0
    assert tr.duration_s == 120.0
    assert tr.live_slot_ids(100.0) == ("b/g0", "b/g1", "c/g0", "c/g1")
    assert tr.gpus_at(130.0) == 2 and tr.peak_gpus == 4
    assert [e.kind for e in tr.events_between(30.0, 90.0)] == [EventKind.NOTICE, EventKind.LEAVE]
    check_invariants(tr)


def test_notice_zero_gives_leave_only_and_notice_is_clamped_to_arrival(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "0,add,a\n10000,add,b\n20000,remove,b\n")
    assert [k for _, k, _ in kinds(load_trace(p, notice_s=0))] == ["arrive", "arrive", "leave"]
    tr = load_trace(p, notice_s=30)
    notice = next(e for e in tr.events if e.kind is EventKind.NOTICE)
    assert (notice.time, notice.deadline) == (10.0, 20.0)  # b only lived 10 s: notice at its arrival


def test_cap_queues_nodes_until_a_mapped_one_leaves(tmp_path: Path) -> None:
    text = "0,add,a\n0,add,b\n1000,add,c\n2000,add,d\n3000,remove,d\n5000,remove,a\n9000,remove,b\n"
    tr = load_trace(write(tmp_path, "t.csv", text), max_gpus=2, notice_s=1)
    assert kinds(tr) == [
        (0.0, "arrive", ("a/g0", "b/g0")),
        (4.0, "notice", ("a/g0",)),
        (5.0, "leave", ("a/g0",)),
        (5.0, "arrive", ("c/g0",)),  # c waited since 1 s; d left while waiting: never mapped
        (8.0, "notice", ("b/g0",)),
        (9.0, "leave", ("b/g0",)),
    ]
    assert (tr.nodes_seen, tr.nodes_ignored, tr.peak_gpus) == (4, 1, 2)
    check_invariants(tr)


def test_add_and_remove_at_one_instant_is_never_mapped(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, "t.csv", "0,add,a\n5000,remove,a\n5000,add,b\n5000,add,c\n5000,remove,c\n"),
                    max_gpus=1, notice_s=0)
    assert kinds(tr) == [(0.0, "arrive", ("a/g0",)), (5.0, "leave", ("a/g0",)), (5.0, "arrive", ("b/g0",))]


def test_out_of_order_rows_are_sorted_with_a_warning_naming_lines(tmp_path: Path, caplog) -> None:
    p = write(tmp_path, "t.csv", "0,add,a\n5000,add,b\n3000,add,c\n9000,remove,a\n8000,remove,c\n")
    with caplog.at_level(logging.WARNING, logger="rollplan.sim.traces"):
        tr = load_trace(p, notice_s=0)
    assert "out of time order (lines 3, 5)" in caplog.text
    assert [e.time for e in tr.events] == [0.0, 3.0, 5.0, 8.0, 9.0]


def test_header_blank_lines_and_comments_are_skipped(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, "t.csv", "t_ms,event,node\n# a comment\n\n0,add,a\r\n1000,remove,a\r\n"))
    assert tr.gpus_at(0.5) == 1 and tr.gpus_at(1.0) == 0


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("0,add,a\n1000,add\n", 2, "expected 3 fields"),
        ("0,add,a\nx,add,b\n", 2, "is not a number"),
        ("0,add,a\n-5,add,b\n", 2, "negative time"),
        ("0,add,a\n10,boot,b\n", 2, "unknown event 'boot'"),
        ("0,add,a\n10,remove,zz\n", 2, "remove of node 'zz'"),
        ("0,add,a\n10,add,a\n", 2, "added again while live"),
        ("0,add,a\n10,add, \n", 2, "empty node id"),
    ],
)
def test_malformed_event_rows_name_file_and_line(tmp_path: Path, text: str, line: int, problem: str) -> None:
    p = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError, match=problem) as err:
        load_trace(p, format="events")
    assert f"{p}:{line}:" in str(err.value) and "To fix:" in str(err.value)
    assert err.value.values["line"] == line


def test_empty_and_undetectable_files(tmp_path: Path) -> None:
    for fmt in ("auto", "events", "counts-text"):
        with pytest.raises(TraceError, match="empty"):
            load_trace(write(tmp_path, "empty.csv", "\n\n"), format=fmt)
    with pytest.raises(TraceError, match=r"undetectable.txt:1: cannot tell the trace format"):
        load_trace(write(tmp_path, "undetectable.txt", "hello world\n"))
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "missing.csv")


def test_bad_mapping_arguments(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "0,add,a\n")
    with pytest.raises(UserInputError, match="max_gpus=1 is below gpus_per_node=2"):
        load_trace(p, gpus_per_node=2, max_gpus=1)
    with pytest.raises(UnknownNameError, match="GPU kind"):
        load_trace(p, gpu="v100x")
    with pytest.raises(UserInputError, match="notice_s"):
        load_trace(p, notice_s=-1)
    with pytest.raises(UnknownNameError, match="trace format"):
        load_trace(p, format="xml")  # type: ignore[arg-type]


# --- segments -----------------------------------------------------------------------------------------------

SEGMENTS = """segment,t_ms,event,n_nodes,nodes,available_after,interval_ms
s1,0,add,3,n0;n1;n2,3,60000
s1,60000,no-op,0,,3,60000
s1,120000,remove,2,n0;n2,1,60000
s1,180000,migration,0,,1,60000
s1,240000,add,1,n3,2,60000
s2,0,add,1,n0,1,60000
"""


def test_segments_select_one_segment(tmp_path: Path) -> None:
    p = write(tmp_path, "seg.csv", SEGMENTS)
    tr = load_trace(p, segment="s1", notice_s=0)
    assert tr.name == "seg:s1" and tr.duration_s == 300.0
    assert tr.gpu_count_series() == ((0.0, 3), (120.0, 1), (240.0, 2))
    assert load_trace(p, segment="s2").peak_gpus == 1
    with pytest.raises(TraceError, match="2 segments"):
        load_trace(p)
    with pytest.raises(UnknownNameError, match="segment") as err:
        load_trace(p, segment="s9")
    assert str(p) in str(err.value) and "s1, s2" in str(err.value)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("s1,60000,remove,1,n0,3,60000", "the row says 3 nodes are live"),
        ("s1,60000,remove,2,n0,2,60000", "n_nodes=2 but 1 node id"),
        ("s1,60000,explode,0,,3,60000", "unknown event"),
        ("s1,60000,remove,1,n9,2,60000", "remove of node 'n9'"),
        ("s1,60000,remove,1,n0", "fewer fields than the 7 header columns"),
    ],
)
def test_malformed_segment_rows_name_the_line(tmp_path: Path, row: str, problem: str) -> None:
    text = "segment,t_ms,event,n_nodes,nodes,available_after,interval_ms\ns1,0,add,3,n0;n1;n2,3,60000\n" + row + "\n"
    p = write(tmp_path, "seg.csv", text)
    with pytest.raises(TraceError, match=problem) as err:
        load_trace(p)
    assert f"{p}:3:" in str(err.value)


# --- count series -------------------------------------------------------------------------------------------


def test_counts_json_synthesizes_nodes_and_removes_newest(tmp_path: Path) -> None:
    p = write(tmp_path, "c.json", '{"metadata": {"gap_seconds": 60}, "data": [2, 3, 1, 1, 2]}')
    tr = load_trace(p, notice_s=0)
    assert kinds(tr) == [
        (0.0, "arrive", ("n0/g0", "n1/g0")),
        (60.0, "arrive", ("n2/g0",)),
        (120.0, "leave", ("n1/g0", "n2/g0")),  # the newest two (n1, n2) left
        (240.0, "arrive", ("n3/g0",)),
    ]
    assert tr.duration_s == 300.0
    assert tr.mean_gpus == pytest.approx((2 + 3 + 1 + 1 + 2) / 5)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"metadata": {"gap_seconds": 60}, "data": [2, -1]}', r"data\[1\] = -1"),
        ('{"metadata": {"gap_seconds": 0}, "data": [2]}', "gap_seconds must be a number > 0"),
        ('{"data": [2]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 60},\n "data": [2,]}', r"c.json:2: not valid JSON"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "'data' is empty"),
    ],
)
def test_counts_json_errors(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(TraceError, match=problem):
        load_trace(write(tmp_path, "c.json", text))


def test_counts_text_with_header_and_out_of_order_line(tmp_path: Path, caplog) -> None:
    text = "date, time, count\n2024-01-01, 00:00:00, 2\n2024-01-01, 00:02:00, 1\n2024-01-01, 00:01:00, 4\n"
    with caplog.at_level(logging.WARNING):
        tr = load_trace(write(tmp_path, "c.txt", text), notice_s=0)
    assert "lines 4" in caplog.text
    assert tr.gpu_count_series() == ((0.0, 2), (60.0, 4), (120.0, 1))
    assert tr.duration_s == 180.0  # last point + the median gap


def test_counts_text_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"c.txt:2: bad date/time"):
        load_trace(write(tmp_path, "c.txt", "2024-01-01, 00:00:00, 2\n2024-13-01, 00:01:00, 3\n"))
    with pytest.raises(TraceError, match=r"c.txt:2: negative count"):
        load_trace(write(tmp_path, "c.txt", "2024-01-01, 00:00:00, 2\n2024-01-01, 00:01:00, -3\n"))


def test_auto_detects_every_format(tmp_path: Path) -> None:
    assert load_trace(write(tmp_path, "e.csv", "0,add,a\n")).name == "e"
    assert load_trace(write(tmp_path, "s.csv", SEGMENTS), segment="s2").name == "s:s2"
    assert load_trace(write(tmp_path, "c.json", '{"metadata":{"gap_seconds":1},"data":[1]}')).peak_gpus == 1
    assert load_trace(write(tmp_path, "c.txt", "2024/01/01, 10:00, 3\n")).peak_gpus == 3
    with pytest.raises(UserInputError, match="segment='x' given"):
        load_trace(tmp_path / "e.csv", segment="x")


# --- synthetic and property checks --------------------------------------------------------------------------


def test_synthetic_spot_trace_is_seeded_and_capped() -> None:
    a = synthetic_spot_trace(3600, 16, seed=7)
    assert a == synthetic_spot_trace(3600, 16, seed=7)
    assert a != synthetic_spot_trace(3600, 16, seed=8)
    assert a.peak_gpus <= 16 and a.gpus_at(0.0) == 8
    kinds_seen = {e.kind for e in a.events}
    assert {EventKind.ARRIVE, EventKind.NOTICE, EventKind.LEAVE} <= kinds_seen
    check_invariants(a)
    b = synthetic_spot_trace(1800, 16, seed=1, gpus_per_node=8, initial_gpus=16, notice_s=0)
    assert b.gpus_at(0.0) == 16 and all(len(e.slot_ids) % 8 == 0 for e in b.events)
    check_invariants(b)


@st.composite
def node_rows(draw: st.DrawFn) -> list[tuple[int, str, str]]:
    rows: list[tuple[int, str, str]] = []
    live: list[str] = []
    t = 0
    for k in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0, 0, 1000, 30000, 120000]))
        if live and draw(st.booleans()):
            rows.append((t, "remove", live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            live.append(f"n{k}")
            rows.append((t, "add", f"n{k}"))
    return rows


@settings(max_examples=60, deadline=None)
@given(rows=node_rows(), cap=st.one_of(st.none(), st.integers(2, 8)), gpn=st.integers(1, 2),
       notice=st.sampled_from([0.0, 10.0, 60.0]))
def test_mapping_invariants(tmp_path_factory, rows, cap, gpn, notice) -> None:
    p = tmp_path_factory.mktemp("h") / "t.csv"
    p.write_text("".join(f"{t},{op},{n}\n" for t, op, n in rows))
    tr = load_trace(p, gpus_per_node=gpn, max_gpus=cap, notice_s=notice)
    check_invariants(tr)
    if cap is None:
        live = {n for _, op, n in rows if op == "add"} - {n for _, op, n in rows if op == "remove"}
        assert tr.gpus_at(rows[-1][0]) == len(live) * gpn


# --- the real shared traces ----------------------------------------------------------------------------------


def test_real_bamboo_traces(shared_data: Path) -> None:
    p3 = load_trace(shared_data / "bamboo_aws_p3_trace.csv")
    assert p3.peak_gpus == 32 and p3.nodes_seen == 177
    assert p3.duration_s == pytest.approx(11.37 * 3600, rel=0.01)
    check_invariants(p3)
    capped = load_trace(shared_data / "bamboo_aws_p3_trace.csv", max_gpus=16)
    assert capped.peak_gpus == 16 and capped.nodes_ignored > 0
    check_invariants(capped)
    g4 = load_trace(shared_data / "bamboo_aws_g4dn_trace.csv", gpus_per_node=1, max_gpus=16)
    assert g4.peak_gpus == 16
    assert load_trace(shared_data / "bamboo_aws_g4dn_trace.csv").peak_gpus == 24


@pytest.mark.parametrize(("segment", "start"), [("hh_55_65", 32), ("hl_15_25", 27), ("lh_80_90", 18), ("ll_10_11", 19)])
def test_real_parcae_segments(shared_data: Path, segment: str, start: int) -> None:
    tr = load_trace(shared_data / "parcae_aws_p3_32node_1h_segments.csv", segment=segment)
    assert tr.duration_s == 3600.0 and tr.gpus_at(0.0) == start
    check_invariants(tr)
