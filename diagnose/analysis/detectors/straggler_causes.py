"""Why a late rank is late, for the straggler detector (straggler.py, whose
docstring states the thresholds): its busy time beside its stage peers', and
three causes beside slower work of its own.

- busy_rows / busy_ratio: busy is the step less waiting on others (host time),
  less the time its thread waited for a CPU core (tables/run_delay.py: the
  run delay of its compute rows), or its device compute on a device trace.
- kernels_slower: a device straggler's kernels themselves run slower.
- launch_bound: its GPU waited for its host ("host-bound").
- cpu_contention: it works no longer, it waited longer for a core ("cpu
  contention"): a shared core is its host's doing, not its work's. Judged on
  host time only: on the device a wait for a core shows as launch delay.
"""

import numpy as np

from diagnose.analysis.tables.device_idle import idle_before_launches

BUSY_RATIO = 1.4
DEVICE_BUSY_RATIO = 1.1


def busy_gate(columns) -> float:
    """The busy ratio a straggler's own work must reach: on the device where its
    busy rows are device compute (device_compute_ms), else on the host."""
    return DEVICE_BUSY_RATIO if "device_compute_ms" in columns else BUSY_RATIO


CONTENTION_SHARE = 0.5  # of the rank's wall busy excess, waiting for a core


def busy_rows(ctx, rank, stages, steps, net_of_core_wait=True):
    """(breakdown rows per rank and step of the ranks doing the same work as `rank`
    (its pipeline stage) over the given steps, their busy ms): busy is the step minus
    waiting on others and, net_of_core_wait, minus its thread's wait for a core;
    on a device trace the device compute."""
    breakdown = ctx.breakdown
    # device time when the collectives are seen on the device: the compute
    # kernels on the steps they cover, else (a live CUDA run) the CUDA-event
    # spans of forward and backward; host time otherwise
    device = ()
    if ctx.kernel_steady and set(steps) & set(ctx.kernel_steady):
        device = ctx.run.device_compute()
        steps = [s for s in steps if s in set(ctx.kernel_steady)]
    elif ctx.on_device:
        device = ctx.run.device_compute_spans()
    if len(device):
        breakdown = breakdown.merge(device, on=["rank", "step"], how="left").fillna({"device_compute_ms": 0.0})
    else:
        core_wait = ctx.run.core_wait()
        if len(core_wait):
            breakdown = breakdown.merge(core_wait, on=["rank", "step"], how="left").fillna({"core_wait_ms": 0.0})
    if len(steps):
        breakdown = breakdown[breakdown["step"].isin(steps)]
    if stages:
        breakdown = breakdown[breakdown["rank"].map(lambda r: stages.get(r) == stages.get(rank))]
    if "device_compute_ms" in breakdown.columns:
        return breakdown, breakdown["device_compute_ms"]
    busy = breakdown["step_ms"] - breakdown["exposed_comm_ms"] - breakdown["pipeline_wait_ms"]
    if net_of_core_wait and "core_wait_ms" in breakdown.columns:
        busy = busy - breakdown["core_wait_ms"]
    return breakdown, busy


def busy_ratio(ctx, rank, stages, steps, net_of_core_wait=True):
    """(ratio, excess ms, breakdown): the rank's busy time over, and beyond, the
    median of its stage peers', medians over the given steps."""
    rows, busy = busy_rows(ctx, rank, stages, steps, net_of_core_wait)
    breakdown = rows.groupby("rank").median(numeric_only=True)
    busy = busy.groupby(rows["rank"]).median()
    if rank not in breakdown.index or len(breakdown) < 2:
        return None, 0.0, breakdown
    baseline = float(busy.drop(rank).median())
    return (float(busy[rank] / baseline) if baseline > 0 else None), float(busy[rank] - baseline), breakdown


def cpu_contention(ctx, rank, stages, steps) -> dict | None:
    """A rank late because its thread waited for a CPU core: its busy time with
    the wait counted passes BUSY_RATIO, and the wait beyond its peers' (median
    per step) is at least CONTENTION_SHARE of its busy excess. {"wall_ratio",
    "core_wait_ms", "core_wait_excess_ms"} or None."""
    wall_ratio, wall_excess_ms, breakdown = busy_ratio(ctx, rank, stages, steps, net_of_core_wait=False)
    if wall_ratio is None or wall_ratio < BUSY_RATIO or "core_wait_ms" not in breakdown.columns:
        return None
    wait = breakdown["core_wait_ms"]
    excess_ms = float(wait[rank] - wait.drop(rank).median())
    if excess_ms < CONTENTION_SHARE * wall_excess_ms:
        return None
    return {"wall_ratio": wall_ratio, "core_wait_ms": float(wait[rank]), "core_wait_excess_ms": excess_ms}


def kernels_slower(ctx, rank, stages, steps) -> bool:
    """On a trace with kernels: do the rank's compute kernels themselves run
    slower than its stage peers' same kernels (the median over its kernels of
    duration / the peers' median duration of that kernel name >= DEVICE_BUSY_RATIO)?
    A slow GPU (clocks, thermals, a noisy neighbour) slows every kernel; jitter
    (a kernel 20 ms late now and then) adds time in a few, which moves a small
    group's busy time on a few steps but not the typical kernel: 2 ranks over 4
    steps, one late kernel in most of one rank's steps, made a persistent
    "straggler" of it in 8 of 20 seeds. Asked only where the ranks run one
    program (as many compute kernels per step): where their work differs (HTA's
    sampled DLRM ranks, 547 and 572 kernels a step), it says nothing."""
    kernels = ctx.run.kernels()
    peers = [r for r in ctx.run.ranks if not stages or stages.get(r) == stages.get(rank)]
    k = kernels[(kernels["kind"] == "compute") & kernels["step"].isin(list(steps)) & kernels["rank"].isin(peers)]
    # the same kernel: same step, same name, same place among that name's launches
    # (ranks of one stage run one program; one name can run several shapes)
    k = k.assign(nth=k.groupby(["rank", "step", "name"], observed=True).cumcount())
    keys = ["step", "name", "nth"]
    typical = k[k["rank"] != rank].groupby(keys, observed=True)["dur_ms"].median().rename("typical_ms")
    counts = k.groupby(["rank", "step"]).size().unstack("rank")
    if counts.nunique(axis=1).max() > 1:
        return True  # not one program (data-dependent work): kernel against kernel says nothing
    mine = k[k["rank"] == rank].join(typical, on=keys, how="inner")
    ratio = mine["dur_ms"] / mine["typical_ms"]
    ratio = ratio[ratio.notna() & (mine["typical_ms"] > 0)]
    return ratio.empty or float(ratio.median()) >= DEVICE_BUSY_RATIO


def launch_bound(ctx, rank, steps, caused_ms, breakdown) -> dict | None:
    """A rank whose GPU waited for its host. On a device trace, per collective it
    was last into (in `steps`), its lateness is the median member's wait; the
    host made it late where, in that window before its arrival, its GPU sat idle
    until a kernel that started within LAUNCH_BOUND_NS of its launch (the queue
    was empty: the kernel ran as soon as the host launched it). Host-bound when
    that idle is at least half the lateness in at least half of those
    collectives. Not when its own data loading explains at least half of the
    waits it caused (input_stall's cause). {"last_in", "launch_bound"} or None."""
    kernels = ctx.run.kernels()
    if kernels.empty or (kernels["queued_ns"] < 0).all():
        return None
    arrivals = ctx.run.arrivals()
    arrivals = arrivals[(arrivals["last_rank"] == rank) & arrivals["step"].isin(steps) & (arrivals["members"] > 1)]
    late = arrivals[arrivals["rank"] != rank].groupby(["group", "seq"])["wait_ms"].median()
    mine = arrivals[arrivals["rank"] == rank].set_index(["group", "seq"])["arrival_ns"]
    late = late[late.index.isin(mine.index)]
    if late.empty:
        return None
    start, idle_from, _ = idle_before_launches(kernels[kernels["rank"] == rank])
    n_bound = 0
    for key, late_ms in late.items():
        arrival, late_ns = mine[key], late_ms * 1e6
        idle_ns = np.clip(np.minimum(start, arrival) - np.maximum(idle_from, arrival - late_ns), 0, None).sum()
        n_bound += bool(idle_ns >= late_ns / 2)
    if n_bound < len(late) / 2:
        return None
    data = breakdown["data_wait_ms"] if "data_wait_ms" in breakdown else None
    if data is not None and rank in data.index and len(data) > 1:
        if float(data[rank] - data.drop(rank).median()) >= caused_ms / 2:
            return None
    return {"last_in": len(late), "launch_bound": n_bound}
