"""What the device does while the host waits, on a run with kernel rows (imported
Kineto or Nsight traces; kernels: gpu_tables.kernels_table's).

input_wait(): per rank, how much of the step the training loop spends waiting
for the input pipeline, with the GPU-side view of the same stall:
data_wait_frac (diagnose.analysis.tables.breakdown's data_wait / step time), gpu_idle_frac
(no kernel running, within steps) and gpu_idle_in_data_wait_frac (the GPU is
idle while the CPU waits for data: the share of step time that input loading
costs the GPU directly).
device_idle_behind_syncs(): one row per host sync (cudaStreamSynchronize &
co., kind "sync") on a rank with kernels: how long it blocked the host
(host_ms) and how long the device then sat idle (device_idle_ms): from the
sync's return until the host gave the device work again, the first of the
next kernel's start and the start of the host's next range (a phase, a step,
a data wait: from then on the idle is theirs; a kernel that starts later is
waiting for a dependency, a neighbouring stage or a straggler, not for this
sync). Idle while the host is still blocked is not counted: work was queued
then, waiting for something else. A sync with work still queued behind it
(an event sync on an earlier kernel) leaves the device busy and costs nothing;
one that drains the queue costs the host's time to launch again, every time.
What the sync caused (idle_caused_ms) is at most what it made the host wait:
without it the host would have issued its next work host_ms sooner, so the
idle shrinks by min(device_idle_ms, host_ms). A sync that returns at once found
the device already idle: the host was behind, and the sync costs nothing.

device_data_wait(): per rank and step, the time the host waits for data
(data_wait_ms) and the part of it during which no kernel runs
(idle_in_data_wait_ms): a host that waits for its input while the device still
works through the previous step's queue loses nothing.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.tables.gpu_tables import busy_before, covered_ns, intersection_ns

# the host's own ranges: when one starts after a sync, the host has moved on
HOST_RANGE_KINDS = ("step", "phase", "forward", "backward", "optimizer", "data", "sync")


# a kernel that started within this of its launch found its GPU's queue empty: it
# ran as soon as the host launched it (launch latency is ~5-10 us on current GPUs)
LAUNCH_BOUND_NS = 20_000


def idle_before_launches(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank's kernels: (start, idle_from, step) of those launched onto an idle GPU
    (queued_ns within LAUNCH_BOUND_NS), the device idle from idle_from (the furthest
    end of the rank's kernels before it; the first kernel's: any time) to start."""
    k = kernels.sort_values("start_ns", kind="stable")
    start, queued = k["start_ns"].to_numpy(np.int64), k["queued_ns"].to_numpy(np.int64)
    idle_from = np.append(np.iinfo(np.int64).min, np.maximum.accumulate(k["end_ns"].to_numpy(np.int64))[:-1])
    bound = (queued >= 0) & (queued <= LAUNCH_BOUND_NS)
    return start[bound], idle_from[bound], k["step"].to_numpy()[bound]


def input_wait(
    breakdown: pd.DataFrame, steps: pd.DataFrame, kernels: pd.DataFrame, data_wait: pd.DataFrame
) -> pd.DataFrame:
    """Per rank over all steps; data_wait is device_data_wait()'s table."""
    rows = []
    idle_in_data = data_wait.groupby("rank")["idle_in_data_wait_ms"].sum() * 1e6
    for rank, b in breakdown.groupby("rank"):
        step_ms = float(b["step_ms"].sum())
        row = {
            "rank": int(rank),
            "steps": len(b),
            "step_ms": step_ms,
            "data_wait_ms": float(b["data_wait_ms"].sum()),
            "data_wait_frac": float(b["data_wait_ms"].sum()) / step_ms if step_ms else float("nan"),
            "gpu_idle_frac": float("nan"),
            "gpu_idle_in_data_wait_frac": float("nan"),
        }
        k = kernels[kernels["rank"] == rank]
        st = steps[steps["rank"] == rank]
        if len(k) and len(st) and step_ms:
            step_iv = (st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64))
            busy_in_steps = intersection_ns((k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)), step_iv)
            step_ns = covered_ns(*step_iv)
            if step_ns:
                row["gpu_idle_frac"] = 1 - busy_in_steps / step_ns
                row["gpu_idle_in_data_wait_frac"] = float(idle_in_data.get(rank, 0.0)) / step_ns
        rows.append(row)
    columns = [
        "rank",
        "steps",
        "step_ms",
        "data_wait_ms",
        "data_wait_frac",
        "gpu_idle_frac",
        "gpu_idle_in_data_wait_frac",
    ]
    return pd.DataFrame(rows, columns=columns).set_index("rank")


def _idle_ns(busy_before, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return np.maximum((ends - starts) - (busy_before(ends) - busy_before(starts)), 0)


def _next_at_or_after(times: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each t, the first of the sorted `times` >= t (int64 max if none)."""
    i = np.searchsorted(times, t, side="left")
    padded = np.append(times, np.iinfo(np.int64).max)
    return padded[i]


def device_idle_behind_syncs(events: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    columns = ["rank", "step", "name", "callsite", "start_ns", "end_ns", "host_ms", "device_idle_ms", "idle_caused_ms"]
    parts = []
    for rank, syncs in events[events["kind"] == "sync"].groupby("rank"):
        k = kernels[kernels["rank"] == rank]
        if k.empty:
            continue
        start, end = syncs["start_ns"].to_numpy(np.int64), syncs["end_ns"].to_numpy(np.int64)
        host = events[(events["rank"] == rank) & events["kind"].isin(HOST_RANGE_KINDS)]
        resume = np.minimum(
            _next_at_or_after(np.sort(k["start_ns"].to_numpy(np.int64)), end),
            _next_at_or_after(np.sort(host["start_ns"].to_numpy(np.int64)), end),
        )
        resume = np.where(resume == np.iinfo(np.int64).max, end, resume)
        idle = _idle_ns(busy_before(k), end, resume)
        parts.append(
            pd.DataFrame(
                {
                    "rank": int(rank),
                    "step": syncs["step"].to_numpy(np.int64),
                    "name": syncs["name"].astype(str).to_numpy(),
                    "callsite": syncs["callsite"].astype(str).to_numpy(),
                    "start_ns": start,
                    "end_ns": end,
                    "host_ms": (end - start) / 1e6,
                    "device_idle_ms": idle / 1e6,
                    "idle_caused_ms": np.minimum(idle, end - start) / 1e6,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def device_data_wait(events: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    columns = ["rank", "step", "data_wait_ms", "idle_in_data_wait_ms"]
    rows = []
    data_all = events[(events["kind"] == "data") & (events["step"] >= 0)]
    for rank, data in data_all.groupby("rank"):
        k = kernels[kernels["rank"] == rank]
        if k.empty:
            continue
        start, end = data["start_ns"].to_numpy(np.int64), data["end_ns"].to_numpy(np.int64)
        per_step = (
            pd.DataFrame(
                {
                    "step": data["step"].to_numpy(np.int64),
                    "wait": (end - start) / 1e6,
                    "idle": _idle_ns(busy_before(k), start, end) / 1e6,
                }
            )
            .groupby("step")
            .sum()
        )
        rows.extend((int(rank), int(step), float(r["wait"]), float(r["idle"])) for step, r in per_step.iterrows())
    return pd.DataFrame(rows, columns=columns)
