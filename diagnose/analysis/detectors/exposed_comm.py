"""exposed_comm: communication not hidden behind compute dominates the step.

Signal: the breakdown's exposed_comm (time the training thread is blocked in
communication) as a fraction of the step, less the small per-micro-batch
collectives that hidden_sync reports (one cause, one finding), on the rank that
exposes the LEAST:
waiting for a straggler also shows up as blocked communication on the fast
ranks, so the least-exposed rank (typically the straggler itself) is the pure
transfer cost. Threshold: >= 35% of the step is a warning, >= 50% critical;
10-35% is reported as info. Evidence: algorithm and bus bandwidth per
collective kind (nccl-tests formulas: busbw = algbw x 2(n-1)/n for all-reduce,
(n-1)/n for all-gather/reduce-scatter/all-to-all, 1 for broadcast/reduce) and
the groups with the most communication time.

FSDP2 jobs (rows whose detail names an FSDP unit, collectors/instrument/fsdp2.py)
get FSDP2's own knobs in the recommendation and, as evidence, the time the
training thread was blocked in each unit's all-gathers and reduce-scatters per
step, the most exposed unit named, and each unit's all-gather time overlapped
by prefetching (diagnose/analysis/tables/fsdp_units.py; the report's FSDP2 view).

On device traces (collectives are NCCL kernels) the host is never blocked in
communication, so the breakdown says nothing: exposed communication is then
the communication-kernel time no compute kernel overlaps, per step
(gpu_tables.device_exposed_comm), again on the rank that exposes the least,
as a share of the longer of the host step and the device's span of the step's
kernels (never above 100%). Pipeline sends and receives are left out: their
kernels spin while the neighbour computes, the bubble's time, not transfer
(on a Megatron-shaped pp4 trace of 2 micro-batches they made a critical 28.6
ms/step of "communication" that outranked the bubble). A trace of some ranks
of a larger world (one rank's profile of an 8-rank job) is reported at info
with that said: a collective kernel spins until its last member arrives, so
from those ranks alone waiting and transfer are one figure.
"""

import pandas as pd

from collectors.schema import COMMUNICATION
from diagnose.analysis.detectors import hidden_sync
from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables import trace_windows
from diagnose.analysis.tables.device_collectives import timed_on_device
from diagnose.analysis.tables.gpu_tables import device_exposed_comm
from diagnose.analysis.tables.process_group_roles import group_roles

INFO_FRAC, WARNING_FRAC, CRITICAL_FRAC = 0.10, 0.35, 0.50
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
}


def bandwidth_table(ctx):
    arrivals = ctx.run.arrivals()
    arrivals = arrivals[
        (arrivals["kind"] == "collective")
        & arrivals["step"].isin(ctx.steady)
        & (arrivals["bytes"] > 0)
        & (arrivals["transfer_ms"] > 0)
    ]
    if arrivals.empty:
        return arrivals
    per_instance = arrivals.groupby(["group", "seq"]).agg(
        name=("name", "first"),
        bytes=("bytes", "max"),
        transfer_ms=("transfer_ms", "first"),
        members=("members", "first"),
        group_ranks=("group_ranks", "first"),
    )
    per_instance["algbw_gbps"] = per_instance["bytes"] / (per_instance["transfer_ms"] / 1e3) / 1e9
    factor = [BUS_FACTOR.get(n, lambda m: 1.0)(m) for n, m in zip(per_instance["name"], per_instance["members"])]
    per_instance["busbw_gbps"] = per_instance["algbw_gbps"] * factor
    return per_instance


RECOMMENDATION = (
    "Overlap communication with compute (bucketed async all-reduce during backward, "
    "prefetching all-gathers), shrink what is communicated (bf16 gradients, "
    "larger micro-batches per sync), or use a faster interconnect/topology-aware groups."
)


def fsdp_blocked_ms(ctx):
    """FSDP unit -> ms per step the training thread was blocked in its collectives,
    the most exposed first (diagnose/analysis/tables/fsdp_units.py); empty without FSDP2 rows."""
    table = ctx.run.fsdp_unit_comm()
    per_unit = table.groupby("unit", sort=False)["exposed_ms_per_step"].sum()
    return per_unit.sort_values(ascending=False, kind="stable").to_dict()


def fsdp_recommendation(units: dict) -> str:
    top = next(iter(units))
    return (
        f"FSDP2: the most exposed unit is {top} ({units[top]:.1f} ms per step blocked in its all-gathers "
        "and reduce-scatters). Prefetch the next units' all-gathers "
        "(`set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`), keep parameters "
        "gathered after forward where memory allows (`reshard_after_forward=False`, often right for the "
        "last units), or shard coarser units (`fully_shard` on groups of layers: fewer, larger "
        "all-gathers that overlap compute)."
    )


def _device_exposed_comm(run):
    """gpu_tables.device_exposed_comm without the kernels of pipeline sends and
    receives (p2p rows on the device share their kernel's times): a SendRecv
    kernel spins while the neighbouring stage computes, which is the pipeline's
    bubble (pipeline_bubble, the host breakdown's pipeline_wait), not transfer."""
    events = run.events()
    p2p = events[(events["kind"] == "p2p").to_numpy() & timed_on_device(events["detail"])]
    if p2p.empty:
        return run.device_exposed_comm()
    kernels = run.kernels()
    exchange = pd.MultiIndex.from_frame(p2p[["rank", "start_ns"]].astype("int64"))
    mine = pd.MultiIndex.from_frame(kernels[["rank", "start_ns"]])
    return device_exposed_comm(kernels[~((kernels["kind"] == COMMUNICATION) & mine.isin(exchange))])


def detect(ctx):
    b = ctx.breakdown
    if b.empty:
        return []
    on_device = bool(ctx.kernel_steady)
    if on_device:
        device = _device_exposed_comm(ctx.run)
        b = (
            b[b["step"].isin(ctx.kernel_steady)]
            .drop(columns="exposed_comm_ms")
            .merge(device, on=["rank", "step"], how="left")
        )
        b["exposed_comm_ms"] = b["exposed_comm_ms"].fillna(0.0)
        # a step's kernels may run past the host's step end: the share is of the longer,
        # so it is never above 100% (median of each, each step's exposed <= its own)
        b["step_ms"] = b[["step_ms", "span_ms"]].max(axis=1)
    per_rank = b.groupby("rank")[["exposed_comm_ms", "step_ms"]].median()
    syncs = hidden_sync.candidates(ctx)
    syncs = syncs[syncs["kind"].astype(str) == "collective"]
    if len(syncs) and ctx.steady and not on_device:
        per_rank["exposed_comm_ms"] = (
            per_rank["exposed_comm_ms"]
            - syncs.groupby("rank")["dur_ms"].sum().reindex(per_rank.index).fillna(0) / len(ctx.steady)
        ).clip(lower=0)
    frac = per_rank["exposed_comm_ms"] / per_rank["step_ms"]
    least = int(frac.idxmin())
    exposed = float(frac.min())
    if exposed < INFO_FRAC:
        return []
    severity = "critical" if exposed >= CRITICAL_FRAC else "warning" if exposed >= WARNING_FRAC else "info"
    metrics = {
        "exposed_comm_frac": exposed,
        "exposed_comm_ms_per_step": float(per_rank.loc[least, "exposed_comm_ms"]),
        "max_rank_exposed_comm_frac": float(frac.max()),
        "device_time": float(on_device),
    }
    world, seen = ctx.run.world_size, len(frac)
    partial = ""
    if on_device and seen < world:
        # a collective kernel spins until its last member arrives: from some ranks
        # only, waiting for the absent ones and transferring cannot be told apart
        severity = "info"
        metrics.update(ranks_seen=seen, world_size=world)
        partial = (
            f"; from {seen} of {world} ranks, this counts waiting for the others inside the kernels as "
            "communication: the other ranks' traces tell which it is"
        )
    bandwidth = bandwidth_table(ctx)
    slowest = ""
    if len(bandwidth):
        by_kind = bandwidth.groupby("name").agg(busbw=("busbw_gbps", "median"), algbw=("algbw_gbps", "median"))
        for name, row in by_kind.iterrows():
            metrics[f"{name}_busbw_gbps"] = float(row["busbw"])
            metrics[f"{name}_algbw_gbps"] = float(row["algbw"])
        by_group = bandwidth.groupby("group_ranks")["transfer_ms"].sum().sort_values(ascending=False)
        top_group = str(by_group.index[0])
        role = group_roles(ctx.run.rank_meta).get(top_group)
        slowest = f"; most communication time in group [{top_group}]" + (f" ({role})" if role else "")
        if role:
            metrics["top_group_role"] = role
    units = fsdp_blocked_ms(ctx)
    for unit, ms in units.items():
        metrics[f"fsdp_blocked_ms_per_step[{unit}]"] = float(ms)
    for row in ctx.run.fsdp_unit_comm().itertuples():
        if row.op.startswith("all_gather"):
            metrics[f"fsdp_all_gather_overlapped_ms_per_step[{row.unit}]"] = float(row.overlapped_ms_per_step)
    return [
        Finding(
            kind="exposed_comm",
            ranks=sorted(int(r) for r in frac.index),
            severity=severity,
            impact_ms_per_step=float(per_rank.loc[least, "exposed_comm_ms"]),
            title=(
                f"communication not overlapped with compute takes {exposed:.0%} of the "
                f"{'window' if trace_windows.window_ranks(ctx.run.steps()) else 'step'}{slowest}"
                f"{' (NCCL kernels on the GPUs)' if on_device else ''}{partial}"
            ),
            recommendation=fsdp_recommendation(units) if units else RECOMMENDATION,
            metrics=metrics,
        )
    ]
