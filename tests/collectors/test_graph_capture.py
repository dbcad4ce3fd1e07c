"""Issue 44, B3: a CUDA graph captured while diagnose times the GPU stays valid.

No GPU here. CUDA's global capture mode is faked as the driver enforces it: while
any thread captures, an event query from another thread invalidates the capture
(cudaErrorStreamCaptureInvalidated; PyTorch's own NCCL watchdog hit it,
pytorch#104487); so does one from the capturing thread itself; and an event
recorded on the capturing stream joins the graph.
The graph class has torch.cuda.CUDAGraph's methods and signatures."""

import threading
import time

from collectors.instrument import collectives
from collectors.instrument.collective_events import CollectiveEvents
from collectors.instrument.collective_tracker import Tracker
from collectors.instrument.cuda_event_timer import CudaEventTimer
from collectors.instrument.graph_capture import GATE, wrap_graph_class
from collectors.recorder import Recorder
from collectors.schema import event_row


class Driver:
    capturing_thread = None  # the thread whose stream is being captured in global mode
    invalidated = []  # what invalidated a capture


class Event:
    """torch.cuda.Event: record(stream=None), query(), elapsed_time(end_event)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.t_ms = None

    def record(self, stream=None):
        if Driver.capturing_thread == threading.get_ident() and stream != "side":
            Driver.invalidated.append("an event recorded into the user's graph")
        self.t_ms = time.monotonic() * 1e3

    def query(self):
        if Driver.capturing_thread is not None:  # global mode: unsafe from any thread
            Driver.invalidated.append("cudaEventQuery during a global capture")
        return self.t_ms is not None

    def elapsed_time(self, end_event):
        return end_event.t_ms - self.t_ms


class Graph:
    """torch.cuda.CUDAGraph's capture and replay, capturing in global mode."""

    def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
        Driver.capturing_thread = threading.get_ident()

    def capture_end(self):
        Driver.capturing_thread = None

    def replay(self):
        pass


def test_the_poller_never_queries_while_a_graph_is_captured():
    """A poller thread resolving events in a loop beside a training thread that
    captures 200 graphs: no query lands inside a capture, and what was pending
    during the captures is resolved after them."""
    Driver.invalidated = []
    wrap_graph_class(Graph)
    timer = CudaEventTimer(Event, side_stream="side")
    rows, stop = [], threading.Event()

    def poller():
        while not stop.is_set():
            rows.extend(timer.poll())

    thread = threading.Thread(target=poller)
    thread.start()
    try:
        row = event_row("phase", "gpu:forward", None, None, 0, detail="cuda_event")
        for _ in range(200):
            timer.finish(timer.start(), row)  # before the capture: pending while it runs
            graph = Graph()
            graph.capture_begin()
            time.sleep(0.0005)  # the capture's own work (the scenario)
            graph.capture_end()
    finally:
        stop.set()
        thread.join()
    rows.extend(timer.poll())
    assert Driver.invalidated == []
    assert len(rows) == 200 and GATE.active == 0


def test_no_event_is_recorded_or_asked_inside_a_capture():
    """Inside a capture a collective gets no device events (they would join the
    graph), Work.wait() does not ask is_completed() (an event query), and the
    graph's replays are what is timed."""
    Driver.invalidated = []
    wrap_graph_class(Graph)
    rec = Recorder(None)
    rec.max_buffered = 1000
    tracker = Tracker(rec, dist=None)
    tracker.group_info = lambda group, tensor=None: ("pg", "0", "0,1", False)
    timer = CudaEventTimer(Event, side_stream="side")
    tracker.device = CollectiveEvents(timer, ready=lambda: True, capturing=lambda: GATE.active > 0)

    class Tensor:
        is_cuda = True

        def element_size(self):
            return 4

        def numel(self):
            return 8

    class Work:
        def wait(self, timeout=None):
            return True

        def is_completed(self):
            Event().query()  # ProcessGroupNCCL's is_completed queries the work's end event
            return False

    Work.wait = collectives._wrap_wait(tracker, Work.wait)
    all_reduce = collectives._wrap_collective(
        tracker, "all_reduce", lambda t, op=None, group=None, async_op=False: Work() if async_op else None
    )
    graph = Graph()
    graph.capture_begin()
    all_reduce(Tensor())
    all_reduce(Tensor(), async_op=True).wait()
    graph.capture_end()
    assert Driver.invalidated == [] and timer.waiting() == []
    calls = [r for r in rec.events if r[0] == "collective"]
    assert len(calls) == 2  # the host rows are still written
