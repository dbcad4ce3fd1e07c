"""CUDA-graph capture, as every thread of diagnose must see it (issue 44, B3).

Why: `torch.cuda.graph` captures in CUDA's global mode by default. While any
thread captures, a call such as `cudaEventQuery` or `cudaEventSynchronize` from
*another* thread is "unsafe" and invalidates the user's capture (PyTorch's own
NCCL watchdog hit this: pytorch#104487). `torch.cuda.is_current_stream_capturing()`
only sees the calling thread's current stream, so our poller thread cannot ask
it. Hence a process-wide gate:

- `CUDAGraph.capture_begin` / `capture_end` are wrapped to count the captures
  in progress (`torch.cuda.graph`, `make_graphed_callables` and torch.compile's
  CUDA-graph trees all go through them);
- the poller asks, queries events and renews its anchor only inside
  `GATE.idle()`, which holds the gate's lock: a capture cannot begin while the
  poller queries, and the poller skips its turn while one is in progress
  (its pending events wait for the next poll; nothing is lost);
- the training-thread hooks record no event while anything captures
  (`capturing()`): an event recorded into a capture has no time and would
  change the user's graph; `Work.is_completed()` is not asked either;
- `CUDAGraph.replay` is timed with a pair of events on the replaying stream:
  a replayed graph's kernels run without any of our hooks, so the replay is
  the only span of them we can have (rows "gpu:graph_replay").

The lock is held by the poller for one pass over its pending events (no I/O)
and by `capture_begin` to bump a counter: a capture waits at most one pass.
"""

import functools
import threading


class CaptureGate:
    def __init__(self):
        self.active = 0
        self.lock = threading.Lock()

    def begin(self) -> None:
        with self.lock:
            self.active += 1

    def end(self) -> None:
        with self.lock:
            self.active = max(self.active - 1, 0)

    def idle(self) -> "_Idle":
        """`with GATE.idle() as idle:` idle is True when no capture is in
        progress, and none can begin until the block ends."""
        return _Idle(self)


class _Idle:
    def __init__(self, gate: CaptureGate):
        self.gate = gate

    def __enter__(self) -> bool:
        self.gate.lock.acquire()
        return self.gate.active == 0

    def __exit__(self, *exc) -> None:
        self.gate.lock.release()


GATE = CaptureGate()


def capturing(torch) -> bool:
    """On the calling thread: is any capture in progress (ours to see through
    the gate, or one begun on this thread's stream some other way)?"""
    if GATE.active:
        return True
    try:  # never initialise CUDA to answer: no context, no capture
        return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def wrap_graph_class(graph_cls, on_replay=None) -> None:
    """Wrap capture_begin/capture_end (the gate) and replay (on_replay(orig, graph)
    times it) on `graph_cls`, torch.cuda.CUDAGraph. Idempotent."""
    if getattr(graph_cls, "_diagnose_wrapped", False):
        return
    begin, end, replay = graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay

    @functools.wraps(begin)
    def capture_begin(self, *args, **kwargs):
        GATE.begin()
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            GATE.end()
            raise

    @functools.wraps(end)
    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            GATE.end()

    @functools.wraps(replay)
    def timed_replay(self, *args, **kwargs):
        if on_replay is None:
            return replay(self, *args, **kwargs)
        return on_replay(lambda: replay(self, *args, **kwargs))

    graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay = capture_begin, capture_end, timed_replay
    graph_cls._diagnose_wrapped = True
