"""Host syncs the user's code asks for: Tensor.item/.tolist/.cpu/.numpy and
torch.cuda.synchronize, with callsite and duration. Only calls made directly
from user code are recorded (torch calls .cpu() on itself all the time); the
device is kept in `detail`, since on a CPU tensor these are not device syncs."""

import functools
import sys

from collectors.callsite import INTERNAL_FILES, is_internal, is_user_frame
from collectors.clock import now_ns
from collectors.instrument import InjectedFailure, injected_failure

TENSOR_METHODS = ("item", "tolist", "cpu", "numpy")


def install(rec):
    import torch

    st = rec.state
    fail = injected_failure("host_sync")

    def wrap(name, orig):
        @functools.wraps(orig)
        def method(self, *args, **kwargs):
            caller = sys._getframe(1)
            # torch's own calls (AdamW: one .item() per parameter per step) leave
            # at once, on a dict hit without another Python call
            internal = INTERNAL_FILES.get(caller.f_code.co_filename)
            if internal is None:
                internal = is_internal(caller.f_code.co_filename)
            if internal:
                return orig(self, *args, **kwargs)
            t0 = now_ns()
            result = orig(self, *args, **kwargs)
            t1 = now_ns()
            try:
                if fail:
                    raise InjectedFailure("host_sync")
                rec.add(
                    (
                        "sync",
                        name,
                        t0,
                        t1,
                        st.step,
                        st.microbatch,
                        st.stage,
                        "",
                        "",
                        -1,
                        -1,
                        0,
                        False,
                        f"{caller.f_code.co_filename}:{caller.f_lineno}",
                        "cuda" if self.is_cuda else "cpu",
                        -1,
                    )
                )
            except Exception as exc:
                rec.record_error("host_sync", exc)
            return result

        return method

    for name in TENSOR_METHODS:
        setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))

    orig_sync = torch.cuda.synchronize

    @functools.wraps(orig_sync)
    def synchronize(*args, **kwargs):
        t0 = now_ns()
        result = orig_sync(*args, **kwargs)
        caller = sys._getframe(1)
        if is_user_frame(caller):
            rec.add(
                (
                    "sync",
                    "cuda.synchronize",
                    t0,
                    now_ns(),
                    st.step,
                    st.microbatch,
                    st.stage,
                    "",
                    "",
                    -1,
                    -1,
                    0,
                    False,
                    f"{caller.f_code.co_filename}:{caller.f_lineno}",
                    "cuda",
                    -1,
                )
            )
        return result

    torch.cuda.synchronize = synchronize
