"""Issue 44, W1: a rank that drives two GPUs (a pipeline stage per device, or a
tensor on another device than the current one) gets each collective's device
rows from events on *its tensor's* device, mapped by that device's own anchor.

No GPU here. Two devices are faked as CUDA keeps them: each has its own clock
(GPU clocks are not synchronised) and its current stream's queue; an event lives
on the device of the stream it was recorded on (None: the current device's
current stream); elapsed_time between events of two devices raises, as
cudaEventElapsedTime does. Streams have torch.cuda.Stream's device_index and
cuda_stream."""

import pytest

from collectors.instrument import collectives
from collectors.instrument.collective_events import CollectiveEvents
from collectors.instrument.collective_tracker import Tracker
from collectors.instrument.cuda_event_timer import CudaEventTimer
from collectors.recorder import Recorder

MS = 1_000_000


class Device:
    def __init__(self, clock_ms):
        self.clock_ms, self.queue_end_ms = clock_ms, clock_ms


DEVICES = {}
CURRENT = [0]


class Stream:
    def __init__(self, device_index, side=False):
        self.device_index, self.side = device_index, side
        self.cuda_stream = 1000 * device_index + side


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.device, self.t_ms = None, None

    def record(self, stream=None):
        stream = stream or Stream(CURRENT[0])
        dev = DEVICES[stream.device_index]
        self.device = stream.device_index
        self.t_ms = dev.clock_ms if stream.side else max(dev.queue_end_ms, dev.clock_ms)

    def query(self):
        return self.t_ms is not None and DEVICES[self.device].clock_ms >= self.t_ms

    def elapsed_time(self, end_event):
        if end_event.device != self.device:
            raise RuntimeError("CUDA error: invalid resource handle")  # events of two devices
        return end_event.t_ms - self.t_ms


class Tensor:
    is_cuda = True

    def __init__(self, device_index):
        self.device = device_index

    def element_size(self):
        return 4

    def numel(self):
        return 256


@pytest.fixture
def two_gpus(monkeypatch):
    DEVICES.clear()
    DEVICES.update({0: Device(5_000.0), 1: Device(90_000.0)})  # unrelated device clocks
    CURRENT[0] = 0
    host = [10_000 * MS]
    rec = Recorder(None)
    rec.max_buffered = 1000
    tracker = Tracker(rec, dist=None)
    monkeypatch.setattr(tracker, "group_info", lambda group, tensor=None: ("pg", "0", "0,1", False))
    timer = CudaEventTimer(
        Event,
        clock=lambda: host[0],
        device_of=lambda stream: CURRENT[0] if stream is None else stream.device_index,
        side_stream_for=lambda device: Stream(device, side=True),
    )
    tracker.device = CollectiveEvents(
        timer, ready=lambda: True, capturing=lambda: False, stream_of=lambda tensor: Stream(tensor.device)
    )

    def all_reduce(tensor, op=None, group=None, async_op=False):
        DEVICES[tensor.device].queue_end_ms += 3.0  # on its device's current stream
        return None

    return rec, timer, collectives._wrap_collective(tracker, "all_reduce", all_reduce)


def test_each_call_is_timed_on_its_tensors_device_by_that_devices_anchor(two_gpus):
    rec, timer, all_reduce = two_gpus
    DEVICES[1].queue_end_ms += 7.0  # device 1 is 7 ms behind its host: the call arrives then
    all_reduce(Tensor(1))  # current device 0, tensor on device 1
    all_reduce(Tensor(0))
    for dev in DEVICES.values():
        dev.clock_ms += 50.0  # both devices ran what they had
    for row in timer.poll():  # the first poll anchors each device it has events of
        rec.add(row)
    assert rec.errors == []
    assert sorted(timer.anchors) == [0, 1]
    device_rows = [r for r in rec.events if r[14] == "gpu"]
    # anchors made 50 ms after the calls on both devices: host 10 s <-> device clock now
    got = sorted((r[0], (r[2] - 10_000 * MS) / MS) for r in device_rows)
    assert got == [("collective", -50.0), ("collective", -43.0), ("done", -47.0), ("done", -40.0)]
