"""Functional collectives (torch.distributed._functional_collectives): what
DTensor's redistributions and tensor/sequence-parallel layers issue, which never
pass through the torch.distributed functions collectives.py patches.

Each call is one row as collectives.py writes for torch.distributed (op under
its c10d name, group name and ranks, the group's next sequence number from the
same per-group counter, bytes, callsite, issue and return), detail
"functional". Its result is an AsyncCollectiveTensor; its wait is
`wait_tensor` on the tensor inside, called when the result is first used: that
call is the row's wait (and, on gloo, its completion, as for a Work.wait).
On CUDA the call gets its device rows as a c10d call does (collective_events.py):
an arrival event before it, and the end where its wait_tensor returns (or at
once when funcol waited before returning).

Compiled code: under torch.compile the wrappers step aside
(`torch.compiler.is_compiling()`, which dynamo reads as True while it traces),
so a compiled graph holds torch's own collectives and compiles as without
diagnose (tests/interop/test_compile.py); those collectives run inside the graph and
leave no row.
"""

import functools

from collectors.after_import import after_import
from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.instrument import collectives
from collectors.instrument.collective_tracker import MAX_PENDING_WORKS

# funcol function -> the c10d op name its rows carry
OPS = {
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_single_autograd": "all_gather_into_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_single_autograd": "reduce_scatter_tensor",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_single_autograd": "all_to_all_single",
    "all_reduce_coalesced": "all_reduce_coalesced",
}
DETAIL = "functional"


def _storage_key(tensor) -> int:
    """What a wait on this result will share with it: its storage. (A view of an
    AsyncCollectiveTensor is a new one around a view of the tensor, as DTensor's
    to_local makes; its wait_tensor gets the view, not the tensor issued.)"""
    return tensor.untyped_storage().data_ptr()


def _pending(result, async_cls):
    """The key of the wait this result is still owed, or None when the call
    waited before returning (a plain tensor: funcol waits at once when it thinks
    it is traced; the call was then synchronous)."""
    if isinstance(result, (list, tuple)):
        result = result[0] if result else None
    if not isinstance(result, async_cls):
        return None
    try:
        return _storage_key(result.elem)
    except Exception:  # no storage to key on (a tensor subclass): its wait goes unseen
        return None


class _Waits:
    """storage key -> the token the tracker's pending rows are filed under."""

    def __init__(self):
        self.tokens: dict = {}

    def file(self, key):
        if key is None:
            return None
        if len(self.tokens) > MAX_PENDING_WORKS:
            self.tokens.clear()  # never waited: forget rather than grow
        token = self.tokens[key] = object()
        return token


def _wrap(tracker, waits, funcol, c10d, op, orig, is_compiling):
    group_index = collectives._param_index(orig, "group")

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if tracker.local.depth or is_compiling():
            return orig(*args, **kwargs)
        try:
            name = funcol._resolve_group_name(collectives._arg(args, kwargs, group_index, "group"))
            pg, group, ranks, is_gloo = tracker.group_info(c10d._resolve_process_group(name), args[0] if args else None)
            seq = tracker.collective_seq(pg, group)
            nbytes = collectives.tensor_bytes(args[0]) if args else 0
            callsite = user_callsite(2)
        except Exception as exc:
            tracker.rec.record_error("functional_collectives", exc)
            return orig(*args, **kwargs)
        tracker.local.depth += 1
        arrival = collectives._device_mark(tracker, args[0] if args else None, is_gloo=is_gloo)
        t0 = now_ns()
        try:
            result = orig(*args, **kwargs)
        finally:
            t1 = now_ns()
            tracker.local.depth -= 1
        try:
            # waited when first used: a pending row filed under the result's storage
            token = waits.file(_pending(result, funcol.AsyncCollectiveTensor))
            row = tracker.issued(
                "collective", op, group, ranks, seq, -1, nbytes, callsite, t0, t1, token, is_gloo, DETAIL
            )
            # device rows as for a c10d call: the token stands for the Work
            collectives._device(tracker, "returned", arrival, row, token)
        except Exception as exc:
            tracker.rec.record_error("functional_collectives", exc)
        return result

    return wrapper


def _wrap_wait(tracker, waits, orig, is_compiling):
    @functools.wraps(orig)
    def wait_tensor(tensor):
        if is_compiling() or not waits.tokens:
            return orig(tensor)
        try:
            token = waits.tokens.pop(_storage_key(tensor), None)
        except Exception:
            token = None
        if token is None:
            return orig(tensor)
        before = collectives._device(tracker, "before_wait", token)
        t0 = now_ns()
        try:
            return orig(tensor)
        finally:
            t1 = now_ns()
            try:
                callsite = user_callsite(2)
                tracker.waited(token, t0, t1, callsite, False)
                collectives._device(tracker, "waited", token, before, callsite)
            except Exception as exc:
                tracker.rec.record_error("functional_collectives", exc)

    return wait_tensor


def install(rec):
    import torch.distributed as dist

    if not dist.is_available() or collectives.TRACKER is None:
        return
    # patched when the job imports it (DTensor does), never imported for a job that does not
    after_import("torch.distributed._functional_collectives", lambda: _patch(rec))


def _patch(rec):
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        c10d = dist.distributed_c10d
        tracker, waits, is_compiling = collectives.TRACKER, _Waits(), torch.compiler.is_compiling
        for name, op in OPS.items():
            orig = getattr(funcol, name, None)
            if orig is not None:
                setattr(funcol, name, _wrap(tracker, waits, funcol, c10d, op, orig, is_compiling))
        funcol.wait_tensor = _wrap_wait(tracker, waits, funcol.wait_tensor, is_compiling)
    except Exception as exc:
        rec.record_error("functional_collectives", exc)
