"""torch.distributed.pipelining: each stage's forward and backward of one
micro-batch is a phase with the stage index and micro-batch the schedule gave
it, so pipeline detectors work on a job that marks no phases of its own
(these override the inference from send/recv topology: a phase names its
stage). PipelineStage's forward_one_chunk / backward_one_chunk (and
backward_weight_one_chunk, the weight half of zero-bubble schedules, a
"backward" too) run under `collectors.phase`, whatever schedule calls them
(GPipe, 1F1B, interleaved, zero-bubble). Patched when the job imports the
package; under torch.compile they run as torch's.

The schedule's own action order: at a schedule's first `step`, its class,
micro-batch count and per-rank order of actions (`pipeline_order`, pp rank ->
actions as torch writes them, "0F1" = stage 0 forward of micro-batch 1; idle
slots dropped) go into meta.json as `pipeline_schedule`, once. The bubble
detector plays that order (diagnose/analysis/tables/schedule_slots.py) for the idle
the schedule itself implies, whatever the schedule (1F1B, interleaved,
zero-bubble, one loaded from CSV).
"""

import functools
import weakref

from collectors.after_import import after_import
from collectors.phase import phase

STAGE_MODULE = "torch.distributed.pipelining.stage"
SCHEDULES_MODULE = "torch.distributed.pipelining.schedules"
METHODS = {"forward_one_chunk": "forward", "backward_one_chunk": "backward", "backward_weight_one_chunk": "backward"}


def _as_phase(orig, name, is_compiling):
    chunk_arg = "fwd_chunk_id" if name == "forward" else "bwd_chunk_id"

    @functools.wraps(orig)
    def method(self, *args, **kwargs):
        chunk_id = args[0] if args else kwargs.get(chunk_arg)
        if is_compiling() or not isinstance(chunk_id, int):
            return orig(self, *args, **kwargs)
        with phase(name, microbatch=chunk_id, stage=int(self.stage_index)):
            return orig(self, *args, **kwargs)

    return method


def install(rec):
    after_import(STAGE_MODULE, lambda: _patch(rec))
    after_import(SCHEDULES_MODULE, lambda: _patch_schedules(rec))


def _note_schedule(rec, schedule) -> None:
    order = getattr(schedule, "pipeline_order", None)
    if not isinstance(order, dict) or "pipeline_schedule" in rec.meta:
        return
    rec.meta["pipeline_schedule"] = {
        "schedule": type(schedule).__name__,
        "microbatches": int(getattr(schedule, "_n_microbatches", 0) or 0),
        "order": {str(rank): [str(a) for a in actions if a is not None] for rank, actions in order.items()},
    }
    rec.write_meta()


def _with_note(orig, rec, seen):
    @functools.wraps(orig)
    def step(self, *args, **kwargs):
        if self not in seen:
            seen.add(self)
            try:
                _note_schedule(rec, self)
            except Exception as exc:
                rec.record_error("pipelining", exc)
        return orig(self, *args, **kwargs)

    return step


def _patch_schedules(rec):
    try:
        import sys

        module = sys.modules[SCHEDULES_MODULE]
        base, seen = module._PipelineSchedule, weakref.WeakSet()
        for cls in list(vars(module).values()):
            if isinstance(cls, type) and issubclass(cls, base) and "step" in vars(cls):
                cls.step = _with_note(vars(cls)["step"], rec, seen)
    except Exception as exc:
        rec.record_error("pipelining", exc)


def _patch(rec):
    try:
        import sys

        import torch

        stage_cls = sys.modules[STAGE_MODULE]._PipelineStageBase
        for attr, name in METHODS.items():
            orig = getattr(stage_cls, attr, None)
            if orig is not None:
                setattr(stage_cls, attr, _as_phase(orig, name, torch.compiler.is_compiling))
    except Exception as exc:
        rec.record_error("pipelining", exc)
