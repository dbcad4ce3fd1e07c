"""At the hang verdict, ask each rank's faulthandler for every thread's stack
(collectors/instrument/fault_stacks.py: why, and which signal).

Only the pids that wrote a marker on this host are signalled, one `os.kill`
each, never a process group (a real-time signal's default action ends a
process that did not register it), and only while the process is the one that
wrote the marker (its start time in /proc matches: a recycled pid is left
alone) and the marker is not withdrawn (the job put a handler of its own on the
signal). Once per hang: the signal interrupts sleeping system calls in the rank.
"""

import glob
import json
import os
import socket

from collectors.instrument.fault_stacks import start_time_ticks


def markers(run_dir: str) -> list[dict]:
    """The readable stack markers of the run's rank folders."""
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "traces", "*", "stacks-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                marker = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(marker, dict):
            found.append(marker)
    return found


def signal_marked_ranks(run_dir: str) -> list[int]:
    """Signal every live marked rank process on this host; returns the pids signalled."""
    host, sent = socket.gethostname(), []
    for marker in markers(run_dir):
        pid, sig = marker.get("pid"), marker.get("signal")
        if (
            marker.get("host") != host
            or marker.get("withdrawn")
            or not isinstance(pid, int)
            or not isinstance(sig, int)
            or pid <= 1
        ):
            continue
        ticks = marker.get("start_time_ticks")
        if ticks is None or start_time_ticks(pid) != ticks:
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sent
