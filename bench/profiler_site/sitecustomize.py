"""bench/overhead.py's torch.profiler mode: put this folder on PYTHONPATH and
every torchrun worker (RANK and LOCAL_RANK set) records with torch.profiler,
CPU activities, from start-up to exit, marking each optimizer step
(ProfilerStep#N), as a user profiling every step would. The trace is not
exported: that happens after the last step and does not change step times.
"""
import atexit
import os

if os.environ.get("RANK") is not None and os.environ.get("LOCAL_RANK") is not None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile

    _prof = profile(activities=[ProfilerActivity.CPU])
    _prof.start()
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _prof.step())
    atexit.register(_prof.stop)
