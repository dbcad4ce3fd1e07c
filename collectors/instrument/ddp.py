"""DDP's gradient all-reduces, which the C++ reducer issues out of Python's sight.

Two ways, chosen per DDP module when it is constructed:

- CPU modules (gloo): DDP's own runtime timer. Its sample rate is set to every
  iteration, and after each synchronizing forward the reducer's timestamps of
  the previous backward (first bucket issued, last gradient computed, last
  bucket done: wall clock, no device involved) are read from its logging data
  (~80 us per read) and recorded as one all-reduce per backward: issue from the
  first bucket to the last gradient, done when the last bucket is. The job's
  comm path is untouched. Measured here (bench/ddp_hook_cost.py, 70-76 ms
  steps of 2 backwards): the timer +0.9-1.6 ms per step, our timing hook
  +2.6-4.1 ms, torch's own Python allreduce hook +2.8-4.4 ms: on CPU any Python
  comm hook costs that much. The last synchronizing backward of a module is not
  reported (its figures appear at the next forward).
- Other devices, or DIAGNOSE_DDP_TIMING=hook: a timing comm hook registered at
  construction. It does what the built-in path does (scale the bucket by
  1/world, all-reduce by sum; multiplying by the reciprocal as the reducer does
  keeps gradients bitwise identical) and records each bucket as an async
  all-reduce. On CUDA each bucket also gets device rows (collective_events.py):
  an event before the all-reduce (the bucket ready on the device) and one in
  the future's callback, which torch runs on a stream made to wait for the
  all-reduce, so its completion is the device's, not the callback's host time
  (NCCL calls back as soon as the work is queued). (The CUDA timer's
  timestamps would need event syncs.) If the user
  later registers a hook of their own, ours delegates to theirs instead of
  failing DDP's register-once check; their collectives are recorded by the
  collectives instrumentor.

Both record through the collectives tracker, in the group's sequence, with
detail "ddp ..." (the analysis reads DDP's tail from them).
"""

import functools
import os
import time
import weakref

from collectors.clock import now_ns
from collectors.instrument import collectives


class _HookState:
    __slots__ = ("module", "user_state", "user_hook", "__weakref__")

    def __init__(self, module):
        self.module = weakref.ref(module)
        self.user_state = None
        self.user_hook = None


class _TimerReader:
    """Turns a CPU module's DDP logging data into one all-reduce per backward."""

    __slots__ = ("group", "nbytes", "last_comm_end", "stamp")

    def __init__(self, module):
        self.group = module.process_group
        self.nbytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
        self.last_comm_end = None
        self.stamp = None  # (step, microbatch, stage) of the previous synchronizing forward

    def read(self, module, rec):
        st = rec.state
        stamp, self.stamp = self.stamp, (st.step, st.microbatch, st.stage)
        data = module._get_ddp_logging_data()
        comm_start = data.get("backward_comm_time_start", -1)
        comm_end = data.get("backward_comm_time_end", -1)
        compute_end = data.get("backward_compute_time_end", -1)
        if stamp is None or comm_start <= 0 or comm_end < comm_start or comm_end == self.last_comm_end:
            return  # nothing new: first forward, or no synchronizing backward since
        self.last_comm_end = comm_end
        to_mono = now_ns() - time.time_ns()  # the reducer's clock is the wall clock
        tracker = collectives.TRACKER
        pg, group, ranks, _ = tracker.group_info(self.group)
        seq = tracker.next_seq(group)
        issued_until = max(comm_start, min(compute_end, comm_end))
        step, microbatch, stage = stamp
        rec.add(
            (
                "collective",
                "all_reduce",
                comm_start + to_mono,
                issued_until + to_mono,
                step,
                microbatch,
                stage,
                group,
                ranks,
                seq,
                -1,
                self.nbytes,
                True,
                "",
                "ddp backward",
                -1,
            )
        )
        rec.add(
            (
                "done",
                "all_reduce",
                comm_end + to_mono,
                comm_end + to_mono,
                step,
                microbatch,
                stage,
                group,
                ranks,
                seq,
                -1,
                0,
                True,
                "",
                "ddp backward",
                -1,
            )
        )


def _uses_timer(module) -> bool:
    if os.environ.get("DIAGNOSE_DDP_TIMING", "timer") == "hook":
        return False
    params = list(module.parameters())
    return (
        bool(params)
        and all(p.device.type == "cpu" for p in params)
        and hasattr(module, "_set_ddp_runtime_logging_sample_rate")
        and hasattr(module, "_get_ddp_logging_data")
    )


def bucket_timing_hook(orig_all_reduce):
    """The comm hook: DDP's built-in all-reduce (orig_all_reduce is c10d's,
    not our wrapper, so the bucket is recorded once), timed per bucket."""

    def timing_hook(state, bucket):
        if state.user_hook is not None:
            return state.user_hook(state.user_state, bucket)
        module = state.module()
        pg = module.process_group if module is not None else None
        tracker = collectives.TRACKER
        buffer = bucket.buffer()
        pg, group, ranks, is_gloo = tracker.group_info(pg, buffer)
        buffer.mul_(1.0 / pg.size())
        seq = tracker.collective_seq(pg, group)
        arrival = collectives._device_mark(tracker, buffer, is_gloo=is_gloo)
        t0 = now_ns()
        work = orig_all_reduce(buffer, group=pg, async_op=True)
        t1 = now_ns()
        row = tracker.issued(
            "collective",
            "all_reduce",
            group,
            ranks,
            seq,
            -1,
            buffer.element_size() * buffer.numel(),
            "",
            t0,
            t1,
            work,
            False,
            detail=f"ddp bucket {bucket.index()}",
        )

        def bucket_done(fut):  # DDP needs a Python callback here anyway: it also times the bucket
            tracker.done(row, now_ns())  # the host's view: on NCCL, when the work was queued
            collectives._device(tracker, "completed", arrival, row)  # the device's: when it ended
            return fut.value()[0]

        return work.get_future().then(bucket_done)

    return timing_hook


def install(rec):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_all_reduce = dist.distributed_c10d.all_reduce
    if getattr(orig_all_reduce, "__wrapped__", None):
        orig_all_reduce = orig_all_reduce.__wrapped__
    orig_init = DDP.__init__
    orig_forward = DDP.forward
    orig_register = DDP.register_comm_hook
    orig_register_builtin = DDP._register_builtin_comm_hook
    builtin_equivalents = {"ALLREDUCE": default_hooks.allreduce_hook, "FP16_COMPRESS": default_hooks.fp16_compress_hook}

    timing_hook = bucket_timing_hook(orig_all_reduce)

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        try:
            if collectives.TRACKER is None:
                return
            if _uses_timer(self):
                self._set_ddp_runtime_logging_sample_rate(1)
                self._diagnose_timer = _TimerReader(self)
            else:
                self._diagnose_hook_state = _HookState(self)
                orig_register(self, self._diagnose_hook_state, timing_hook)
        except Exception as exc:
            rec.record_error("ddp", exc)

    @functools.wraps(orig_forward)
    def forward(self, *args, **kwargs):
        output = orig_forward(self, *args, **kwargs)
        reader = getattr(self, "_diagnose_timer", None)
        if reader is not None and self.require_backward_grad_sync and torch.is_grad_enabled():
            try:
                reader.read(self, rec)
            except Exception as exc:
                self._diagnose_timer = None
                rec.record_error("ddp", exc)
        return output

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
    DDP.forward = forward
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
