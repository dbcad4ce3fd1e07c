"""Host-device synchronizations that torch performs on the user's behalf,
from `torch.cuda.set_sync_debug_mode("warn")`: every synchronizing CUDA call
(a `.item()`, `.nonzero()`, boolean-mask indexing, a blocking copy to the
host...) becomes an instant "sync" event with the user's callsite, detail
"sync_debug".

Why: the host_sync instrumentor sees the calls the script makes by name; this
sees the ones hidden inside torch ops, which stall the CPU until the GPU has
drained its queue and so serialize CPU and GPU. Times are the moment of the
call (the warning comes before the wait, whose length torch does not report).

The warnings are taken by a hook on `warnings.showwarning` and not printed;
other warnings pass through untouched. The mode is set at the first outermost forward or
optimizer step (setting it initialises CUDA, which must wait until the script
has picked its device). Off on machines without CUDA (one info line) and with
DIAGNOSE_SYNC_DEBUG=0.
"""

import os
import warnings

from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.instrument.gpu_common import cuda_ready, gpu_unavailable

SYNC_WARNING = "synchronizing CUDA operation"


def make_showwarning(rec, previous):
    """A warnings.showwarning that records sync warnings and forwards the rest."""
    st = rec.state

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            t = now_ns()
            rec.add(
                (
                    "sync",
                    "cuda_sync",
                    t,
                    t,
                    st.step,
                    st.microbatch,
                    st.stage,
                    "",
                    "",
                    -1,
                    -1,
                    0,
                    False,
                    user_callsite(2),
                    "sync_debug",
                    -1,
                )
            )
            return None
        return previous(message, category, filename, lineno, file, line)

    showwarning.diagnose_sync_debug = True
    return showwarning


def enable(rec, torch) -> bool:
    ok, reason = cuda_ready(torch)
    if not ok:
        gpu_unavailable(rec, "sync_debug", reason)
        return False
    if not getattr(warnings.showwarning, "diagnose_sync_debug", False):
        warnings.showwarning = make_showwarning(rec, warnings.showwarning)
    # "always": every occurrence reaches showwarning, not only the first per line.
    warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
    torch.cuda.set_sync_debug_mode("warn")
    return True


def install(rec):
    if os.environ.get("DIAGNOSE_SYNC_DEBUG", "1") == "0":
        return
    import torch

    if not torch.backends.cuda.is_built():
        gpu_unavailable(rec, "sync_debug", "CPU-only torch build")
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from collectors.instrument.forward_backward import on_outermost_forward

    done = []

    def first_use(*_):
        if done:  # one list check per call from then on (hooks cannot be removed mid-call)
            return
        done.append(True)
        try:
            enable(rec, torch)
        except Exception as exc:
            rec.record_error("sync_debug", exc)

    # not a global module hook: one would send every module call of the job
    # through Module._call_impl's slow path (forward_backward says how dear)
    on_outermost_forward(first_use, lambda: None)
    register_optimizer_step_pre_hook(first_use)
