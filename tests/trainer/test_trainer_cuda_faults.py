"""The reference trainer's CUDA paths (issue 21): a straggler or slow stage slows
the device, a hung rank blocks, the loss is logged, and nothing in the step
synchronizes the device or sleeps on the host.

There is no GPU here, so CUDA is faked at the level the trainer calls it, name
for name as torch.cuda has it: `Event(enable_timing=..., blocking=...,
interprocess=...)` with `record(stream=None)`, `query()`, `elapsed_time(end_event)`
(an error unless both have completed) and `synchronize()`, and
`_sleep(cycles)`, over a model of one stream: work queues behind the stream's
end, an event completes when the device clock passes it."""

import time

import pytest
import torch

from reference_trainer import device_slowdown
from reference_trainer import faults as faults_module
from reference_trainer.faults import Faults, parse_fault
from reference_trainer.train import LossLog

GHZ_CYCLES_PER_MS = 1_500_000  # the fake GPU's clock: 1.5 GHz


class FakeStream:
    """One CUDA stream: `end_ms` is when its queued work finishes; `now_ms` the device clock."""

    def __init__(self):
        self.end_ms, self.now_ms, self.spins = 0.0, 0.0, []

    def kernel(self, ms: float) -> None:
        self.end_ms = max(self.end_ms, self.now_ms) + ms

    def run_all(self) -> None:
        self.now_ms = self.end_ms


def fake_cuda(monkeypatch):
    stream = FakeStream()

    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            self.enable_timing, self.at_ms = enable_timing, None

        def record(self, stream_=None):
            self.at_ms = max(stream.end_ms, stream.now_ms)

        def query(self):
            return self.at_ms is not None and stream.now_ms >= self.at_ms

        def elapsed_time(self, end_event):
            if not (self.enable_timing and end_event.enable_timing):
                raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
            if not (self.query() and end_event.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            return end_event.at_ms - self.at_ms

        def synchronize(self):
            stream.now_ms = max(stream.now_ms, self.at_ms)

    def _sleep(cycles):
        stream.spins.append(cycles)
        stream.kernel(cycles / GHZ_CYCLES_PER_MS)

    def forbidden(*args, **kwargs):
        raise AssertionError("the step synchronized the device or slept on the host")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", _sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(time, "sleep", forbidden)
    return stream


def test_a_cuda_straggler_makes_its_stream_busy_f_times_as_long_without_waiting(monkeypatch):
    stream = fake_cuda(monkeypatch)
    faults = Faults([parse_fault("straggler:rank=1,factor=2")], rank=1, stage=0, device=torch.device("cuda"))
    phases = []
    for i in range(6):
        start_ms = stream.end_ms
        begun = faults.compute_begins()
        stream.kernel(5.0)  # the phase's own kernels: 5 ms on the device
        faults.compute_ends(begun)
        phases.append(stream.end_ms - start_ms)
        if i % 2:
            stream.run_all()  # the device catches up now and then; the host never waits
    # the calibration spin and the first phase were not measured yet: no spin after it
    assert phases[0] == pytest.approx(5.0 + device_slowdown.CALIBRATION_CYCLES / GHZ_CYCLES_PER_MS)
    # once a phase is measured, every phase is twice as long on the device
    assert phases[2:] == pytest.approx([10.0] * 4)
    assert faults._device_slowdown.cycles_per_ms == pytest.approx(GHZ_CYCLES_PER_MS)


def test_ranks_without_a_compute_fault_queue_nothing(monkeypatch):
    stream = fake_cuda(monkeypatch)
    faults = Faults([parse_fault("slow_stage:stage=1,factor=3")], rank=0, stage=0, device=torch.device("cuda"))
    assert faults.compute_begins() is None
    faults.compute_ends(None)
    assert stream.spins == [] and stream.end_ms == 0.0


def test_a_cuda_hang_blocks_without_sleeping(monkeypatch):
    fake_cuda(monkeypatch)

    class Blocked(Exception):
        pass

    class Lock:  # threading.Event: wait() with no timeout never returns; here it raises instead
        def wait(self, timeout=None):
            raise Blocked

    monkeypatch.setattr(faults_module.threading, "Event", Lock)
    faults = Faults([parse_fault("hang:rank=0,step=3")], rank=0, stage=0, device=torch.device("cuda"))
    faults.step = 3
    with pytest.raises(Blocked):
        faults.before_collective()


class Rows:
    def __init__(self):
        self.rows, self.closed = [], False

    def write(self, row):
        self.rows.append(row)

    def close(self):
        self.closed = True


def test_the_cuda_loss_log_reads_each_loss_once_copied_never_waiting_in_the_step(monkeypatch):
    stream = fake_cuda(monkeypatch)
    rows = Rows()
    log = LossLog(rows, torch.device("cuda"))
    for step in range(3):
        stream.kernel(10.0)  # the step's work, still queued when the host logs it
        log.add({"step": step}, torch.tensor(float(step)))
    assert rows.rows == []  # nothing has run yet; nothing was waited for
    stream.now_ms = 15.0  # step 0's work (and its loss copy) has run
    stream.kernel(10.0)
    log.add({"step": 3}, torch.tensor(3.0))
    assert rows.rows == [{"step": 0, "loss": 0.0}]
    log.close()  # after the last step: the rest, in order
    assert [r["step"] for r in rows.rows] == [0, 1, 2, 3] and rows.closed


def test_no_device_sync_in_the_trainer_step():
    """The step has no torch.cuda.synchronize anywhere (the only host reads of
    device values are the hidden_sync fault's, which is its point)."""
    import ast
    import pathlib

    import reference_trainer

    offenders = []
    for path in pathlib.Path(reference_trainer.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            if (
                isinstance(node, ast.Call)
                and isinstance(func, ast.Attribute)
                and func.attr == "synchronize"
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == "cuda"
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_unpinned_copies_moves_the_offloaded_state_with_blocking_copies_each_step(monkeypatch):
    """The fault's state round trip: mb MB device -> host -> device per step, each copy
    blocking (copy_'s non_blocking left False), from a host buffer allocated once; the
    device buffer comes from torch.zeros(..., device=cuda), here a CPU tensor."""
    real_zeros, copies = torch.zeros, []
    monkeypatch.setattr(torch, "zeros", lambda *shape, device=None, **kw: real_zeros(*shape, **kw))
    real_copy = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        copies.append((self.numel() * self.element_size(), non_blocking))
        return real_copy(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    faults = Faults([parse_fault("unpinned_copies:mb=2")], rank=0, stage=0, device=torch.device("cuda"))
    assert faults.unpinned_copies
    for _ in range(3):
        faults.offload_states()
    assert copies == [(2 * 2**20, False)] * 6
    host = faults._offload[0]
    faults.offload_states()
    assert faults._offload[0] is host  # allocated once, not per step


def test_unpinned_copies_on_cpu_stops_with_one_line():
    with pytest.raises(SystemExit, match="needs CUDA: a CPU run has no host-device copy"):
        Faults([parse_fault("unpinned_copies")], rank=0, stage=0, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="mb >= 0"):
        parse_fault("unpinned_copies:mb=-1")
    assert Faults([], rank=0, stage=0, device=torch.device("cpu")).unpinned_copies is False


def test_each_phase_is_slowed_by_its_own_kind_of_time(monkeypatch):
    """Issue 44 O4: forwards of 5 ms and backwards of 10 ms alternate, factor 2: each
    forward's spin is 5 ms and each backward's 10 (before, each spin was sized from
    the latest phase measured, the other kind: 10 after a forward, 5 after a backward)."""
    stream = fake_cuda(monkeypatch)
    faults = Faults([parse_fault("straggler:rank=1,factor=2")], rank=1, stage=0, device=torch.device("cuda"))
    spins = {1.0: [], 2.0: []}
    for _ in range(4):
        for weight, ms in ((1.0, 5.0), (2.0, 10.0)):
            begun = faults.compute_begins()
            stream.kernel(ms)
            before = len(stream.spins)
            faults.compute_ends(begun, weight=weight)
            spins[weight].extend(c / GHZ_CYCLES_PER_MS for c in stream.spins[before:])
            stream.run_all()
    assert spins[1.0][-3:] == pytest.approx([5.0] * 3) and spins[2.0][-3:] == pytest.approx([10.0] * 3)
