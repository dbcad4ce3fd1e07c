"""Zero-code instrumentors, one per library concern (OpenTelemetry style).

Each module exposes `install(recorder)`. A failure to install, or a failure
inside a hook at run time, is recorded in the run and never reaches the job.
"""
import os

INSTRUMENTORS = ("clock_sync", "steps", "forward_backward", "dataloader", "collectives", "ddp",
                 "host_sync", "host_sampler")


def injected_failure(name: str) -> bool:
    """True when a test asked this instrumentor to fail (DIAGNOSE_TEST_FAIL_COLLECTOR)."""
    return os.environ.get("DIAGNOSE_TEST_FAIL_COLLECTOR", "") == name


class InjectedFailure(RuntimeError):
    pass
