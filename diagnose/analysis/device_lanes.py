"""The what-if replay's inputs on device time: each rank's lane is its GPU, not
its host thread (diagnose/analysis/step_replay.py models lanes; this module
says what a lane is made of when the kernels are recorded).

- A collective is its NCCL kernel: it arrives when the kernel starts (the
  stream got to it) and ends with its instance (every member's kernel ends
  together). It holds the rank's lane until then: the compute after a
  collective is taken to consume its output, as the optimizer consumes the
  gradients' all-reduce. Where compute overlaps communication (DDP buckets
  during backward, FSDP prefetch) the model serialises the two: replayed as
  recorded it still gives every step back (the gap after a kernel is signed
  and keeps the overlap), but a what-if that shortens the communication
  overstates its saving, and exposed_comm's what-if is not used on device.
- A rank's step on the device runs from the first start to the last end of
  the kernels launched in it.
- The work to scale (a straggler's, a stage's, a micro-batch's) is the union
  of its compute kernels, not host phases: on CUDA the host returns before the
  device works.
Used for steps the kernels cover on every rank (imports; a live run's
profiler window is too few steps to replay).
"""
import numpy as np
import pandas as pd

from diagnose.analysis.device_collectives import timed_on_device
from diagnose.analysis.gpu_tables import COMPUTE, merge_intervals


def device_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """The device rows of the collectives table, each a call that holds the lane
    from its kernel's start to its kernel's end."""
    dev = calls[timed_on_device(calls["detail"]) & calls["exit_ns"].notna()]
    return dev.assign(async_op=False, return_ns=dev["exit_ns"].astype(np.int64),
                      wait_start_ns=np.nan, wait_end_ns=np.nan)


def device_steps(kernels: pd.DataFrame) -> pd.DataFrame:
    """rank, step, start_ns, end_ns: the span of the kernels launched in each step."""
    k = kernels[kernels["step"] >= 0]
    return (k.groupby(["rank", "step"], as_index=False)
            .agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max")))


def compute_rows(kernels: pd.DataFrame) -> pd.DataFrame:
    """rank, start_ns, end_ns: the union of each rank's compute kernels."""
    out = []
    for rank, k in kernels[kernels["kind"] == COMPUTE].groupby("rank"):
        starts, ends = merge_intervals(k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64))
        out.append(pd.DataFrame({"rank": int(rank), "start_ns": starts, "end_ns": ends}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["rank", "start_ns", "end_ns"])
