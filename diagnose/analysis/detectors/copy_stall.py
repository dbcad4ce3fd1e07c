"""copy_stall: host-device copies on the critical path.

Signal (device traces: kernels recorded; the steady steps they cover): the
host-to-device and device-to-host copies (Memcpy HtoD / DtoH activities; not
device-to-device) and the part of their time during which no compute kernel
runs on that GPU: the exposed copy time per step (median rank). An input batch
copied from pageable memory (no `pin_memory=True`) is staged through a bounce
buffer and cannot overlap compute; a pinned copy issued with `non_blocking=True`
on a side stream can; CPU offload (ZeRO/FSDP) and optimizer states moved each
step show up here too. The share of pageable copies (the activity's name says
"Pageable") picks the advice.

Threshold: exposed copy time >= MIN_STEP_FRAC of the step (severity from
impact). Impact: the exposed time (what overlapping the copy with compute
saves; not a replay). Evidence: copy time, exposed time, MB per step, the
pageable share, the copies' directions.
"""

import numpy as np
import pandas as pd

from collectors.schema import COMPUTE, MEMORY
from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.gpu_tables import covered_ns, intersection_ns

MIN_STEP_FRAC = 0.01


def exposed_copies(kernels) -> list:
    """[(rank, step, copy_ms, exposed_ms, mb, pageable_ms)] per (rank, step)."""
    rows = []
    names = kernels["name"].astype(str)
    host = names.str.contains("HtoD|DtoH", regex=True) & (kernels["kind"] == MEMORY)
    k = kernels.assign(_host_copy=host.to_numpy(), _pageable=names.str.contains("Pageable").to_numpy())
    for (rank, step), part in k[k["step"] >= 0].groupby(["rank", "step"]):
        copy = part[part["_host_copy"]]
        if copy.empty:
            continue
        s, e = copy["start_ns"].to_numpy(np.int64), copy["end_ns"].to_numpy(np.int64)
        comp = part[part["kind"] == COMPUTE]
        cs, ce = comp["start_ns"].to_numpy(np.int64), comp["end_ns"].to_numpy(np.int64)
        copy_ns = covered_ns(s, e)
        hidden = intersection_ns((s, e), (cs, ce)) if len(comp) else 0
        pageable = copy[copy["_pageable"]]
        rows.append(
            (
                int(rank),
                int(step),
                copy_ns / 1e6,
                (copy_ns - hidden) / 1e6,
                float(copy["bytes"].clip(lower=0).sum()) / 1e6,
                covered_ns(pageable["start_ns"].to_numpy(np.int64), pageable["end_ns"].to_numpy(np.int64)) / 1e6,
            )
        )
    return rows


def detect(ctx):
    steps = ctx.kernel_covered
    if not steps or not ctx.step_ms:
        return []
    kernels = ctx.run.kernels()
    kernels = kernels[kernels["step"].isin(steps)]
    rows = exposed_copies(kernels)
    if not rows:
        return []
    table = pd.DataFrame(rows, columns=["rank", "step", "copy_ms", "exposed_ms", "mb", "pageable_ms"])
    per_rank = table.groupby("rank")[["copy_ms", "exposed_ms", "mb", "pageable_ms"]].sum() / len(steps)
    exposed_ms = float(per_rank["exposed_ms"].median())
    if exposed_ms < MIN_STEP_FRAC * ctx.step_ms:
        return []
    copy_ms = float(per_rank["copy_ms"].median())
    pageable_frac = (
        float(per_rank["pageable_ms"].sum() / per_rank["copy_ms"].sum()) if per_rank["copy_ms"].sum() else 0.0
    )
    mb = float(per_rank["mb"].median())
    if pageable_frac >= 0.5:
        advice = (
            "copy from pinned memory: `DataLoader(..., pin_memory=True)` and "
            "`batch.to(device, non_blocking=True)` (a pageable copy is staged through a bounce "
            "buffer and blocks the stream), and prefetch the next batch on a side stream"
        )
    else:
        advice = (
            "overlap the copies with compute: issue them with `non_blocking=True` on a side "
            "stream ahead of use (prefetch), and keep optimizer state and offloaded parameters "
            "on the GPU if memory allows (CPU offload moves them every step)"
        )
    ranks = sorted(int(r) for r in per_rank.index[per_rank["exposed_ms"] >= MIN_STEP_FRAC * ctx.step_ms])
    return [
        Finding(
            kind="copy_stall",
            title=(
                f"host-device copies stall the GPU {exposed_ms:.1f} ms/step: {copy_ms:.1f} ms of copies "
                f"({mb:.1f} MB) per step, {exposed_ms / copy_ms:.0%} of it with no compute beside it"
                f"{', mostly from pageable memory' if pageable_frac >= 0.5 else ''} (on the GPUs' clocks)"
            ),
            ranks=ranks or sorted(int(r) for r in per_rank.index),
            impact_ms_per_step=exposed_ms,
            recommendation=f"Take the copies off the critical path: {advice}.",
            metrics={
                "copy_ms_per_step": copy_ms,
                "exposed_copy_ms_per_step": exposed_ms,
                "copy_mb_per_step": mb,
                "pageable_frac": pageable_frac,
                "device_time": 1.0,
            },
        )
    ]
