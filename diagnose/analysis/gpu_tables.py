"""GPU-side tables of a run with kernel rows (imported Kineto or Nsight traces).

kernels(): one row per GPU activity: start_ns, end_ns, name, kind (class:
compute / communication / memory / other, HTA's kernel types), rank, stream,
step (the profiler step that launched it), correlation, bytes, dur_ms; name
and kind are pandas categoricals.

temporal_breakdown(), HTA's definition (TraceAnalysis.get_temporal_breakdown):
for each rank, over the span from the start of its first GPU kernel to the end
of its last one,

    compute_frac      time at least one compute kernel runs, / span
    non_compute_frac  time some kernel runs but no compute kernel does
                      (communication, memory copies and sets, GPU syncs), / span
    idle_frac         time no kernel runs at all, / span

so the three add up to 1. As HTA does, when a rank has at least two profiler
steps, only kernels launched inside the trace before its last step count (the
profiler stops inside that step, so its tail is cut short). One deliberate
difference: HTA rounds nanosecond-resolution traces inward to whole
microseconds (start up, end down), which shortens every short kernel; we keep
the nanoseconds, so on such traces our idle_frac is up to ~1 point lower
(measured on HTA's own fixtures: 0.2-0.95 points; identical elsewhere).

device_compute(): per rank and step, the time at least one compute kernel ran
(device_compute_ms), kernels counted in the step that launched them: a rank's
busy time on the device, which the straggler detector compares across ranks.

device_exposed_comm(): per rank and step, communication-kernel time (comm_ms)
and the part of it no compute kernel overlaps (exposed_comm_ms): what the
device spends communicating, or waiting inside NCCL kernels for the last
member, with nothing else to do.

comm_comp_overlap(): per rank, the fraction of communication-kernel time
(union over streams) during which a compute kernel also runs: near 1, the
collectives are hidden behind compute; near 0, they are exposed.

input_wait(): per rank, how much of the step the training loop spends waiting
for the input pipeline, with the GPU-side view of the same stall:
data_wait_frac (diagnose.analysis.breakdown's data_wait / step time), gpu_idle_frac
(no kernel running, within steps) and gpu_idle_in_data_wait_frac (the GPU is
idle while the CPU waits for data: the share of step time that input loading
costs the GPU directly).
"""
import numpy as np
import pandas as pd

from collectors.schema import COMMUNICATION, COMPUTE
from diagnose.analysis.matching import per_distinct

KERNEL_COLUMNS = ["rank", "start_ns", "end_ns", "name", "kind", "stream", "step", "correlation",
                  "bytes", "dur_ms"]


def kernels_table(events: pd.DataFrame) -> pd.DataFrame:
    rows = events[events["kind"] == "kernel"]
    table = pd.DataFrame({
        "rank": rows["rank"].astype("int64"), "start_ns": rows["start_ns"].astype("int64"),
        "end_ns": rows["end_ns"].astype("int64"), "name": _categorical(rows["name"]),
        "kind": _categorical(rows["detail"]),
        "stream": per_distinct(rows["group"], lambda group: pd.to_numeric(group.astype(str), errors="coerce"))
                  .fillna(-1).astype("int64"),
        "step": rows["step"].astype("int64"), "correlation": rows["seq"].astype("int64"),
        "bytes": rows["bytes"].astype("int64")})
    table["dur_ms"] = (table["end_ns"] - table["start_ns"]) / 1e6
    return table.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)[KERNEL_COLUMNS]


def _categorical(series: pd.Series) -> pd.Series:
    """Kernel names and classes stay pandas categoricals, as the loader reads
    them: a few hundred distinct strings over 10^5-10^7 kernels (one Python
    string per row cost more than the whole breakdown)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.remove_unused_categories()
    return series.astype(str).astype("category")


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint intervals."""
    if len(starts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > running_end[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def covered_ns(starts, ends) -> int:
    s, e = merge_intervals(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    return int((e - s).sum())


def intersection_ns(a, b) -> int:
    """Length of (union of intervals a) ∩ (union of intervals b); a, b = (starts, ends)."""
    a_s, a_e = merge_intervals(*a)
    b_s, b_e = merge_intervals(*b)
    total, j = 0, 0
    for s, e in zip(a_s.tolist(), a_e.tolist()):
        while j < len(b_s) and b_e[j] <= s:
            j += 1
        k = j
        while k < len(b_s) and b_s[k] < e:
            total += min(e, int(b_e[k])) - max(s, int(b_s[k]))
            k += 1
    return total


def analysed_kernels(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Kernels HTA's breakdown uses: when a rank has two profiler steps or more,
    those launched inside the traced steps before the last one (its launch is
    in the trace, correlation >= 0); otherwise all of them."""
    if kernels.empty or steps.empty:
        return kernels
    last = steps.groupby("rank")["step"].agg(["max", "size"])
    last = last[last["size"] >= 2]["max"]
    cutoff = kernels["rank"].map(last)
    keep = cutoff.isna() | ((kernels["step"] < cutoff) & (kernels["correlation"] >= 0))
    return kernels[keep]


def temporal_breakdown(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for rank, k in analysed_kernels(kernels, steps).groupby("rank"):
        s, e = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
        span = int(e.max() - s.min())
        busy = covered_ns(s, e)
        comp = (k["kind"] == COMPUTE).to_numpy()
        compute = covered_ns(s[comp], e[comp])
        frac = (lambda x: x / span) if span > 0 else (lambda x: float("nan"))
        rows.append({"rank": int(rank), "idle_frac": frac(span - busy), "compute_frac": frac(compute),
                     "non_compute_frac": frac(busy - compute), "span_ms": span / 1e6,
                     "idle_ms": (span - busy) / 1e6, "compute_ms": compute / 1e6,
                     "non_compute_ms": (busy - compute) / 1e6, "kernels": len(k)})
    columns = ["rank", "idle_frac", "compute_frac", "non_compute_frac", "span_ms", "idle_ms",
               "compute_ms", "non_compute_ms", "kernels"]
    return pd.DataFrame(rows, columns=columns).set_index("rank")


def device_compute(kernels: pd.DataFrame) -> pd.DataFrame:
    compute = kernels[(kernels["kind"] == COMPUTE) & (kernels["step"] >= 0)]
    if compute.empty:
        return pd.DataFrame({"rank": [], "step": [], "device_compute_ms": []})
    rows = [(int(rank), int(step), covered_ns(k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)) / 1e6)
            for (rank, step), k in compute.groupby(["rank", "step"])]
    return pd.DataFrame(rows, columns=["rank", "step", "device_compute_ms"])


def device_exposed_comm(kernels: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (rank, step), k in kernels[kernels["step"] >= 0].groupby(["rank", "step"]):
        s, e = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
        comm, comp = (k["kind"] == COMMUNICATION).to_numpy(), (k["kind"] == COMPUTE).to_numpy()
        comm_ns = covered_ns(s[comm], e[comm])
        if comm_ns:
            hidden = intersection_ns((s[comm], e[comm]), (s[comp], e[comp]))
            rows.append((int(rank), int(step), comm_ns / 1e6, (comm_ns - hidden) / 1e6))
    return pd.DataFrame(rows, columns=["rank", "step", "comm_ms", "exposed_comm_ms"])


def comm_comp_overlap(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for rank, k in analysed_kernels(kernels, steps).groupby("rank"):
        s, e = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
        comm, comp = (k["kind"] == COMMUNICATION).to_numpy(), (k["kind"] == COMPUTE).to_numpy()
        comm_ns = covered_ns(s[comm], e[comm])
        overlap = intersection_ns((s[comm], e[comm]), (s[comp], e[comp]))
        rows.append({"rank": int(rank), "comm_ms": comm_ns / 1e6, "overlap_ms": overlap / 1e6,
                     "overlap_frac": overlap / comm_ns if comm_ns else float("nan")})
    return pd.DataFrame(rows, columns=["rank", "comm_ms", "overlap_ms", "overlap_frac"]).set_index("rank")


def input_wait(breakdown: pd.DataFrame, steps: pd.DataFrame, events: pd.DataFrame,
               kernels: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for rank, b in breakdown.groupby("rank"):
        step_ms = float(b["step_ms"].sum())
        row = {"rank": int(rank), "steps": len(b), "step_ms": step_ms,
               "data_wait_ms": float(b["data_wait_ms"].sum()),
               "data_wait_frac": float(b["data_wait_ms"].sum()) / step_ms if step_ms else float("nan"),
               "gpu_idle_frac": float("nan"), "gpu_idle_in_data_wait_frac": float("nan")}
        k = kernels[kernels["rank"] == rank]
        st = steps[steps["rank"] == rank]
        if len(k) and len(st) and step_ms:
            step_iv = (st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64))
            busy_in_steps = intersection_ns((k["start_ns"].to_numpy(np.int64),
                                             k["end_ns"].to_numpy(np.int64)), step_iv)
            step_ns = covered_ns(*step_iv)
            row["gpu_idle_frac"] = 1 - busy_in_steps / step_ns if step_ns else float("nan")
            data = events[(events["rank"] == rank) & (events["kind"] == "data")]
            d_iv = (data["start_ns"].to_numpy(np.int64), data["end_ns"].to_numpy(np.int64))
            data_in_steps = intersection_ns(d_iv, step_iv)
            idle_data = intersection_ns(d_iv, _complement(k, step_iv)) if data_in_steps else 0
            row["gpu_idle_in_data_wait_frac"] = idle_data / step_ns if step_ns else float("nan")
        rows.append(row)
    columns = ["rank", "steps", "step_ms", "data_wait_ms", "data_wait_frac", "gpu_idle_frac",
               "gpu_idle_in_data_wait_frac"]
    return pd.DataFrame(rows, columns=columns).set_index("rank")


def _complement(k: pd.DataFrame, within) -> tuple[np.ndarray, np.ndarray]:
    """Intervals inside `within` where no kernel of `k` runs."""
    w_s, w_e = merge_intervals(*within)
    b_s, b_e = merge_intervals(k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64))
    out_s, out_e = [], []
    j = 0
    for s, e in zip(w_s.tolist(), w_e.tolist()):
        cur = s
        while j < len(b_s) and b_e[j] <= s:
            j += 1
        k2 = j
        while k2 < len(b_s) and b_s[k2] < e:
            if b_s[k2] > cur:
                out_s.append(cur)
                out_e.append(int(b_s[k2]))
            cur = max(cur, int(b_e[k2]))
            k2 += 1
        if cur < e:
            out_s.append(cur)
            out_e.append(e)
    return np.array(out_s, np.int64), np.array(out_e, np.int64)
