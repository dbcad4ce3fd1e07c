"""The launcher's hang watchdog.

Signal: no rank recorded a new event for `timeout_s` while the job is alive.
Then: ask every rank for a dump (a file the ranks' writer threads poll, so a
main thread stuck in C++ cannot prevent it), give them a few seconds to write
in-flight collectives and all thread stacks, and end the job (SIGTERM, then
SIGKILL) so the analysis can say which rank never arrived where.
"""
import glob
import json
import os
import signal
import socket
import time

from collectors.recorder import DUMP_REQUEST

DUMP_WAIT_S = 5.0
TERM_GRACE_S = 5.0


def kill_rank_processes(run_dir: str) -> None:
    """torchrun starts each rank in a session of its own: a rank wedged in C++
    survives the signals sent to the launcher's group, so end it by pid."""
    host = socket.gethostname()
    for meta_path in glob.glob(os.path.join(run_dir, "traces", "rank-*", "meta.json")):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            if meta.get("host") == host and isinstance(meta.get("pid"), int):
                os.kill(meta["pid"], signal.SIGKILL)
        except (OSError, ValueError):
            continue


class HangWatchdog:
    def __init__(self, run_dir: str, proc, timeout_s: float):
        self.run_dir = run_dir
        self.proc = proc
        self.timeout_s = timeout_s
        self.last_total = None
        self.last_change = time.monotonic()
        self.report = None

    def tick(self, progress: dict[int, dict]) -> None:
        if self.report is not None or not progress or self.timeout_s <= 0:
            return
        total = sum(p.get("events_total", 0) for p in progress.values())
        now = time.monotonic()
        if total != self.last_total:
            self.last_total, self.last_change = total, now
            return
        if now - self.last_change >= self.timeout_s:
            self.end_hung_job(progress)

    def end_hung_job(self, progress) -> None:
        stalled_s = time.monotonic() - self.last_change
        print(f"diagnose: no progress on any rank for {stalled_s:.0f} s: dumping stacks and "
              "ending the job", flush=True)
        open(os.path.join(self.run_dir, DUMP_REQUEST), "w").close()
        deadline = time.monotonic() + DUMP_WAIT_S
        live_ranks = len(progress)
        while time.monotonic() < deadline:
            dumps = glob.glob(os.path.join(self.run_dir, "traces", "rank-*", "watchdog-*.json"))
            if len(dumps) >= live_ranks:
                break
            time.sleep(0.2)
        self.report = {"stalled_s": round(stalled_s, 1), "timeout_s": self.timeout_s,
                       "wall_ns": time.time_ns()}
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        kill_rank_processes(self.run_dir)

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
