"""The what-if replay on device time: a graph of every rank's kernels on their
streams, the host's launches and syncs, and NCCL's rendezvous
(diagnose/analysis/replay/op_graph.py replays it; diagnose/analysis/replay/whatif.py asks it
what a fix saves). Used where the kernels are recorded (imported Kineto or
Nsight traces).

Nodes and edges, per rank:
- the host: one lane of kernel launches (a kernel's start minus its queued
  time) and host syncs (cudaDeviceSynchronize & co.), in time order. Between
  two the host works on its own: the recorded gap is its work, kept. A sync
  waits for the last kernel launched before it on each stream it syncs
  (cudaDeviceSynchronize: every stream; a sync whose stream the trace does
  not say: the stream whose kernel ended last before it returned), never a
  kernel that ended after the sync returned, so a host blocked behind a slow
  device launches late in the replay too;
- each stream: its kernels in order. A kernel starts at the latest of its
  stream's previous kernel's end, its launch and the kernels it waits for on
  other streams; then runs its own duration (its work, what a what-if
  scales). What the recorded start is later than all of those by is its
  delay, kept apart and added to it in every replay;
- waits across streams: recorded ones and inferred ones
  (diagnose/analysis/replay/cross_stream_waits.py), each kind counted;
- NCCL: a collective kernel arrives when its stream gets to it; each instance
  (group, seq: a collective, or a message of a p2p batch) starts when its last
  member arrived and lasts its recorded transfer; a kernel ends when the last
  of its instances does (a fused SendRecv kernel holds a batch: its messages
  complete together), plus the recorded time it ran on after its first
  instance ended.
So idle is not work: a stream that waited for a neighbour's data waits in the
replay for the same data, and stops waiting when the data comes sooner.

Where it is wrong: a dependency neither recorded nor inferred (a kernel held by
something other than another stream's kernel end) stays a fixed delay; which
stream a host sync waits for is read from its return as above (a sync that
returned before any kernel it could wait for ended waits for none); a rank's
launching threads are one lane (the autograd thread's launches interleave with the main
thread's in time order); a negative delay (a kernel recorded as starting
before what it waited for ended: the trace's clock error) becomes 0.
"""

import re

import numpy as np
import pandas as pd

from diagnose.analysis.replay.cross_stream_waits import INFER_TOLERANCE_NS, inferred_waits, recorded_waits
from diagnose.analysis.replay.instance_table import InstanceTable
from diagnose.analysis.replay.op_graph import NEG_INF, Cycle, OpGraph
from diagnose.analysis.tables.device_collectives import timed_on_device
from diagnose.analysis.tables.gpu_tables import COMMUNICATION, COMPUTE

DEVICE_WIDE_SYNCS = ("cudaDeviceSynchronize",)
SYNC_RECORDS = ("Stream Sync", "Event Sync", "Context Sync")
_NCCL_OP = re.compile(r"Kernel_([A-Za-z]+?)(?:_|\(|$)")


def device_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """The collectives table's rows timed by an NCCL kernel: each arrives at its
    kernel's start and leaves at its end."""
    dev = calls[timed_on_device(calls["detail"]) & calls["exit_ns"].notna()]
    return dev.assign(
        async_op=False, return_ns=dev["exit_ns"].astype(np.int64), wait_start_ns=np.nan, wait_end_ns=np.nan
    )


def _kernel_family(name: str) -> str:
    """A comm kernel's op as _row_family names a row's: "p2p" for send/recv kernels,
    "allreduce" for ncclDevKernel_AllReduce_..., "nccl" where the name says no op
    (RCCL's and newer NCCL's ncclDevKernel_Generic runs any op: the MI300 trace's
    all-reduces and broadcasts were left unmatched, their what-ifs saving 0)."""
    m = _NCCL_OP.search(name)
    op = m.group(1).lower() if m else "nccl"
    if op == "generic":
        return "nccl"
    return "p2p" if op in ("sendrecv", "send", "recv") else op


def _row_family(kind: str, name: str) -> str:
    return "p2p" if kind == "p2p" else name.replace("_", "").lower()


class DeviceModel:
    def __init__(self, run):
        self.ok, self.why = True, ""
        kernels = run.kernels()
        # GPU sync records (Stream Sync & co.) time a host call, not device work
        kernels = kernels[(kernels["step"] >= 0) & ~kernels["name"].astype(str).isin(SYNC_RECORDS)]
        kernels = kernels.reset_index(drop=True)
        calls = device_calls(run.collectives())
        calls = calls[calls["seq"] >= 0]
        if kernels.empty or calls.empty:
            self.ok, self.why = False, "no kernels or device collectives to replay"
            return
        self._kernels(kernels)
        self._instances(calls)
        self._host(run.events())
        self._waits(run.events())
        try:
            self._graph()
        except Cycle as cycle:
            self.ok, self.why = False, f"the kernels' dependencies have a cycle through {len(cycle.nodes)} ops"

    def _kernels(self, k):
        self.k_rank = k["rank"].to_numpy(np.int64)
        self.k_stream = k["stream"].to_numpy(np.int64)
        self.k_start = k["start_ns"].to_numpy(np.int64)
        self.k_end = k["end_ns"].to_numpy(np.int64)
        self.k_step = k["step"].to_numpy(np.int64)
        self.k_corr = k["correlation"].to_numpy(np.int64)
        kind = k["kind"].astype(str).to_numpy()
        self.k_comm = kind == COMMUNICATION
        self.k_name = k["name"].astype(str).to_numpy()
        queued = k["queued_ns"].to_numpy(np.int64)
        self.k_launch = np.where(queued >= 0, self.k_start - queued, -1)
        n = len(k)
        # each stream's previous kernel
        order = np.lexsort((self.k_start, self.k_stream, self.k_rank))
        same = (self.k_rank[order[1:]] == self.k_rank[order[:-1]]) & (
            self.k_stream[order[1:]] == self.k_stream[order[:-1]]
        )
        self.k_prev = np.full(n, -1)
        self.k_prev[order[1:][same]] = order[:-1][same]
        # the what-if interface (whatif.py): a unit is a kernel, its work its duration
        self.unit_work = np.where(self.k_comm, 0.0, (self.k_end - self.k_start).astype(np.float64))
        self.unit_rank, self.unit_step = self.k_rank, self.k_step
        self.unit_is_compute = kind == COMPUTE
        steps = pd.MultiIndex.from_arrays([self.k_rank, self.k_step])
        self._step_id, uniques = steps.factorize()
        self.end_rank = uniques.get_level_values(0).to_numpy()
        self.end_step = uniques.get_level_values(1).to_numpy()
        self.recorded_end_ns = self._step_ends(self.k_end.astype(np.float64))

    def _step_ends(self, kernel_end) -> np.ndarray:
        """Per (rank, step): the last end of the kernels launched in it."""
        out = np.full(len(self.end_rank), NEG_INF)
        np.maximum.at(out, self._step_id, kernel_end)
        return out

    def _instances(self, calls):
        """Map each device collective row to its kernel (same rank, same start; where
        several start together, the one whose name says the row's op, else one whose
        name says none) and number the instances. A kernel's name is no op (NCCL runs
        all-reduces as SendRecv kernels: HTA's trace_filter trace), the row's op is
        its launching call's, so the name only breaks ties. An instance starts
        when its last member arrives; each kernel then runs its recorded tail: from the
        latest start of its instances to its end (the transfer, and the wait for the
        fused batch's other messages, which the replay moves with their own partners)."""
        comm = np.flatnonzero(self.k_comm)
        ops = pd.Series(self.k_name[comm]).map(_kernel_family).to_numpy()
        at = pd.DataFrame({"rank": self.k_rank[comm], "issue_ns": self.k_start[comm], "_fam": ops, "_kernel": comm})
        calls = calls.assign(
            issue_ns=calls["issue_ns"].astype(np.int64),
            _fam=[_row_family(k, n) for k, n in zip(calls["kind"].astype(str), calls["name"].astype(str))],
        )
        calls = calls.assign(_row=np.arange(len(calls)))
        pairs = calls.merge(at.rename(columns={"_fam": "_kernel_fam"}), on=["rank", "issue_ns"])
        same, unnamed = pairs["_fam"] == pairs["_kernel_fam"], pairs["_kernel_fam"] == "nccl"
        pairs = pairs.assign(_pref=np.select([same, unnamed], [0, 1], 2))
        calls = pairs.sort_values(["_row", "_pref"], kind="stable").drop_duplicates("_row")
        calls = calls.drop(columns=["_kernel_fam", "_pref"]).reset_index(drop=True)
        t = InstanceTable(calls)
        self.calls, self.call_inst = t.calls, t.inst
        n_inst = len(t.length_ns)
        self.length_ns = np.zeros(n_inst)  # on device a transfer is its kernels' tail
        self.member_kernel = self.calls["_kernel"].to_numpy(np.int64)
        self.member_inst = t.inst
        self.k_matched = np.zeros(len(self.k_rank), bool)
        self.k_matched[self.member_kernel] = True
        started = np.full(len(self.k_rank), np.iinfo(np.int64).min)
        np.maximum.at(started, self.member_kernel, t.last_arrival[self.member_inst])
        self.k_tail = np.where(self.k_matched, np.maximum(self.k_end - started, 0), 0).astype(np.float64)
        is_p2p = self.calls["kind"].astype(str).eq("p2p").to_numpy()
        self.k_p2p = np.zeros(len(self.k_rank), bool)
        self.k_p2p[self.member_kernel[is_p2p]] = True

    def _host(self, events):
        """Host lane points: launches (one per kernel with a known launch) and syncs."""
        syncs = events[(events["kind"] == "sync") & (events["detail"].astype(str) == "cuda")]
        self.s_rank = syncs["rank"].to_numpy(np.int64)
        self.s_start = syncs["start_ns"].to_numpy(np.int64)
        self.s_end = syncs["end_ns"].to_numpy(np.int64)
        self.s_wide = syncs["name"].astype(str).isin(DEVICE_WIDE_SYNCS).to_numpy()
        # where a sync comes from, as hidden_sync groups them: its callsite, else its name
        self.s_site = (
            syncs["callsite"]
            .astype(str)
            .where(syncs["callsite"].astype(str) != "", syncs["name"].astype(str))
            .to_numpy()
        )
        self.s_step = syncs["step"].to_numpy(np.int64)

    def _waits(self, events):
        """Cross-stream edges (src kernel, dst kernel): recorded, then inferred."""
        rec_src, rec_dst = recorded_waits(events, self.k_rank, self.k_stream, self.k_corr, self.k_start, self.k_end)
        self.recorded_waits = len(rec_src)
        explained = self._explained(rec_src, rec_dst)
        inf_src, inf_dst = inferred_waits(self.k_rank, self.k_stream, self.k_start, self.k_end, explained)
        self.inferred_waits = len(inf_src)
        self.w_src = np.concatenate([rec_src, inf_src])
        self.w_dst = np.concatenate([rec_dst, inf_dst])

    def _explained(self, w_src, w_dst) -> np.ndarray:
        """Per kernel, the latest recorded time its start depends on (stream, launch, waits)."""
        prev_end = np.where(self.k_prev >= 0, self.k_end[np.maximum(self.k_prev, 0)], np.iinfo(np.int64).min)
        out = np.maximum(prev_end, self.k_launch)
        if len(w_src):
            np.maximum.at(out, w_dst, self.k_end[w_src])
        return out

    def _graph(self):
        nk, ni = len(self.k_rank), len(self.length_ns)
        comm = np.flatnonzero(self.k_comm & self.k_matched)
        arrival = np.full(nk, -1)
        # nodes: kernels [0, nk), comm arrivals, instances, host points
        arrival[comm] = nk + np.arange(len(comm))
        i0 = nk + len(comm)
        h0 = i0 + ni
        host_t, host_end, host_kind, host_rank, host_ref = self._host_points()
        n = h0 + len(host_t)
        entry = np.where(arrival >= 0, arrival, np.arange(nk))  # where a kernel's start is decided
        explained = self._explained(self.w_src, self.w_dst)
        delay = np.maximum(self.k_start - explained, 0).astype(np.float64)
        src, dst, weight = [], [], []

        def edges(s, d, w):
            src.append(np.asarray(s, np.int64)), dst.append(np.asarray(d, np.int64))
            weight.append(np.broadcast_to(np.asarray(w, np.float64), len(src[-1])))

        has_prev = self.k_prev >= 0
        edges(self.k_prev[has_prev], entry[has_prev], delay[has_prev])
        edges(self.w_src, entry[self.w_dst], delay[self.w_dst])
        edges(arrival[comm], comm, 0.0)  # a kernel ends no sooner than it arrived
        edges(arrival[self.member_kernel], i0 + self.member_inst, 0.0)
        edges(i0 + self.member_inst, self.member_kernel, 0.0)
        # the host: its lane, its launches, its syncs
        nh = len(host_t)
        hidx = h0 + np.arange(nh)
        same = np.r_[False, host_rank[1:] == host_rank[:-1]]
        gap = np.r_[0, host_t[1:] - host_end[:-1]].astype(np.float64)
        chain = same[1:]
        first_host_edge = sum(len(x) for x in src)
        edges(hidx[:-1][chain], hidx[1:][chain], gap[1:][chain])
        # the host's own work between two of its points: what a host-bound what-if scales
        self._host_edges = slice(first_host_edge, first_host_edge + int(chain.sum()))
        point_step = np.empty(len(host_kind), np.int64)
        point_step[host_kind == 0] = self.k_step[host_ref[host_kind == 0]]
        point_step[host_kind == 1] = self.s_step[host_ref[host_kind == 1]]
        self.host_gap_ns = gap[1:][chain]
        self.host_gap_window = (host_end[:-1][chain], host_t[1:][chain])
        self.host_gap_rank, self.host_gap_step = host_rank[1:][chain], point_step[1:][chain]
        launch = host_kind == 0
        edges(hidx[launch], entry[host_ref[launch]], delay[host_ref[launch]])
        sync_pts, waited = self._sync_waits(host_t, host_kind, host_rank, host_ref)
        first_sync_edge = sum(len(x) for x in src)
        edges(waited, hidx[sync_pts], 0.0)
        # per sync edge and per sync node, the sync row (a what-if removes syncs)
        self._sync_edges = slice(first_sync_edge, first_sync_edge + len(waited))
        self._sync_edge_row = host_ref[sync_pts]
        at = np.flatnonzero(host_kind == 1)
        self._sync_node, self._sync_node_row = hidx[at], host_ref[at]
        floor = np.full(n, NEG_INF)
        first = ~same
        floor[hidx[first]] = host_t[first]
        # a kernel with nothing before it (its stream's first, launch unknown) starts as recorded
        floor[entry[~has_prev & (self.k_launch < 0)]] = self.k_start[~has_prev & (self.k_launch < 0)]
        dur = np.zeros(n)
        dur[:nk] = np.where(self.k_comm & self.k_matched, self.k_tail, self.unit_work)
        dur[:nk][self.k_comm & ~self.k_matched] = (self.k_end - self.k_start)[self.k_comm & ~self.k_matched]
        self._sync_post(host_t, host_end, host_kind, sync_pts, waited, dur, hidx)
        self._n, self._nk, self._i0 = n, nk, i0
        self._weight = np.concatenate(weight)
        self.graph = OpGraph(n, np.concatenate(src), np.concatenate(dst), self._weight, dur, floor)
        self._dur = dur

    def _host_points(self):
        known = np.flatnonzero(self.k_launch >= 0)
        t = np.concatenate([self.k_launch[known], self.s_start])
        end = np.concatenate([self.k_launch[known], self.s_end])
        kind = np.concatenate([np.zeros(len(known), np.int8), np.ones(len(self.s_start), np.int8)])
        rank = np.concatenate([self.k_rank[known], self.s_rank])
        ref = np.concatenate([known, np.arange(len(self.s_start))])
        order = np.lexsort((kind, t, rank))
        return t[order], end[order], kind[order], rank[order], ref[order]

    def _sync_waits(self, host_t, host_kind, host_rank, host_ref):
        """(host point index, kernel) pairs: what each sync waited for. Of each stream,
        the last kernel launched before the call, if it ended before the sync returned
        (a sync cannot return before the work it waits for: one that ended later was
        not waited for, whatever the guess). cudaDeviceSynchronize waits for every such
        kernel; a sync whose stream the trace does not say (cudaStreamSynchronize
        without a stream) for the one that ended last: the sync returned after it."""
        pts, kernels = [], []
        sync_at = np.flatnonzero(host_kind == 1)
        if not len(sync_at):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        known = np.flatnonzero(self.k_launch >= 0)
        for rank in np.unique(host_rank[sync_at]):
            mine = known[self.k_rank[known] == rank]
            if not len(mine):
                continue
            at = sync_at[host_rank[sync_at] == rank]
            streams = np.unique(self.k_stream[mine])
            # per (sync, stream): the stream's last kernel launched before the call
            waited = np.full((len(at), len(streams)), -1)
            for j, stream in enumerate(streams):
                on = mine[self.k_stream[mine] == stream]
                on = on[np.argsort(self.k_launch[on], kind="stable")]
                i = np.searchsorted(self.k_launch[on], host_t[at], side="right") - 1
                waited[:, j] = np.where(i >= 0, on[np.maximum(i, 0)], -1)
            ends = np.where(waited >= 0, self.k_end[np.maximum(waited, 0)], np.iinfo(np.int64).max)
            returned = self.s_end[host_ref[at]][:, None]
            waited[ends > returned + INFER_TOLERANCE_NS] = -1
            wide = self.s_wide[host_ref[at]]
            last = np.where(waited >= 0, ends, np.iinfo(np.int64).min).argmax(axis=1)
            keep = (waited >= 0) & (wide[:, None] | (np.arange(len(streams)) == last[:, None]))
            row, col = np.nonzero(keep)
            pts.append(at[row]), kernels.append(waited[row, col])
        if not pts:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(pts), np.concatenate(kernels)

    def _sync_post(self, host_t, host_end, host_kind, sync_pts, waited, dur, hidx):
        """A sync's own time: from the later of its call and the device's end of what it
        waited for, to its return."""
        at = np.flatnonzero(host_kind == 1)
        device_done = np.full(len(host_t), np.iinfo(np.int64).min)
        np.maximum.at(device_done, sync_pts, self.k_end[waited])
        dur[hidx[at]] = np.maximum(host_end[at] - np.maximum(host_t[at], device_done[at]), 0)

    def replay_units(
        self, work=None, length_ns=None, skip=frozenset(), tail_ns=None, skip_syncs=None, host_gap_ns=None
    ) -> np.ndarray:
        """Per (rank, step) (end_rank, end_step): the last replayed end of its kernels,
        with these kernel durations (`work`, comm kernels' ignored), comm kernels'
        tails (`tail_ns`, per kernel: transfers) and without the host syncs of
        `skip_syncs` (a mask over the sync rows: the host goes on at once), with the
        host's own work between its points `host_gap_ns` (as host_gap_rank/step)."""
        assert not skip, "device what-ifs change durations, not calls"
        dur = self._dur.copy()
        weight = None if skip_syncs is None and host_gap_ns is None else self._weight.copy()
        if host_gap_ns is not None:
            weight[self._host_edges] = host_gap_ns
        if skip_syncs is not None:
            weight[self._sync_edges] = np.where(skip_syncs[self._sync_edge_row], NEG_INF, 0.0)
            dur[self._sync_node] = np.where(skip_syncs[self._sync_node_row], 0.0, dur[self._sync_node])
        if work is not None:
            dur[: self._nk] = np.where(self.k_comm, dur[: self._nk], work)
        if tail_ns is not None:
            dur[: self._nk] = np.where(self.k_comm & self.k_matched, tail_ns, dur[: self._nk])
        return self._step_ends(self.graph.replay(dur_ns=dur, weight_ns=weight)[: self._nk])
