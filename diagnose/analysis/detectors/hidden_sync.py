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
"""
import pandas as pd

from diagnose.analysis.findings import Finding
from diagnose.analysis.matching import as_str
from diagnose.analysis.per_rank import started_inside

SMALL_BYTES = 1 << 20
MIN_PER_STEP = 2


def candidates(ctx):
    """The small user collectives outside compute and the device syncs inside
    it, in steady steps (computed once per analysis: exposed_comm uses them too)."""
    cached = getattr(ctx, "_hidden_sync_candidates", None)
    if cached is None:
        cached = ctx._hidden_sync_candidates = _candidates(ctx)
    return cached.copy(deep=False)


def _candidates(ctx):
    events = ctx.run.events()
    # the rows that can matter, first: the steady-step filter then copies few rows
    events = events[events["kind"].isin(["collective", "sync", "forward", "backward"])
                    & events["step"].isin(ctx.steady)]
    kind, detail = as_str(events["kind"]), as_str(events["detail"])
    calls = events[(kind == "collective") & (events["bytes"] <= SMALL_BYTES)
                   & (as_str(events["callsite"]) != "") & ~detail.str.startswith("ddp")]
    syncs = events[(kind == "sync") & (detail == "cuda")]
    windows = events[events["kind"].isin(["forward", "backward"])]
    found = pd.concat([calls[~started_inside(calls, windows)], syncs[started_inside(syncs, windows)]])
    found = found.assign(dur_ms=(found["end_ns"] - found["start_ns"]) / 1e6,
                         callsite=as_str(found["callsite"]), name=as_str(found["name"]))
    return found


def detect(ctx):
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
