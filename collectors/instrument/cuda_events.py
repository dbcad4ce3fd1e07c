"""GPU-side timing with CUDA events: when the GPU actually ran each step, the
outermost forward and backward, and each collective and send/receive on a
CUDA tensor (their device rows: collective_events.py).

Why: the host returns from a CUDA call long before the GPU finishes, so CPU
spans say when work was queued, not when it ran. A "gpu:step" much longer than
the CPU step means the host is ahead and the GPU is the bottleneck; a short one
with long CPU steps means the GPU starves.

How, without synchronizing the training thread: events are recorded on the
current stream at the start and end of each span (a cheap enqueue), and a
poller thread checks `event.query()` every DIAGNOSE_CUDA_EVENTS_POLL_S
(0.25 s), turning completed pairs into rows (CudaEventTimer, in
cuda_event_timer.py; this module records the events and runs the poller).
GPU times become host times through an anchor: an event recorded on an
otherwise idle side stream and waited for right away (it runs at once, so the user's queue is never waited on),
paired with the host clock read when it completes; the poller renews it every
60 s against drift; each anchor's residual (the host interval that brackets
it) and drift (against the previous anchor) go to meta.json, gpu.clock_anchors.
Rows: kind "phase", name "gpu:<span>" (gpu:step, gpu:forward, gpu:backward,
gpu:optimizer: every optimizer's step, from its pre- to its post-hook),
detail "cuda_event", which the breakdown ignores, so nothing is counted twice;
and the collectives' device rows (detail "gpu" / "gpu:wait" / "gpu:nccl").

Everything is switched on at the first forward or optimizer step, when the
script has chosen its device; on a machine without CUDA it stays off (one
info line). DIAGNOSE_CUDA_EVENTS=0 turns it off.
"""

import functools
import os

from collectors.callsite import user_callsite
from collectors.daemon_thread import start_daemon
from collectors.instrument.cuda_event_timer import CudaEventTimer
from collectors.instrument.gpu_common import cuda_ready, gpu_unavailable, note_rank_device
from collectors.instrument.graph_capture import capturing, wrap_graph_class
from collectors.schema import EventRow, new_row

MAX_ANCHORS_KEPT = 200  # meta.json keeps the latest anchors' residual and drift


def _row(name, st, group="", nbytes=0, callsite="", step=None) -> EventRow:
    """A span's row template: its times are the events', filled in by the poll."""
    return new_row(
        EventRow,
        (
            "phase",
            f"gpu:{name}",
            None,
            None,
            st.step if step is None else step,
            st.microbatch,
            st.stage,
            group,
            "",
            -1,
            -1,
            nbytes,
            False,
            callsite,
            "cuda_event",
            -1,
        ),
    )


def install(rec):
    if os.environ.get("DIAGNOSE_CUDA_EVENTS", "1") == "0":
        return
    import torch

    if not torch.backends.cuda.is_built():
        gpu_unavailable(rec, "cuda_events", "CPU-only torch build")
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from collectors.instrument import collectives, records_compute_rows
    from collectors.instrument.forward_backward import on_outermost_forward

    st = rec.state
    state = {"on": None, "fwd": None, "step_ev": None, "primary": None, "opt": {}}
    anchors = rec.meta.setdefault("gpu", {}).setdefault("clock_anchors", [])

    def on_anchor(host_ns, residual_ns, drift_ns, device):
        anchors.append({"host_ns": host_ns, "residual_ns": residual_ns, "drift_ns": drift_ns, "device": device})
        del anchors[:-MAX_ANCHORS_KEPT]

    side_streams = {}

    def side_stream_for(device):
        if device not in side_streams:
            side_streams[device], how = dedicated_stream(torch, device)
            rec.meta["gpu"].setdefault("anchor_streams", {})[str(device)] = how
        return side_streams[device]

    timer = CudaEventTimer(
        lambda: torch.cuda.Event(enable_timing=True),
        on_anchor=on_anchor,
        device_of=lambda stream: torch.cuda.current_device() if stream is None else stream.device_index,
        side_stream_for=side_stream_for,
    )

    def ready() -> bool:
        if state["on"] is None:
            ok, reason = cuda_ready(torch)
            state["on"] = ok
            if not ok:
                gpu_unavailable(rec, "cuda_events", reason)
            else:
                try:
                    note_rank_device(torch)
                except Exception as exc:  # NVML keeps its guess from the environment
                    rec.record_error("gpu_identity", exc)
                start_daemon(poller, "diagnose-cuda-events")
        return state["on"]

    def timing() -> bool:
        """On the training thread: record events now (CUDA in use, nothing being captured)."""
        return ready() and not capturing(torch)

    def poller():
        interval = float(os.environ.get("DIAGNOSE_CUDA_EVENTS_POLL_S", "0.25"))
        while not rec._stop.wait(interval):
            try:
                for row in timer.poll():
                    rec.add(row)
            except Exception as exc:
                rec.record_error("cuda_events", exc)
                state["on"] = False
                return

    def last_poll():
        """At exit: what the device finished since the last poll, still without
        waiting for it; what it has not finished is counted, not waited for."""
        if state["on"]:
            for row in timer.poll():
                rec.add(row)
            rec.meta["gpu"]["pending_at_exit"] = timer.n_pending
            rec.meta["gpu"]["dropped_event_pairs"] = timer.dropped
            rec.meta["gpu"]["anchor_misses"] = timer.anchor_misses
            device = getattr(collectives.TRACKER, "device", None)
            if device is not None:
                rec.meta["gpu"]["never_waited_calls_forgotten"] = device.forgotten

    # the outermost forward, from forward_backward's Module.__call__ wrapper (global
    # module hooks would put every module call on PyTorch's slow path)
    compute_rows = records_compute_rows()  # DIAGNOSE_COMPUTE_ROWS=0: the step's span, no forward's

    def forward_start():
        try:
            if timing():
                start = timer.start()
                state["fwd"] = start if compute_rows else None
                if state["step_ev"] is None:
                    state["step_ev"] = (start, st.step)
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def forward_end():
        try:
            start, state["fwd"] = state["fwd"], None
            if start is not None and not capturing(torch):  # a capture begun since: its end would join it
                timer.finish(start, _row("forward", st))
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def step_pre(optimizer, args, kwargs):
        try:
            if timing():
                state["opt"][id(optimizer)] = timer.start()
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def step_post(optimizer, args, kwargs):
        opt_ev = state["opt"].pop(id(optimizer), None)
        if opt_ev is not None and not capturing(torch):  # every optimizer's step: its kernels on the current stream
            timer.finish(opt_ev, _row("optimizer", st))
        if state["primary"] is None:
            state["primary"] = id(optimizer)
        if id(optimizer) != state["primary"] or not timing():
            return
        ev = timer.start()
        if state["step_ev"] is not None:
            start_ev, step = state["step_ev"]
            timer.finish(start_ev, _row("step", st, step=step))
        state["step_ev"] = (ev, st.step)

    rec.close_hooks.append(last_poll)
    on_outermost_forward(forward_start, forward_end)
    register_optimizer_step_pre_hook(step_pre)
    register_optimizer_step_post_hook(step_post)
    depth = [0]  # Tensor.backward calls torch.autograd.backward: one span, the outermost
    if compute_rows:
        torch.Tensor.backward = _timed(torch.Tensor.backward, "backward", timer, timing, st, depth)
        torch.autograd.backward = _timed(torch.autograd.backward, "backward", timer, timing, st, depth)

    def replay(run):
        if not timing():
            return run()
        start = timer.start()
        result = run()
        timer.finish(start, _row("graph_replay", st))
        return result

    wrap_graph_class(torch.cuda.graphs.CUDAGraph, on_replay=replay)
    from collectors.instrument.collective_events import CollectiveEvents

    if collectives.TRACKER is not None:  # device rows of collectives (collective_events.py)
        nccl_timing = os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0").strip().lower() in ("1", "true", "yes", "y")
        collectives.TRACKER.device = CollectiveEvents(
            timer,
            ready,
            lambda: capturing(torch),
            nccl_timing,
            stream_of=lambda tensor: torch.cuda.current_stream(tensor.device),
        )


def _timed(orig, name, timer, ready, st, depth):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if depth[0] or not ready():
            return orig(*args, **kwargs)
        depth[0] += 1
        try:
            start = timer.start()
            result = orig(*args, **kwargs)
            if ready():  # `ready` is timing(): not if a capture began meanwhile
                timer.finish(start, _row(name, st, callsite=user_callsite(2)))
            return result
        finally:
            depth[0] -= 1

    return wrapper


def dedicated_stream(torch, device: int):
    """(stream, "dedicated" or "pool"): a stream of our own on `device` for the
    anchors. Not one of torch's pooled streams: NCCL draws its streams from the
    same pool, and an anchor queued behind a hung NCCL kernel never completes.
    cudaStreamCreateWithFlags(cudaStreamNonBlocking) from the process's own
    libcudart, wrapped as torch.cuda.ExternalStream (never destroyed: one per
    device for the life of the process); torch's pool where no libcudart is
    mapped (the anchor is then asked, never waited for: set_anchor)."""
    import ctypes

    path = next(
        (
            line.split()[-1]
            for line in open("/proc/self/maps", encoding="utf-8", errors="replace")
            if "libcudart.so" in line and line.split()[-1].startswith("/")
        ),
        None,
    )
    with torch.cuda.device(device):
        if path is not None:
            try:
                handle = ctypes.c_void_p()
                if ctypes.CDLL(path).cudaStreamCreateWithFlags(ctypes.byref(handle), 1) == 0 and handle.value:
                    return torch.cuda.ExternalStream(handle.value, device=device), "dedicated"
            except (OSError, AttributeError):
                pass
        return torch.cuda.Stream(device=device), "pool"
