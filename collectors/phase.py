"""Explicit ranges for code that knows its own structure:

    with collectors.phase("forward", microbatch=i, stage=s):
        ...

    @collectors.phase("optimizer")
    def step(): ...

Inside a phase, every event the zero-code instrumentors record (collectives,
syncs, module forwards) is stamped with the phase's micro-batch and stage, which
is what lets the analyzer tell a collective inside the micro-batch loop from one
outside it. Outside `diagnose run` a phase costs two attribute reads.
"""

import functools

from collectors import nvtx_ranges
from collectors.clock import now_ns
from collectors.core_wait import queued_ns, queued_since
from collectors.recorder import get_recorder


class phase:
    __slots__ = ("name", "microbatch", "stage", "_rec", "_t0", "_q0", "_step", "_saved")

    def __init__(self, name: str, microbatch: int | None = None, stage: int | None = None):
        self.name = name
        self.microbatch = microbatch
        self.stage = stage

    def __enter__(self):
        rec = get_recorder()
        if not rec.active:
            self._rec = None
            return self
        self._rec = rec  # the exit records into the recorder the entry saw
        st = rec.state
        self._saved = (st.microbatch, st.stage)
        if self.microbatch is not None:
            st.microbatch = self.microbatch
        if self.stage is not None:
            st.stage = self.stage
        if nvtx_ranges.MIRRORING:
            nvtx_ranges.push(self.name, "phase")
        self._q0 = queued_ns()
        self._t0 = now_ns()
        self._step = st.step  # a phase around optimizer.step() belongs to the step it ends
        if st.step_start_ns is None:
            st.step_start_ns = self._t0
        return self

    def __exit__(self, exc_type, exc, tb):
        rec = self._rec
        if rec is None:
            return False
        t1 = now_ns()
        queued = queued_since(self._q0)
        if nvtx_ranges.MIRRORING:
            nvtx_ranges.pop()
        st = rec.state
        rec.add(
            (
                "phase",
                self.name,
                self._t0,
                t1,
                self._step,
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
                queued,
            )
        )
        st.microbatch, st.stage = self._saved
        return False

    def __call__(self, fn):
        name, microbatch, stage = self.name, self.microbatch, self.stage

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with phase(name, microbatch, stage):
                return fn(*args, **kwargs)

        return wrapped


def mark(name: str, detail: str = "") -> None:
    """An instant event (e.g. "checkpoint saved")."""
    rec = get_recorder()
    if rec.active:
        t = now_ns()
        rec.add(
            (
                "mark",
                name,
                t,
                t,
                rec.state.step,
                rec.state.microbatch,
                rec.state.stage,
                "",
                "",
                -1,
                -1,
                0,
                False,
                "",
                detail,
                -1,
            )
        )
