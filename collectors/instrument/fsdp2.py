"""FSDP2 (`fully_shard`): each all-gather and reduce-scatter row names the FSDP
unit it serves, detail "fsdp:<module fqn>" ("fsdp:<root>" for the root unit).

FSDP2 issues its collectives through torch.distributed (collectives.py records
them), but their callsite is the user's forward or backward call, the same for
every unit. A unit's unshard (its parameters' all-gather, prefetched or not)
and post-backward (its gradients' reduce-scatter) run as methods of its
FSDPParamGroup, which knows the unit's module name: while one runs, the
tracker's context is that unit. Patched when the job imports FSDP2 (0.6 s of
imports here: never for a job that does not use it). Under torch.compile the
methods run as torch's.
"""

import functools

from collectors.after_import import after_import
from collectors.instrument import collectives

PARAM_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
METHODS = ("unshard", "post_backward")


def _in_unit(tracker, orig, is_compiling):
    @functools.wraps(orig)
    def method(self, *args, **kwargs):
        if is_compiling():
            return orig(self, *args, **kwargs)
        saved = tracker.context
        tracker.context = f"fsdp:{getattr(self, '_module_fqn', None) or '<root>'}"
        try:
            return orig(self, *args, **kwargs)
        finally:
            tracker.context = saved

    return method


def install(rec):
    if collectives.TRACKER is None:
        return
    after_import(PARAM_GROUP, lambda: _patch(rec))


def _patch(rec):
    try:
        import sys

        import torch

        group_cls = sys.modules[PARAM_GROUP].FSDPParamGroup
        for name in METHODS:
            setattr(
                group_cls, name, _in_unit(collectives.TRACKER, getattr(group_cls, name), torch.compiler.is_compiling)
            )
    except Exception as exc:
        rec.record_error("fsdp2", exc)
