"""Issue 44, NVML: PCIe rates from byte counters (O3) and the sampled GPU found by
UUID (O2), on the pynvml stand-in of tests/support/fake_pynvml.py."""

import sys
import time
import types

import pytest

from collectors.instrument import nvml_sampler
from collectors.instrument.nvml_sampler import NvmlSampler
from collectors.recorder import Recorder
from tests.support.fake_pynvml import fake_pynvml


def test_pcie_rates_come_from_the_byte_counters_not_20_ms_bus_samples():
    """Issue 44 O3: where the driver has NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES, PCIe MB/s
    is their change between samples, and nvmlDeviceGetPcieThroughput (20 ms of bus
    sampling per call) is never called; without them it is the fallback (below)."""
    nvml = fake_pynvml()
    nvml.pcie_bytes = {"tx": 0, "rx": 0}
    nvml.nvmlDeviceGetPcieThroughput = lambda h, which: pytest.fail("a 20 ms throughput sample was taken")
    sampler = NvmlSampler(nvml, "gpu0")
    assert "pcie_tx_mb_per_s" not in dict(sampler.sample(1_000_000_000))  # one reading: no rate yet
    nvml.pcie_bytes.update(tx=30 * 2**20, rx=10 * 2**20)  # in the next half second
    second = dict(sampler.sample(1_500_000_000))
    assert second["pcie_tx_mb_per_s"] == pytest.approx(60.0) and second["pcie_rx_mb_per_s"] == pytest.approx(20.0)


def test_nvml_follows_the_device_the_training_thread_uses_by_uuid(monkeypatch):
    """Issue 44, O2: CUDA_VISIBLE_DEVICES=4,6 and local rank 1 guess NVML's index 6;
    but CUDA's default order is fastest first, not NVML's PCI order, and the script
    may set_device another GPU: once the training thread uses CUDA, the sampler
    opens the device by its UUID (torch.cuda.get_device_properties(i).uuid), the
    name CUDA and NVML share, and samples that one from then on."""
    from collectors.instrument import gpu_common

    nvml = fake_pynvml(nvlink=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("DIAGNOSE_NVML_INTERVAL_S", "0.01")
    monkeypatch.setitem(gpu_common.RANK_GPU, "uuid", None)
    cuda = types.SimpleNamespace(
        current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(uuid="8f1c2e4a-0b7d-4c1e-9a55-3d2f6e7b9c10"),
    )  # torch prints the UUID without NVML's "GPU-"
    rec = Recorder(None)
    try:
        nvml_sampler.install(rec)
        gpu_common.note_rank_device(types.SimpleNamespace(cuda=cuda))  # the script's first CUDA use
        deadline = time.monotonic() + 5
        while len(nvml.opened) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # poll period
    finally:
        rec._stop.set()
    assert nvml.opened == [6, "GPU-8f1c2e4a-0b7d-4c1e-9a55-3d2f6e7b9c10"]
    assert rec.meta["gpu"]["nvml_device"] == "GPU-8f1c2e4a-0b7d-4c1e-9a55-3d2f6e7b9c10"
