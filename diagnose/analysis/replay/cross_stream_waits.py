"""Which kernel a kernel on another stream of its rank waited for: the device
graph's cross-stream edges (diagnose/analysis/replay/device_graph.py).

Recorded: a trace's stream waits (Kineto `Stream Wait Event`, as `stream_wait`
rows: diagnose/analysis/tables/stream_waits.py): the last kernel before the
event's record on the recording stream gates the first kernel after the wait
on the waiting stream. Inferred: a kernel that started later than its stream,
launch and recorded waits explain, within INFER_TOLERANCE_NS after a kernel of
another stream of its rank ended, waited for that kernel (NCCL's stream waits
on the compute stream, the compute on the p2p stream's receive, through events
a trace without sync records does not show).
"""

import numpy as np
import pandas as pd

# a kernel gated by another stream starts a few microseconds after the kernel it
# waits for ends (the event's signal and the scheduler): within this, the end
# that freed it is taken as its dependency. Above the launch latency of current
# GPUs (~2-10 us), far below a kernel's typical gap to an unrelated end
INFER_TOLERANCE_NS = 20_000
_NONE = (np.empty(0, np.int64), np.empty(0, np.int64))


def recorded_waits(events: pd.DataFrame, rank, stream, corr, start, end) -> tuple[np.ndarray, np.ndarray]:
    """(src kernel, dst kernel) of the trace's stream waits; kernels by their arrays."""
    if "stream_wait" not in set(events["kind"].unique()):
        return _NONE
    from diagnose.analysis.tables.stream_waits import stream_waits, waited_kernels

    kernels = pd.DataFrame({"rank": rank, "stream": stream, "correlation": corr, "_kernel": np.arange(len(rank))})
    edges = waited_kernels(kernels, stream_waits(events))
    # one launch can run several kernels on a stream (a CUDA graph, a memset
    # before its kernel): a recorded event follows the launch's last kernel,
    # a wait gates its first
    key = ["rank", "stream", "correlation"]
    last = kernels.assign(_t=end).sort_values("_t", kind="stable").drop_duplicates(key, keep="last")
    first = kernels.assign(_t=start).sort_values("_t", kind="stable").drop_duplicates(key, keep="first")
    s = last.set_index(key)["_kernel"].reindex(
        pd.MultiIndex.from_arrays([edges["rank"], edges["src_stream"], edges["src_corr"]])
    )
    d = first.set_index(key)["_kernel"].reindex(
        pd.MultiIndex.from_arrays([edges["rank"], edges["dst_stream"], edges["dst_corr"]])
    )
    ok = s.notna().to_numpy() & d.notna().to_numpy()
    return s.to_numpy()[ok].astype(np.int64), d.to_numpy()[ok].astype(np.int64)


def inferred_waits(rank, stream, start, end, explained) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst): a kernel that started > INFER_TOLERANCE_NS after what explains it
    (`explained`, per kernel), within INFER_TOLERANCE_NS of another stream's kernel
    end on its rank, waited for it."""
    late = np.flatnonzero(start - explained > INFER_TOLERANCE_NS)
    if not len(late):
        return _NONE
    src, dst = [], []
    for (r, st), rows in pd.DataFrame({"rank": rank[late], "stream": stream[late], "k": late}).groupby(
        ["rank", "stream"]
    ):
        others = np.flatnonzero((rank == r) & (stream != st))
        if not len(others):
            continue
        others = others[np.argsort(end[others], kind="stable")]
        ends = end[others]
        k = rows["k"].to_numpy()
        i = np.searchsorted(ends, start[k], side="right") - 1
        hit = (i >= 0) & (start[k] - ends[np.maximum(i, 0)] <= INFER_TOLERANCE_NS)
        src.append(others[i[hit]])
        dst.append(k[hit])
    if not src:
        return _NONE
    return np.concatenate(src), np.concatenate(dst)
