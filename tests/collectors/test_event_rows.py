"""Issue 49, typed event records: a row read back is a schema.EventRow (its
fields the Parquet columns) and read by name; rows are written as plain tuples
in that order, and an EventRow written is serialized as one."""

import re
from pathlib import Path

import orjson

from collectors import part_writer
from collectors.instrument.collective_events import device_rows, follow_up, stall_row
from collectors.part_writer import _row_part_bytes
from collectors.schema import EVENT_COLUMNS, EventRow, event_row, new_row


def _issued():
    return event_row(
        "p2p",
        "send",
        100,
        150,
        3,
        microbatch=1,
        stage=0,
        group="0->1",
        group_ranks="0,1",
        seq=7,
        peer=1,
        nbytes=4096,
        async_op=True,
        callsite="train.py:12",
        detail="fsdp",
    )


def test_an_event_row_names_the_columns_and_is_built_either_way():
    row = _issued()
    assert EventRow._fields == EVENT_COLUMNS
    assert isinstance(row, EventRow) and (row.seq, row.peer, row.bytes, row.queued_ns) == (7, 1, 4096, -1)
    assert new_row(EventRow, tuple(row)) == EventRow(*row) == row


def test_the_follow_up_rows_keep_the_instance_and_name_their_own_fields():
    """Rows nothing reads back are plain tuples, in EVENT_COLUMNS order."""
    row = _issued()
    wait = EventRow._make(follow_up(row, "wait", 200, 260, "train.py:20", row.detail))
    assert (wait.kind, wait.name, wait.start_ns, wait.end_ns, wait.callsite, wait.detail) == (
        "wait",
        "send",
        200,
        260,
        "train.py:20",
        "fsdp",
    )
    assert (wait.step, wait.microbatch, wait.stage, wait.group, wait.group_ranks, wait.seq, wait.peer) == (
        3,
        1,
        0,
        "0->1",
        "0,1",
        7,
        1,
    )
    assert (wait.bytes, wait.async_op, wait.queued_ns) == (0, True, -1)
    arrival, done = map(EventRow._make, device_rows(row, 120, 180, "gpu"))
    assert (arrival.kind, arrival.start_ns, arrival.end_ns, arrival.bytes, arrival.detail) == (
        "p2p",
        120,
        120,
        4096,
        "gpu",
    )
    assert (done.kind, done.start_ns, done.bytes, done.callsite, done.seq) == ("done", 180, 0, "", 7)
    stall = EventRow._make(stall_row(row, 130, 180, "train.py:20"))
    assert (stall.kind, stall.start_ns, stall.end_ns, stall.detail) == ("wait", 130, 180, "gpu:wait")


def test_a_live_part_writes_an_event_row_as_orjson_writes_a_tuple(monkeypatch):
    """orjson takes exact tuples only: without default=tuple a part holding one
    EventRow fell back to the stdlib json, many times slower on the writer thread
    (bench/results/2026-12-06-typed-event-records.md)."""

    def no_fallback(*args, **kwargs):
        raise AssertionError("the stdlib json fallback ran")

    monkeypatch.setattr(part_writer.json, "dumps", no_fallback)
    rows = [_issued(), tuple(_issued())]
    assert _row_part_bytes(EVENT_COLUMNS, rows) == orjson.dumps(
        {"columns": EVENT_COLUMNS, "rows": [tuple(r) for r in rows]}
    )


def test_no_reader_indexes_an_event_row_by_number():
    """Issue 49's acceptance: a field added in the middle would shift such a reader."""
    repo = Path(__file__).resolve().parents[2]
    found = [
        f"{path.relative_to(repo)}:{n}"
        for top in ("collectors", "diagnose")
        for path in sorted((repo / top).rglob("*"))
        if path.suffix in (".py", ".c")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"row\[[0-9]+\]", line)
    ]
    assert found == []
