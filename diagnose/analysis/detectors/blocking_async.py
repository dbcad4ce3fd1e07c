"""blocking_async: asynchronous operations waited immediately after issue.

Signal: async collectives and p2p sends (isend via batch_isend_irecv,
async_op=True) whose Work.wait() starts within 0.5 ms of the issue call
returning: nothing ran in between, so the "non-blocking" op blocked. Receives
are excluded (a pipeline must wait for the activation it is about to use), and
so are sends batched with a receive (Megatron's combined send+recv exchange:
the wait is for the receive).
Threshold: >= 80% of the async ops at one callsite waited immediately, >= 1 per
step; the estimate is their wait time per step (what overlap would hide),
severity from impact. On host lanes the impact is the replay of the fix
(whatif.py, deferred_sends: exchanges batched, lone sends waited at the end of
the schedule), where the replay holds.

On a live CUDA run the calls and waits are their device rows
(collectors/instrument/collective_events.py): Work.wait() returns at once on
the host and only makes the compute stream wait, so the gap is the compute the
device had queued between the call's arrival and the wait, and the wait is how
long the compute stream stalled behind it, never how long Python waited.
"""

import pandas as pd

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.device_collectives import NCCL_TIMED, WAIT_BOUND
from diagnose.analysis.tables.matching import wait_site
from diagnose.analysis.tables.p2p_exchanges import NOTHING_BETWEEN_NS

IMMEDIATE_NS = NOTHING_BETWEEN_NS  # nothing ran between the return and the wait
IMMEDIATE_FRAC = 0.8


def async_waits(calls: pd.DataFrame) -> pd.DataFrame:
    """The waited async sends and collectives a wait could be moved for, with the
    gap from return to wait, the wait, and the site (the wait's callsite, else the call's)."""
    recvs = calls.loc[calls["name"] == "recv", ["rank", "issue_ns"]]
    calls = calls[calls["async_op"].astype(bool) & calls["wait_start_ns"].notna()]
    calls = calls[~calls["detail"].str.startswith("ddp")]
    # a batch (batch_isend_irecv) is the ops one rank issued at one instant
    batch = pd.MultiIndex.from_frame(calls[["rank", "issue_ns"]])
    calls = calls[~batch.isin(pd.MultiIndex.from_frame(recvs))]
    return calls.assign(
        gap_ns=calls["wait_start_ns"] - calls["return_ns"],
        wait_ms=(calls["wait_end_ns"] - calls["wait_start_ns"]) / 1e6,
        site=wait_site(calls),
    )


def detect(ctx):
    calls = ctx.run.collectives()
    if calls.empty or not ctx.steady:
        return []
    calls = async_waits(calls)
    calls = calls[calls["step"].isin(ctx.steady)]
    if calls.empty:
        return []
    findings = []
    n_steps = len(ctx.steady)
    for site, at_site in calls.groupby("site"):
        immediate = at_site["gap_ns"] <= IMMEDIATE_NS
        frac = float(immediate.mean())
        per_step = len(at_site) / n_steps / max(at_site["rank"].nunique(), 1)
        if frac < IMMEDIATE_FRAC or per_step < 1:
            continue
        waited = at_site[immediate]
        per_rank_ms = waited.groupby("rank")["wait_ms"].sum() / n_steps
        impact_ms = float(per_rank_ms.median())
        where = ctx.relpath(site)
        ops = "/".join(sorted(at_site["name"].unique()))
        on_device = bool(at_site["detail"].isin([WAIT_BOUND, NCCL_TIMED]).all())
        what = "the compute stream stalled" if on_device else "non-overlapped waiting"
        findings.append(
            Finding(
                kind="blocking_async",
                callsite=where,
                ranks=sorted(int(r) for r in per_rank_ms.index),
                impact_ms_per_step=impact_ms,
                title=(
                    f"{where}: async {ops} waited immediately after issue ({frac:.0%} of "
                    f"{len(at_site)} ops), {impact_ms:.1f} ms/step of {what}"
                    + (" (on the GPUs' clocks)" if on_device else "")
                ),
                recommendation=_advice(set(at_site["name"])),
                metrics={
                    "immediate_wait_frac": frac,
                    "ops_per_step": per_step,
                    "blocked_ms_per_step": impact_ms,
                    "device_time": float(on_device),
                },
            )
        )
    return findings


def _advice(ops: set) -> str:
    """What to change, for sends (a pipeline's) or collectives (overlap with compute)."""
    if "send" in ops:
        return (
            "Issue the send earlier and wait only where its buffer is reused "
            "(start the send, run the next micro-batch's compute, then wait); "
            "post a send and the receive from the same peer as one batch_isend_irecv."
        )
    return (
        "Issue the collective earlier and wait only where its result is first needed "
        "(start it, run compute that does not read it, then wait), or let the framework "
        "overlap it (bucketed gradient reduction, asynchronous tensor parallelism)."
    )
