"""`diagnose run --metrics-port N`: the live monitor's state as Prometheus text.

One endpoint per node, served by the live monitor's child process (which
already reads every rank's progress and events): a custom collector over
diagnose.live.rank_gauges.RankGauges, on prometheus-client's start_http_server,
in a registry of its own. No server in the ranks and no multiprocess mode: the
ranks never import prometheus-client, and a scrape costs them nothing.

Port 0 takes any free port; the port serving goes to <run>/metrics_port either
way. The server failing to start (port taken, no prometheus-client) is one
warning line: the monitor, its alerts and the job go on.

METRICS names every metric with its type, labels and meaning; docs/outputs.md
("Prometheus metrics") lists the same."""

import os
import socket

METRICS_PORT_FILE = "metrics_port"  # in the run directory: the port serving, as text
INSTALL_HINT = "pip install 'diagnose[metrics]' (or prometheus-client)"

# name -> (type, labels, help). Seconds and bytes, as Prometheus names its base units.
METRICS = {
    "diagnose_step_time_seconds": ("gauge", ("rank",), "Wall time of the rank's newest step."),
    "diagnose_steps": ("counter", ("rank",), "Steps the rank completed."),
    "diagnose_steps_behind": ("gauge", ("rank",), "Steps completed by the furthest rank minus this rank's."),
    "diagnose_arrival_lag_seconds": (
        "gauge",
        ("rank",),
        "Lag behind the fastest: how long after the first rank this rank reached the step's "
        "collectives, summed over a step (median of its last 8 steps; this node's ranks).",
    ),
    "diagnose_waited_for": ("gauge", ("rank",), "1 for the rank the others wait for at collectives, 0 for the others."),
    "diagnose_exposed_comm_ratio": (
        "gauge",
        ("rank",),
        "Exposed communication / step time of the rank's newest step read from its events.",
    ),
    "diagnose_input_wait_seconds": ("gauge", ("rank",), "Data (input) wait in the rank's newest step."),
    "diagnose_alerts": ("counter", ("kind", "rank"), "Live alerts raised, by kind and rank."),
    "diagnose_gpu_utilization_percent": ("gauge", ("rank", "gpu"), "NVML utilization of the rank's GPU."),
    "diagnose_gpu_memory_used_bytes": ("gauge", ("rank", "gpu"), "NVML memory used on the rank's GPU."),
    "diagnose_ranks_reporting": ("gauge", (), "Ranks whose progress this node's monitor reads."),
}


def client_missing() -> str | None:
    """None when prometheus-client imports, else the one line to print."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return f"--metrics-port needs prometheus-client: {INSTALL_HINT}"
    return None


def samples(snapshot: dict) -> dict:
    """name -> [(label values, value)] from RankGauges.snapshot()."""
    ranks, lags, waited = snapshot["ranks"], snapshot["lags_ms"], snapshot["waited_for"]
    out = {name: [] for name in METRICS}
    furthest = max((v["steps_done"] or 0 for v in ranks.values()), default=0)
    for rank, v in sorted(ranks.items()):
        label = str(rank)
        gpu = "" if v.get("gpu") is None else str(v["gpu"])
        if v.get("step_ms") is not None:
            out["diagnose_step_time_seconds"].append(((label,), v["step_ms"] / 1e3))
        if v.get("data_wait_ms") is not None:
            out["diagnose_input_wait_seconds"].append(((label,), v["data_wait_ms"] / 1e3))
        out["diagnose_steps"].append(((label,), v["steps_done"] or 0))
        out["diagnose_steps_behind"].append(((label,), furthest - (v["steps_done"] or 0)))
        if rank in lags:
            out["diagnose_arrival_lag_seconds"].append(((label,), lags[rank] / 1e3))
        out["diagnose_waited_for"].append(((label,), float(waited is not None and waited[0] == rank)))
        if v.get("exposed_comm_frac") is not None:
            out["diagnose_exposed_comm_ratio"].append(((label,), v["exposed_comm_frac"]))
        if v.get("gpu_util_pct") is not None:
            out["diagnose_gpu_utilization_percent"].append(((label, gpu), v["gpu_util_pct"]))
        if v.get("mem_used_mb") is not None:
            out["diagnose_gpu_memory_used_bytes"].append(((label, gpu), v["mem_used_mb"] * 2**20))
    for (kind, rank), n in sorted(snapshot["alerts"].items()):
        out["diagnose_alerts"].append(((kind, str(rank)), n))
    out["diagnose_ranks_reporting"].append(((), len(ranks)))
    return out


class GaugeCollector:
    """prometheus-client's custom collector protocol: collect() yields metric families."""

    def __init__(self, gauges):
        self.gauges = gauges

    def describe(self):
        return []  # registering must not run collect() (the state may be empty yet)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, values in samples(self.gauges.snapshot()).items():
            kind, labels, text = METRICS[name]
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=list(labels))
            for label_values, value in values:
                family.add_metric(list(label_values), float(value))
            yield family


def serve(run_dir: str, port: int, gauges, say):
    """Start the endpoint on every interface at `port` (0: any free one) and
    write the port to <run>/metrics_port. Returns the server, or None after
    one warning line (say) when it cannot start."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(GaugeCollector(gauges))
        server, _ = start_http_server(int(port), registry=registry)
    except ImportError:
        say(f"diagnose: warning: Prometheus metrics off: {client_missing()}")
        return None
    except Exception as exc:  # the port is taken, not ours to bind, or no number
        say(f"diagnose: warning: Prometheus metrics off: {type(exc).__name__}: {exc}")
        return None
    bound = int(server.server_port)
    path = os.path.join(run_dir, METRICS_PORT_FILE)
    try:  # whole or absent: a script polling for it never reads half a number
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"{bound}\n")
        os.replace(path + ".tmp", path)
    except OSError as exc:
        say(f"diagnose: warning: metrics port not written to the run directory: {exc}")
    say(f"diagnose: Prometheus metrics at http://{socket.gethostname()}:{bound}/metrics")
    return server
