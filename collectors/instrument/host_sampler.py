"""Host samples in a thread: this process's CPU % and RSS, every
DIAGNOSE_SAMPLE_INTERVAL_S (1 s). Reads /proc and os.times only."""

import os

from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except OSError:
        return float("nan")


def install(rec):
    interval_s = float(os.environ.get("DIAGNOSE_SAMPLE_INTERVAL_S", "1.0"))

    def run():
        last_t, last_cpu = now_ns(), sum(os.times()[:2])
        while not rec._stop.wait(interval_s):
            t, cpu = now_ns(), sum(os.times()[:2])
            rec.add_sample(t, "cpu_pct", 100.0 * (cpu - last_cpu) / max((t - last_t) / 1e9, 1e-9))
            rec.add_sample(t, "rss_mb", _rss_mb())
            last_t, last_cpu = t, cpu

    start_daemon(run, "diagnose-host-sampler")
