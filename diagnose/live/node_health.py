"""While the job runs: the samples every rank records (NVML per GPU, CPU % and
RSS per rank, network throughput per node), streamed to the MLflow run under the
keys MLflow's own system metrics use, and two alerts operators of large runs ask
for.

Each rank's recorder puts its samplers' newest values in progress.json
(`samples`); the rank's meta.json says its host and GPU. Every SYSTEM_INTERVAL_S
the monitor streams, under `system/` (`system/<host>/` when the job spans
several hosts, as MLflow names a node's metrics):

    gpu_<i>_utilization_percentage  gpu_<i>_memory_usage_megabytes  gpu_<i>_power_usage_watts
    gpu_<i>_sm_clock_mhz  gpu_<i>_clock_event_reasons           (i: the GPU's index on its node)
    rank_<r>_cpu_utilization_percentage  rank_<r>_rss_megabytes
    network_receive_megabytes_per_second  network_transmit_megabytes_per_second   (all but loopback)
    network_<iface>_receive_megabytes_per_second  ..._transmit_...                 (each interface)

Alerts, checked every ALERT_INTERVAL_S on the newest samples:

- `gpu_util`: a GPU whose utilization falls below GPU_DROP_FRAC of its own
  recent median (at least GPU_MIN_PCT busy) on CONFIRM checks in a row while
  its peers' stays above PEER_KEEP_FRAC of theirs: one GPU went idle (its rank
  is stuck on the host, its data stalled, it lost its clocks), not the job.
  NVML's utilization counts any kernel, so a GPU that waits in a NCCL kernel
  reads busy: the alert is about a GPU that stopped getting work.
- `network`: a node whose throughput (all interfaces but loopback) falls below
  NET_DROP_FRAC of its recent median (at least NET_MIN_MB_S) on CONFIRM checks
  while the job's step time is above STEP_RISE_FRAC of its own median: a link
  collapsed or stalled and the job slowed with it (a quiet link while steps
  keep their pace is a phase of the job, not a fault).
"""

import collections
import json
import os
import statistics
import time

from diagnose import rundir
from diagnose.live.baseline import CONFIRM, MIN_HISTORY, WINDOW

SYSTEM_INTERVAL_S = 5.0
ALERT_INTERVAL_S = 1.0
GPU_DROP_FRAC, GPU_MIN_PCT, PEER_KEEP_FRAC = 0.5, 20.0, 0.8
NET_DROP_FRAC, NET_MIN_MB_S, STEP_RISE_FRAC = 0.2, 1.0, 1.25

GPU_KEYS = {
    "gpu_util_pct": "utilization_percentage",
    "mem_used_mb": "memory_usage_megabytes",
    "power_w": "power_usage_watts",
    "sm_clock_mhz": "sm_clock_mhz",
    "clock_event_reasons": "clock_event_reasons",
}
RANK_KEYS = {"cpu_pct": "cpu_utilization_percentage", "rss_mb": "rss_megabytes"}
NET_KEYS = {"net_rx_mb_per_s": "receive_megabytes_per_second", "net_tx_mb_per_s": "transmit_megabytes_per_second"}


def _median(values) -> float:
    return statistics.median(values)


class NodeHealth:
    def __init__(self, run_dir: str, metric, alert, now=time.monotonic, warn=lambda message: None):
        """metric(key, value, step) streams; alert(rank, kind, step, value, median, limit, text)."""
        self.run_dir, self.metric, self.alert, self.now, self.warn = run_dir, metric, alert, now, warn
        self.off = False
        self.where: dict = {}  # rank -> (host, gpu index or None), from its meta.json
        self.last_system = self.last_check = -1e18
        self.published = 0
        self.gpu_history: dict = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
        self.gpu_streak: dict = collections.defaultdict(int)
        self.gpu_alerted: set = set()
        self.net_history: dict = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
        self.net_streak: dict = collections.defaultdict(int)
        self.net_alerted: set = set()
        self.step_history = collections.deque(maxlen=WINDOW)
        self.step = -1

    def job_step(self, step: int, step_ms: float) -> None:
        """The job's step time (p50 over ranks) of each completed step."""
        self.step = max(self.step, step)
        self.step_history.append(step_ms)

    def tick(self, progress: dict) -> None:
        """Never raises: bad samples turn node health off, not the monitor's step alerts."""
        if self.off:
            return
        try:
            self._tick(progress)
        except Exception as exc:
            self.off = True
            self.warn(f"node health off: {type(exc).__name__}: {exc}")

    def _tick(self, progress: dict) -> None:
        now = self.now()
        samples = {
            r: {k: v for k, v in s["samples"].items() if isinstance(v, (int, float))}
            for r, s in progress.items()
            if isinstance(s.get("samples"), dict)
        }
        if not samples:
            return
        for rank in samples:
            if rank not in self.where:
                self._locate(rank)
        if now - self.last_system >= SYSTEM_INTERVAL_S:
            self.last_system = now
            self._stream(samples)
        if now - self.last_check >= ALERT_INTERVAL_S:
            self.last_check = now
            self._check_gpus(samples)
            self._check_network(samples)

    def _locate(self, rank: int) -> None:
        path = os.path.join(self.run_dir, rundir.TRACES, f"rank-{rank:05d}", "meta.json")
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return  # not written yet: asked again next tick
        gpu = (meta.get("gpu") or {}).get("nvml_device")
        self.where[rank] = (str(meta.get("host") or "node"), gpu)

    def _stream(self, samples: dict) -> None:
        step = self.published
        self.published += 1
        nodes_done = set()
        several = len({h for h, _ in self.where.values()}) > 1  # then the host goes in the key
        for rank, values in sorted(samples.items()):
            host, gpu = self.where.get(rank, ("node", None))
            prefix = f"system/{host}/" if several else "system/"
            for name, key in RANK_KEYS.items():
                if name in values:
                    self.metric(f"{prefix}rank_{rank}_{key}", values[name], step)
            if gpu is not None:
                for name, key in GPU_KEYS.items():
                    if name in values:
                        self.metric(f"{prefix}gpu_{gpu}_{key}", values[name], step)
            if host in nodes_done:
                continue
            for name, value in values.items():
                base, _, iface = name.partition(":")
                if base in NET_KEYS:
                    nodes_done.add(host)
                    where = f"network_{iface}_" if iface else "network_"
                    self.metric(f"{prefix}{where}{NET_KEYS[base]}", value, step)

    def _check_gpus(self, samples: dict) -> None:
        utils = {r: float(v["gpu_util_pct"]) for r, v in samples.items() if "gpu_util_pct" in v}
        usual = {r: _median(self.gpu_history[r]) for r in utils if len(self.gpu_history[r]) >= MIN_HISTORY}
        for rank, util in utils.items():
            median = usual.get(rank)
            peers = [utils[p] >= PEER_KEEP_FRAC * usual[p] for p in usual if p != rank]
            dropped = (
                median is not None
                and median >= GPU_MIN_PCT
                and util < GPU_DROP_FRAC * median
                and peers
                and sum(peers) > len(peers) / 2
            )
            if not dropped:
                self.gpu_streak[rank] = 0
                self.gpu_alerted.discard(rank)
                self.gpu_history[rank].append(util)  # a dropped value does not lower its own normal
                continue
            self.gpu_streak[rank] += 1
            if self.gpu_streak[rank] >= CONFIRM and rank not in self.gpu_alerted:
                self.gpu_alerted.add(rank)
                host, gpu = self.where.get(rank, ("node", None))
                self.alert(
                    rank,
                    "gpu_util",
                    self.step + 1,
                    util,
                    median,
                    GPU_DROP_FRAC * median,
                    f"GPU {gpu if gpu is not None else '?'} on {host} dropped to {util:.0f}% busy, "
                    f"usually {median:.0f}%, while the other GPUs keep theirs: it stopped getting "
                    "work (its rank is stuck on the host, waits for data, or lost its clocks)",
                )

    def _check_network(self, samples: dict) -> None:
        per_node: dict = {}
        for rank, values in samples.items():
            host = self.where.get(rank, ("node", None))[0]
            if "net_rx_mb_per_s" in values or "net_tx_mb_per_s" in values:
                per_node[host] = (
                    rank,
                    float(values.get("net_rx_mb_per_s", 0.0)) + float(values.get("net_tx_mb_per_s", 0.0)),
                )
        slow = len(self.step_history) >= MIN_HISTORY and self.step_history[-1] > STEP_RISE_FRAC * _median(
            list(self.step_history)[:-1]
        )
        for host, (rank, mb_s) in per_node.items():
            history = self.net_history[host]
            median = _median(history) if len(history) >= MIN_HISTORY else None
            collapsed = median is not None and median >= NET_MIN_MB_S and mb_s < NET_DROP_FRAC * median
            if not (collapsed and slow):
                self.net_streak[host] = 0
                self.net_alerted.discard(host)
                history.append(mb_s)
                continue
            self.net_streak[host] += 1
            if self.net_streak[host] >= CONFIRM and host not in self.net_alerted:
                self.net_alerted.add(host)
                self.alert(
                    rank,
                    "network",
                    self.step + 1,
                    mb_s,
                    median,
                    NET_DROP_FRAC * median,
                    f"node {host}'s network fell to {mb_s:.1f} MB/s, usually {median:.1f} MB/s, "
                    f"while the job's step time rose to {self.step_history[-1]:.0f} ms: a link "
                    "collapsed or stalled (check the NIC, the switch port, the fabric's health)",
                )
