"""DDP's bucket all-reduces, which the C++ reducer issues out of Python's sight.

A timing comm hook is registered when DDP is constructed. It does what the
built-in path does (scale the bucket by 1/world, all-reduce by sum; multiplying
by the reciprocal as the reducer does keeps gradients bitwise identical) and
records each bucket as an async all-reduce in the group's sequence. If the user
later registers a hook of their own, ours delegates to theirs instead of failing
DDP's register-once check; their hook's collectives are recorded by the
collectives instrumentor.
"""
import functools
import weakref

from collectors.clock import now_ns
from collectors.instrument import collectives


class _HookState:
    __slots__ = ("module", "user_state", "user_hook", "__weakref__")

    def __init__(self, module):
        self.module = weakref.ref(module)
        self.user_state = None
        self.user_hook = None


def install(rec):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    orig_all_reduce = dist.distributed_c10d.all_reduce
    if getattr(orig_all_reduce, "__wrapped__", None):
        orig_all_reduce = orig_all_reduce.__wrapped__
    orig_init = DDP.__init__
    orig_register = DDP.register_comm_hook
    orig_register_builtin = DDP._register_builtin_comm_hook
    builtin_equivalents = {"ALLREDUCE": default_hooks.allreduce_hook,
                           "FP16_COMPRESS": default_hooks.fp16_compress_hook}

    def timing_hook(state, bucket):
        if state.user_hook is not None:
            return state.user_hook(state.user_state, bucket)
        module = state.module()
        pg = module.process_group if module is not None else None
        tracker = collectives.TRACKER
        pg, group, ranks, is_gloo = tracker.group_info(pg)
        buffer = bucket.buffer()
        buffer.mul_(1.0 / pg.size())
        seq = tracker.next_seq(group)
        t0 = now_ns()
        work = orig_all_reduce(buffer, group=pg, async_op=True)
        t1 = now_ns()
        tracker.issued("collective", "all_reduce", group, ranks, seq, -1,
                       buffer.element_size() * buffer.numel(), "", t0, t1, work, is_gloo,
                       detail=f"ddp bucket {bucket.index()}")
        return work.get_future().then(lambda fut: fut.value()[0])

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        try:
            if collectives.TRACKER is not None:
                self._diagnose_hook_state = _HookState(self)
                orig_register(self, self._diagnose_hook_state, timing_hook)
        except Exception as exc:
            rec.record_error("ddp", exc)

    @functools.wraps(orig_register)
    def register_comm_hook(self, state, hook):
        hook_state = getattr(self, "_diagnose_hook_state", None)
        if hook_state is None or hook_state.user_hook is not None:
            return orig_register(self, state, hook)
        hook_state.user_state, hook_state.user_hook = state, hook

    @functools.wraps(orig_register_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        hook_state = getattr(self, "_diagnose_hook_state", None)
        equivalent = builtin_equivalents.get(getattr(comm_hook_type, "name", ""))
        if hook_state is None or equivalent is None or hook_state.user_hook is not None:
            return orig_register_builtin(self, comm_hook_type)
        hook_state.user_state, hook_state.user_hook = self.process_group, equivalent

    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
