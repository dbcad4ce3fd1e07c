"""A PyTorch-profiler window over chosen steps: `diagnose run --torch-profiler 10-12`
sets DIAGNOSE_TORCH_PROFILER=10-12 and every rank records steps 10 to 12 with
torch.profiler (CPU, and CUDA when the build and device have it), then writes
the Kineto trace to <rank dir>/torch_profiler/rank-NNNNN.pt.trace.json.gz.

Why: our own events say which phase is slow; the profiler's kernels say why
(which kernels, how busy the GPU is, whether communication overlaps compute).
`diagnose run` imports the GPU activity of these traces into the run after the
job (diagnose.importers.kineto.import_profiler_windows), on the same step
numbers: the window is driven by the optimizer step hooks, as the step events
are, and the profiler's ProfilerStep#N is our step N.

Cost: profiling slows the profiled steps, and writing the trace at the end of
the window pauses the rank for a moment; keep the window short. A job that ends
inside the window still writes what was recorded (at exit).
"""

import atexit
import os

from collectors.clock import now_ns
from collectors.profiler_window import ENV, OUT_DIR, parse_window


class Window:
    """Starts the profiler when step `first` begins, marks each step, stops and
    exports when step `last` ends. `boundary()` is called when a step ends."""

    def __init__(self, rec, first, last, make_profiler):
        self.rec = rec
        self.first, self.last = first, last
        self.make_profiler = make_profiler
        self.steps_done = 0
        self.prof = None
        self.path = None

    def start(self) -> None:
        self.prof = self.make_profiler()
        self.prof.step_num = self.first
        self.prof.start()

    def boundary(self) -> None:
        self.steps_done += 1
        starting = self.steps_done
        if self.prof is None and self.path is None and starting == self.first:
            self.start()
        elif self.prof is not None and starting <= self.last:
            self.prof.step()
        elif self.prof is not None:
            self.finish()

    def finish(self) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        t0 = now_ns()
        prof.stop()
        rank = self.rec.meta.get("rank", int(os.environ.get("RANK", 0)))
        out = os.path.join(self.rec.rank_dir, OUT_DIR)
        os.makedirs(out, exist_ok=True)
        self.path = os.path.join(out, f"rank-{rank:05d}.pt.trace.json.gz")
        prof.export_chrome_trace(self.path)
        t1 = now_ns()
        self.rec.add(
            (
                "mark",
                "torch_profiler_export",
                t0,
                t1,
                self.rec.state.step,
                -1,
                -1,
                "",
                "",
                -1,
                -1,
                0,
                False,
                "",
                self.path,
                -1,
            )
        )


def _make_profiler():
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.backends.cuda.is_built() and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    # A schedule makes the profiler label steps (ProfilerStep#N); we start and
    # stop it ourselves, so it always says "record".
    return profile(activities=activities, schedule=lambda step: ProfilerAction.RECORD)


def install(rec):
    spec = os.environ.get(ENV)
    if not spec or rec.rank_dir is None:
        return
    first, last = parse_window(spec)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    window = Window(rec, first, last, _make_profiler)
    primary = []

    def post(optimizer, args, kwargs):
        if not primary:
            primary.append(id(optimizer))
        if id(optimizer) != primary[0]:
            return
        try:
            window.boundary()
        except Exception as exc:
            rec.record_error("torch_profiler", exc)

    def at_exit():
        try:
            window.finish()
        except Exception as exc:
            rec.record_error("torch_profiler", exc)

    register_optimizer_step_post_hook(post)
    atexit.register(at_exit)
    if first == 0:
        window.start()
