"""Issue 7: GPU collectors, with fakes for NVML and CUDA events (no GPU here),
and their CPU path: one info line, nothing else changes."""

import subprocess
import sys
import time
import warnings

import pytest

from collectors.instrument import net_sampler, nvml_sampler, sync_debug
from collectors.instrument.cuda_event_timer import CudaEventTimer
from collectors.instrument.nvml_sampler import NvmlSampler
from collectors.instrument.torch_profiler import Window
from collectors.profiler_window import parse_window
from collectors.recorder import Recorder
from collectors.schema import event_row
from tests.support.fake_pynvml import fake_pynvml
from tests.support.jobs import REPO


def test_nvml_sampler_reads_metrics_and_drops_unsupported_ones():
    nvml = fake_pynvml()
    sampler = NvmlSampler(nvml, "gpu0")
    first = dict(sampler.sample(1_000_000_000))
    assert first == {
        "gpu_util_pct": 87,
        "mem_util_pct": 40,
        "mem_used_mb": 3072,
        "power_w": 312.5,
        "sm_clock_mhz": 1980,
        "temp_c": 61,
        "clock_event_reasons": 4,
        "pcie_tx_mb_per_s": 2.0,
    }
    assert "pcie_rx_mb_per_s" not in sampler.readers  # unsupported: no longer asked
    nvml.nvlink[0].update(tx=2048 * 10, rx=1024 * 10)  # KiB in the next half second
    second = dict(sampler.sample(1_500_000_000))
    assert second["nvlink_tx_mb_per_s"] == pytest.approx(40.0)
    assert second["nvlink_rx_mb_per_s"] == pytest.approx(20.0)


def test_nvml_install_samples_the_ranks_own_device(monkeypatch):
    nvml = fake_pynvml(nvlink=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("DIAGNOSE_NVML_INTERVAL_S", "0.01")
    rec = Recorder(None)
    try:
        nvml_sampler.install(rec)
        deadline = time.monotonic() + 5
        while not any(m == "gpu_util_pct" for _, m, _ in rec.samples) and time.monotonic() < deadline:
            time.sleep(0.01)  # poll period
    finally:
        rec._stop.set()
    assert nvml.opened == [6]
    assert {"gpu_util_pct", "power_w", "sm_clock_mhz"} <= {m for _, m, _ in rec.samples}


def test_no_driver_is_one_info_line_and_meta(monkeypatch, capsys):
    from collectors.instrument import gpu_common

    monkeypatch.setattr(gpu_common, "_said", [])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    monkeypatch.setenv("RANK", "0")
    rec = Recorder(None)
    nvml_sampler.install(rec)
    gpu_common.gpu_unavailable(rec, "cuda_events", "CPU-only torch build")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("diagnose: info: no usable GPU here (NVML")
    assert rec.meta["gpu"]["available"] is False
    assert rec.meta["gpu"]["off"] == ["nvml_sampler", "cuda_events"]


def test_cpu_machine_prints_one_info_line_for_all_gpu_collectors():
    """The real instrumentors on this GPU-less machine, in a fresh process."""
    code = """
import torch
from collectors.recorder import Recorder
from collectors.instrument import nvml_sampler, cuda_events, sync_debug, net_sampler
rec = Recorder(None)
for m in (nvml_sampler, cuda_events, sync_debug, net_sampler):
    m.install(rec)
lin = torch.nn.Linear(4, 4)
lin(torch.randn(2, 4)).sum().backward()
torch.optim.SGD(lin.parameters(), lr=0.1).step()
rec._stop.set()
print(sorted(rec.meta["gpu"]["off"]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "RANK": "0", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    info = [line for line in proc.stderr.splitlines() if line.startswith("diagnose:")]
    assert len(info) == 1 and info[0].startswith("diagnose: info: no usable GPU here")
    assert proc.stdout.strip() == "['cuda_events', 'nvml_sampler', 'sync_debug']"


class FakeEvent:
    """A CUDA event on a fake GPU clock: completes when the test says so."""

    gpu_now_ms = 0.0

    def __init__(self):
        self.t_ms = None
        self.done = False
        self.synchronized = False
        self.stream = "unset"

    def record(self, stream=None):
        self.stream = stream
        self.t_ms = FakeEvent.gpu_now_ms
        self.done = stream == "side"  # the idle side stream runs at once

    def query(self):
        return self.done

    def synchronize(self):
        assert self.stream == "side", "only anchors may be waited for"
        self.synchronized = True

    def elapsed_time(self, other):
        assert self.done and other.done
        return other.t_ms - self.t_ms


def test_cuda_event_timer_resolves_off_the_hot_path_without_syncing():
    host = [10_000_000_000]
    timer = CudaEventTimer(FakeEvent, side_stream="side", clock=lambda: host[0])
    FakeEvent.gpu_now_ms = 100.0
    timer.set_anchor()  # GPU 100 ms <-> host 10 s
    FakeEvent.gpu_now_ms = 105.0
    start = timer.start()
    FakeEvent.gpu_now_ms = 112.5
    row = event_row("phase", "gpu:forward", None, None, 3, callsite="x.py:1", detail="cuda_event")
    timer.finish(start, row)
    assert timer.poll() == []  # not run on the GPU yet: nothing, no waiting
    start.done = True
    timer.waiting()[0][2].done = True
    (out,) = timer.poll()
    assert out[2:4] == (10_005_000_000, 10_012_500_000)
    assert out[:2] == row[:2] and out[4:] == row[4:]
    assert not start.synchronized and timer.waiting() == []


def test_net_sampler_rates_from_interface_counters(tmp_path):
    def write(iface, rx, tx):
        d = tmp_path / iface / "statistics"
        d.mkdir(parents=True, exist_ok=True)
        (d / "rx_bytes").write_text(f"{rx}\n")
        (d / "tx_bytes").write_text(f"{tx}\n")

    write("lo", 0, 0)
    write("eth0", 1_000_000, 2_000_000)
    sampler = net_sampler.NetSampler(str(tmp_path))
    assert sampler.sample(0) == []
    write("lo", 10**9, 10**9)
    write("eth0", 6_000_000, 3_000_000)
    got = dict(sampler.sample(500_000_000))
    # loopback is reported on its own (a one-node job's traffic), never in the node's totals
    assert got == {
        "net_rx_mb_per_s": 10.0,
        "net_tx_mb_per_s": 2.0,
        "net_rx_mb_per_s:eth0": 10.0,
        "net_tx_mb_per_s:eth0": 2.0,
        "net_rx_mb_per_s:lo": 2000.0,
        "net_tx_mb_per_s:lo": 2000.0,
    }


def test_sync_debug_warnings_become_sync_events_with_callsite():
    rec = Recorder(None)
    rec.max_buffered = 100
    seen = []
    show = sync_debug.make_showwarning(rec, lambda *a: seen.append(str(a[0])))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    (row,) = rec.events
    assert row[0] == "sync" and row[14] == "sync_debug"
    assert row[13].startswith(__file__ + ":")
    assert seen == ["something else"]


def test_sync_debug_adds_no_global_module_hook_on_a_cuda_build():
    """On a CUDA build sync_debug waits for the first forward without a global
    module hook (one would slow every module call of the job): it rides on
    forward_backward's outermost-forward callbacks. The build is the only fake."""
    code = """
import torch
import torch.nn.modules.module as mm
torch.backends.cuda.is_built = lambda: True
from collectors.recorder import Recorder
from collectors.instrument import forward_backward, sync_debug
rec = Recorder(None)
forward_backward.install(rec)
sync_debug.install(rec)
assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks
torch.nn.Sequential(torch.nn.Linear(4, 4))(torch.randn(2, 4))
print(rec.meta["gpu"]["off"])
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "RANK": "0", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['sync_debug']"  # enable() ran at the forward: no GPU here


def test_torch_profiler_window_over_steps(tmp_path):
    class FakeProfiler:
        def __init__(self):
            self.calls, self.step_num = [], 0

        def start(self):
            self.calls.append(("start", self.step_num))

        def step(self):
            self.step_num += 1
            self.calls.append(("step", self.step_num))

        def stop(self):
            self.calls.append(("stop", self.step_num))

        def export_chrome_trace(self, path):
            self.calls.append(("export", path))

    rec = Recorder(None)
    rec.rank_dir, rec.meta, rec.max_buffered = str(tmp_path), {"rank": 3}, 100
    made = []
    window = Window(rec, 2, 4, lambda: made.append(FakeProfiler()) or made[-1])
    for _ in range(8):  # eight steps end
        window.boundary()
    (prof,) = made
    path = str(tmp_path / "torch_profiler" / "rank-00003.pt.trace.json.gz")
    assert prof.calls == [("start", 2), ("step", 3), ("step", 4), ("stop", 4), ("export", path)]
    assert window.path == path and rec.events[-1][0] == "mark"
    assert parse_window("10-12") == (10, 12) and parse_window("7") == (7, 7)
    for bad in ("12-10", "a-b", "", "-3"):
        with pytest.raises(ValueError):
            parse_window(bad)


def test_cuda_event_spans_bracket_forward_backward_and_every_optimizer(tmp_path):
    """cuda_events' own hooks, in a fresh process with CUDA faked where the code
    asks for it (torch.backends.cuda.is_built, torch.cuda.is_available / Event /
    Stream / is_current_stream_capturing): two training steps of two optimizers
    give a gpu:forward, gpu:backward and gpu:optimizer span each, and a gpu:step
    from the first forward to the primary optimizer's step, then between its
    steps. The poller never runs (a 1000 s interval): the last poll at exit
    resolves what the device has finished, and counts, without waiting, what it
    has not (the last step's optimizers). A graph captured first records no
    span (an event inside a capture would join it); its two replays are two
    gpu:graph_replay spans (issue 44, B3). No event but the anchor is ever
    waited for (the fake refuses it)."""
    code = """
import glob, json, sys, torch, pyarrow.parquet as pq
class Event:
    clock, done_until = [0.0], [float("inf")]
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.t_ms, self.stream = None, None
    def record(self, stream=None):
        Event.clock[0] += 1.0
        self.t_ms, self.stream = Event.clock[0], stream
    def query(self):
        return self.t_ms is not None and (self.stream == "side" or self.t_ms <= Event.done_until[0])
    def synchronize(self):
        assert self.stream == "side", "a device sync outside the anchor"
    def elapsed_time(self, end_event):
        return end_event.t_ms - self.t_ms
torch.backends.cuda.is_built = lambda: True
torch.cuda.is_available = lambda: True
torch.cuda.Event, torch.cuda.Stream = Event, lambda *a, **k: "side"
torch.cuda.is_current_stream_capturing = lambda: False
torch.cuda.current_device = lambda: 0
class Properties:
    uuid = "8f1c2e4a-0b7d-4c1e-9a55-3d2f6e7b9c10"
torch.cuda.get_device_properties = lambda index: Properties()
class device:  # torch.cuda.device(index): a context manager
    def __init__(self, index):
        self.index = index
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
torch.cuda.device = device
class CUDAGraph:  # torch.cuda.CUDAGraph's capture and replay
    capturing = False
    def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
        CUDAGraph.capturing = True
    def capture_end(self):
        CUDAGraph.capturing = False
    def replay(self):
        pass
torch.cuda.graphs.CUDAGraph = CUDAGraph
_record = Event.record
def record(self, stream=None):
    assert not CUDAGraph.capturing, "an event recorded inside a capture"
    _record(self, stream)
Event.record = record
from collectors.recorder import Recorder
from collectors.instrument import forward_backward, cuda_events
rec = Recorder(sys.argv[1])
forward_backward.install(rec)
cuda_events.install(rec)
lin, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
opts = [torch.optim.SGD(lin.parameters(), lr=0.1), torch.optim.SGD(head.parameters(), lr=0.1)]
graph = torch.cuda.graphs.CUDAGraph()
graph.capture_begin()   # captured: no span of ours; its replays are the spans
head(lin(torch.randn(2, 4))).sum().backward()
graph.capture_end()
graph.replay()
graph.replay()
for step in range(2):
    head(lin(torch.randn(2, 4))).sum().backward()
    if step == 1:
        Event.done_until[0] = Event.clock[0]   # the device has not reached the last optimizer steps
    for opt in opts:
        opt.step()
    rec.state.step += 1
rec.close()
names = [n for f in glob.glob(sys.argv[1] + "/events*.parquet") for n, d in
         zip(*pq.read_table(f, columns=["name", "detail"]).to_pydict().values()) if d == "cuda_event"]
print(sorted(names), rec.meta["gpu"]["pending_at_exit"], rec.errors)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "rank-00000")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "PYTHONPATH": str(REPO),
            "DIAGNOSE_CUDA_EVENTS_POLL_S": "1000",
        },
    )
    assert proc.returncode == 0, proc.stderr
    # lin and head are both outermost calls; Tensor.backward's call of
    # torch.autograd.backward is the same backward; step 1's optimizers and the
    # gpu:step they end are still on the device at exit: 3 pairs counted
    names = ["gpu:backward"] * 2 + ["gpu:forward"] * 4 + ["gpu:graph_replay"] * 2 + ["gpu:optimizer"] * 2 + ["gpu:step"]
    assert proc.stdout.strip() == f"{names} 3 []"
