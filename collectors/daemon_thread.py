"""Background threads of diagnose, named for the OS as well as for Python, so
that `top -H`, py-spy and Nsight Systems show "dg-writer" instead of one more
"python" thread next to the job's own (Python 3.11 names only the Python object)."""
import ctypes
import ctypes.util
import sys
import threading

_PR_SET_NAME = 15
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _prctl = None


def os_thread_name(name: str) -> bytes:
    """"diagnose-host-sampler" -> b"dg-host-sampler" (Linux keeps 15 bytes)."""
    return ("dg-" + name.removeprefix("diagnose-")).encode()[:15]


def start_daemon(target, name: str) -> threading.Thread:
    def run():
        if _prctl is not None:
            _prctl(_PR_SET_NAME, ctypes.c_char_p(os_thread_name(name)), 0, 0, 0)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
