"""forward = the outermost module forward; backward = the outermost
Tensor.backward / torch.autograd.backward.

Outermost module calls are found by wrapping `__call__` with a depth count,
not with global module forward hooks. Any global module hook sends every
module call of the job through the slow path of Module._call_impl: measured
here +4.3 us per module call (the reference trainer makes 287 module calls per
step, 2.7% of a 45 ms step).

Where the wrapper sits. Until the first optimizer step ends it wraps
torch.nn.Module.__call__, so every module call of step 0 passes through it,
and it learns the classes whose calls are outermost (the model, DDP, a loss
module called on its own). Then it moves onto those classes alone and
Module.__call__ is torch's again: inner modules (82 calls per step of the
reference trainer, each one more Python frame and a repacking of its
arguments) no longer pass through any collector code. Turning forward_backward
and host_sync off took 0.4-0.9 ms of interpreter time per step off the
reference trainer's training thread beside a twin, against ~0.1 ms that their
warm per-call costs predict. The price: a class first called as outermost
after step 0 (a model used only for evaluation, say) has no forward events.
A job that never steps an optimizer keeps the global wrapper, and so does a
job that compiles (below).

The events are the same: one "forward" per outermost call, from its start to
its return or exception. Instrumentors that also need the outermost forward
(cuda_events) register callbacks with `on_outermost_forward` instead of hooks
of their own.

DIAGNOSE_COMPUTE_ROWS=0 (records_compute_rows): no forward or backward rows and
no NVTX ranges of ours, as in a trace a profiler took of the job; the forward
wrapper stays, for the step's start and the outermost-forward callbacks.
"""

import functools

from collectors import nvtx_ranges
from collectors.after_import import after_import
from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.core_wait import queued_ns, queued_since
from collectors.instrument import InjectedFailure, injected_failure, records_compute_rows

_CALLBACKS: list = []  # (start, end) pairs, called at the start and end of each outermost forward


def on_outermost_forward(start, end) -> None:
    """start() and end() run around every outermost module call (exceptions
    they raise are theirs to handle: they run inside the user's forward)."""
    _CALLBACKS.append((start, end))


def install(rec):
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    st = rec.state
    depth = [0, 0]  # [forward depth, backward depth]
    fail = injected_failure("forward_backward")
    rows = records_compute_rows()
    module_call = torch.nn.Module.__call__
    root_classes: set = set()  # classes whose calls were outermost while learning

    def outermost(call, learning):
        @functools.wraps(call)
        def __call__(self, *args, **kwargs):
            if depth[0]:
                return call(self, *args, **kwargs)
            depth[0] = 1
            q0 = queued_ns() if rows else -1
            t0 = now_ns()
            if learning:
                root_classes.add(type(self))
            if st.step_start_ns is None:
                st.step_start_ns = t0
            if rows and nvtx_ranges.MIRRORING:
                nvtx_ranges.push("forward", "forward")
            for start, _ in _CALLBACKS:
                start()
            try:
                return call(self, *args, **kwargs)
            finally:
                depth[0] = 0
                for _, end in _CALLBACKS:
                    end()
                try:  # (never a return in this finally: it would replace the forward's own)
                    if fail:
                        raise InjectedFailure("forward_backward")
                    if rows:
                        if nvtx_ranges.MIRRORING:
                            nvtx_ranges.pop()
                        rec.add(
                            (
                                "forward",
                                "forward",
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
                                "",
                                "",
                                queued_since(q0),
                            )
                        )
                except Exception as exc:
                    rec.record_error("forward_backward", exc)

        __call__._diagnose_wraps = call  # (_compiled_modules_call_torchs)
        return __call__

    torch.nn.Module.__call__ = outermost(module_call, learning=True)
    after_import("torch._dynamo.eval_frame", lambda: _compiled_modules_call_torchs(rec))
    compiles = []  # torch.compile was called (torch imports dynamo without compiling)
    torch.compile = _noting_use(torch.compile, compiles)
    learned = []

    def move_onto_root_classes(optimizer, args, kwargs):
        if learned or depth[0] or not root_classes:
            return  # (an optimizer stepped inside a forward: learn on)
        learned.append(True)
        if compiles:
            # a job that compiles keeps the global wrapper: dynamo guards the graphs it
            # traced on the Module.__call__ it saw, and moving off it would recompile
            # every graph once (samples/titan_style.py --compile: 4 graphs, not 2)
            return
        try:
            for cls in root_classes:
                own = cls.__dict__.get("__call__")  # a class with a __call__ of its own keeps it
                cls.__call__ = outermost(module_call if own is None else own, learning=False)
            torch.nn.Module.__call__ = module_call
        except Exception as exc:  # the global wrapper stays: slower, never wrong
            rec.record_error("forward_backward", exc)

    register_optimizer_step_post_hook(move_onto_root_classes)

    def wrap_backward(orig):
        @functools.wraps(orig)
        def backward(*args, **kwargs):
            if depth[1]:
                return orig(*args, **kwargs)
            depth[1] = 1
            q0 = queued_ns()
            t0 = now_ns()
            if st.step_start_ns is None:
                st.step_start_ns = t0
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.push("backward", "backward")
            try:
                return orig(*args, **kwargs)
            finally:
                depth[1] = 0
                if nvtx_ranges.MIRRORING:
                    nvtx_ranges.pop()
                # the user's backward line (once per micro-batch: a short frame walk); an
                # accumulation that reduces every micro-batch is named by it
                rec.add(
                    (
                        "backward",
                        "backward",
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
                        user_callsite(2),
                        "",
                        queued_since(q0),
                    )
                )

        return backward

    if rows:  # (the forward before a backward has started the step)
        torch.Tensor.backward = wrap_backward(torch.Tensor.backward)
        torch.autograd.backward = wrap_backward(torch.autograd.backward)


def _noting_use(compile_fn, compiles: list):
    @functools.wraps(compile_fn)
    def compile(*args, **kwargs):
        if not compiles:
            compiles.append(True)
        return compile_fn(*args, **kwargs)

    return compile


def _compiled_modules_call_torchs(rec) -> None:
    """A compiled module's inner call is torch's Module.__call__, never our wrapper.
    OptimizedModule binds `_orig_mod.__call__` when it is built and hands that to
    dynamo as the frame to start from: dynamo skips torch's own (module.py), runs
    the module's hooks eagerly and compiles its forward's frame, but it traced
    ours, and with it the hooks: FSDP2's, disabled for dynamo, broke the graph
    (samples/titan_style.py --compile: 4 graphs and 2 graph breaks instead of 2
    and none). So while it binds, the class that holds our wrapper holds the
    call it wraps (a swap on the training thread, where torch.compile runs)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule

        orig = OptimizedModule._initialize

        @functools.wraps(orig)
        def _initialize(self):
            owner = next(
                (c for c in type(self._orig_mod).__mro__ if hasattr(c.__dict__.get("__call__"), "_diagnose_wraps")),
                None,
            )
            if owner is None:
                return orig(self)
            ours = owner.__dict__["__call__"]
            owner.__call__ = ours._diagnose_wraps
            try:
                return orig(self)
            finally:
                owner.__call__ = ours

        OptimizedModule._initialize = _initialize
    except Exception as exc:  # compiled modules would then trace the wrapper: say so
        rec.record_error("forward_backward", exc)
