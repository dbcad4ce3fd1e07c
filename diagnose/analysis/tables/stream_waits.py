"""Recorded waits between the streams of a rank, and the kernels they join.

A "stream_wait" row (docs/run-directory.md) is one cudaStreamWaitEvent an
imported trace recorded: the stream in `group` waits, until the event recorded
on the stream in `peer` completes, before anything enqueued after the wait call
runs. Both sides are placed by correlation ids, which CUPTI hands out in the
order the host calls happen (one counter for every thread of a process): the
wait covers the kernels on the waiting stream whose correlation is above the
wait call's, and it waits for the kernels on the recording stream whose
correlation is below the cudaEventRecord call's.

stream_waits(events): one row per wait, [rank, stream, waits_on_stream,
wait_corr, record_corr, start_ns] (-1: not recorded; a Kineto trace from before
PyTorch 2.2 names the recording stream but not the record's correlation, and an
Nsight export without CUDA-event trace names neither).

waited_kernels(kernels, waits): the edge each wait makes between two kernels,
[rank, src_stream, src_corr, dst_stream, dst_corr]: src the last kernel launched
on the recording stream before the record, dst the first kernel launched on the
waiting stream after the wait call. HTA's critical path
(hta/analyzers/critical_path_analysis.py) makes the same edge from the same
trace, looking for both launches on the calling CPU thread only; by correlation
the launching thread does not matter. A wait whose either side has no kernel in
the trace (nothing recorded before it, nothing waiting after it, a stream
without kernels) makes no edge.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.tables.matching import per_distinct

WAIT_COLUMNS = ["rank", "stream", "waits_on_stream", "wait_corr", "record_corr", "start_ns"]
EDGE_COLUMNS = ["rank", "src_stream", "src_corr", "dst_stream", "dst_corr"]


def stream_waits(events: pd.DataFrame) -> pd.DataFrame:
    rows = events[events["kind"] == "stream_wait"]
    table = pd.DataFrame(
        {
            "rank": rows["rank"].astype("int64"),
            # (the waiting stream, written as kernel rows write theirs: gpu_tables.kernels_table)
            "stream": per_distinct(rows["group"], lambda group: pd.to_numeric(group.astype(str), errors="coerce"))
            .fillna(-1)
            .astype("int64"),
            "waits_on_stream": rows["peer"].astype("int64"),
            "wait_corr": rows["seq"].astype("int64"),
            "record_corr": rows["bytes"].astype("int64"),
            "start_ns": rows["start_ns"].astype("int64"),
        }
    )
    return table.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)[WAIT_COLUMNS]


def waited_kernels(kernels: pd.DataFrame, waits: pd.DataFrame) -> pd.DataFrame:
    """kernels: gpu_tables.kernels_table's (rank, stream, correlation); waits: stream_waits'."""
    known = waits[
        (waits["waits_on_stream"] >= 0)
        & (waits["record_corr"] >= 0)
        & (waits["wait_corr"] >= 0)
        & (waits["stream"] >= 0)
    ]
    launched = kernels.loc[kernels["correlation"] >= 0, ["rank", "stream", "correlation"]].astype("int64")
    launched = launched.sort_values("correlation", kind="stable")
    src = pd.merge_asof(  # the last kernel before the record on the recording stream
        known.rename(columns={"waits_on_stream": "src_stream"}).sort_values("record_corr", kind="stable"),
        launched.rename(columns={"stream": "src_stream", "correlation": "src_corr"}),
        left_on="record_corr",
        right_on="src_corr",
        by=["rank", "src_stream"],
        direction="backward",
        allow_exact_matches=False,
    )
    edges = pd.merge_asof(  # the first kernel after the wait call on the waiting stream
        src.dropna(subset=["src_corr"])
        .rename(columns={"stream": "dst_stream"})
        .sort_values("wait_corr", kind="stable"),
        launched.rename(columns={"stream": "dst_stream", "correlation": "dst_corr"}),
        left_on="wait_corr",
        right_on="dst_corr",
        by=["rank", "dst_stream"],
        direction="forward",
        allow_exact_matches=False,
    ).dropna(subset=["dst_corr"])
    edges = edges[EDGE_COLUMNS].astype(np.int64)
    return edges.sort_values(["rank", "dst_corr", "src_corr"], kind="stable").reset_index(drop=True)
