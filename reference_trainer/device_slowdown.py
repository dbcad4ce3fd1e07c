"""A slower GPU, made on a real GPU: the straggler and slow_stage faults on CUDA.

A slow GPU (throttled, fewer SMs, a bad part) makes its kernels take longer;
the host does not notice: it queues work and runs ahead, and the other ranks
find out inside their NCCL kernels. A fault that slept on the host or
synchronized the device to time the compute would look nothing like that (the
host would wait, the device would idle). So on CUDA the compute of each
forward/backward is followed, on the same stream, by a spin kernel
(`torch.cuda._sleep`, PyTorch's own test helper) lasting (factor - 1) x that
compute's device time: the stream is busy F times as long, and nothing on the
host waits.

The device time of a phase is known only once its kernels have run, so the
spin after a phase is sized from the latest phase of the same kind already
measured (events queried without blocking; a backward costs about twice a
forward, so sizing a forward's spin from the backward before it made the
forward ~(F-1) x the backward), and its cycles per millisecond from one spin
timed the same way at start-up. The first phases of each kind (before a
measurement is back) are not slowed: a warm-up step, as after any change of clocks.
"""

import torch

CALIBRATION_CYCLES = 20_000_000  # ~10-20 ms at 1-2 GHz: long against launch jitter
MAX_PENDING = 64  # event pairs awaiting their times; the oldest are dropped


class DeviceSlowdown:
    def __init__(self, factor: float):
        self.factor = factor
        self.cycles_per_ms: float | None = None
        self.compute_ms: dict = {}  # phase kind -> its latest measured device time
        self._pending: list = []  # (start, end, kind) of phases not yet measured
        start = self.begin()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        self._calibration = (start, self._record())

    @staticmethod
    def _record():
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current stream
        return event

    def begin(self):
        """Call before a phase's compute: marks where it starts on the stream."""
        return self._record()

    def end(self, start, kind: float = 1.0) -> int:
        """Call after a phase's compute: queue the spin that makes it F times as
        long on the device. `kind`: which phases are alike (the caller's weight:
        1 forward, 2 backward). Returns the cycles queued (0 before a measurement)."""
        self._pending.append((start, self._record(), kind))
        del self._pending[:-MAX_PENDING]
        self._collect()
        if self.cycles_per_ms is None or kind not in self.compute_ms:
            return 0
        cycles = int((self.factor - 1.0) * self.compute_ms[kind] * self.cycles_per_ms)
        if cycles > 0:
            torch.cuda._sleep(cycles)
        return cycles

    def _collect(self) -> None:
        """Read the times of what has finished, never waiting for the rest."""
        if self.cycles_per_ms is None and self._calibration[1].query():
            start, end = self._calibration
            self.cycles_per_ms = CALIBRATION_CYCLES / max(start.elapsed_time(end), 1e-3)
        while self._pending and self._pending[0][1].query():
            start, end, kind = self._pending.pop(0)
            self.compute_ms[kind] = start.elapsed_time(end)
