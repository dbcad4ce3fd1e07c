"""A fake of a GPU for the collectives' CUDA path: CUDA events as
torch.cuda.Event behaves, name for name (record(stream=None), query(),
elapsed_time(end_event), synchronize()), over a device clock and one stream's
queue; a Work with NCCL's _get_duration; and `traced`, a fixture of a Tracker
wired to them (tests/collectors/test_collective_events*.py)."""

import pytest

from collectors.instrument import collectives
from collectors.instrument.collective_events import CollectiveEvents
from collectors.instrument.collective_tracker import Tracker
from collectors.instrument.cuda_event_timer import CudaEventTimer
from collectors.recorder import Recorder
from collectors.schema import fields

MS = 1_000_000


class FakeGPU:
    """The device clock (now_ms), the current stream's queue (queue_end_ms) and
    the NCCL stream's, where async collectives run (nccl_end_ms)."""

    now_ms, queue_end_ms, nccl_end_ms, capturing = 0.0, 0.0, 0.0, False


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing, self.t_ms, self.side = enable_timing, None, False

    def record(self, stream=None):
        self.side = stream == "side"  # the idle side stream runs it at once
        self.t_ms = FakeGPU.now_ms if self.side else max(FakeGPU.queue_end_ms, FakeGPU.now_ms)

    def query(self):
        return self.t_ms is not None and FakeGPU.now_ms >= self.t_ms

    def synchronize(self):
        assert self.side, "only the anchor on the idle side stream may be waited for"

    def elapsed_time(self, end_event):
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return end_event.t_ms - self.t_ms


class Tensor:
    is_cuda = True

    def element_size(self):
        return 4

    def numel(self):
        return 1024

    def mul_(self, factor):
        self.scaled_by = factor
        return self


class Work:
    timing = False  # TORCH_NCCL_ENABLE_TIMING in the process group

    def __init__(self, kernel_ms):
        self.kernel_ms, self.end_ms = kernel_ms, FakeGPU.nccl_end_ms

    def _get_duration(self):  # ms between NCCL's own start and end events of the kernel
        if not self.timing:
            raise RuntimeError("getDuration only works if timing was enabled")
        if FakeGPU.now_ms < self.end_ms:  # cudaEventElapsedTime on an unfinished event
            raise RuntimeError("CUDA error: device not ready")
        return self.kernel_ms

    def wait(self, timeout=None):  # the current stream now waits for the NCCL stream
        FakeGPU.queue_end_ms = max(FakeGPU.queue_end_ms, FakeGPU.nccl_end_ms)
        return True

    def is_completed(self):
        return False


def queue(ms):
    """`ms` of work queued on the current stream."""
    FakeGPU.queue_end_ms = max(FakeGPU.queue_end_ms, FakeGPU.now_ms) + ms


@pytest.fixture
def traced(monkeypatch):
    FakeGPU.now_ms, FakeGPU.queue_end_ms, FakeGPU.nccl_end_ms, FakeGPU.capturing = 100.0, 100.0, 0.0, False
    host = [10_000 * MS]
    anchors = []
    rec = Recorder(None)
    rec.max_buffered = 10_000
    tracker = Tracker(rec, dist=None)
    groups = {"dp": ("pg", "0", "0,1", False), "gloo": ("pg2", "1", "0,1", True)}
    monkeypatch.setattr(tracker, "group_info", lambda group, tensor=None: groups[group or "dp"])
    timer = CudaEventTimer(
        lambda: Event(enable_timing=True),
        side_stream="side",
        clock=lambda: host[0],
        on_anchor=lambda *a: anchors.append(a),
    )
    tracker.device = CollectiveEvents(timer, ready=lambda: True, capturing=lambda: FakeGPU.capturing)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if not async_op:  # torch >= 2.8: on the current stream, after what it holds
            queue(3.0)
            return None
        # on the NCCL stream, once the current stream has reached the call
        FakeGPU.nccl_end_ms = max(FakeGPU.nccl_end_ms, FakeGPU.queue_end_ms, FakeGPU.now_ms) + 3.0
        return Work(3.0)

    monkeypatch.setattr(Work, "wait", collectives._wrap_wait(tracker, Work.wait))
    return dict(
        rec=rec,
        timer=timer,
        host=host,
        anchors=anchors,
        tracker=tracker,
        all_reduce=collectives._wrap_collective(tracker, "all_reduce", all_reduce),
    )


_DETAIL = fields("detail")


def device_rows(rec):
    """The recorder's rows from the device (CUDA events, NCCL's timing)."""
    return [r for r in rec.events if _DETAIL(r) in ("gpu", "gpu:wait", "gpu:nccl")]
