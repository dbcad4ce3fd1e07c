"""torch.distributed calls made from Python: op, group, per-group sequence
number, bytes, user callsite, issue/return time, and for async work the wait
call and, on gloo, the completion time as the wait sees it: the wait's end, or
its start if the work had completed by then. (A Python callback on the work's
future would give the exact time, but gloo runs it on its worker thread, which
then waits for the GIL before it can start the next collective: +2-3% of a
step with four async all-reduces, measured here. On NCCL the completion is the
GPU's, timed by cuda_events.)

Sequence numbers are counted per process group, as Flight Recorder does: every
member issues the same collectives on a group in the same order, so (group,
seq) names one collective instance on all of its members. On NCCL the number
is the process group's own (`seqCollective_`, Flight Recorder's
`collective_seq_id`), so calls diagnose does not see (compiled, C++) count too
and one rank's unseen call cannot shift the rest of its run; on gloo the group's
counter also counts sends and receives, including isend/irecv that are not
patched (below), so a Python counter of the seen calls numbers them there
(docs/instrumentation.md#compiled-code). Point-to-point ops
are numbered per (src, dst) pair, so the n-th send of a->b meets the n-th recv
of b from a. isend/irecv are left alone (patching them breaks P2POp's identity
check); batch_isend_irecv and blocking send/recv are recorded instead.

This module patches the calls; what they report goes through the installed
`Tracker` (collective_tracker.py), which keeps the counters and the pending work.
"""

import functools
import sys
import threading

from collectors import nvtx_ranges
from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.instrument.c10d_calls import _arg, _device, _device_mark, _param_index, tensor_bytes  # noqa: F401
from collectors.instrument.collective_tracker import Tracker
from collectors.instrument.graph_capture import GATE

COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "reduce",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)

TRACKER = None  # the installed Tracker; the DDP instrumentor records through it


def _wrap_collective(tracker, op, orig):
    group_index = _param_index(orig, "group")
    nvtx_name = op

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        local = tracker.local
        if local.depth:  # e.g. all_gather_object calling all_gather: count the outer op only
            return orig(*args, **kwargs)
        batch = local.coalescing
        if batch is not None:
            # queued, not run: the manager's exit runs the group as one op (recorded
            # there); what the call returns (None, or an _IllegalWork whose every
            # attribute access raises) is handed back untouched
            batch.add(op, args[0] if args else kwargs.get("tensor"))
            return orig(*args, **kwargs)
        try:
            pg, group, ranks, is_gloo = tracker.group_info(
                _arg(args, kwargs, group_index, "group"), args[0] if args else None
            )
            seq = tracker.collective_seq(pg, group)
            nbytes = max(tensor_bytes(args[0]) if args else 0, tensor_bytes(args[1]) if len(args) > 1 else 0)
            callsite = user_callsite(2)
        except Exception as exc:
            tracker.rec.record_error("collectives", exc)
            return orig(*args, **kwargs)
        local.depth += 1
        if nvtx_ranges.MIRRORING:
            nvtx_ranges.push(nvtx_name, "collective")
        arrival = _device_mark(tracker, args[0] if args else None, is_gloo=is_gloo)
        t0 = now_ns()
        st = tracker.rec.state
        thread = threading.get_ident()
        # a plain tuple in EVENT_COLUMNS order, the cheapest to build: read only by a hang dump
        tracker.blocked_in[thread] = (
            "collective",
            op,
            t0,
            t0,
            st.step,
            st.microbatch,
            st.stage,
            group,
            ranks,
            seq,
            -1,
            nbytes,
            False,
            callsite,
            "",
            -1,
        )
        try:
            work = orig(*args, **kwargs)
        finally:
            t1 = now_ns()
            tracker.blocked_in.pop(thread, None)
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.pop()
            local.depth -= 1
        # by type, never by attribute: an _IllegalWork raises on hasattr(work, "wait")
        is_work = isinstance(work, tracker.work_cls) and type(work).__name__ != "_IllegalWork"
        row = tracker.issued(
            "collective", op, group, ranks, seq, -1, nbytes, callsite, t0, t1, work if is_work else None, is_gloo
        )
        _device(tracker, "returned", arrival, row, work if is_work else None)
        return work

    return wrapper


def _wrap_send_recv(tracker, op, orig, dist):
    peer_name = "dst" if op == "send" else "src"
    peer_index = _param_index(orig, peer_name)
    group_index = _param_index(orig, "group")

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        tensor = args[0] if args else kwargs.get("tensor")
        arrival = (
            _device_mark(tracker, tensor, _arg(args, kwargs, group_index, "group"))
            if tracker.device is not None
            else None
        )
        t0 = now_ns()
        result = orig(*args, **kwargs)
        t1 = now_ns()
        try:
            me = dist.get_rank()
            other = _arg(args, kwargs, peer_index, peer_name)
            if other is None and kwargs.get(f"group_{peer_name}") is not None:
                other = dist.get_global_rank(_arg(args, kwargs, group_index, "group"), kwargs[f"group_{peer_name}"])
            if other is None:
                other = result  # recv(src=None) returns the sender
            src, dst = (me, other) if op == "send" else (other, me)
            seq = tracker.next_seq(f"{src}->{dst}")
            row = tracker.issued(
                "p2p",
                op,
                f"{src}->{dst}",
                f"{src},{dst}",
                seq,
                other,
                tensor_bytes(tensor),
                user_callsite(2),
                t0,
                t1,
                None,
                False,
            )
            _device(tracker, "returned", arrival, row, None)
        except Exception as exc:
            tracker.rec.record_error("collectives", exc)
        return result

    return wrapper


def _wrap_batch_isend_irecv(tracker, orig, dist):
    @functools.wraps(orig)
    def wrapper(p2p_op_list):
        first = p2p_op_list[0] if p2p_op_list else None
        arrival = _device_mark(tracker, getattr(first, "tensor", None), getattr(first, "group", None))
        t0 = now_ns()
        works = orig(p2p_op_list)
        t1 = now_ns()
        try:
            me = dist.get_rank()
            callsite = user_callsite(2)
            rows_per_op = []
            for p2p in p2p_op_list:
                op = "send" if p2p.op is dist.isend else "recv"
                peer = p2p.peer
                if peer is None:
                    peer = dist.get_global_rank(p2p.group, p2p.group_peer)
                src, dst = (me, peer) if op == "send" else (peer, me)
                seq = tracker.next_seq(f"{src}->{dst}")
                rows_per_op.append((op, peer, src, dst, seq, tensor_bytes(p2p.tensor)))
            one_work_each = works is not None and len(works) == len(rows_per_op)
            _, _, _, is_gloo = tracker.group_info(
                p2p_op_list[0].group if p2p_op_list else None, getattr(first, "tensor", None)
            )
            for i, (op, peer, src, dst, seq, nbytes) in enumerate(rows_per_op):
                work = works[i] if one_work_each else (works[0] if works else None)
                row = tracker.issued(
                    "p2p", op, f"{src}->{dst}", f"{src},{dst}", seq, peer, nbytes, callsite, t0, t1, work, is_gloo
                )
                # one arrival for the batch: its ops are queued together, and end together
                _device(tracker, "returned", arrival, row, work)
        except Exception as exc:
            tracker.rec.record_error("collectives", exc)
        return works

    return wrapper


def _wrap_wait(tracker, orig):
    @functools.wraps(orig)
    def wait(self, *args, **kwargs):
        rows = tracker.pending.get(id(self))
        if rows is None:
            return orig(self, *args, **kwargs)
        t0 = now_ns()
        try:  # is_completed queries an event: never inside a CUDA-graph capture (graph_capture.py)
            completed_before = not GATE.active and self.is_completed()
        except Exception:
            completed_before = False
        if nvtx_ranges.MIRRORING:
            nvtx_ranges.push("wait", "collective")
        thread = threading.get_ident()
        tracker.waiting_on[thread] = rows
        before = _device(tracker, "before_wait", self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            t1 = now_ns()
            tracker.waiting_on.pop(thread, None)
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.pop()
            try:
                callsite = user_callsite(2)
                tracker.waited(self, t0, t1, callsite, completed_before)
                _device(tracker, "waited", self, before, callsite)
            except Exception as exc:
                tracker.rec.record_error("collectives", exc)

    return wait


def _patch(modules, name, wrapper_factory):
    orig = getattr(modules[0], name, None)
    if orig is None:
        return
    wrapped = wrapper_factory(orig)
    for mod in modules:
        if getattr(mod, name, None) is orig:
            setattr(mod, name, wrapped)


def install(rec):
    global TRACKER
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    tracker = TRACKER = Tracker(rec, dist)
    rec.dump_providers.append(tracker.in_flight)
    modules = (c10d, dist)
    for op in COLLECTIVE_OPS:
        _patch(modules, op, functools.partial(_wrap_collective, tracker, op))
    for op in ("send", "recv"):
        _patch(modules, op, lambda orig, op=op: _wrap_send_recv(tracker, op, orig, dist))
    _patch(modules, "batch_isend_irecv", lambda orig: _wrap_batch_isend_irecv(tracker, orig, dist))
    from collectors.instrument.coalescing import wrap_coalescing_manager

    _patch(modules, "_coalescing_manager", lambda orig: wrap_coalescing_manager(tracker, orig))
    work_cls = tracker.work_cls = torch_work_class()
    work_cls.wait = _wrap_wait(tracker, work_cls.wait)


def torch_work_class():
    import torch

    return torch._C._distributed_c10d.Work
