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
gpu_util_pct is reported but is no evidence of compute: NVML counts a period as
busy when any kernel ran in it, so one small kernel, or a NCCL kernel spinning
while it waits for a peer, reads 100%. No detector uses it (docs/instrumentation.md).

PCIe throughput comes from the cumulative byte counters
(NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES, one field-values call, a rate between two
samples) where the driver has them: nvmlDeviceGetPcieThroughput samples the bus
for 20 ms per call (~40 ms for TX and RX, every sample). It is the fallback.

NVLink throughput is the sum over every link that answers: NVML's throughput
fields are per link (the link is the field's scopeId, and a request without one
reads link 0 only), and an absent or inactive link answers NOT_SUPPORTED.

Which GPU: until the training thread uses CUDA, CUDA_VISIBLE_DEVICES[local rank]
(gpu_common.local_device_index); from then on the device it uses, by UUID
(gpu_common.note_rank_device), which holds whatever CUDA_DEVICE_ORDER,
set_device or MIG make of the indices.

pynvml comes from the nvidia-ml-py package; without a driver, NVML does not
initialise and the sampler is off (one info line, see gpu_common).
"""

import os

from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon
from collectors.instrument.gpu_common import GPU_MEM_USED_MB, RANK_GPU, gpu_unavailable, local_device_index

MB = 2**20


class NvmlSampler:
    """Reads one device; `sample(t_ns)` -> [(metric, value)]."""

    def __init__(self, nvml, handle):
        self.nvml = nvml
        self.handle = handle
        self.readers = {
            "gpu_util_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "mem_util_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).memory,
            GPU_MEM_USED_MB: lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / MB,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temp_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "clock_event_reasons": self._clock_event_reasons,
        }
        self.pcie_throughput = {  # the fallback: 20 ms of bus sampling per call
            "pcie_tx_mb_per_s": lambda: (
                nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) / 1024.0
            ),  # NVML reports KB/s
            "pcie_rx_mb_per_s": lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) / 1024.0,
        }
        self.pcie_fields = [
            getattr(nvml, n, None) for n in ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
        ]
        if None in self.pcie_fields:
            self.pcie_fields = None
            self.readers.update(self.pcie_throughput)
        self._last_pcie = None  # (t_ns, tx_bytes, rx_bytes), cumulative counters
        self.nvlink_fields = [
            getattr(nvml, n, None)
            for n in ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
        ]
        self.nvlink_ok = all(f is not None for f in self.nvlink_fields)
        # every link NVML may have; narrowed to those that answer at the first sample
        self.nvlink_links = list(range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0)))
        self._last_nvlink = None  # (t_ns, {link: (tx_kib, rx_kib)}), cumulative counters

    def _clock_event_reasons(self):
        nvml = self.nvml
        read = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return float(read(self.handle))

    def _nvlink_counters(self) -> dict:
        """{link: (tx_kib, rx_kib)} of the links that answered this time."""
        nvml, tx_id, rx_id = self.nvml, *self.nvlink_fields
        ids = [(field, link) for link in self.nvlink_links for field in (tx_id, rx_id)]
        try:
            values = list(nvml.nvmlDeviceGetFieldValues(self.handle, ids))
        except nvml.NVMLError:
            # NVML answers per value (each value's nvmlReturn); should a driver
            # refuse the whole request, ask link by link so one bad link hides no other
            values = []
            for link in self.nvlink_links:
                try:
                    values += nvml.nvmlDeviceGetFieldValues(self.handle, [(tx_id, link), (rx_id, link)])
                except nvml.NVMLError:
                    continue
        read = {}
        for v in values:
            if v.nvmlReturn == nvml.NVML_SUCCESS:  # else: NOT_SUPPORTED, a link not there
                read[(v.fieldId, v.scopeId)] = float(v.value.ullVal)
        return {
            link: (read[(tx_id, link)], read[(rx_id, link)])
            for link in self.nvlink_links
            if (tx_id, link) in read and (rx_id, link) in read
        }

    def _nvlink(self, t_ns) -> list:
        counters = self._nvlink_counters()
        if self._last_nvlink is None:
            if not counters:
                raise RuntimeError("no NVLink link reports throughput")
            self.nvlink_links = sorted(counters)  # stop asking for links that are not there
        last, self._last_nvlink = self._last_nvlink, (t_ns, counters)
        if last is None or t_ns <= last[0]:
            return []
        # per link, so that a link missing from one sample or a counter that went
        # back (reset) drops that link's interval instead of skewing the sum
        tx_kib = rx_kib = 0.0
        paired = 0
        for link, (tx, rx) in counters.items():
            before = last[1].get(link)
            if before is not None and tx >= before[0] and rx >= before[1]:
                tx_kib += tx - before[0]
                rx_kib += rx - before[1]
                paired += 1
        if not paired:
            return []  # no link read twice: no rate, rather than a false 0 MB/s
        per_s = 1e9 / (t_ns - last[0]) / 1024.0  # KiB counters -> MB/s
        return [("nvlink_tx_mb_per_s", tx_kib * per_s), ("nvlink_rx_mb_per_s", rx_kib * per_s)]

    def _pcie(self, t_ns) -> list:
        """PCIe MB/s from the byte counters between this sample and the last; the
        first time they do not answer, the throughput calls take over for good."""
        nvml = self.nvml
        try:
            values = nvml.nvmlDeviceGetFieldValues(self.handle, list(self.pcie_fields))
            tx, rx = (float(v.value.ullVal) for v in values if v.nvmlReturn == nvml.NVML_SUCCESS)
        except Exception:
            if self._last_pcie is None:
                self.pcie_fields = None
                self.readers.update(self.pcie_throughput)
            return []
        last, self._last_pcie = self._last_pcie, (t_ns, tx, rx)
        if last is None or t_ns <= last[0] or tx < last[1] or rx < last[2]:
            return []
        per_s = 1e9 / (t_ns - last[0]) / MB
        return [("pcie_tx_mb_per_s", (tx - last[1]) * per_s), ("pcie_rx_mb_per_s", (rx - last[2]) * per_s)]

    def sample(self, t_ns: int) -> list:
        out = self._pcie(t_ns) if self.pcie_fields else []
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
    sampler = [NvmlSampler(nvml, handle), None]  # the sampler, the UUID it was opened by
    rec.meta.setdefault("gpu", {})["nvml_device"] = local_device_index()

    def run():
        while not rec._stop.wait(interval_s):
            uuid = RANK_GPU["uuid"]
            if uuid is not None and uuid != sampler[1]:  # the device the training thread uses
                sampler[1] = uuid
                try:
                    sampler[0] = NvmlSampler(nvml, nvml.nvmlDeviceGetHandleByUUID(uuid))
                    rec.meta["gpu"]["nvml_device"] = uuid
                except Exception as exc:
                    rec.record_error("nvml_sampler", exc)
            t = now_ns()
            for metric, value in sampler[0].sample(t):
                rec.add_sample(t, metric, value)

    start_daemon(run, "diagnose-nvml-sampler")
