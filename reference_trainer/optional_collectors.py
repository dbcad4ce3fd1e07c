"""`phase` from collectors, or a do-nothing stand-in: where collectors is absent
(the trainer must also run on a machine that only has this package), and when
REFERENCE_TRAINER_PHASES=0 asks for a job that marks no phases, stages or
micro-batches at all, as most jobs do (the analysis must then infer the pipeline
from the traffic: diagnose/analysis/tables/pipeline_topology.py)."""

import functools
import os


class _no_phase:
    def __init__(self, name: str, microbatch: int | None = None, stage: int | None = None):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapped


try:
    from collectors import phase
except ImportError:  # pragma: no cover - collectors ships with this repo
    phase = _no_phase
if os.environ.get("REFERENCE_TRAINER_PHASES", "1") == "0":
    phase = _no_phase  # noqa: F811

__all__ = ["phase"]
