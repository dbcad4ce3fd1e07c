"""Zero-code instrumentors, one per library concern (OpenTelemetry style).

Each module exposes `install(recorder)`. A failure to install, or a failure
inside a hook at run time, is recorded in the run and never reaches the job.
"""
import os

INSTRUMENTORS = ("clock_sync", "steps", "forward_backward", "dataloader", "collectives",
                 # today's stacks, each patched when the job imports it
                 "functional_collectives", "fsdp2", "pipelining",
                 "ddp", "host_sync", "host_sampler", "exceptions", "flight_recorder_dump",
                 # GPU and interop (issue 7); each is quiet on a machine without a GPU
                 "nvml_sampler", "net_sampler", "cuda_events", "sync_debug", "torch_profiler")


def injected_failure(name: str) -> bool:
    """True when a test asked this instrumentor to fail (DIAGNOSE_TEST_FAIL_COLLECTOR)."""
    return os.environ.get("DIAGNOSE_TEST_FAIL_COLLECTOR", "") == name


class InjectedFailure(RuntimeError):
    pass
