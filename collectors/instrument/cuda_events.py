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
(0.25 s), turning completed pairs into rows. GPU times become host times
through an anchor: an event recorded on an otherwise idle side stream and
waited for right away (it runs at once, so the user's queue is never waited on),
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
import threading

from collectors.callsite import user_callsite
from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon
from collectors.instrument.gpu_common import cuda_ready, gpu_unavailable

MAX_PENDING = 100_000
REANCHOR_S = 60.0
MAX_ANCHORS_KEPT = 200   # meta.json keeps the latest anchors' residual and drift


class CudaEventTimer:
    """Pairs of events -> rows, resolved by `poll()` off the training thread.

    make_event() -> an object with record(stream=None), query(), elapsed_time(other)
    and synchronize(); side_stream is where anchors are recorded."""

    def __init__(self, make_event, side_stream=None, clock=now_ns, on_anchor=None):
        self.make_event = make_event
        self.side_stream = side_stream
        self.clock = clock
        self.on_anchor = on_anchor  # (host_ns, residual_ns, drift_ns or None) at every anchor
        self.pending = []       # [row_template, start_event, end_event, rows_of]
        self.anchor = None      # (event, host_ns)
        self.anchor_at = 0
        self.residual_ns = None
        self.dropped = 0
        self._lock = threading.Lock()

    def set_anchor(self) -> None:
        """Pair a GPU time with a host time: the event's host time lies between
        the clock read before it was recorded and the one after it completed,
        so that interval is the mapping's residual. Against the previous anchor
        the same pair also measures how far the two clocks drifted apart."""
        ev = self.make_event()
        before = self.clock()
        ev.record(self.side_stream)
        ev.synchronize()        # idle side stream: completes at once
        host_ns = self.clock()
        drift_ns = None
        if self.anchor is not None:
            drift_ns = host_ns - self._host_ns(ev)  # > 0: the host clock ran ahead of the GPU's
        self.anchor, self.anchor_at, self.residual_ns = (ev, host_ns), host_ns, host_ns - before
        if self.on_anchor is not None:
            self.on_anchor(host_ns, self.residual_ns, drift_ns)

    def start(self):
        ev = self.make_event()
        ev.record()
        return ev

    def finish(self, start_event, row_template, rows_of=None) -> None:
        """row_template: the event row with start/end left as None; or
        rows_of(start_ns, end_ns) -> the rows to write."""
        ev = self.make_event()
        ev.record()
        with self._lock:
            if len(self.pending) >= MAX_PENDING:
                self.dropped += 1
                return
            self.pending.append((row_template, start_event, ev, rows_of))

    def _host_ns(self, ev) -> int:
        anchor_ev, anchor_ns = self.anchor
        return anchor_ns + int(round(anchor_ev.elapsed_time(ev) * 1e6))

    def poll(self) -> list:
        """Rows for every pair the GPU has completed; the rest wait."""
        if self.anchor is None or self.clock() - self.anchor_at > REANCHOR_S * 1e9:
            self.set_anchor()
        with self._lock:
            pending, self.pending = self.pending, []
        rows, waiting = [], []
        for item in pending:
            row, start_ev, end_ev, rows_of = item
            if not end_ev.query():
                waiting.append(item)
                continue
            t0, t1 = self._host_ns(start_ev), self._host_ns(end_ev)
            if rows_of is None:
                rows.append(row[:2] + (t0, max(t1, t0)) + row[4:])
            else:
                rows.extend(rows_of(t0, max(t1, t0)))
        if waiting:
            with self._lock:
                self.pending[:0] = waiting
        return rows


def _row(name, st, group="", nbytes=0, callsite=""):
    return ("phase", f"gpu:{name}", None, None, st.step, st.microbatch, st.stage, group, "", -1, -1,
            nbytes, False, callsite, "cuda_event", -1)


def install(rec):
    if os.environ.get("DIAGNOSE_CUDA_EVENTS", "1") == "0":
        return
    import torch
    if not torch.backends.cuda.is_built():
        gpu_unavailable(rec, "cuda_events", "CPU-only torch build")
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from collectors.instrument.forward_backward import on_outermost_forward
    st = rec.state
    state = {"on": None, "fwd": None, "step_ev": None, "primary": None, "opt": {}}
    anchors = rec.meta.setdefault("gpu", {}).setdefault("clock_anchors", [])

    def on_anchor(host_ns, residual_ns, drift_ns):
        anchors.append({"host_ns": host_ns, "residual_ns": residual_ns, "drift_ns": drift_ns})
        del anchors[:-MAX_ANCHORS_KEPT]

    timer = CudaEventTimer(lambda: torch.cuda.Event(enable_timing=True), on_anchor=on_anchor)

    def ready() -> bool:
        if state["on"] is None:
            ok, reason = cuda_ready(torch)
            state["on"] = ok
            if not ok:
                gpu_unavailable(rec, "cuda_events", reason)
            else:
                timer.side_stream = torch.cuda.Stream()
                start_daemon(poller, "diagnose-cuda-events")
        return state["on"]

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
            rec.meta["gpu"]["pending_at_exit"] = len(timer.pending)
            rec.meta["gpu"]["dropped_event_pairs"] = timer.dropped

    # the outermost forward, from forward_backward's Module.__call__ wrapper (global
    # module hooks would put every module call on PyTorch's slow path)
    def forward_start():
        try:
            if ready():
                state["fwd"] = timer.start()
                if state["step_ev"] is None:
                    state["step_ev"] = (state["fwd"], st.step)
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def forward_end():
        try:
            if state["fwd"] is not None:
                timer.finish(state["fwd"], _row("forward", st))
                state["fwd"] = None
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def step_pre(optimizer, args, kwargs):
        try:
            if ready():
                state["opt"][id(optimizer)] = timer.start()
        except Exception as exc:
            rec.record_error("cuda_events", exc)

    def step_post(optimizer, args, kwargs):
        opt_ev = state["opt"].pop(id(optimizer), None)
        if opt_ev is not None:  # every optimizer's step: its kernels on the current stream
            timer.finish(opt_ev, _row("optimizer", st))
        if state["primary"] is None:
            state["primary"] = id(optimizer)
        if id(optimizer) != state["primary"] or not ready():
            return
        ev = timer.start()
        if state["step_ev"] is not None:
            start_ev, step = state["step_ev"]
            row = _row("step", st)
            timer.finish(start_ev, row[:4] + (step,) + row[5:])
        state["step_ev"] = (ev, st.step)

    rec.close_hooks.append(last_poll)
    on_outermost_forward(forward_start, forward_end)
    register_optimizer_step_pre_hook(step_pre)
    register_optimizer_step_post_hook(step_post)
    depth = [0]  # Tensor.backward calls torch.autograd.backward: one span, the outermost
    torch.Tensor.backward = _timed(torch.Tensor.backward, "backward", timer, ready, st, depth)
    torch.autograd.backward = _timed(torch.autograd.backward, "backward", timer, ready, st, depth)
    from collectors.instrument import collectives
    from collectors.instrument.collective_events import CollectiveEvents
    if collectives.TRACKER is not None:  # device rows of collectives (collective_events.py)
        nccl_timing = os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0").strip().lower() in ("1", "true", "yes", "y")
        collectives.TRACKER.device = CollectiveEvents(timer, ready, torch.cuda.is_current_stream_capturing,
                                                      nccl_timing)


def _timed(orig, name, timer, ready, st, depth):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if depth[0] or not ready():
            return orig(*args, **kwargs)
        depth[0] += 1
        try:
            start = timer.start()
            result = orig(*args, **kwargs)
            timer.finish(start, _row(name, st, callsite=user_callsite(2)))
            return result
        finally:
            depth[0] -= 1

    return wrapper
