"""How long this thread has waited for a CPU core: Linux's run delay, the
second field of /proc/thread-self/schedstat (ns the thread was runnable but
not running, since it started).

Why: on a host with more busy ranks than cores a phase's wall time is its
work plus the time it queued for a core, and which rank queues changes with
what its neighbours do (a peer asleep in data loading frees a core). A phase
row, and the zero-code forward, backward and optimizer rows, carry the queued
ns of their span so that the analysis can tell work that varies (sequence
lengths) from a shared core (workload_imbalance), and a slow rank from one
kept off a core (straggler's "cpu contention").

Cost: one pread on a file kept open per thread (0.9 us measured here), no
allocation beyond the small bytes read. -1 where the kernel has no schedstat
(not Linux, or a kernel without CONFIG_SCHED_INFO).
"""

import os
import threading

_PATH = "/proc/thread-self/schedstat"
_local = threading.local()


def _open() -> int:
    try:
        fd = os.open(_PATH, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        fd = -1
    _local.fd = fd
    return fd


def queued_ns() -> int:
    """This thread's total ns queued for a core so far; -1 where unknown."""
    fd = getattr(_local, "fd", None)
    if fd is None:
        fd = _open()
    if fd < 0:
        return -1
    try:
        return int(os.pread(fd, 64, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def queued_since(start: int) -> int:
    """ns this thread queued for a core since queued_ns() returned `start`; -1
    if either reading failed (or the span ended on another thread: they disagree)."""
    end = queued_ns()
    return end - start if start >= 0 and end >= start else -1


def _forget_in_child():
    # a forked child's thread is not the parent's: its file names the parent's thread
    _local.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
