"""Per-node network throughput from the kernel's interface counters
(/sys/class/net/<iface>/statistics/{rx,tx}_bytes), sampled by local rank 0
only (the counters are per node) every DIAGNOSE_SAMPLE_INTERVAL_S (1 s).

Why: gradient all-reduce and pipeline traffic between nodes crosses these
interfaces (TCP/IP for gloo and NCCL's socket transport); a link saturated
during the step points at communication-bound training, an idle one during a
long collective at a peer that has not arrived. RDMA traffic (InfiniBand,
RoCE) bypasses these counters. Metrics, in MB/s, totals over all interfaces
except loopback and per interface (loopback too: a one-node job's gloo and
NCCL-socket traffic between its ranks):

    net_rx_mb_per_s  net_tx_mb_per_s  net_rx_mb_per_s:<iface>  net_tx_mb_per_s:<iface>
"""

import os

from collectors import identity
from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon

SYS_NET = "/sys/class/net"
LOOPBACK = "lo"
MB = 1e6


def read_counters(root: str = SYS_NET) -> dict:
    """{iface: (rx_bytes, tx_bytes)} for every interface."""
    out = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(root, name, "statistics", "rx_bytes")) as f:
                rx = int(f.read())
            with open(os.path.join(root, name, "statistics", "tx_bytes")) as f:
                tx = int(f.read())
        except (OSError, ValueError):
            continue
        out[name] = (rx, tx)
    return out


class NetSampler:
    def __init__(self, root: str = SYS_NET):
        self.root = root
        self.last = None  # (t_ns, counters)

    def sample(self, t_ns: int) -> list:
        counters = read_counters(self.root)
        last, self.last = self.last, (t_ns, counters)
        if last is None or t_ns <= last[0]:
            return []
        per_s = 1e9 / (t_ns - last[0]) / MB
        out, total_rx, total_tx = [], 0.0, 0.0
        for iface, (rx, tx) in counters.items():
            if iface not in last[1]:
                continue
            d_rx = max(rx - last[1][iface][0], 0) * per_s
            d_tx = max(tx - last[1][iface][1], 0) * per_s
            if iface != LOOPBACK:  # the node's own traffic, not the network's
                total_rx += d_rx
                total_tx += d_tx
            out += [(f"net_rx_mb_per_s:{iface}", d_rx), (f"net_tx_mb_per_s:{iface}", d_tx)]
        return [("net_rx_mb_per_s", total_rx), ("net_tx_mb_per_s", total_tx)] + out


def install(rec):
    if identity.local_rank() != 0 or not os.path.isdir(SYS_NET):
        return
    interval_s = float(os.environ.get("DIAGNOSE_SAMPLE_INTERVAL_S", "1.0"))
    sampler = NetSampler()
    sampler.sample(now_ns())

    def run():
        while not rec._stop.wait(interval_s):
            t = now_ns()
            for metric, value in sampler.sample(t):
                rec.add_sample(t, metric, value)

    start_daemon(run, "diagnose-net-sampler")
