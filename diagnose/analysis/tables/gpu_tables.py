"""GPU-side tables of a run with kernel rows (imported Kineto or Nsight traces).

kernels(): one row per GPU activity: start_ns, end_ns, name, kind (class:
compute / communication / memory / other, HTA's kernel types), rank, stream,
step (the profiler step that launched it), correlation, bytes, dur_ms,
queued_ns (launch to start: ~0 when the GPU waited for the host; -1 unknown);
name and kind are pandas categoricals.

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

device_compute_spans(): the same from a live CUDA run's event spans (no
kernels recorded): per rank and step, the union of its gpu:forward,
gpu:backward and gpu:optimizer spans (collectors/instrument/cuda_events.py), the time from the
device reaching a forward's start to finishing its last kernel: an upper bound
of the compute, as it includes what the stream waited for in between.

device_exposed_comm(): per rank and step, communication-kernel time (comm_ms)
and the part of it no compute kernel overlaps (exposed_comm_ms): what the
device spends communicating, or waiting inside NCCL kernels for the last
member, with nothing else to do; span_ms, first kernel start to last kernel
end of the step's kernels (they run past the host's step end when the device
lags), the share's denominator where it exceeds the host step.

comm_comp_overlap(): per rank, the fraction of communication-kernel time
(union over streams) during which a compute kernel also runs: near 1, the
collectives are hidden behind compute; near 0, they are exposed.

device_step_breakdown(): per rank and step, the host's step window on the
device: compute_ms (some compute kernel runs), exposed_comm_ms (communication
kernels and no compute), other_kernel_ms (only memory copies/sets and other
kernels) and idle_ms (no kernel at all); they sum to step_ms. Kernels count by
when they ran, not which step launched them: the window is the step's time.

What the device does while the host waits (input_wait, device_idle_behind_syncs,
device_data_wait): diagnose/analysis/tables/device_idle.py.

"""

import numpy as np
import pandas as pd

from collectors.schema import COMMUNICATION, COMPUTE
from diagnose.analysis.tables.matching import per_distinct

KERNEL_COLUMNS = [
    "rank",
    "start_ns",
    "end_ns",
    "name",
    "kind",
    "stream",
    "step",
    "correlation",
    "bytes",
    "dur_ms",
    "queued_ns",
]


def kernels_table(events: pd.DataFrame) -> pd.DataFrame:
    rows = events[events["kind"] == "kernel"]
    table = pd.DataFrame(
        {
            "rank": rows["rank"].astype("int64"),
            "start_ns": rows["start_ns"].astype("int64"),
            "end_ns": rows["end_ns"].astype("int64"),
            "name": _categorical(rows["name"]),
            "kind": _categorical(rows["detail"]),
            "stream": per_distinct(rows["group"], lambda group: pd.to_numeric(group.astype(str), errors="coerce"))
            .fillna(-1)
            .astype("int64"),
            "step": rows["step"].astype("int64"),
            "correlation": rows["seq"].astype("int64"),
            "bytes": rows["bytes"].astype("int64"),
            # launch to start (-1: launch not in the trace, or a run dir written before it was kept)
            "queued_ns": rows["queued_ns"].astype("int64") if "queued_ns" in rows else -1,
        }
    )
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
        frac = (lambda x, span=span: x / span) if span > 0 else (lambda x: float("nan"))
        rows.append(
            {
                "rank": int(rank),
                "idle_frac": frac(span - busy),
                "compute_frac": frac(compute),
                "non_compute_frac": frac(busy - compute),
                "span_ms": span / 1e6,
                "idle_ms": (span - busy) / 1e6,
                "compute_ms": compute / 1e6,
                "non_compute_ms": (busy - compute) / 1e6,
                "kernels": len(k),
            }
        )
    columns = [
        "rank",
        "idle_frac",
        "compute_frac",
        "non_compute_frac",
        "span_ms",
        "idle_ms",
        "compute_ms",
        "non_compute_ms",
        "kernels",
    ]
    return pd.DataFrame(rows, columns=columns).set_index("rank")


def device_compute(kernels: pd.DataFrame) -> pd.DataFrame:
    return _covered_per_step(kernels[(kernels["kind"] == COMPUTE) & (kernels["step"] >= 0)])


def _covered_per_step(rows: pd.DataFrame) -> pd.DataFrame:
    """rank, step, device_compute_ms: the union of `rows` per rank and step."""
    out = [
        (int(rank), int(step), covered_ns(k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)) / 1e6)
        for (rank, step), k in rows.groupby(["rank", "step"])
    ]
    table = pd.DataFrame(out, columns=["rank", "step", "device_compute_ms"])
    return table.astype({"rank": "int64", "step": "int64", "device_compute_ms": "float64"})


DEVICE_SPANS = ("gpu:forward", "gpu:backward", "gpu:optimizer")


def device_compute_spans(events: pd.DataFrame) -> pd.DataFrame:
    return _covered_per_step(
        events[
            (events["kind"] == "phase")
            & (events["step"] >= 0)
            & events["name"].isin(DEVICE_SPANS)
            & (events["detail"] == "cuda_event")
        ]
    )


def device_exposed_comm(kernels: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (rank, step), k in kernels[kernels["step"] >= 0].groupby(["rank", "step"]):
        s, e = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
        comm, comp = (k["kind"] == COMMUNICATION).to_numpy(), (k["kind"] == COMPUTE).to_numpy()
        comm_ns = covered_ns(s[comm], e[comm])
        if comm_ns:
            hidden = intersection_ns((s[comm], e[comm]), (s[comp], e[comp]))
            rows.append(
                (int(rank), int(step), comm_ns / 1e6, (comm_ns - hidden) / 1e6, (int(e.max()) - int(s.min())) / 1e6)
            )
    return pd.DataFrame(rows, columns=["rank", "step", "comm_ms", "exposed_comm_ms", "span_ms"])


def comm_comp_overlap(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for rank, k in analysed_kernels(kernels, steps).groupby("rank"):
        s, e = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
        comm, comp = (k["kind"] == COMMUNICATION).to_numpy(), (k["kind"] == COMPUTE).to_numpy()
        comm_ns = covered_ns(s[comm], e[comm])
        overlap = intersection_ns((s[comm], e[comm]), (s[comp], e[comp]))
        rows.append(
            {
                "rank": int(rank),
                "comm_ms": comm_ns / 1e6,
                "overlap_ms": overlap / 1e6,
                "overlap_frac": overlap / comm_ns if comm_ns else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=["rank", "comm_ms", "overlap_ms", "overlap_frac"]).set_index("rank")


def busy_before(k: pd.DataFrame):
    """t -> ns during which some kernel of `k` (not empty) ran before t,
    vectorized: the kernels' union as disjoint intervals, with running sums."""
    s, e = merge_intervals(k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64))
    before = np.concatenate([[0], np.cumsum(e - s)])

    def at(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(s, t, side="right")  # intervals begun by t; all but the last have ended
        last = np.clip(i - 1, 0, None)
        return np.where(i > 0, before[last] + np.minimum(t, e[last]) - s[last], 0)

    return at


DEVICE_PARTS = ("compute", "exposed_comm", "other_kernel", "idle")


def device_step_breakdown(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    columns = ["rank", "step", "step_ms", *[f"{p}_ms" for p in DEVICE_PARTS]]
    parts = []
    for rank, st in steps.groupby("rank"):
        k = kernels[kernels["rank"] == rank]
        if k.empty:
            continue
        a, b = st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64)
        comp = k["kind"] == COMPUTE

        def covered(rows, a=a, b=b):  # ns of the union of `rows` inside each step window
            if rows.empty:
                return np.zeros(len(a), np.int64)
            before = busy_before(rows)
            return before(b) - before(a)

        compute = covered(k[comp])
        with_comm = covered(k[comp | (k["kind"] == COMMUNICATION)])
        busy = covered(k)
        parts.append(
            pd.DataFrame(
                {
                    "rank": int(rank),
                    "step": st["step"].to_numpy(np.int64),
                    "step_ms": (b - a) / 1e6,
                    "compute_ms": compute / 1e6,
                    "exposed_comm_ms": (with_comm - compute) / 1e6,
                    "other_kernel_ms": (busy - with_comm) / 1e6,
                    "idle_ms": ((b - a) - busy) / 1e6,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)
