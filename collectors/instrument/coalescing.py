"""Collectives queued inside torch.distributed._coalescing_manager, recorded as the
one op its exit runs (collectives.py records the calls outside it).

Megatron's DDP and distributed optimizer, Megatron-FSDP, and c10d's own
batch_isend_irecv on NCCL queue collectives inside the manager: each call returns
None (sync) or an `_IllegalWork` whose every attribute access raises ValueError
(async), and nothing runs until the manager's exit, which issues one coalesced
op (allreduce_coalesced, ...). So a call inside is only noted (op, bytes; its
return value handed back untouched), and the exit is one row with the group's
bytes and one sequence number, as the group's own counter advances once.
"""

import contextlib
import functools
import sys

from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.instrument.c10d_calls import _arg, _device, _device_mark, _param_index, tensor_bytes


class CoalescedBatch:
    """The collectives called inside one torch.distributed._coalescing_manager."""

    __slots__ = ("ops", "nbytes", "first_tensor", "callsite")

    def __init__(self):
        self.ops, self.nbytes, self.first_tensor, self.callsite = [], 0, None, ""

    def add(self, op, tensor):
        if not self.ops:
            self.first_tensor = tensor
            self.callsite = user_callsite(3)
        self.ops.append(op)
        self.nbytes += tensor_bytes(tensor)


def wrap_coalescing_manager(tracker, orig):
    """Megatron's DDP and distributed optimizer (and c10d's own batch_isend_irecv on
    NCCL) queue collectives inside `_coalescing_manager`; its exit runs them as one
    coalesced op, so that is the op recorded: one row (and one sequence number, as
    the group's own counter advances once) at the exit, with the group's bytes; the
    Work of async_ops=True is the manager's, waited through cm.wait()."""
    group_index = _param_index(orig, "group")

    @functools.wraps(orig)
    @contextlib.contextmanager
    def manager(*args, **kwargs):
        inner = orig(*args, **kwargs)
        cm = inner.__enter__()
        local = tracker.local
        outer, batch = local.coalescing, CoalescedBatch()
        local.coalescing = batch
        try:
            yield cm
        except BaseException:
            local.coalescing = outer
            if not inner.__exit__(*sys.exc_info()):
                raise
            return
        local.coalescing = outer
        if not batch.ops or outer is not None:
            inner.__exit__(None, None, None)
            return
        try:
            pg, group, ranks, is_gloo = tracker.group_info(_arg(args, kwargs, group_index, "group"), batch.first_tensor)
            seq = tracker.collective_seq(pg, group)
        except Exception as exc:
            tracker.rec.record_error("collectives", exc)
            inner.__exit__(None, None, None)
            return
        arrival = _device_mark(tracker, batch.first_tensor, is_gloo=is_gloo)
        t0 = now_ns()
        inner.__exit__(None, None, None)
        t1 = now_ns()
        work = cm.works[-1] if getattr(cm, "works", None) else None
        try:
            name = f"{batch.ops[0]}_coalesced" if len(set(batch.ops)) == 1 else "coalesced"
            row = tracker.issued(
                "collective",
                name,
                group,
                ranks,
                seq,
                -1,
                batch.nbytes,
                batch.callsite,
                t0,
                t1,
                work,
                is_gloo,
                f"{len(batch.ops)} ops",
            )
            _device(tracker, "returned", arrival, row, work)
        except Exception as exc:
            tracker.rec.record_error("collectives", exc)

    return manager
