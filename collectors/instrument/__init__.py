"""Zero-code instrumentors, one per library concern (OpenTelemetry style).

Each module exposes `install(recorder)`. A failure to install, or a failure
inside a hook at run time, is recorded in the run and never reaches the job.
"""

import os

INSTRUMENTORS = (
    "process_group_identity",
    "clock_sync",
    "steps",
    "forward_backward",
    "dataloader",
    "collectives",
    # today's stacks, each patched when the job imports it
    "functional_collectives",
    "fsdp2",
    "pipelining",
    "ddp",
    "host_sync",
    "host_sampler",
    "exceptions",
    "flight_recorder_dump",
    "fault_stacks",
    "checkpoints",
    # one step's FLOPs for MFU (after "steps": its post-hook reads the step number)
    "flop_count",
    # GPU and interop (issue 7); each is quiet on a machine without a GPU
    "nvml_sampler",
    "net_sampler",
    "cuda_events",
    "sync_debug",
    "torch_profiler",
)


def on_process_group(callback) -> None:
    """callback() once the job's default process group exists: now, if it does (a
    process recorded from its init_process_group on), else each time
    init_process_group returns. Call after `import torch`."""
    import functools

    import torch.distributed as dist

    if not dist.is_available():
        return
    if dist.is_initialized():
        callback()
        return
    c10d = dist.distributed_c10d
    orig = c10d.init_process_group

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        callback()
        return result

    for mod in (c10d, dist):
        if getattr(mod, "init_process_group", None) is orig:
            mod.init_process_group = init_process_group


def records_compute_rows(environ=os.environ) -> bool:
    """False under DIAGNOSE_COMPUTE_ROWS=0: no forward or backward rows (host or
    device), as in what a Kineto or Nsight capture of a job holds, so that a live
    run checks the analysis on what an imported trace gives it
    (diagnose/analysis/tables/inferred_compute.py). Every other row stays."""
    return environ.get("DIAGNOSE_COMPUTE_ROWS", "1") != "0"


def injected_failure(name: str) -> bool:
    """True when a test asked this instrumentor to fail (DIAGNOSE_TEST_FAIL_COLLECTOR)."""
    return os.environ.get("DIAGNOSE_TEST_FAIL_COLLECTOR", "") == name


class InjectedFailure(RuntimeError):
    pass
