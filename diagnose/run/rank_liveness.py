"""When each local rank's process died, watched by `diagnose run` from a thread:
the first rank to die is the one that failed (rank_failure reads the order)."""

import json
import os
import time

from collectors.daemon_thread import start_daemon
from diagnose import rundir


class RankLiveness:
    """When each local rank's process died, watched from a thread. The first rank
    to die is the one that failed; torchrun (which polls its workers every 0.1 s)
    takes the others down after it. Each rank is watched through a pidfd (Linux
    >= 5.3: readable the moment the process exits, zombie or not, at no CPU cost
    while it runs); where that is unavailable, its /proc state is polled every
    20 ms (a killed rank stays a zombie until torchrun reaps it, so kill(pid, 0)
    would not do)."""

    POLL_S = 0.02  # /proc fallback
    DISCOVER_S = 0.5  # new ranks' meta.json

    def __init__(self, run_dir: str):
        import socket
        import threading

        self.run_dir = run_dir
        self.host = socket.gethostname()
        self.pids: dict[int, int] = {}
        self.exited_wall_ns: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = start_daemon(self._run, "diagnose-liveness")

    def _discover(self) -> list:
        """(rank, pid) of this host's ranks not seen before."""
        found = []
        for rank_dir in rundir.rank_dirs(self.run_dir):
            rank = rundir.rank_of_dir(rank_dir)
            if rank is None or rank in self.pids:
                continue
            try:
                with open(os.path.join(rank_dir, "meta.json"), encoding="utf-8") as f:
                    meta = json.load(f)
                if meta.get("host") == self.host and isinstance(meta.get("pid"), int):
                    self.pids[rank] = meta["pid"]
                    found.append((rank, meta["pid"]))
            except (OSError, ValueError):
                continue
        return found

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            return state not in (b"Z", b"X")
        except (OSError, IndexError):
            return False

    def _run(self) -> None:
        import select

        poller = select.poll()
        pidfd_rank: dict[int, int] = {}  # pidfd -> rank
        polled: dict[int, int] = {}  # rank -> pid, where no pidfd could be had
        next_discover = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_discover:
                    next_discover = time.monotonic() + self.DISCOVER_S
                    for rank, pid in self._discover():
                        try:
                            fd = os.pidfd_open(pid)
                        except (AttributeError, OSError):
                            polled[rank] = pid
                            continue
                        poller.register(fd, select.POLLIN)
                        pidfd_rank[fd] = rank
                wait_s = self.POLL_S if polled else max(next_discover - time.monotonic(), 0.0)
                for fd, _ in poller.poll(wait_s * 1000):
                    self.exited_wall_ns.setdefault(pidfd_rank.pop(fd), time.time_ns())
                    poller.unregister(fd)
                    os.close(fd)
                for rank, pid in list(polled.items()):
                    if not self._alive(pid):
                        self.exited_wall_ns.setdefault(rank, time.time_ns())
                        del polled[rank]
        finally:
            for fd in pidfd_rank:
                os.close(fd)

    def close(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=1)
        order = sorted(self.exited_wall_ns, key=self.exited_wall_ns.get)
        return {"exit_order": order, "exited_wall_ns": {str(r): t for r, t in self.exited_wall_ns.items()}}
