"""torch.distributed.pipelining: each stage's forward and backward of one
micro-batch is a phase with the stage index and micro-batch the schedule gave
it, so pipeline detectors work on a job that marks no phases of its own
(these override the inference from send/recv topology: a phase names its
stage). PipelineStage's forward_one_chunk / backward_one_chunk (and
backward_weight_one_chunk, the weight half of zero-bubble schedules, a
"backward" too) run under `collectors.phase`, whatever schedule calls them
(GPipe, 1F1B, interleaved, zero-bubble). Patched when the job imports the
package; under torch.compile they run as torch's.
"""
import functools

from collectors.after_import import after_import
from collectors.phase import phase

STAGE_MODULE = "torch.distributed.pipelining.stage"
METHODS = {"forward_one_chunk": "forward", "backward_one_chunk": "backward",
           "backward_weight_one_chunk": "backward"}


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
