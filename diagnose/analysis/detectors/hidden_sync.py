"""hidden_sync: host-blocking points inside the step that are not part of the
parallel pattern.

Signal: (a) small collectives or barriers (<= 1 MiB) issued from user code,
outside any forward/backward (so not tensor-parallel traffic) and not by DDP,
repeated >= 2 times per step from one callsite: a logging all-reduce or a
`.item()`-driven check inside the micro-batch loop; each one makes every rank
wait for the slowest, every micro-batch (on a rank with no forward/backward
rows, recorded or inferred, its asynchronous reductions are not counted: they
are gradient reductions, accumulation_sync's). (b) device syncs (.item/.cpu/.tolist/
.numpy on CUDA tensors, torch.cuda.synchronize) inside forward/backward.
Impact: the time those calls block per step (median rank). Threshold: >= 3% of
the step for a warning (severity from impact).

On device traces (collectives seen on the device, kernels recorded: imported
Kineto / Nsight; judged on the steady steps the kernels cover) a
host sync costs what the device loses, not what the host waits: the device
idle from the sync's start until the host gives it work again
(device_idle.device_idle_behind_syncs), as far as the sync caused it: at most
the time it made the host wait. A sync with work still queued behind it costs
nothing, nor does one that finds the device already idle; one that drains the
queue costs the host's time to launch again, every time. Signal: per callsite (or sync call where the trace has no
stacks), that idle per step on the median rank, every sync in the step (the
idle is measured, so no count rule); reported from DEVICE_MIN_FRAC of the step.

TORCH_NCCL_BLOCKING_WAIT (NCCL_BLOCKING_WAIT before torch 2.2) set on a rank of a
CUDA run makes every Work.wait() block the host until the collective ends: a
host sync per wait, where without it the wait only orders streams. Its host
wait rows are then syncs: on device traces they are judged as above; on a live
run without kernels the device's loss cannot be measured, so the finding is
info, gives the host's blocked time and says how to measure the rest.
"""

import pandas as pd

from diagnose.analysis.detectors.accumulation_sync import REDUCTIONS
from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.device_collectives import timed_on_device
from diagnose.analysis.tables.device_idle import device_idle_behind_syncs
from diagnose.analysis.tables.matching import as_str
from diagnose.analysis.tables.per_rank import started_inside

SMALL_BYTES = 1 << 20
MIN_PER_STEP = 2
DEVICE_MIN_FRAC = 0.01
BLOCKING_WAIT_VARS = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
BLOCKING_WAIT_NAME = "Work.wait (TORCH_NCCL_BLOCKING_WAIT)"
READ_ONCE_PER_STEP = (
    "Do not read device values on the host inside the step (.item(), .cpu(), printing a "
    "loss, torch.cuda.synchronize()): accumulate on the device and read once per step or "
    "every N steps, so the host stays ahead of the GPU."
)
UNSET_BLOCKING_WAIT = (
    "Unset TORCH_NCCL_BLOCKING_WAIT (a debugging setting): without it a wait only orders "
    "the streams, and NCCL's watchdog still ends a collective that times out "
    "(TORCH_NCCL_ASYNC_ERROR_HANDLING)."
)


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
    calls = events[
        steady
        & (kind == "collective").to_numpy()
        & (events["bytes"] <= SMALL_BYTES).to_numpy()
        & (events["callsite"] != "").to_numpy()
        & ~detail.str.startswith("ddp", na=False).to_numpy()
        & ~timed_on_device(detail)
    ]  # a live CUDA run's device rows: the host's are here
    syncs = events[steady & (kind == "sync").to_numpy() & (detail == "cuda").to_numpy()]
    windows = events[steady & kind.isin(["forward", "backward"]).to_numpy()]
    # a rank with no forward/backward rows (recorded or inferred) cannot tell its
    # gradient reductions from a check: its asynchronous reductions are left to
    # accumulation_sync (a check blocks: that is what makes it a hidden sync)
    blind = ~calls["rank"].isin(windows["rank"].unique()).to_numpy()
    gradients = calls["async_op"].astype(bool).to_numpy() & calls["name"].isin(REDUCTIONS).to_numpy()
    calls = calls[~(blind & gradients)]
    # a checkpoint save's own collectives (DCP plans and gathers inside save) are the save's
    saves = events[steady & (kind == "checkpoint").to_numpy()]
    if len(saves):
        calls = calls[~started_inside(calls, saves)]
    found = pd.concat([calls[~started_inside(calls, windows)], syncs[started_inside(syncs, windows)]])
    found = found.assign(
        dur_ms=(found["end_ns"] - found["start_ns"]) / 1e6,
        callsite=as_str(found["callsite"]),
        name=as_str(found["name"]),
    )
    return found


def blocking_wait_rows(ctx) -> pd.DataFrame:
    """The host wait rows of the ranks that ran with NCCL's blocking wait on a
    CUDA run (their collectives have device rows; gloo ignores the variable),
    renamed as the host syncs they are."""
    meta = ctx.run.rank_meta
    ranks = [r for r, m in meta.items() if isinstance(m, dict) and _blocking_wait(m)]
    events = ctx.run.events()
    if not ranks or events.empty:
        return events.iloc[:0]
    device = timed_on_device(events["detail"])
    on_cuda = set(events.loc[device, "rank"].unique()) & set(ranks)
    waits = events[(events["kind"] == "wait").to_numpy() & ~device & events["rank"].isin(on_cuda).to_numpy()]
    return waits.assign(kind="sync", name=BLOCKING_WAIT_NAME)


def _blocking_wait(meta: dict) -> bool:
    env = (meta.get("env") or {}).get("nccl_env") or {}
    # torch reads "1" (c10d's getCvarBool); the words are what users also write
    return any(str(env.get(k, "")).strip().lower() in ("1", "true", "yes", "y") for k in BLOCKING_WAIT_VARS)


def detect(ctx):
    blocking = blocking_wait_rows(ctx)
    if ctx.kernel_steady:
        return _detect_on_device(ctx, blocking)
    findings = _blocking_wait_on_host(ctx, blocking)
    found = candidates(ctx)
    if found.empty or not ctx.steady:
        return findings
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
        what = (
            f"a device sync ({op}) inside forward/backward"
            if is_sync
            else f"calls {op} on a {int(at_site['bytes'].median())}-byte tensor"
        )
        findings.append(
            Finding(
                kind="hidden_sync",
                callsite=where,
                ranks=sorted(int(r) for r in per_rank_ms.index),
                impact_ms_per_step=impact_ms,
                title=(
                    f"{where} {what} {count_per_step:.0f}x per step: a hidden synchronization "
                    f"costing {impact_ms:.1f} ms/step"
                ),
                recommendation=(
                    "Accumulate the value on the device and reduce/print it once per step "
                    "(or every N steps), outside the micro-batch loop; avoid .item() in the loop."
                ),
                metrics={
                    "calls_per_step": count_per_step,
                    "blocking_ms_per_step": impact_ms,
                    "bytes": float(at_site["bytes"].median()),
                },
            )
        )
    return findings


def _blocking_wait_on_host(ctx, blocking: pd.DataFrame) -> list:
    blocking = blocking[blocking["step"].isin(ctx.steady)]
    if blocking.empty:
        return []
    n_steps = len(ctx.steady)
    per_rank = blocking.assign(ms=(blocking["end_ns"] - blocking["start_ns"]) / 1e6).groupby("rank")
    host_ms = float((per_rank["ms"].sum() / n_steps).median())
    per_step = float((per_rank.size() / n_steps).median())
    ranks = sorted(int(r) for r in per_rank.size().index)
    return [
        Finding(
            kind="hidden_sync",
            ranks=ranks,
            severity="info",
            title=(
                f"TORCH_NCCL_BLOCKING_WAIT is set: each Work.wait() blocks the host until its collective "
                f"ends ({per_step:.0f} per step, {host_ms:.1f} ms/step of the host blocked), so the host "
                f"cannot queue work ahead of the GPU; what the GPU loses needs its kernels "
                f"(diagnose run --torch-profiler STEPS)"
            ),
            recommendation=UNSET_BLOCKING_WAIT,
            metrics={"calls_per_step": per_step, "blocking_ms_per_step": host_ms},
        )
    ]


def _detect_on_device(ctx, blocking: pd.DataFrame):
    if blocking.empty:
        syncs = ctx.run.device_idle_behind_syncs()
    else:  # the blocking waits join the syncs the loader's table holds
        events = ctx.run.events()
        events = pd.concat([events[events["kind"] != "wait"], blocking], ignore_index=True)
        syncs = device_idle_behind_syncs(events, ctx.run.kernels())
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
        waits = op == BLOCKING_WAIT_NAME
        findings.append(
            Finding(
                kind="hidden_sync",
                callsite=callsite,
                ranks=sorted(int(r) for r in per_rank_ms.index),
                impact_ms_per_step=impact_ms,
                title=(
                    f"{callsite or op} blocks the host {count_per_step:.0f}x per step"
                    + (" (Work.wait() under TORCH_NCCL_BLOCKING_WAIT)" if waits and callsite else "")
                    + f" and leaves the GPU idle {impact_ms:.1f} ms/step until the host launches again "
                    f"(on the GPUs' clocks)"
                ),
                recommendation=UNSET_BLOCKING_WAIT if waits else READ_ONCE_PER_STEP,
                metrics={
                    "calls_per_step": count_per_step,
                    "device_idle_ms_per_step": impact_ms,
                    "blocking_ms_per_step": float((at_site.groupby("rank")["host_ms"].sum() / n_steps).median()),
                    "device_time": 1.0,
                    "sync_site": str(where),
                },
            )
        )
    return findings
