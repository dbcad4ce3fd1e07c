"""Forward and backward compute inferred from a pipeline rank's own sends and
receives, for ranks that record no forward/backward rows (an import, a job
without our module hooks, a trainer that names its phases otherwise).

What a pipeline rank does between two blocking points of its step is compute:
the host's time inside the step outside every row that blocks it
(collectives, sends, receives, waits, syncs, data loading, the optimizer).
Each such gap is labelled by the pipeline's traffic around it:

    next p2p posted is a    the compute that produced it: forward for an
    send                    activation, backward for a gradient
    else, the last p2p      the compute that consumes it: forward for an
    before it is a receive  activation, backward for a gradient (the first
    completing              stage's backward, which sends nothing back; a
                            receive posted early counts when its data came)
    otherwise               not labelled (idle before a receive, optimizer
                            bookkeeping): left out

Which way is forward, per peer, from the rank's own rows: a micro-batch's
activation goes forward before its gradient can come back, so the direction of
the earlier of its first send to the peer and its first receive from the peer
completing, in most steps. The rows are kind forward/backward with detail
"inferred" (SOURCE); stages and micro-batches then come to them as to recorded
compute rows (diagnose/analysis/tables/pipeline_topology.py), and the per-rank pass
makes them before the step breakdown, so every reader of forward and backward
sees them. Known limits: compute with no blocking point between two passes is
one gap, labelled by what follows (1F1B's first stage runs a backward and the
next forward back to back: both count as that forward; the last stage's forward
and backward of a micro-batch: both count as its backward); host time is what the
host did, so on a CUDA run without kernels it is launch time, not the device's.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

SOURCE = "inferred"
# forward/backward rows an importer made from a GPU trace's kernels: device spans
# of the compute kernels launched from the main thread (forward) or the autograd
# thread (backward) between p2p exchanges (diagnose/importers/kineto_structure.py;
# the run directory's contract, so spelled here too: analysis imports no importer)
DEVICE_SOURCE = "gpu:inferred"
BLOCKING_KINDS = ("collective", "p2p", "wait", "sync", "data", "optimizer", "checkpoint")
COMPUTE_KINDS = ("forward", "backward")
# device rows of a live CUDA run (diagnose/analysis/tables/device_collectives.py) are not the host's
DEVICE_DETAIL_PREFIX = "gpu"


def needs_inference(table: pa.Table) -> bool:
    """A rank's events with sends or receives to a peer and no compute rows."""
    kind = table.column("kind")
    if pc.any(pc.is_in(kind, value_set=pa.array(COMPUTE_KINDS))).as_py():
        return False
    phases = pc.and_(pc.equal(kind, "phase"), pc.is_in(table.column("name"), value_set=pa.array(COMPUTE_KINDS)))
    if pc.any(phases).as_py():
        return False
    return bool(pc.any(pc.and_(pc.equal(kind, "p2p"), pc.greater_equal(table.column("peer"), 0))).as_py())


def with_inferred_rows(table: pa.Table) -> pa.Table:
    """One rank's events (arrow) with its inferred forward/backward rows appended."""
    if not needs_inference(table):
        return table
    rows = inferred_rows(table.to_pandas(use_threads=False))
    if rows.empty:
        return table
    for column in table.column_names:
        if column not in rows:
            rows[column] = -1
    rows = rows[table.column_names]
    fields = [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in table.schema]
    added = pa.Table.from_pandas(rows, schema=pa.schema(fields), preserve_index=False)
    return pa.concat_tables([table, added.cast(table.schema)])


def inferred_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The inferred forward/backward rows of one rank's events (pandas)."""
    host = ~events["detail"].astype(str).str.startswith(DEVICE_DETAIL_PREFIX)
    events = events[host]
    p2p = events[(events["kind"] == "p2p") & (events["peer"] >= 0)]
    steps = events[(events["kind"] == "step") & (events["step"] >= 0)]
    if p2p.empty or steps.empty:
        return pd.DataFrame()
    forward_to = _forward_peers(events, p2p)
    is_send = (p2p["name"].astype(str) == "send").to_numpy()
    peer = p2p["peer"].to_numpy()
    # a send travels forward to a peer downstream; a receive comes forward from one upstream
    fwd = np.array([(p in forward_to) if s else (p not in forward_to) for s, p in zip(is_send, peer)], bool)
    order = np.argsort(p2p["start_ns"].to_numpy(np.int64), kind="stable")
    p2p_start = p2p["start_ns"].to_numpy(np.int64)[order]
    # what came before a gap: a send when it was posted, a receive when it completed (a
    # pre-posted receive is posted long before its data arrives)
    mark = np.where(is_send, p2p["start_ns"].to_numpy(np.int64), _completions(events, p2p))
    by_mark = np.argsort(mark, kind="stable")
    before = (mark[by_mark], is_send[by_mark], fwd[by_mark], p2p["step"].to_numpy()[by_mark])
    is_send, fwd, p2p_step = is_send[order], fwd[order], p2p["step"].to_numpy()[order]
    blocking = events[events["kind"].isin(BLOCKING_KINDS)]
    steps = steps.sort_values("start_ns", kind="stable")
    s0, s1 = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    g0, g1 = _gaps(blocking["start_ns"].to_numpy(np.int64), blocking["end_ns"].to_numpy(np.int64), s0, s1)
    # each gap's step: the one it starts in (the step boundaries cut every gap)
    k = np.searchsorted(s0, g0, side="right") - 1
    inside = (k >= 0) & (g1 <= s1[np.clip(k, 0, None)])
    g0, g1, step = g0[inside], g1[inside], steps["step"].to_numpy()[k[inside]]
    label = _labels(g0, g1, step, (p2p_start, is_send, fwd, p2p_step), before)
    keep = label != ""
    if not keep.any():
        return pd.DataFrame()
    kind, start, end, step = label[keep], g0[keep], g1[keep], step[keep]
    rank = int(events["rank"].iloc[0]) if "rank" in events else -1
    return pd.DataFrame(
        {
            "kind": kind,
            "name": kind,
            "start_ns": start,
            "end_ns": end,
            "step": step,
            "microbatch": -1,
            "stage": _marked_stage(events),
            "group": "",
            "group_ranks": "",
            "seq": -1,
            "peer": -1,
            "bytes": 0,
            "async_op": False,
            "callsite": "",
            "detail": SOURCE,
            "queued_ns": -1,
            "rank": rank,
        }
    )


def _forward_peers(events: pd.DataFrame, p2p: pd.DataFrame) -> set:
    """The peers this rank sends activations to (downstream), by majority over steps."""
    sends = p2p[p2p["name"].astype(str) == "send"].groupby(["peer", "step"])["start_ns"].min()
    # a receive completes at its done row (async), else at its return
    recvs = events[(events["name"].astype(str) == "recv") & (events["peer"] >= 0)]
    done = recvs[recvs["kind"] == "done"]
    received = (done if len(done) else recvs[recvs["kind"] == "p2p"]).groupby(["peer", "step"])["end_ns"].min()
    both = pd.concat([sends.rename("send"), received.rename("recv")], axis=1)
    votes = (both["send"] < both["recv"]).where(both["recv"].notna(), True)  # only sends: downstream
    votes = votes[both["send"].notna()]
    by_peer = votes.groupby(level="peer").mean()
    return {int(p) for p, frac in by_peer.items() if frac > 0.5}


def _marked_stage(events: pd.DataFrame) -> int:
    staged = events.loc[events["stage"] >= 0, "stage"]
    return int(staged.mode().iloc[0]) if len(staged) else -1


def _gaps(starts: np.ndarray, ends: np.ndarray, step_starts: np.ndarray, step_ends: np.ndarray):
    """(gap starts, gap ends): the time outside every [start, end], cut at every
    step boundary (zero-length cuts), vectorised: one sort and a running max."""
    cuts = np.concatenate([step_starts, step_ends])
    s = np.concatenate([starts, cuts])
    order = np.argsort(s, kind="stable")
    s = s[order]
    reach = np.maximum.accumulate(np.concatenate([ends, cuts])[order])  # furthest end so far
    g0, g1 = reach[:-1], s[1:]
    open_ = g1 > g0
    return g0[open_], g1[open_]


def _completions(events: pd.DataFrame, p2p: pd.DataFrame) -> np.ndarray:
    """Per p2p row, when its operation completed: the latest end of its own, wait and
    done rows (same group and sequence number)."""
    rows = events[events["kind"].isin(["p2p", "wait", "done"]) & (events["seq"] >= 0)]
    ends = rows.groupby([rows["group"].astype(str), rows["seq"]])["end_ns"].max()
    keys = pd.MultiIndex.from_arrays([p2p["group"].astype(str), p2p["seq"]])
    return ends.reindex(keys).fillna(pd.Series(p2p["end_ns"].to_numpy(), index=keys)).to_numpy(np.int64)


def _labels(g0, g1, step, posted, before) -> np.ndarray:
    """Per gap: "forward", "backward" or "" (not compute). `posted`: the p2p rows by
    posting time, `before`: by send posting and receive completion; each (times,
    is_send, forward, step)."""
    t, is_send, fwd, p_step = posted
    n = len(t)
    after = np.searchsorted(t, g1, side="left")
    a = np.clip(after, 0, max(n - 1, 0))
    by_send = (after < n) & (p_step[a] == step) & is_send[a]
    t, is_send_b, fwd_b, p_step = before
    prev = np.searchsorted(t, g0, side="right") - 1
    b = np.clip(prev, 0, max(n - 1, 0))
    by_recv = ~by_send & (prev >= 0) & (p_step[b] == step) & ~is_send_b[b]
    direction = np.where(by_send, fwd[a], fwd_b[b])
    return np.where(by_send | by_recv, np.where(direction, "forward", "backward"), "")


def phase_source(events: pd.DataFrame) -> str:
    """Where a run's forward/backward come from, for a detector's evidence: the
    phases when it has any (the detectors read them first), else its rows'."""
    if (events["kind"] == "phase").any():
        return "recorded phases"
    details = set(events.loc[events["kind"].isin(COMPUTE_KINDS), "detail"].astype(str))
    if DEVICE_SOURCE in details:
        return (
            "device passes inferred from the trace: compute kernels by launching thread "
            "(main: forward, autograd: backward) between p2p exchanges"
        )
    if SOURCE in details:
        return "host gaps between blocking rows, labelled by the p2p around them"
    return "recorded forward/backward rows"
