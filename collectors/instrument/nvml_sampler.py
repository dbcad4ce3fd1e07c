"""NVML samples of this rank's own GPU, in a thread, every
DIAGNOSE_NVML_INTERVAL_S (default 1 s; 0 turns the sampler off).

What the CPU-side trace cannot see: whether the GPU is busy (gpu_util_pct: the
share of the last sample period in which any kernel ran), how full its memory is,
and why it may run slow though busy: power draw, SM clock, temperature and the
clock-event (throttle) reasons bitmask (power cap, thermal, sync boost...).
PCIe and NVLink throughput show input copies and peer traffic. Metrics:

    gpu_util_pct  mem_util_pct  mem_used_mb  power_w  sm_clock_mhz  temp_c
    clock_event_reasons  pcie_tx_mb_per_s  pcie_rx_mb_per_s
    nvlink_tx_mb_per_s  nvlink_rx_mb_per_s

A metric the device does not support is dropped after its first failure.
pynvml comes from the nvidia-ml-py package; without a driver, NVML does not
initialise and the sampler is off (one info line, see gpu_common).
"""
import os

from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon
from collectors.instrument.gpu_common import gpu_unavailable, local_device_index

MB = 2 ** 20


class NvmlSampler:
    """Reads one device; `sample(t_ns)` -> [(metric, value)]."""

    def __init__(self, nvml, handle):
        self.nvml = nvml
        self.handle = handle
        self.readers = {
            "gpu_util_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "mem_util_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).memory,
            "mem_used_mb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / MB,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temp_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "clock_event_reasons": self._clock_event_reasons,
            "pcie_tx_mb_per_s": lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_TX_BYTES) / 1024.0,   # NVML reports KB/s
            "pcie_rx_mb_per_s": lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_RX_BYTES) / 1024.0,
        }
        self.nvlink_fields = [getattr(nvml, n, None) for n in
                              ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
                               "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")]
        self.nvlink_ok = all(f is not None for f in self.nvlink_fields)
        self._last_nvlink = None  # (t_ns, tx_kib, rx_kib), cumulative counters

    def _clock_event_reasons(self):
        nvml = self.nvml
        read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return float(read(self.handle))

    def _nvlink(self, t_ns) -> list:
        values = self.nvml.nvmlDeviceGetFieldValues(self.handle, self.nvlink_fields)
        if any(getattr(v, "nvmlReturn", 0) != 0 for v in values):
            raise RuntimeError("NVLink throughput fields not supported")
        tx, rx = (float(v.value.ullVal) for v in values)
        last, self._last_nvlink = self._last_nvlink, (t_ns, tx, rx)
        if last is None or t_ns <= last[0]:
            return []
        per_s = 1e9 / (t_ns - last[0]) / 1024.0   # KiB counters -> MB/s
        return [("nvlink_tx_mb_per_s", (tx - last[1]) * per_s),
                ("nvlink_rx_mb_per_s", (rx - last[2]) * per_s)]

    def sample(self, t_ns: int) -> list:
        out = []
        for metric, read in list(self.readers.items()):
            try:
                out.append((metric, float(read())))
            except Exception:
                del self.readers[metric]  # not supported here: stop asking
        if self.nvlink_ok:
            try:
                out.extend(self._nvlink(t_ns))
            except Exception:
                self.nvlink_ok = False
        return out


def open_device(nvml):
    """Handle of this rank's GPU (by index or UUID), or None."""
    which = local_device_index()
    if which is None:
        return None
    if which.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(which))
    return nvml.nvmlDeviceGetHandleByUUID(which)


def install(rec):
    interval_s = float(os.environ.get("DIAGNOSE_NVML_INTERVAL_S", "1.0"))
    if interval_s <= 0:
        return
    try:
        import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:
        gpu_unavailable(rec, "nvml_sampler", f"NVML: {type(exc).__name__}: {exc}".rstrip(": "))
        return
    try:
        handle = open_device(nvml)
    except Exception as exc:
        handle, reason = None, f"NVML cannot open this rank's GPU: {exc}"
    else:
        reason = "this rank sees no GPU (CUDA_VISIBLE_DEVICES)"
    if handle is None:
        gpu_unavailable(rec, "nvml_sampler", reason)
        return
    sampler = NvmlSampler(nvml, handle)
    rec.meta.setdefault("gpu", {})["nvml_device"] = local_device_index()

    def run():
        while not rec._stop.wait(interval_s):
            t = now_ns()
            for metric, value in sampler.sample(t):
                rec.add_sample(t, metric, value)

    start_daemon(run, "diagnose-nvml-sampler")
