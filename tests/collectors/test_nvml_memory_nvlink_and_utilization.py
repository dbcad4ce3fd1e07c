"""Issue 21, NVML fixes: memory_imbalance reads the device memory the NVML
sampler writes (and says so when it falls back to host RSS), NVLink throughput
is summed over every link, and GPU utilization is never evidence of compute.
NVML is faked (no GPU here) by tests/support/fake_pynvml.py, which
follows pynvml name for name; the sampler, writer, loader and detectors are real."""

import glob
import os

import pytest

import diagnose
from collectors.instrument.gpu_common import GPU_MEM_USED_MB
from collectors.instrument.nvml_sampler import NvmlSampler
from collectors.part_writer import PartWriter
from collectors.schema import rank_dir_name
from diagnose.analysis.findings.run_detectors import detect
from tests.support.fake_pynvml import fake_pynvml
from tests.support.jobs import REPO
from tests.support.synthetic_run import write_synthetic_run

GIB = 2**30


def _run_with_memory(tmp_path, device_gib: dict | None, rss_mb: dict) -> str:
    """A 4-rank, 2-stage synthetic run whose samples are replaced: device memory
    from the real NvmlSampler reading a faked NVML per rank (device_gib: rank ->
    GiB used; None: no NVML) and host RSS (rank -> MB)."""
    run_dir = write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=12, pp=2)
    for rank in range(4):
        rank_dir = os.path.join(run_dir, "traces", rank_dir_name(rank))
        for old in glob.glob(os.path.join(rank_dir, "samples-*")):
            os.remove(old)
        rows = []
        if device_gib is not None:
            nvml = fake_pynvml(nvlink=False)
            handle = nvml.nvmlDeviceGetHandleByIndex(rank)
            sampler = NvmlSampler(nvml, handle)
            for k in range(3):  # the allocator's reserve grows to its peak
                nvml.mem_used[handle] = int(device_gib[rank] * GIB * (k + 1) / 3)
                rows += [(k * 10**9, metric, value) for metric, value in sampler.sample(k * 10**9)]
        rows += [(k * 10**9, "rss_mb", float(rss_mb[rank])) for k in range(3)]
        PartWriter(rank_dir).write_samples(rows)
    return run_dir


def _memory_findings(run_dir):
    return [f for f in detect(diagnose.load(run_dir)) if f["kind"] == "memory_imbalance"]


def test_memory_imbalance_names_the_rank_with_1_5x_the_device_memory(tmp_path):
    # host RSS points at rank 0 (2x): a detector that read RSS would blame it
    run_dir = _run_with_memory(
        tmp_path, device_gib={0: 10, 1: 10, 2: 10, 3: 15}, rss_mb={0: 4000, 1: 2000, 2: 2000, 3: 2000}
    )
    (finding,) = _memory_findings(run_dir)
    assert finding["ranks"] == [3]
    assert finding["stage"] == 1  # ranks 2 and 3 run pipeline stage 1
    assert finding["callsite"] is None  # memory held has no line (detector docstring)
    assert finding["severity"] == "warning"  # 1.5x: >= 1.3, < 1.6
    metrics = finding["metrics"]
    assert metrics["peak_device_mem_mb"] == pytest.approx(15 * 1024)
    assert metrics["median_peak_device_mem_mb"] == pytest.approx(10 * 1024)
    assert metrics["peak_ratio_x"] == pytest.approx(1.5)
    assert not any("rss" in k for k in metrics)
    assert "GPU memory" in finding["title"] and f"[{GPU_MEM_USED_MB}]" in finding["title"]


def test_memory_imbalance_falls_back_to_rss_and_says_so(tmp_path):
    run_dir = _run_with_memory(tmp_path, device_gib=None, rss_mb={0: 4000, 1: 2000, 2: 2000, 3: 2000})
    (finding,) = _memory_findings(run_dir)
    assert finding["ranks"] == [0] and finding["stage"] == 0 and finding["callsite"] is None
    assert finding["metrics"]["peak_rss_mb"] == pytest.approx(4000)
    assert not any("device" in k for k in finding["metrics"])
    assert "[rss_mb]" in finding["title"] and "no NVML device memory" in finding["title"]


@pytest.mark.parametrize(
    "refuse_whole_request", [False, True], ids=["link-answers-not-supported", "request-raises-not-supported"]
)
def test_nvlink_throughput_is_the_sum_over_links(refuse_whole_request):
    """Links 0-3 carry 10, 20, 30 and 40 MB/s out (half that in); link 4 is not
    there: NVML answers NOT_SUPPORTED in its value, or (some drivers) the whole
    request raises NVMLError_NotSupported and the sampler asks link by link."""
    nvml = fake_pynvml()
    nvml.refuse_whole_request = refuse_whole_request
    nvml.nvlink = {link: {"tx": 0, "rx": 0} for link in range(4)}
    sampler = NvmlSampler(nvml, "gpu0")
    assert "nvlink_tx_mb_per_s" not in dict(sampler.sample(1_000_000_000))  # one reading: no rate
    assert sampler.nvlink_links == [0, 1, 2, 3]  # links that are not there are no longer asked
    for link, counters in nvml.nvlink.items():  # KiB in the next half second
        counters.update(tx=(link + 1) * 10 * 1024 // 2, rx=(link + 1) * 5 * 1024 // 2)
    got = dict(sampler.sample(1_500_000_000))
    assert got["nvlink_tx_mb_per_s"] == pytest.approx(10 + 20 + 30 + 40)
    assert got["nvlink_rx_mb_per_s"] == pytest.approx(5 + 10 + 15 + 20)
    assert sampler.nvlink_ok


def test_nvlink_link_lost_between_samples_drops_that_link_not_the_sum():
    nvml = fake_pynvml()
    nvml.nvlink = {0: {"tx": 0, "rx": 0}, 1: {"tx": 0, "rx": 0}}
    sampler = NvmlSampler(nvml, "gpu0")
    sampler.sample(0)
    nvml.nvlink[0].update(tx=1024, rx=1024)  # 1 MB each way in 1 s
    del nvml.nvlink[1]  # link 1 stops answering
    got = dict(sampler.sample(1_000_000_000))
    assert got["nvlink_tx_mb_per_s"] == pytest.approx(1.0)
    assert got["nvlink_rx_mb_per_s"] == pytest.approx(1.0)


def test_no_nvlink_on_the_device_turns_nvlink_sampling_off():
    nvml = fake_pynvml()
    nvml.nvlink = {}  # a PCIe-only GPU
    sampler = NvmlSampler(nvml, "gpu0")
    assert not any(m.startswith("nvlink") for m, _ in sampler.sample(0))
    assert not sampler.nvlink_ok


def test_gpu_utilization_is_never_evidence_in_the_analysis():
    """gpu_util_pct reads 100% for one small kernel or a NCCL kernel waiting on a
    peer (nvml_sampler's docstring): it is plotted, and no detector or table reads it."""
    readers = [
        str(p.relative_to(REPO))
        for p in (REPO / "diagnose" / "analysis").rglob("*.py")
        if "util_pct" in p.read_text(encoding="utf-8")
    ]
    assert readers == []
