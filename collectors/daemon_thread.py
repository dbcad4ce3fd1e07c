"""Background threads of diagnose, named for the OS as well as for Python, so
that `top -H`, py-spy and Nsight Systems show "dg-writer" instead of one more
"python" thread next to the job's own (Python 3.11 names only the Python object).

They run under SCHED_BATCH (Linux): same weight as the job's threads, but a
batch thread that wakes does not preempt the running one. When the training
thread still woke the writer at every step end (it no longer does: see
Recorder.step_done), the writer as a normal thread preempted it at once, found
the GIL held and went back to sleep, and with the core shared the scheduler
then often ran another process's turn first: py-spy put the reference
trainer's main thread inside that wake-up for 2.4% of its time beside a twin
job (0.4% as SCHED_BATCH). A batch thread starts when the training thread
blocks (a collective, a GPU wait) or its time slice ends. Weight is kept, so a
batch thread holding the GIL is never starved behind the job's other work (an
idle-priority writer could be, with the training thread waiting on it).
"""

import ctypes
import ctypes.util
import os
import sys
import threading

_PR_SET_NAME = 15
try:
    _prctl = (
        ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl if sys.platform == "linux" else None
    )
except (OSError, AttributeError):
    _prctl = None


def os_thread_name(name: str) -> bytes:
    """ "diagnose-host-sampler" -> b"dg-host-sampler" (Linux keeps 15 bytes)."""
    return ("dg-" + name.removeprefix("diagnose-")).encode()[:15]


def _batch_policy() -> None:
    """This thread (pid 0 = the calling thread on Linux) from SCHED_OTHER to
    SCHED_BATCH; a thread already below (the live monitor's, SCHED_IDLE) stays."""
    try:
        if os.sched_getscheduler(0) == os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass  # not Linux, or refused: the thread runs as any other


def start_daemon(target, name: str, batch: bool = True) -> threading.Thread:
    """batch=False for a thread whose wake-up latency is its measurement (clock sync)."""

    def run():
        if _prctl is not None:
            _prctl(_PR_SET_NAME, ctypes.c_char_p(os_thread_name(name)), 0, 0, 0)
        if batch:
            _batch_policy()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
