"""hidden_sync: host-blocking points inside the step that are not part of the
parallel pattern.

Signal: (a) small collectives or barriers (<= 1 MiB) issued from user code,
outside any forward/backward (so not tensor-parallel traffic) and not by DDP,
repeated >= 2 times per step from one callsite: a logging all-reduce or a
`.item()`-driven check inside the micro-batch loop; each one makes every rank
wait for the slowest, every micro-batch. (b) device syncs (.item/.cpu/.tolist/
.numpy on CUDA tensors, torch.cuda.synchronize) inside forward/backward.
Impact: the time those calls block per step (median rank). Threshold: >= 3% of
the step for a warning (severity from impact).

On device traces (collectives seen on the device, kernels recorded: imported
Kineto / Nsight; judged on the steady steps the kernels cover) a
host sync costs what the device loses, not what the host waits: the device
idle from the sync's start until the host gives it work again
(gpu_tables.device_idle_behind_syncs), as far as the sync caused it: at most
the time it made the host wait. A sync with work still queued behind it costs
nothing, nor does one that finds the device already idle; one that drains the
queue costs the host's time to launch again, every time. Signal: per callsite (or sync call where the trace has no
stacks), that idle per step on the median rank, every sync in the step (the
idle is measured, so no count rule); reported from DEVICE_MIN_FRAC of the step.
"""
import pandas as pd

from diagnose.analysis.device_collectives import timed_on_device
from diagnose.analysis.findings import Finding
from diagnose.analysis.matching import as_str
from diagnose.analysis.per_rank import started_inside

SMALL_BYTES = 1 << 20
MIN_PER_STEP = 2
DEVICE_MIN_FRAC = 0.01


def candidates(ctx):
    """The small user collectives outside compute and the device syncs inside
    it, in steady steps (computed once per analysis: exposed_comm uses them too)."""
    cached = getattr(ctx, "_hidden_sync_candidates", None)
    if cached is None:
        cached = ctx._hidden_sync_candidates = _candidates(ctx)
    return cached.copy(deep=False)


def _candidates(ctx):
    # Masks over the whole table (on the categoricals' codes), rows copied only once
    # picked, as accumulation_sync does: the kind, detail and callsite of every
    # steady collective, sync and forward/backward row as strings cost 1,024 ranks x
    # 200 steps ~330 MB and 0.3 s (bench/results/2026-12-05-categorical-collectives.md)
    events = ctx.run.events()
    steady = events["step"].isin(ctx.steady).to_numpy()
    kind, detail = events["kind"], events["detail"]
    calls = events[steady & (kind == "collective").to_numpy() & (events["bytes"] <= SMALL_BYTES).to_numpy()
                   & (events["callsite"] != "").to_numpy() & ~detail.str.startswith("ddp", na=False).to_numpy()
                   & ~timed_on_device(detail)]  # a live CUDA run's device rows: the host's are here
    syncs = events[steady & (kind == "sync").to_numpy() & (detail == "cuda").to_numpy()]
    windows = events[steady & kind.isin(["forward", "backward"]).to_numpy()]
    found = pd.concat([calls[~started_inside(calls, windows)], syncs[started_inside(syncs, windows)]])
    found = found.assign(dur_ms=(found["end_ns"] - found["start_ns"]) / 1e6,
                         callsite=as_str(found["callsite"]), name=as_str(found["name"]))
    return found


def detect(ctx):
    if ctx.kernel_steady:
        return _detect_on_device(ctx)
    found = candidates(ctx)
    if found.empty or not ctx.steady:
        return []
    findings = []
    n_steps = len(ctx.steady)
    for callsite, at_site in found.groupby("callsite"):
        per_rank_step = at_site.groupby(["rank", "step"]).agg(count=("dur_ms", "size"), ms=("dur_ms", "sum"))
        count_per_step = float(per_rank_step["count"].median())
        if count_per_step < MIN_PER_STEP:
            continue
        per_rank_ms = per_rank_step.groupby("rank")["ms"].sum() / n_steps
        impact_ms = float(per_rank_ms.median())
        op = at_site["name"].mode().iloc[0]
        is_sync = (at_site["kind"].astype(str) == "sync").all()
        where = ctx.relpath(callsite)
        what = (f"a device sync ({op}) inside forward/backward" if is_sync
                else f"calls {op} on a {int(at_site['bytes'].median())}-byte tensor")
        findings.append(Finding(
            kind="hidden_sync", callsite=where, ranks=sorted(int(r) for r in per_rank_ms.index),
            impact_ms_per_step=impact_ms,
            title=(f"{where} {what} {count_per_step:.0f}x per step: a hidden synchronization "
                   f"costing {impact_ms:.1f} ms/step"),
            recommendation=("Accumulate the value on the device and reduce/print it once per step "
                            "(or every N steps), outside the micro-batch loop; avoid .item() in the loop."),
            metrics={"calls_per_step": count_per_step, "blocking_ms_per_step": impact_ms,
                     "bytes": float(at_site["bytes"].median())}))
    return findings


def _detect_on_device(ctx):
    syncs = ctx.run.device_idle_behind_syncs()
    syncs = syncs[syncs["step"].isin(ctx.kernel_steady)]
    if syncs.empty or ctx.step_ms <= 0:
        return []
    findings = []
    n_steps = len(ctx.kernel_steady)
    where_of = syncs["callsite"].where(syncs["callsite"] != "", syncs["name"])
    for where, at_site in syncs.groupby(where_of):
        per_rank_ms = at_site.groupby("rank")["idle_caused_ms"].sum() / n_steps
        impact_ms = float(per_rank_ms.median())
        if impact_ms < DEVICE_MIN_FRAC * ctx.step_ms:
            continue
        count_per_step = float(at_site.groupby(["rank", "step"]).size().median())
        op = at_site["name"].mode().iloc[0]
        callsite = ctx.relpath(where) if (at_site["callsite"] != "").all() else None
        findings.append(Finding(
            kind="hidden_sync", callsite=callsite, ranks=sorted(int(r) for r in per_rank_ms.index),
            impact_ms_per_step=impact_ms,
            title=(f"{callsite or op} blocks the host {count_per_step:.0f}x per step and leaves the GPU "
                   f"idle {impact_ms:.1f} ms/step until the host launches again (on the GPUs' clocks)"),
            recommendation=("Do not read device values on the host inside the step (.item(), .cpu(), "
                            "printing a loss, torch.cuda.synchronize()): accumulate on the device and read "
                            "once per step or every N steps, so the host stays ahead of the GPU."),
            metrics={"calls_per_step": count_per_step, "device_idle_ms_per_step": impact_ms,
                     "blocking_ms_per_step": float((at_site.groupby("rank")["host_ms"].sum() / n_steps).median()),
                     "device_time": 1.0}))
    return findings
