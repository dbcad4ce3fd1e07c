"""CudaEventTimer: pairs of CUDA events turned into rows with host times, off
the training thread (cuda_events.py records the events and runs the poller).

Each pending pair waits in its stream's queue; `poll()` asks each queue's head
whether it completed (`event.query()`, never a wait). GPU times become host
times through an anchor per device: an event recorded on an otherwise idle
side stream and asked for right away (it runs at once, so the user's queue is
never waited on), paired with the host clock read when it completes; the poll
renews it every REANCHOR_S against drift, and reports each anchor's residual
(the host interval that brackets it) and drift (against the previous anchor).
"""

import threading
import time
from collections import deque

from collectors.clock import now_ns
from collectors.instrument.graph_capture import GATE

MAX_PENDING = 100_000
REANCHOR_S = 60.0
ANCHOR_PAIRS = 5  # host/device stamp pairs per anchor: the one with the lowest round trip is kept
ANCHOR_SPIN_NS = 5_000_000  # how long one pair may take; longer: the side stream is held up, no anchor now


class CudaEventTimer:
    """Pairs of events -> rows, resolved by `poll()` off the training thread.

    make_event() -> an object with record(stream=None), query() and
    elapsed_time(other), as torch.cuda.Event. Events of one span are recorded on
    one stream (None: the current one); `device_of(stream)` names its device, and
    each device has its own anchor (elapsed_time between devices raises), made
    on `side_stream_for(device)`, a stream nothing else uses."""

    def __init__(
        self,
        make_event,
        side_stream=None,
        clock=now_ns,
        on_anchor=None,
        device_of=lambda stream: 0,
        side_stream_for=None,
    ):
        self.make_event = make_event
        self.side_stream = side_stream
        self.side_stream_for = side_stream_for or (lambda device: self.side_stream)
        self.device_of = device_of
        self.clock = clock
        self.on_anchor = on_anchor  # (host_ns, residual_ns, drift_ns or None, device) at every anchor
        # (device, stream) -> deque of (row_template, start_event, end_event, rows_of, device),
        # in the order the end events were recorded on that stream, so the order they complete in
        self.pending: dict = {}
        self.n_pending = 0
        self.anchors = {}  # device -> (event, host_ns)
        self.residual_ns = None
        self.anchor_misses = 0  # anchors not made: the side stream did not answer in time
        self.dropped = 0
        self._lock = threading.Lock()

    def set_anchor(self, device=0) -> bool:
        """Pair a GPU time with a host time: an event on an idle side stream
        completes at once, so its host time lies between the clock read before it
        was recorded and the first read that sees it complete; that interval is
        the residual. The best of ANCHOR_PAIRS pairs is kept. The event is asked,
        never waited for: a side stream held up (a hung device) costs this poll
        ANCHOR_SPIN_NS and leaves the previous anchor in place. Against the
        previous anchor the pair also measures the clocks' drift."""
        best = None
        for _ in range(ANCHOR_PAIRS):
            ev = self.make_event()
            before = self.clock()
            ev.record(self.side_stream_for(device))
            give_up = time.perf_counter_ns() + ANCHOR_SPIN_NS
            while not ev.query():
                if time.perf_counter_ns() > give_up:
                    break
            else:
                after = self.clock()
                if best is None or after - before < best[2]:
                    best = (ev, after, after - before)
                continue
            break
        if best is None:
            self.anchor_misses += 1
            return False
        ev, host_ns, self.residual_ns = best
        drift_ns = None
        if device in self.anchors:
            drift_ns = host_ns - self._host_ns(ev, device)  # > 0: the host clock ran ahead of the GPU's
        self.anchors[device] = (ev, host_ns)
        if self.on_anchor is not None:
            self.on_anchor(host_ns, self.residual_ns, drift_ns, device)
        return True

    def start(self, stream=None):
        ev = self.make_event()
        ev.record(stream)
        return ev

    def finish(self, start_event, row_template, rows_of=None, stream=None, end_event=None):
        """row_template: the EventRow with start/end left as None; or
        rows_of(start_ns, end_ns) -> the rows to write. `stream`: the start's.
        Returns the end event, which another span ending at the same point of
        the same stream may share (`end_event`): one event fewer."""
        ev = end_event
        if ev is None:
            ev = self.make_event()
            ev.record(stream)
        device = self.device_of(stream)
        key = (device, getattr(stream, "cuda_stream", stream))
        with self._lock:
            if self.n_pending >= MAX_PENDING:
                self.dropped += 1
                return ev
            self.n_pending += 1
            queue = self.pending.get(key)
            if queue is None:
                queue = self.pending[key] = deque()
            queue.append((row_template, start_event, ev, rows_of, device))
        return ev

    def waiting(self) -> list:
        """The pairs not resolved yet, stream by stream."""
        with self._lock:
            return [item for queue in self.pending.values() for item in queue]

    def _host_ns(self, ev, device) -> int:
        anchor_ev, anchor_ns = self.anchors[device]
        return anchor_ns + int(round(anchor_ev.elapsed_time(ev) * 1e6))

    def poll(self) -> list:
        """Rows for every pair the GPU has completed; the rest wait. Nothing is
        asked of CUDA while a graph is being captured (graph_capture.py)."""
        with GATE.idle() as idle:
            return self._poll() if idle else []

    def _poll(self) -> list:
        """Events on one stream complete in the order they were recorded: each
        stream's queue is resolved from its head and its first unfinished pair
        ends the stream's turn, so a poll costs the pairs it resolves plus one
        query a stream, not one a pending pair (10^5 pending: bench/event_poll.py)."""
        now = self.clock()
        with self._lock:
            queues = list(self.pending.items())
        for device in {key[0] for key, queue in queues if queue} | set(self.anchors):
            anchor = self.anchors.get(device)
            if anchor is None or now - anchor[1] > REANCHOR_S * 1e9:
                self.set_anchor(device)
        rows = []
        for (device, _), queue in queues:
            if device not in self.anchors:
                continue
            while queue:  # only this thread takes from a queue; the training thread appends
                row, start_ev, end_ev, rows_of, _ = queue[0]
                if not end_ev.query():
                    break
                with self._lock:
                    queue.popleft()
                    self.n_pending -= 1
                t0, t1 = self._host_ns(start_ev, device), self._host_ns(end_ev, device)
                if rows_of is None:
                    rows.append(row._replace(start_ns=t0, end_ns=max(t1, t0)))
                else:
                    rows.extend(rows_of(t0, max(t1, t0)))
        return rows
