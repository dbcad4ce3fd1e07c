"""Issue 46: recorded waits between streams become "stream_wait" rows, and the
kernels they join are found (diagnose/analysis/tables/stream_waits.py).

On HTA's critical-path traces (tests/data/kineto/hta/critical_path: PyTorch
profiler with CUDA sync events, 20 Stream Wait Events each; alexnet's name the
cudaEventRecord they wait for, simple_add's, older, do not), on the 2 x H100
Nsight pair (200 STREAM_WAIT_EVENT rows, no CUDA-event trace: the stream
waited on is not in the export), and on small hand-made cases with a known
record and wait.
"""

import gzip
import json
import shutil
import sqlite3

import pytest

from diagnose.analysis.tables.stream_waits import EDGE_COLUMNS, WAIT_COLUMNS, stream_waits, waited_kernels
from diagnose.importers import kineto, kineto_scan
from diagnose.importers.kineto import import_kineto
from diagnose.importers.kineto_io import parse_trace, read_trace_bytes
from diagnose.importers.nsys import import_nsys
from tests.support.jobs import fixture_path, load_run

CRITICAL_PATH = fixture_path("kineto", "hta", "critical_path")
NSYS = fixture_path("nsys")


def _waits_in(path) -> list:
    """(stream, waits on, wait correlation, record correlation) of every Stream Wait Event in a trace."""
    events = json.loads(read_trace_bytes(str(path)))["traceEvents"]
    return sorted(
        (
            e["args"]["stream"],
            e["args"]["wait_on_stream"],
            e["args"]["correlation"],
            e["args"].get("wait_on_cuda_event_record_corr_id", -1),
        )
        for e in events
        if e.get("cat") == "cuda_sync" and e["name"] == "Stream Wait Event"
    )


def _imported(paths, out, importer=import_kineto):
    run = load_run(importer([str(p) for p in paths], str(out))[0])
    return run, stream_waits(run.events())


@pytest.mark.parametrize("name", ["alexnet", "simple_add"])
def test_every_stream_wait_event_is_one_row_with_its_streams_and_correlations(tmp_path, name):
    (path,) = (CRITICAL_PATH / name).glob("*.json.gz")
    run, waits = _imported([path], tmp_path / name)
    assert list(waits.columns) == WAIT_COLUMNS
    expected = _waits_in(path)
    assert len(expected) == 20
    assert (
        sorted(waits[["stream", "waits_on_stream", "wait_corr", "record_corr"]].itertuples(index=False, name=None))
        == expected
    )
    # not device work: no kernel row; the syncs that block the host stay kernel rows of class "other"
    kernels = run.kernels()
    assert "Stream Wait Event" not in set(kernels["name"])
    syncs = kernels[kernels["name"].isin(["Stream Sync", "Context Sync"])]
    assert syncs["name"].astype(str).value_counts().to_dict() == {"Stream Sync": 16, "Context Sync": 5}
    assert set(syncs["kind"]) == {"other"}
    edges = waited_kernels(kernels, waits)
    assert list(edges.columns) == EDGE_COLUMNS
    if name == "simple_add":  # (a trace that does not say which record each wait is for: no edge)
        assert (waits["record_corr"] == -1).all() and edges.empty


def test_a_resolved_wait_joins_a_kernel_that_ended_before_the_waiting_one_started(tmp_path):
    """alexnet: streams 7 and 20 wait on each other (6 edges); the waits of stream 7
    on streams 21-27, which run no kernel, make none. On the device's own clock
    each source kernel has ended when its target starts."""
    (path,) = (CRITICAL_PATH / "alexnet").glob("*.json.gz")
    run, waits = _imported([path], tmp_path / "alexnet")
    kernels = run.kernels()
    edges = waited_kernels(kernels, waits)
    assert len(edges) == 6
    assert set(zip(edges["src_stream"], edges["dst_stream"])) == {(7, 20), (20, 7)}
    by_corr = kernels.set_index(["stream", "correlation"])
    src_end = by_corr.loc[list(zip(edges["src_stream"], edges["src_corr"])), "end_ns"].to_numpy()
    dst_start = by_corr.loc[list(zip(edges["dst_stream"], edges["dst_corr"])), "start_ns"].to_numpy()
    assert (src_end <= dst_start).all()
    for edge in edges.itertuples():  # and each is the nearest launch on either side
        wait = waits[
            (waits["stream"] == edge.dst_stream)
            & (waits["wait_corr"] < edge.dst_corr)
            & (waits["waits_on_stream"] == edge.src_stream)
        ].iloc[-1]
        on_src = kernels[(kernels["stream"] == edge.src_stream) & (kernels["correlation"] < wait["record_corr"])]
        on_dst = kernels[(kernels["stream"] == edge.dst_stream) & (kernels["correlation"] > wait["wait_corr"])]
        assert edge.src_corr == on_src["correlation"].max() and edge.dst_corr == on_dst["correlation"].min()


def _trace(*events) -> bytes:
    return json.dumps({"traceEvents": list(events), "distributedInfo": {"rank": 0, "world_size": 1}}).encode()


def _call(name, corr, ts):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 1,
        "args": {"correlation": corr},
    }


def _kernel(name, stream, corr, ts, dur=10):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr},
    }


# stream 7 runs A, an event is recorded behind it, stream 20 waits for it and runs
# B; C is launched on 7 after the record, so B does not wait for it
HAND_MADE = _trace(
    _call("cudaLaunchKernel", 1, 100),
    _kernel("A", 7, 1, 105, 50),
    _call("cudaEventRecord", 2, 110),
    _call("cudaStreamWaitEvent", 3, 112),
    {
        "ph": "X",
        "cat": "cuda_sync",
        "name": "Stream Wait Event",
        "pid": 0,
        "tid": 20,
        "ts": 112,
        "dur": 0,
        "args": {
            "cuda_sync_kind": "Stream Wait Event",
            "wait_on_stream": 7,
            "wait_on_cuda_event_record_corr_id": 2,
            "wait_on_cuda_event_id": 1,
            "stream": 20,
            "correlation": 3,
            "device": 0,
            "context": 1,
        },
    },
    _call("cudaLaunchKernel", 4, 114),
    _kernel("B", 20, 4, 156),
    _call("cudaLaunchKernel", 5, 116),
    _kernel("C", 7, 5, 156),
    _call("cudaStreamSynchronize", 6, 120),
    {
        "ph": "X",
        "cat": "cuda_sync",
        "name": "Stream Sync",
        "pid": 0,
        "tid": 7,
        "ts": 120,
        "dur": 50,
        "args": {"cuda_sync_kind": "Stream Sync", "stream": 7, "correlation": 6, "device": 0, "context": 1},
    },
)


def test_a_hand_made_record_and_wait_is_one_row_and_one_edge_in_every_scan(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(HAND_MADE)
    fast, _ = kineto.file_table(str(path))
    assert kineto_scan._kineto_c is None or kineto_scan.native_scan(HAND_MADE, False, kineto._classify)  # the C scan's
    assert fast.equals(kineto.trace_table(parse_trace(HAND_MADE, "trace.json"))[0])  # the dict path
    native = kineto_scan._kineto_c
    try:
        kineto_scan._kineto_c = None  # msgspec's
        assert fast.equals(kineto.file_table(str(path))[0])
    finally:
        kineto_scan._kineto_c = native
    rows = fast.to_pandas()
    wait = rows[rows["kind"] == "stream_wait"]
    assert wait[["name", "group", "peer", "seq", "bytes", "detail"]].values.tolist() == [
        ["Stream Wait Event", "20", 7, 3, 2, "cuda"]
    ]
    assert sorted(rows.loc[rows["kind"] == "kernel", "name"]) == ["A", "B", "C", "Stream Sync"]
    run, waits = _imported([path], tmp_path / "run")
    assert waits[["stream", "waits_on_stream", "wait_corr", "record_corr"]].values.tolist() == [[20, 7, 3, 2]]
    assert waited_kernels(run.kernels(), waits).values.tolist() == [[0, 7, 1, 20, 4]]


def test_nsys_stream_waits_without_cuda_event_trace_name_no_stream_waited_on(tmp_path):
    """The 2 x H100 pair: every STREAM_WAIT_EVENT row is one stream_wait row of its
    process; CUDA_EVENT is empty (recorded without --cuda-event-trace), so what was
    waited on is unknown (-1) and no edge is made."""
    sqlite = tmp_path / "before.sqlite"
    with gzip.open(NSYS / "nsysai_2gpu_h100" / "mfu_2gpu_before.sqlite.gz", "rb") as src, open(sqlite, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with sqlite3.connect(sqlite) as con:
        expected = sorted(
            con.execute(
                "SELECT streamId, correlationId FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE syncType = 2"
            ).fetchall()
        )
        assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_CUDA_EVENT").fetchone() == (0,)
    run, waits = _imported([sqlite], tmp_path / "run", import_nsys)
    assert len(expected) == 200
    assert sorted(waits[["stream", "wait_corr"]].itertuples(index=False, name=None)) == expected
    assert waits.groupby("rank")["stream"].unique().map(sorted).to_dict() == {0: [7, 24, 28, 153], 1: [15, 32, 36, 161]}
    assert (waits["waits_on_stream"] == -1).all() and (waits["record_corr"] == -1).all()
    assert waited_kernels(run.kernels(), waits).empty


def test_nsys_wait_takes_the_last_record_of_its_event_before_the_call(tmp_path):
    """tests/data/nsys/tc_report1.sqlite records event 1 (correlation 130) and
    event 2 (147) on stream 7; it has no stream wait, so three are added: on event 2
    after its record, on event 1, and on event 2 before any record of it."""
    sqlite = tmp_path / "report.sqlite"
    shutil.copyfile(NSYS / "tc_report1.sqlite", sqlite)
    with sqlite3.connect(sqlite) as con:
        assert con.execute(
            "SELECT eventId, correlationId, streamId FROM CUPTI_ACTIVITY_KIND_CUDA_EVENT ORDER BY correlationId"
        ).fetchall() == [(1, 130, 7), (2, 147, 7)]
        pid, context = con.execute("SELECT globalPid, contextId FROM CUPTI_ACTIVITY_KIND_CUDA_EVENT").fetchone()
        start = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, syncType, eventId) VALUES (?, ?, 0, ?, 13, ?, ?, 2, ?)",
            [
                (start + i, start + i + 5, context, corr, pid, event)
                for i, (corr, event) in enumerate([(149, 2), (150, 1), (120, 2)])
            ],
        )
    _, waits = _imported([sqlite], tmp_path / "run", import_nsys)
    assert sorted(waits[["wait_corr", "stream", "waits_on_stream", "record_corr"]].values.tolist()) == [
        [120, 13, -1, -1],
        [149, 13, 7, 147],
        [150, 13, 7, 130],
    ]
