"""Device rows of collectives and sends/receives on CUDA (issue 21): when the
device was ready for each call and when its communication was over, from CUDA
events on the current stream of the tensor's device, so that the analysis judges NCCL runs on device
time as it does imported GPU traces (diagnose/analysis/tables/device_collectives.py).

    arrival  an event recorded on the current stream just before the call: the
             NCCL stream waits on the current stream, so the collective's
             kernel can start when the device reaches this event
    end      synchronous call: an event recorded right after it returns. Since
             torch 2.8 a synchronous collective runs on the current stream, so
             this is its kernel's end; before, it runs on an internal NCCL
             stream that the current stream is made to wait for, so this is
             the end plus that wait's latency. Both: detail "gpu".
             Async call: an event recorded when the host calls Work.wait()
             (after it, the current stream waits for the NCCL stream): an
             upper bound, as late as the host waited and behind whatever the
             current stream had queued by then. Detail "gpu:wait". Where
             TORCH_NCCL_ENABLE_TIMING is on (diagnose run sets it), NCCL's
             own kernel duration (Work._get_duration()) narrows it: detail
             "gpu:nccl", see _waited_rows.
             DDP's buckets: an event recorded in the future's callback, on the
             stream torch made wait for the all-reduce (ddp.py). Detail "gpu".
    stall    async call: a "wait" row from an event recorded right before
             Work.wait() (where the current stream was) to that end: how long
             the stream stalled behind the wait (blocking_async reads it).
             It shares the end event: a synchronous call costs two events,
             an async one three (arrival, before the wait, end), however
             many calls one Work covers.

The rows, written by the poller of cuda_events.py once both events have
completed (never waiting for them): a "collective" (or "p2p") row at the
arrival, with the host row's group, seq and name, and a "done" row at the end;
times through the GPU-to-host anchor, so their error is the anchor's residual.
The matching prefers them to the host row of the same call
(diagnose/analysis/tables/matching.py). Not recorded: gloo groups (their work is the
host's), calls on CPU tensors, and anything while a CUDA graph is being
captured (a captured event has no time, recording one would change the graph,
and asking one from any thread would invalidate it: graph_capture.py).
"""

import weakref

from collectors.schema import fields


class CollectiveEvents:
    """What collective_tracker.Tracker calls around each collective when CUDA is in use.
    Every event of a call is recorded on the current stream of its tensor's
    device (not the current device's: a rank may drive several GPUs). A call's
    host row comes as Tracker.issued returns it: the plain tuple written
    (EVENT_COLUMNS order), read by field name (`fields`)."""

    def __init__(self, timer, ready, capturing, nccl_timing=False, stream_of=lambda tensor: None):
        self.timer = timer  # cuda_event_timer.CudaEventTimer
        self.ready = ready  # () -> bool: CUDA usable, the poller running
        self.capturing = capturing  # () -> bool: a CUDA graph is being captured (graph_capture.py)
        self.nccl_timing = nccl_timing  # TORCH_NCCL_ENABLE_TIMING: Work._get_duration() answers
        self.stream_of = stream_of  # tensor -> the current stream of its device
        # work -> [(arrival event, host row, work or None, stream)], weakly keyed: an
        # entry leaves when its work is waited or dies, so a new Work at a reused
        # address never finds an old one's rows (a Work without weak references
        # is keyed by id, bounded below)
        self.by_work = weakref.WeakKeyDictionary()
        self.by_id: dict = {}
        self.forgotten = 0  # calls whose work was never waited, past the bound
        self.stream_end_ns: dict = {}  # (group, peer) -> modelled end of its NCCL stream's last kernel

    def mark(self, tensor, is_gloo: bool):
        """Before the call: (its arrival event, the stream), or None when not timed."""
        if is_gloo or not getattr(tensor, "is_cuda", False) or not self.ready() or self.capturing():
            return None
        stream = self.stream_of(tensor)
        return self.timer.start(stream), stream

    def returned(self, arrival, row, work) -> None:
        """After the call: a synchronous call ends now; async work at its wait."""
        if arrival is None:
            return
        arrival, stream = arrival
        if work is None:  # a synchronous call's row: the plain tuple written
            self._finish(arrival, row, "gpu", stream)
            return
        # with NCCL's timing the work is kept until its events are read (its
        # tensors live up to one poll interval longer; an entry holding its own
        # key lives until waited or the bound); else nothing of it
        held = work if self.nccl_timing else None
        entry = (arrival, row, held, stream)
        try:
            self._bounded(self.by_work).setdefault(work, []).append(entry)
        except TypeError:
            self._bounded(self.by_id).setdefault(id(work), []).append(entry)

    def _bounded(self, held: dict) -> dict:
        """Works kept alive and never waited (or held for NCCL's timing): forget
        them past 65,536 rather than grow; `forgotten` counts their calls."""
        if len(held) >= 65536:
            self.forgotten += sum(map(len, held.values()))
            held.clear()
        return held

    def _entries(self, work, pop: bool) -> list:
        try:
            return (self.by_work.pop(work, None) if pop else self.by_work.get(work)) or []
        except TypeError:
            return (self.by_id.pop(id(work), None) if pop else self.by_id.get(id(work))) or []

    def completed(self, arrival, row) -> None:
        """From a CUDA future's callback (DDP's bucket hook): the callback runs
        on a stream that was made to wait for the work's end events, so an
        event recorded there completes when the communication is over, not
        when the host was called back (NCCL calls back when it has queued)."""
        if arrival is not None:
            self._finish(arrival[0], row, "gpu", arrival[1])

    def before_wait(self, work):
        """Right before Work.wait(): where the current stream is (an event), if
        the work is timed. The stream stalls from there until the work's end."""
        entries = self._entries(work, pop=False)
        if not entries or self.capturing():
            return None
        return self.timer.start(entries[0][3])

    def waited(self, work, before, callsite: str) -> None:
        """Right after Work.wait() returned on the host."""
        end, end_stream = None, None
        for arrival, row, held, stream in self._entries(work, pop=True):
            if before is None or self.capturing():
                continue
            # one end event for all of the work's calls and their stalls: the stream
            # passed the wait when the work was over
            end = self.timer.finish(
                arrival,
                row,
                rows_of=lambda t0, t1, row=row, held=held: self._waited_rows(row, t0, t1, held),
                stream=stream,
                end_event=end if stream is end_stream else None,
            )
            end_stream = stream
            self.timer.finish(
                before,
                row,
                rows_of=lambda t0, t1, row=row: [stall_row(row, t0, t1, callsite)],
                stream=stream,
                end_event=end,
            )

    def _waited_rows(self, row, arrival_ns: int, bound_ns: int, work) -> list:
        """Async work's rows once its end event completed. With NCCL's own
        timing: its kernel starts when its NCCL stream (one per group, and per
        peer for sends/receives) reaches it, the arrival or the end of that
        stream's previous kernel, and lasts Work._get_duration(); never past
        the wait's bound. Detail "gpu:nccl". Without: the bound, "gpu:wait"."""
        if work is not None:
            try:
                duration_ns = int(work._get_duration() * 1e6)
            except Exception:  # timing off for this group, or not NCCL's work
                duration_ns = -1
            if duration_ns >= 0:
                key = _STREAM(row)
                start_ns = max(arrival_ns, self.stream_end_ns.get(key, arrival_ns))
                end_ns = min(bound_ns, start_ns + duration_ns)
                self.stream_end_ns[key] = end_ns
                return device_rows(row, arrival_ns, end_ns, "gpu:nccl")
        return device_rows(row, arrival_ns, bound_ns, "gpu:wait")

    def _finish(self, arrival, row, detail: str, stream=None) -> None:
        if self.capturing():
            return
        self.timer.finish(arrival, row, rows_of=lambda t0, t1: device_rows(row, t0, t1, detail), stream=stream)


_INSTANCE = fields("name", "step", "microbatch", "stage", "group", "group_ranks", "seq", "peer")
_CALL = fields(
    "kind", "name", "step", "microbatch", "stage", "group", "group_ranks", "seq", "peer", "bytes", "callsite"
)
_STREAM = fields("group", "peer")  # the call's NCCL stream: one per group, and per peer for p2p
_DETAIL = fields("detail")


def follow_up(row: tuple, kind: str, start_ns: int, end_ns: int, callsite: str, detail: str | None = None) -> tuple:
    """A "wait" or "done" row of an issued call (host or device; `row` its event
    row, EVENT_COLUMNS order): its op, step and instance (group, seq, peer), no
    bytes; `detail` the call's unless given. Read back by nothing, it is a plain
    tuple (bench/results/2026-12-06-typed-event-records.md)."""
    name, step, microbatch, stage, group, group_ranks, seq, peer = _INSTANCE(row)
    return (
        kind,
        name,
        start_ns,
        end_ns,
        step,
        microbatch,
        stage,
        group,
        group_ranks,
        seq,
        peer,
        0,
        True,
        callsite,
        _DETAIL(row) if detail is None else detail,
        -1,
    )


def device_rows(host_row: tuple, arrival_ns: int, end_ns: int, detail: str) -> list:
    """The call's device rows from its host row: the call at its arrival, "done"
    at its end; plain tuples, as follow_up's, the host row's fields read once
    for both (the poller makes thousands at a time behind a slow device)."""
    kind, name, step, mb, stage, group, ranks, seq, peer, nbytes, callsite = _CALL(host_row)
    return [
        (
            kind,
            name,
            arrival_ns,
            arrival_ns,
            step,
            mb,
            stage,
            group,
            ranks,
            seq,
            peer,
            nbytes,
            True,
            callsite,
            detail,
            -1,
        ),
        ("done", name, end_ns, end_ns, step, mb, stage, group, ranks, seq, peer, 0, True, "", detail, -1),
    ]


def stall_row(host_row: tuple, stream_at_wait_ns: int, end_ns: int, callsite: str) -> tuple:
    """The wait on the device: from where the current stream was when the host
    called Work.wait() to the work's end; its length is how long the stream
    stalled behind the wait (0 when the work was over by then)."""
    return follow_up(host_row, "wait", stream_at_wait_ns, end_ns, callsite, "gpu:wait")
