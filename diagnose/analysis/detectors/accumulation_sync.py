"""accumulation_sync: gradient accumulation that reduces the gradients after every
micro-batch's backward instead of once per optimizer step.

Signal: per rank and steady step, its backward calls (each `Tensor.backward` /
`torch.autograd.backward`, one per micro-batch) and the gradient reductions
issued inside them: asynchronous all-reduces and reduce-scatters (DDP's buckets
and its reducer's row, FSDP's reduce-scatters, a trainer's bucket hooks).
Functional collectives are left out: DTensor's tensor-parallel traffic runs in
every backward by design (so does Megatron's, which is blocking). A step whose
k >= 2 backwards each issue reductions ran k rounds where one was needed: the
user forgot `model.no_sync()` (or FSDP's `set_requires_gradient_sync(False)`)
on the micro-batches before the last.

Threshold: on at least half the ranks that run >= 2 backwards per step, in at
least half of the steady steps, every backward issues reductions. Impact: the
step without the reductions of all but the last backward, by what-if replay
(diagnose/analysis/replay/whatif.py); the estimate: the time those rounds block the
rank (their exposed part is what a fix saves, overlapped time is not).
Evidence: backwards and reduction rounds per step, bytes per round, the
backward's callsite.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.device_collectives import timed_on_device
from diagnose.analysis.tables.matching import as_str
from diagnose.analysis.tables.per_rank import rank_slice, sorted_by_rank

REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_reduce_coalesced")
FUNCTIONAL = "functional"  # collectors/instrument/functional_collectives.py's detail
STEP_FRAC = 0.5
RANK_FRAC = 0.5


def _in_backward(calls: pd.DataFrame, backwards: pd.DataFrame) -> np.ndarray:
    """For each call, the index (into `backwards`) of its own rank's backward it was
    issued in, or -1."""
    rank, start, end, index = sorted_by_rank(
        backwards["rank"].to_numpy(np.int64),
        backwards["start_ns"].to_numpy(np.int64),
        backwards["end_ns"].to_numpy(np.int64),
        np.arange(len(backwards)),
    )
    out = np.full(len(calls), -1)
    c_rank, c_start = calls["rank"].to_numpy(np.int64), calls["start_ns"].to_numpy(np.int64)
    for r in np.unique(c_rank):
        mine = np.flatnonzero(c_rank == r)
        starts, ends, idx = rank_slice(rank, r, start, end, index)
        if not len(starts):
            continue
        k = np.searchsorted(starts, c_start[mine], side="right") - 1
        ok = (k >= 0) & (c_start[mine] <= ends[np.clip(k, 0, None)])
        out[mine[ok]] = idx[np.clip(k, 0, None)][ok]
    return out


def reduction_rounds(events: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Where no backward call is recorded (an import, a run without our hooks):
    each round of gradient reductions as a window, in place of the backward that
    issued it. A round is a run of reduction issues on a rank that no wait on
    its reductions interrupts: a micro-batch's reductions are waited before the
    next micro-batch reduces again (accumulation without no_sync); one
    reduction per optimizer step is one round however it overlaps the backward.
    Only rounds that issue the same calls (callsites, sizes) as another round of
    their step count: the same gradients reduced again, not two reductions."""
    columns = ["rank", "step", "start_ns", "end_ns", "callsite"]
    if calls.empty:
        return pd.DataFrame(columns=columns)
    keys = pd.MultiIndex.from_frame(calls[["rank", "group", "seq"]].astype({"group": str}))
    waits = events[(events["kind"] == "wait").to_numpy() & ~timed_on_device(events["detail"])]
    waits = waits[pd.MultiIndex.from_frame(waits[["rank", "group", "seq"]].astype({"group": str})).isin(keys)]
    calls = calls.assign(_what=as_str(calls["callsite"]) + "|" + calls["bytes"].astype(str))
    marks = pd.concat(
        [
            calls[["rank", "step", "start_ns", "_what"]].assign(_issue=True),
            waits[["rank", "step", "start_ns"]].assign(_issue=False, _what=""),
        ]
    )
    marks = marks.sort_values(["rank", "step", "start_ns"], kind="stable")
    issue = marks["_issue"].to_numpy(bool)
    same = (marks[["rank", "step"]].shift() == marks[["rank", "step"]]).all(axis=1).to_numpy()
    # a round starts at an issue after a wait, or at the step's first issue
    new_run = issue & ~(same & np.roll(issue, 1))
    run_id = np.cumsum(new_run)
    issues = marks[issue].assign(_run=run_id[issue])
    rounds = issues.groupby("_run").agg(
        rank=("rank", "first"),
        step=("step", "first"),
        start_ns=("start_ns", "min"),
        end_ns=("start_ns", "max"),
        what=("_what", lambda w: "/".join(sorted(w))),
    )
    # the same gradients reduced again: rounds of one step that issue the same calls
    # (callsites and sizes); two different reductions waited in turn are not rounds
    again = rounds.groupby(["rank", "step", "what"])["what"].transform("size") >= 2
    return rounds[again].assign(callsite="").reset_index(drop=True)[columns]


def extra_rounds(ctx) -> pd.DataFrame | None:
    """Per (rank, step): backwards, reduction rounds, bytes per round, and (in
    attrs["extra"]) the reductions of every backward but the step's last, for the
    what-if; None when no step has two backwards. Computed once per analysis."""
    if not hasattr(ctx, "_accumulation_rounds"):
        ctx._accumulation_rounds = _extra_rounds(ctx)
    return ctx._accumulation_rounds


def _extra_rounds(ctx) -> pd.DataFrame | None:
    # Masks over the whole table, rows copied only once picked: a steady-step copy of
    # every event and its strings as Python objects cost 1,024 ranks x 200 steps
    # ~450 MB and ~2.5 s (bench/results/2026-12-05-analysis-memory.md)
    events = ctx.run.events()
    steady = events["step"].isin(ctx.steady).to_numpy()
    kind, device = events["kind"], timed_on_device(events["detail"])
    backwards = events[steady & (kind == "backward").to_numpy()].reset_index(drop=True)
    calls = events[
        steady
        & (kind == "collective").to_numpy()
        & events["async_op"].astype(bool).to_numpy()
        & events["name"].isin(REDUCTIONS).to_numpy()
        & (events["detail"] != FUNCTIONAL).to_numpy()
        & ~device
        & (events["seq"] >= 0).to_numpy()
    ]
    if backwards.empty:
        backwards = reduction_rounds(events, calls)
    if backwards.empty:
        return None
    inside = _in_backward(calls, backwards)
    calls = calls.assign(_bw=inside)[inside >= 0]
    per_step = backwards.groupby(["rank", "step"]).size().rename("backwards").to_frame()
    if per_step["backwards"].max() < 2:
        return None
    rounds = calls.groupby(["rank", "step"])["_bw"].nunique().rename("rounds")
    per_round = calls.groupby(["rank", "step", "_bw"])["bytes"].sum().groupby(["rank", "step"]).median()
    table = per_step.join(rounds, how="left").join(per_round.rename("bytes_per_round"), how="left")
    table = table.fillna({"rounds": 0, "bytes_per_round": 0}).reset_index()
    # the last backward of each (rank, step) is the one that must reduce
    last_bw = backwards.reset_index().groupby(["rank", "step"])["index"].max()
    is_last = (
        calls["_bw"].to_numpy() == last_bw.reindex(pd.MultiIndex.from_arrays([calls["rank"], calls["step"]])).to_numpy()
    )
    extra = calls.loc[~is_last, ["rank", "step", "group", "seq", "start_ns", "end_ns"]]
    # what those rounds blocked the rank: the issue call, and the wait on it (DDP's reducer
    # row has no wait of its own: the replay models it)
    waits = events[steady & (kind == "wait").to_numpy() & ~device]
    # groups as text: the two frames' categoricals can have codes of different widths
    # (int8 vs int16), which pandas cannot look up one in the other
    waits = (
        waits.assign(_wait_ns=waits["end_ns"] - waits["start_ns"], group=waits["group"].astype(str))
        .groupby(["rank", "group", "seq"])["_wait_ns"]
        .sum()
    )
    waited = waits.reindex(pd.MultiIndex.from_arrays([extra["rank"], extra["group"].astype(str), extra["seq"]])).fillna(
        0
    )
    table.attrs["extra"] = extra.assign(blocked_ns=(extra["end_ns"] - extra["start_ns"]).to_numpy() + waited.to_numpy())
    table.attrs["callsites"] = as_str(backwards["callsite"])
    table.attrs["details"] = as_str(calls["detail"])
    return table


def detect(ctx):
    table = extra_rounds(ctx)
    if table is None:
        return []
    accumulating = table[table["backwards"] >= 2]
    every = accumulating.assign(all_reduce=accumulating["rounds"] >= accumulating["backwards"])
    per_rank = every.groupby("rank")["all_reduce"].mean()
    syncing = per_rank[per_rank >= STEP_FRAC]
    if syncing.empty or len(syncing) < RANK_FRAC * len(per_rank):
        return []
    mine = every[every["rank"].isin(syncing.index)]
    backwards = float(mine["backwards"].median())
    rounds = float(mine["rounds"].median())
    mb = float(mine["bytes_per_round"].median()) / 2**20
    extra = table.attrs["extra"]
    extra = extra[extra["rank"].isin(syncing.index)]
    n_steps = max(len(ctx.steady), 1)
    blocked_ms = (
        float((extra["blocked_ns"] / 1e6).groupby(extra["rank"]).sum().median()) / n_steps if len(extra) else 0.0
    )
    callsites = table.attrs["callsites"]
    callsites = callsites[callsites != ""]
    callsite = ctx.relpath(callsites.mode().iloc[0]) if len(callsites) else None
    details = table.attrs["details"]
    ddp = details.str.startswith("ddp").mean() > 0.5 if len(details) else False
    fsdp = details.str.startswith("fsdp").mean() > 0.5 if len(details) else False
    where = (f"the backward at {callsite}" if callsite else "each backward") + (
        " (DDP)" if ddp else " (FSDP)" if fsdp else ""
    )
    if ddp:
        fix = (
            "run the micro-batches before the last inside `with model.no_sync():` (DDP then "
            "all-reduces once, in the last backward)"
        )
    elif fsdp:
        fix = (
            "call `model.set_requires_gradient_sync(False)` before the micro-batches before the "
            "last and `True` before the last (FSDP2; FSDP1: `with model.no_sync():`), trading "
            "memory for unsharded gradients for communication"
        )
    else:
        fix = (
            "launch the gradient reduction only in the last micro-batch's backward (Megatron: "
            "`config.no_sync_func`; DeepSpeed: let its engine accumulate with "
            "`gradient_accumulation_steps`)"
        )
    return [
        Finding(
            kind="accumulation_sync",
            title=(
                f"gradients are reduced after every micro-batch: {rounds:.0f} reduction rounds per "
                f"optimizer step for {backwards:.0f} backwards ({mb:.1f} MiB each) from {where}; "
                f"one is needed"
            ),
            ranks=sorted(int(r) for r in syncing.index),
            callsite=callsite,
            impact_ms_per_step=blocked_ms,
            recommendation=f"Accumulate locally and reduce once per step: {fix}.",
            metrics={
                "backwards_per_step": backwards,
                "reduction_rounds_per_step": rounds,
                "mib_per_round": mb,
                "extra_rounds_blocked_ms_per_step": blocked_ms,
                "steps_frac": float(syncing.median()),
            },
        )
    ]
