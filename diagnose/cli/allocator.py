"""Memory settings for the analyzer's own process: keep freed memory for reuse.

Analysing 10^7 events makes and drops hundreds of column-sized arrays. By
default each is fresh memory from the kernel (glibc returns big blocks with
munmap, Arrow's mimalloc purges freed pages after 10 ms, numpy asks for
transparent huge pages) and every new page is zeroed on first touch. On a VM
that is the dominant cost: in `bench/scale.py` (1,024 ranks, 2 cores) the
kernel's clear_page took a third of all CPU time, and the analysis spent 28-36 s
in the kernel against 33 s in Python and C. With the three settings below the
same analysis spends 6-7 s in the kernel and finishes in 38-40 s instead of
58-72 s, at a peak RSS 5% higher (measured one after another, same run dir).

Only `diagnose`'s command-line process calls this: a user's own process that
imports `diagnose.load` keeps its allocator as it was.
"""

import ctypes

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4
_done = False


def keep_freed_memory() -> None:
    """glibc: serve big blocks from the heap and never trim it; Arrow: allocate
    through that same malloc; numpy: no huge-page advice. Each is skipped where
    the platform lacks it (macOS, musl, another numpy)."""
    global _done
    if _done:
        return
    _done = True
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "gnu_get_libc_version"):  # mallopt's numbers are glibc's
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, 2**30 - 1)
    except OSError:
        pass
    try:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:
        pass
    try:
        from numpy._core import multiarray

        multiarray._set_madvise_hugepage(False)
    except (ImportError, AttributeError):
        pass
