"""Issue 26: node health while the job runs (diagnose/live/node_health.py).

The rank side is real: each rank's Recorder, its NVML sampler over the faithful
fake of pynvml (no GPU here; tests/support/fake_pynvml.py),
progress.json and meta.json on disk; the live monitor reads them with
read_progress as the live child does, on a clock the test advances. The live
CPU/RSS/network metrics of a real job reach MLflow in tests/live/test_live.py."""

import io
import json
import types

from collectors.instrument.nvml_sampler import NvmlSampler
from collectors.recorder import Recorder
from diagnose.live.monitor import LiveMonitor
from diagnose.rundir.progress import read_progress
from tests.support.fake_pynvml import fake_pynvml

RANKS = 4


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _job(tmp_path, host_of=lambda r: "node0"):
    """Four ranks, one GPU each; returns (recorders, their NVML samplers, the fake
    pynvml with a per-GPU utilization to set, a monitor, its stderr, its clock)."""
    nvml = fake_pynvml()
    nvml.util = {f"gpu{r}": 90 for r in range(RANKS)}
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=nvml.util[h], memory=40)
    recs, samplers = [], []
    for r in range(RANKS):
        rec = Recorder(str(tmp_path / "traces" / f"rank-{r:05d}"))
        rec.meta = {"rank": r, "host": host_of(r), "gpu": {"nvml_device": r}}
        rec.write_meta()
        recs.append(rec)
        samplers.append(NvmlSampler(nvml, nvml.nvmlDeviceGetHandleByIndex(r)))
    clock, stream = Clock(), io.StringIO()
    monitor = LiveMonitor(str(tmp_path), manifest={}, stream=stream, track=False, read_events=False, now=clock)
    return recs, samplers, nvml, monitor, stream, clock


def _second(recs, samplers, monitor, clock, extra=None):
    """One second of the job: every rank samples its GPU (and `extra` samples),
    writes progress.json, and the monitor ticks."""
    clock.t += 1.0
    for r, (rec, sampler) in enumerate(zip(recs, samplers)):
        for metric, value in sampler.sample(int(clock.t * 1e9)):
            rec.add_sample(int(clock.t * 1e9), metric, value)
        for metric, value in (extra or {}).get(r, {}).items():
            rec.add_sample(int(clock.t * 1e9), metric, value)
        rec.write_progress()
    monitor.tick(read_progress(monitor.run_dir))


def test_one_gpu_going_idle_is_a_gpu_util_alert_naming_its_rank(tmp_path):
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path)
    for _ in range(10):
        _second(recs, samplers, monitor, clock)
    assert monitor.alerts == []
    nvml.util["gpu2"] = 8  # rank 2's GPU stops getting work; the others keep theirs
    for _ in range(4):
        _second(recs, samplers, monitor, clock)
    assert [(a["rank"], a["kind"]) for a in monitor.alerts] == [(2, "gpu_util")], monitor.alerts
    alert = monitor.alerts[0]
    assert alert["value_pct"] == 8 and alert["median_pct"] == 90
    assert "GPU 2 on node0 dropped to 8% busy, usually 90%" in stream.getvalue()
    lines = (tmp_path / "alerts.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["gpu_util"]


def test_every_gpu_going_idle_together_is_not_one_ranks_alert(tmp_path):
    """The whole job paused (a checkpoint, an evaluation): no GPU is to blame."""
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path)
    for _ in range(10):
        _second(recs, samplers, monitor, clock)
    for r in range(RANKS):
        nvml.util[f"gpu{r}"] = 5
    for _ in range(6):
        _second(recs, samplers, monitor, clock)
    assert monitor.alerts == []


def test_a_nodes_network_collapsing_while_steps_slow_is_a_network_alert(tmp_path):
    """Two nodes; node1's NIC traffic falls to nothing while the job's step time
    rises. Before, the same collapse with steady steps says nothing."""
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path, host_of=lambda r: f"node{r // 2}")
    net = {
        0: {"net_rx_mb_per_s": 400.0, "net_tx_mb_per_s": 400.0},
        2: {"net_rx_mb_per_s": 400.0, "net_tx_mb_per_s": 400.0},
    }
    for step in range(10):
        monitor.health.job_step(step, 100.0)
        _second(recs, samplers, monitor, clock, net)
    net[2] = {"net_rx_mb_per_s": 2.0, "net_tx_mb_per_s": 1.0}
    monitor.health.job_step(10, 101.0)
    _second(recs, samplers, monitor, clock, net)
    _second(recs, samplers, monitor, clock, net)
    assert monitor.alerts == []  # quiet link, steady steps: a phase of the job
    for step in range(11, 13):
        monitor.health.job_step(step, 400.0)
        _second(recs, samplers, monitor, clock, net)
    assert [(a["rank"], a["kind"]) for a in monitor.alerts] == [(2, "network")], monitor.alerts
    assert monitor.alerts[0]["value_mb_per_s"] == 3.0
    assert "node node1's network fell to 3.0 MB/s, usually 800.0 MB/s" in stream.getvalue()


def test_samples_stream_under_mlflow_system_metric_keys(tmp_path):
    """Per GPU (its index on the node), per rank, per node; the node in the key
    once the job spans several hosts, as MLflow's system metrics name a node."""
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path, host_of=lambda r: f"node{r // 2}")
    sent = []
    monitor.health.metric = lambda key, value, step: sent.append((key, value))
    extra = {r: {"cpu_pct": 97.0, "rss_mb": 2048.0 + r} for r in range(RANKS)}
    extra[0].update({"net_rx_mb_per_s": 5.0, "net_tx_mb_per_s": 6.0, "net_rx_mb_per_s:lo": 70.0})
    _second(recs, samplers, monitor, clock, extra)
    keys = dict(sent)
    assert keys["system/node0/gpu_1_utilization_percentage"] == 90
    assert keys["system/node1/gpu_3_power_usage_watts"] == 312.5
    assert keys["system/node1/rank_3_rss_megabytes"] == 2051.0
    assert keys["system/node0/rank_0_cpu_utilization_percentage"] == 97.0
    assert keys["system/node0/network_receive_megabytes_per_second"] == 5.0
    assert keys["system/node0/network_lo_receive_megabytes_per_second"] == 70.0
    assert not any(k.startswith("system/node1/network") for k in keys)  # node1 sent no network sample


def test_bad_samples_turn_node_health_off_not_the_monitor(tmp_path):
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path)
    monitor.health.where = None  # any failure inside node health
    _second(recs, samplers, monitor, clock)
    assert monitor.health.off and not monitor.disabled
    assert "node health off" in stream.getvalue()
    # text where a number belongs is skipped, not a failure
    recs, samplers, nvml, monitor, stream, clock = _job(tmp_path / "again")
    recs[0].latest_samples["cpu_pct"] = "n/a"  # as a damaged progress.json would say
    _second(recs, samplers, monitor, clock)
    assert not monitor.health.off
