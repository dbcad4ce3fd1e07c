"""Every thread's Python stack on a hang, even while a thread holds the GIL.

The watchdog dump (collectors/recorder.py) is written by a Python thread: a
rank whose main thread holds the GIL in a C call (a lock taken in C, a C
extension spinning) never runs it, and its dump is missing exactly when it
matters. faulthandler writes from its C signal handler without the GIL, every
thread, file, line and function (no source line, no thread names; at most 100
frames and 100 threads). So at start each rank registers faulthandler on a
real-time signal, writes its pid and signal to a marker
(`stacks-<pid>.json` in its rank folder: the launcher signals exactly the pids
that wrote one, never a process group) and lets the dump go to
`stacks-<pid>.txt`. diagnose/run/stack_signal.py sends the signal once, at the
hang verdict (it interrupts sleeping system calls in the target: a `sleep()`
in C returns early, so never more than once).

The signal is the first of SIGRTMIN+1..SIGRTMIN+8 still at its default action
at the C level (a handler a library installed in C is seen too): torchrun's
agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT, and SLURM setups use
SIGUSR1/SIGUSR2 (torchrun's --signals-to-handle), so those are never taken.
`chain` is off: the previous action is the default, whose action for a
real-time signal is to end the process. The user's handlers are never
changed; if the job later installs one on our signal from Python, the writer
thread sees it and withdraws the marker, so the launcher never sends it.
The marker also keeps the process's start time (the launcher checks it: a
recycled pid is not signalled) and the names of the process's threads,
refreshed by the writer thread, since faulthandler prints thread idents only.
"""

import ctypes
import faulthandler
import json
import os
import signal
import socket
import threading

from collectors.part_writer import atomic_write_bytes

OFFSETS = range(1, 9)  # SIGRTMIN+1..SIGRTMIN+8
MARKER = "stacks-{pid}.json"
DUMP = "stacks-{pid}.txt"


def at_default(sig: int) -> bool:
    """Whether `sig` is at its default action, in Python's table and in C's."""
    if signal.getsignal(sig) != signal.SIG_DFL:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old = ctypes.create_string_buffer(256)  # struct sigaction: sa_handler comes first
        if libc.sigaction(int(sig), None, old) != 0:
            return False
        return ctypes.c_void_p.from_buffer(old).value in (None, 0)  # SIG_DFL is 0
    except (OSError, AttributeError, ValueError):
        return True  # no libc to ask: Python's table is the best we know


def start_time_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


class StackSignal:
    def __init__(self, rank_dir: str):
        self.rank_dir = rank_dir
        self.pid = os.getpid()
        self.sig = None
        self.withdrawn = False
        self._threads = None
        self._file = None

    def register(self) -> bool:
        sig = next(
            (
                signal.SIGRTMIN + k
                for k in OFFSETS
                if signal.SIGRTMIN + k <= signal.SIGRTMAX and at_default(signal.SIGRTMIN + k)
            ),
            None,
        )
        if sig is None:
            return False
        self._file = open(os.path.join(self.rank_dir, DUMP.format(pid=self.pid)), "w")  # noqa: SIM115
        faulthandler.register(sig, file=self._file, all_threads=True, chain=False)
        self.sig = int(sig)
        self.write_marker()
        return True

    def refresh(self) -> None:
        """On the writer thread: keep the thread names current; withdraw if the job
        has since put a handler of its own on our signal."""
        if self.sig is None or self.withdrawn:
            return
        if signal.getsignal(self.sig) != signal.SIG_DFL:
            # not faulthandler.unregister: it would put back the default over the job's handler
            self.withdrawn = True
            self.write_marker()
            return
        threads = {t.ident: t.name for t in threading.enumerate()}
        if threads != self._threads:
            self.write_marker(threads)

    def write_marker(self, threads: dict | None = None) -> None:
        self._threads = threads if threads is not None else {t.ident: t.name for t in threading.enumerate()}
        marker = {
            "pid": self.pid,
            "host": socket.gethostname(),
            "signal": self.sig,
            "start_time_ticks": start_time_ticks(self.pid),
            "dump": DUMP.format(pid=self.pid),
            "withdrawn": self.withdrawn,
            # faulthandler prints an ident as 0x%016lx
            "threads": {f"0x{ident:016x}": name for ident, name in self._threads.items() if ident},
        }
        atomic_write_bytes(os.path.join(self.rank_dir, MARKER.format(pid=self.pid)), json.dumps(marker).encode())


def install(rec) -> None:
    if rec.rank_dir is None or not hasattr(signal, "SIGRTMIN"):
        return
    stacks = StackSignal(rec.rank_dir)
    if stacks.register():
        rec.periodic_hooks.append(stacks.refresh)
