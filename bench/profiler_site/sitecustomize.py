"""bench/overhead.py's torch.profiler mode: put this folder on PYTHONPATH and
every torchrun worker (RANK and LOCAL_RANK set) records with torch.profiler,
CPU activities, from start-up to exit, marking each optimizer step
(ProfilerStep#N), as a user profiling every step would. The profiler is
stopped before the process group is destroyed (stopping it at interpreter exit,
after gloo's teardown, can hang the rank); the trace is not exported: that
happens after the last step and does not change step times.
"""

import atexit
import functools
import os

if os.environ.get("RANK") is not None and os.environ.get("LOCAL_RANK") is not None:
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile

    _prof = profile(activities=[ProfilerActivity.CPU])
    _prof.start()
    _stopped = []

    def _stop():
        if not _stopped:
            _stopped.append(True)
            _prof.stop()

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _prof.step())
    _destroy = dist.destroy_process_group

    @functools.wraps(_destroy)
    def _destroy_after_profiler(*args, **kwargs):
        _stop()
        return _destroy(*args, **kwargs)

    dist.destroy_process_group = _destroy_after_profiler
    atexit.register(_stop)
