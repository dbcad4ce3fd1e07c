"""forward = the outermost module forward (global module hooks with a depth
count); backward = the outermost Tensor.backward / torch.autograd.backward."""
import functools

from collectors import nvtx_ranges
from collectors.clock import now_ns
from collectors.instrument import InjectedFailure, injected_failure


def install(rec):
    import torch
    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)
    st = rec.state
    depth = [0, 0]       # [forward depth, backward depth]
    fwd_start = [0]
    fail = injected_failure("forward_backward")

    def pre(module, args):
        depth[0] += 1
        if depth[0] == 1:
            t = now_ns()
            fwd_start[0] = t
            if st.step_start_ns is None:
                st.step_start_ns = t
            nvtx_ranges.push("forward", "forward")

    def post(module, args, output):
        depth[0] -= 1
        if depth[0] == 0:
            try:
                if fail:
                    raise InjectedFailure("forward_backward")
                nvtx_ranges.pop()
                rec.add(("forward", "forward", fwd_start[0], now_ns(), st.step, st.microbatch,
                         st.stage, "", "", -1, -1, 0, False, "", ""))
            except Exception as exc:
                rec.record_error("forward_backward", exc)
        elif depth[0] < 0:
            depth[0] = 0

    register_module_forward_pre_hook(pre)
    register_module_forward_hook(post, always_call=True)

    def wrap_backward(orig):
        @functools.wraps(orig)
        def backward(*args, **kwargs):
            if depth[1]:
                return orig(*args, **kwargs)
            depth[1] = 1
            t0 = now_ns()
            if st.step_start_ns is None:
                st.step_start_ns = t0
            nvtx_ranges.push("backward", "backward")
            try:
                return orig(*args, **kwargs)
            finally:
                depth[1] = 0
                nvtx_ranges.pop()
                rec.add(("backward", "backward", t0, now_ns(), st.step, st.microbatch, st.stage,
                         "", "", -1, -1, 0, False, "", ""))

        return backward

    torch.Tensor.backward = wrap_backward(torch.Tensor.backward)
    torch.autograd.backward = wrap_backward(torch.autograd.backward)
