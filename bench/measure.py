"""Wall time and peak memory of a command, process tree included.

The peak is sampled every 20 ms as the SUM of the resident set sizes of the
process and all its descendants (/proc), because some tools (HTA) parse in a
pool of worker processes: getrusage/`time -v` would report the largest single
process, not what the machine had to hold. Linux only.

Sampling is not free: walking the tree 50 times a second took 0.1-0.3 s of a
2-core machine's CPU away from a 2 s command. So time a command with
interval_s=None (no sampling) and take its memory from a separate run.
"""

import os
import subprocess
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree_rss_bytes(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
        todo += _children(p)
    return total


def run_measured(
    command: list, cwd=None, env=None, timeout: float | None = None, interval_s: float | None = 0.02
) -> dict:
    """{"wall_s", "peak_mb", "returncode", "stdout", "stderr", "timed_out"};
    interval_s=None: no memory sampling (peak_mb is nan)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
            done.wait(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    if interval_s is not None:
        sampler.start()
    else:
        peak[0] = float("nan")
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    if interval_s is not None:
        sampler.join()
    return {
        "wall_s": wall,
        "peak_mb": peak[0] / 2**20,
        "returncode": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": timed_out,
    }
