"""pynvml faked name for name (no GPU here): the NVML sampler, the node health and the
NVML tests read it as they read the real module."""

import types


class NVMLError(Exception):
    """pynvml's: its subclasses are named after NVML's return codes."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):  # pynvml's name
    def __init__(self):
        super().__init__(3)


def fake_pynvml(fail_init=False, nvlink=True):
    """pynvml as the sampler calls it, name for name (nvidia-ml-py 12/13):
    constants keep their real values. `m.nvlink` is {link: {"tx": KiB, "rx": KiB}},
    cumulative counters; a link not in it answers NOT_SUPPORTED in its value's
    nvmlReturn, as NVML does, or, with `m.refuse_whole_request`, makes the whole
    nvmlDeviceGetFieldValues call raise (what a driver may do). `m.mem_used` is
    {handle: bytes} (3 GiB by default)."""
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    m.NVML_SUCCESS, m.NVML_ERROR_NOT_SUPPORTED = 0, 3
    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU = 1, 0
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.NVML_NVLINK_MAX_LINKS = 36
    if nvlink:
        m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    m.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, m.NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198
    m.nvlink = {0: {"tx": 0, "rx": 0}}
    m.pcie_bytes = None  # {"tx": bytes, "rx": bytes} where the driver has the counters
    m.refuse_whole_request = False
    m.mem_used = {}
    m.opened = []

    def init():
        if fail_init:
            raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByIndex = lambda i: m.opened.append(i) or f"gpu{i}"
    m.nvmlDeviceGetHandleByUUID = lambda u: m.opened.append(u) or f"gpu-{u}"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=m.mem_used.get(h, 3 * 2**30), total=80 * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500  # mW
    m.nvmlDeviceGetClockInfo = lambda h, c: 1980
    m.nvmlDeviceGetTemperature = lambda h, s: 61
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4  # SW power cap

    def pcie(h, which):
        if which == m.NVML_PCIE_UTIL_RX_BYTES:
            raise NVMLError_NotSupported()
        return 2048  # KB/s

    m.nvmlDeviceGetPcieThroughput = pcie

    def fields(h, field_ids):
        out = []
        for fid in field_ids:  # an int, or (fieldId, scopeId) as pynvml takes it
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            if fid in (197, 198):  # PCIe byte counters
                ok = m.pcie_bytes is not None
                out.append(
                    types.SimpleNamespace(
                        fieldId=fid,
                        scopeId=scope,
                        nvmlReturn=0 if ok else m.NVML_ERROR_NOT_SUPPORTED,
                        value=types.SimpleNamespace(ullVal=m.pcie_bytes["tx" if fid == 197 else "rx"] if ok else 0),
                    )
                )
                continue
            link = m.nvlink.get(scope)
            if link is None and m.refuse_whole_request:
                raise NVMLError_NotSupported()
            ok = link is not None and fid in (138, 139)
            out.append(
                types.SimpleNamespace(
                    fieldId=fid,
                    scopeId=scope,
                    nvmlReturn=0 if ok else m.NVML_ERROR_NOT_SUPPORTED,
                    value=types.SimpleNamespace(ullVal=link["tx" if fid == 138 else "rx"] if ok else 0),
                )
            )
        return out

    m.nvmlDeviceGetFieldValues = fields
    return m
