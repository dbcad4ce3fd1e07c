"""Test aid: the host calls of tests/support/megatron_stream_model.py that order its
CUDA streams or wait for them, as Kineto records them, DDP's bucketed
all-reduces, the schedules beside 1F1B (interleaved, a ring of exchanges), and
the export's "dependencies removed" (issue 46: the what-if replay reads only
the export).

The model's cross-stream dependencies (a compute kernel waits for the exchanges
and all-reduce launched before it; an NCCL kernel waits for the compute launched
before it) become, with record_waits, what torch.profiler writes with
`experimental_config=_ExperimentalConfig(enable_cuda_sync_events=True)`:

    NCCL waits for compute   at the collective's call, right before its kernel
                             launch (ProcessGroupNCCL's syncStream): cudaEventRecord
                             on the compute stream, cudaStreamWaitEvent of the NCCL
                             stream on it
    compute waits for NCCL   right after each NCCL launch, cudaEventRecord on its
                             stream (the work's end event); before the next compute
                             launch that depends on it, cudaStreamWaitEvent of the
                             compute stream (Megatron's req.wait()), once per NCCL
                             op: stream order covers the later compute kernels

each cudaStreamWaitEvent with its device record, a "Stream Wait Event" on the
waiting stream that names the stream and the cudaEventRecord waited on.

DDP's buckets (simulate's buckets=n): its reducer launches a bucket's
all-reduce as soon as the backward has produced the bucket's gradients, so
during the last micro-batch's backward an all-reduce follows every
(backward kernels // n)-th kernel launch, the last one the last kernel: each
waits for the compute before it, and the rest of the backward runs on while
it moves. The backward's compute waits only for the p2p stream (DDP's
backward never waits for a bucket); the optimizer waits for the last bucket
(the reducer's finalize: one Stream Wait Event on the data-parallel stream). Every
record written is a dependency the simulation obeys. Host calls are on the main
thread (tid 1) and cost CALL_US of host time each, as real ones cost some.

A host sync (`.item()` every few micro-batches, a blocking p2p wait) is a
cudaStreamSynchronize that holds the host until the stream's last launched op
ends, with its "Stream Sync" record on that stream.

Format, verified against libkineto's source (pytorch/kineto) and the real traces
in tests/data/kineto/hta/critical_path/{alexnet,simple_add}/:
- libkineto/src/CuptiActivity.{h,cpp}, CudaSyncActivity::metadataJson: args
  "cuda_sync_kind", then for Event Sync / Stream Wait Event only "wait_on_stream",
  "wait_on_cuda_event_record_corr_id", "wait_on_cuda_event_id", then "stream",
  "correlation", "device", "context"; name() is syncTypeString
  (libkineto/src/cupti_strings.cpp): "Event Sync", "Stream Wait Event",
  "Stream Sync", "Context Sync". resourceId() (the trace's tid) is the stream.
- CuptiActivityProfiler.cpp: handleCudaEventActivity keeps, per (context, event
  id), the stream and correlation id of the CUDA_EVENT record, i.e. of the
  cudaEventRecord call; handleCudaSyncActivity fills wait_on_stream and
  wait_on_cuda_event_record_corr_id from it (-1 when unknown). Stream Wait Events
  are kept only with activitiesCudaSyncWaitEvents (torch's enable_cuda_sync_events)
  and only on streams that ran a kernel in the window.
- The fixtures: cat "cuda_sync", ph "X", pid the device, tid the waiting stream;
  "correlation" is the cudaStreamWaitEvent's / cudaStreamSynchronize's, whose
  cuda_runtime events carry "cbid" (cudaEventRecord 135, cudaStreamWaitEvent 147,
  cudaStreamSynchronize 131) and "correlation". A sync record's times are the
  host call's (CUPTI): a Stream Wait Event 1 us into its 5 us call, 0-3 us long;
  a Stream Sync 1-2 us into its cudaStreamSynchronize, ending with it. The older
  simple_add trace has no wait_on_cuda_event_record_corr_id; real args also hold
  "External id", which the model never writes.
"""

import numpy as np

COMPUTE_STREAM, DP_STREAM, P2P_STREAM = 7, 21, 24
NCCL_STREAMS = (P2P_STREAM, DP_STREAM)
CALL_US = 4.0  # host time of a cudaEventRecord / cudaStreamWaitEvent
SYNC_RETURN_US = 5.0  # from the device's last end to the host call's return
CBID = {"cudaEventRecord": 135, "cudaStreamWaitEvent": 147, "cudaStreamSynchronize": 131}
STREAM_WAIT, STREAM_SYNC = "Stream Wait Event", "Stream Sync"


def bucketed(launches: list, buckets: int, group: list) -> list:
    """The last backward's compute launches with DDP's bucket all-reduces ("A"
    instructions) among them: after every (len // buckets)-th and after the last."""
    if not buckets:
        return launches
    per = len(launches) // buckets
    after = {per * (b + 1) - 1 for b in range(buckets - 1)} | {len(launches) - 1}
    out = []
    for i, launch in enumerate(launches):
        out += [launch, ("A", group)] if i in after else [launch]
    return out


def interleaved(stage: int, stages: int, microbatches: int, chunks: int) -> list:
    """A virtual-stage schedule: chunk c of stage s is virtual stage
    c * stages + s, so the last stage sends chunk c's output to the first stage
    (offset +1 wraps round). Micro-batches go in groups of `stages` through each
    chunk in turn (Megatron's interleaved order), forwards then backwards; a
    send and the receive after it are one exchange (send_forward_recv_forward:
    lone blocking sends round the ring would deadlock the in-order p2p streams)."""
    last = chunks * stages - 1
    groups = [range(g, min(g + stages, microbatches)) for g in range(0, microbatches, stages)]
    out = []
    for group in groups:
        for c in range(chunks):
            v = c * stages + stage
            for i in group:
                out += [("X", [("recv", -1)] if v > 0 else []), ("F", i), ("X", [("send", +1)] if v < last else [])]
    for group in groups:
        for c in reversed(range(chunks)):
            v = c * stages + stage
            for i in group:
                out += [("X", [("recv", +1)] if v < last else []), ("B", i), ("X", [("send", -1)] if v > 0 else [])]
    fused = []
    for a in out:
        if a[0] == "X" and fused and fused[-1][0] == "X":
            fused[-1] = ("X", fused[-1][1] + a[1])
        else:
            fused.append(a)
    return [a for a in fused if a[0] != "X" or a[1]]


def ring_schedule(microbatches: int) -> list:
    """Each micro-batch: forward, backward, then one fused exchange with both
    neighbours of the ring (send to the next rank, receive from the previous)."""
    out = []
    for i in range(microbatches):
        out += [("F", i), ("B", i), ("X", [("send", +1), ("recv", -1)])]
    return out


class HostCalls:
    """The host calls above, for StreamQueues (tests/support/stream_sim_queues.py): it
    provides rank, t, corr, latest (per rank: stream -> its last launched op),
    waited, blocked, events, cpu() and buckets (simulate's, 0 without dp)."""

    record_waits = False

    def _runtime(self, name: str) -> int:
        self.corr += 1
        self.cpu(
            self.rank, name, self.t, CALL_US, cat="cuda_runtime", args={"cbid": CBID[name], "correlation": self.corr}
        )
        self.t += CALL_US
        return self.corr

    def _sync_record(self, kind: str, stream: int, ts: float, dur: float, corr: int, extra=None):
        args = {
            "cuda_sync_kind": kind,
            **(extra or {}),
            "stream": stream,
            "correlation": corr,
            "device": self.rank,
            "context": 1,
        }
        self.events[self.rank].append(
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": kind,
                "pid": self.rank,
                "tid": stream,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    def _wait_event(self, stream: int, on_stream: int, record_corr: int):
        ts = self.t
        corr = self._runtime("cudaStreamWaitEvent")
        self._sync_record(
            STREAM_WAIT,
            stream,
            ts + 1,
            0.0,
            corr,
            {"wait_on_stream": on_stream, "wait_on_cuda_event_record_corr_id": record_corr},
        )

    buckets = 0

    def compute_waits_on(self) -> tuple:
        """The NCCL streams a backward or forward kernel waits for: not DDP's buckets."""
        return (P2P_STREAM,) if self.buckets else NCCL_STREAMS

    def order_streams(self, stream: int, on: tuple = NCCL_STREAMS):
        """Before a launch on `stream`: the waits the device model gives it (a
        compute launch: for the latest op on each of the NCCL streams `on`)."""
        if not self.record_waits:
            return
        latest, waited = self.latest[self.rank], self.waited[self.rank]
        if stream != COMPUTE_STREAM:
            if COMPUTE_STREAM in latest:
                self._wait_event(stream, COMPUTE_STREAM, self._runtime("cudaEventRecord"))
            return
        for nccl in on:
            op = latest.get(nccl)
            if op is not None and waited.get(nccl) is not op:
                waited[nccl] = op
                self._wait_event(stream, nccl, op["record"])

    def end_event(self, op: dict):
        """Right after an NCCL launch: the event its waiters will wait on."""
        if self.record_waits:
            op["record"] = self._runtime("cudaEventRecord")

    def host_sync(self, stream: int, why: str) -> bool:
        """cudaStreamSynchronize: False while the stream's last op (when the host
        got here) has not ended; the host stays at the call's start meanwhile."""
        r = self.rank
        if self.blocked[r] is None:
            self.blocked[r] = (self.t, self.latest[r].get(stream))
        t_call, target = self.blocked[r]
        if target is not None and target["end"] is None:
            return False
        self.blocked[r] = None
        done = max(t_call, target["end"] if target is not None else t_call) + SYNC_RETURN_US
        self.corr += 1
        if why == "item":  # loss.item(): the op that syncs, around the runtime call
            self.cpu(r, "aten::item", t_call - 1, done - t_call + 2)
        self.cpu(
            r,
            "cudaStreamSynchronize",
            t_call,
            done - t_call,
            cat="cuda_runtime",
            args={"cbid": CBID["cudaStreamSynchronize"], "correlation": self.corr},
        )
        self._sync_record(STREAM_SYNC, stream, t_call + 1, done - t_call - 1, self.corr)
        self.t = done + 1
        return True


def drop_waits(traces: list, frac: float, seed: int) -> list:
    """Remove round(frac x n) of each rank's n recorded waits, chosen at random
    (seeded apart from the simulation's draws): the Stream Wait Event and its
    cudaStreamWaitEvent call. Their cudaEventRecord calls stay, as records that
    nothing waits on do in real traces. In place; returns the traces."""
    if not frac:
        return traces
    rng = np.random.default_rng([seed, 46])
    for trace in traces:
        events = trace["traceEvents"]
        waits = [e["args"]["correlation"] for e in events if e["cat"] == "cuda_sync" and e["name"] == STREAM_WAIT]
        gone = set(rng.choice(waits, size=int(round(frac * len(waits))), replace=False).tolist()) if waits else set()
        trace["traceEvents"] = [
            e
            for e in events
            if not (
                e["args"].get("correlation") in gone
                and (e["name"] == STREAM_WAIT or e["name"] == "cudaStreamWaitEvent")
            )
        ]
    return traces
