"""checkpoint_stall: checkpoint saves that block training.

Signal: the "checkpoint" rows (collectors/instrument/checkpoints.py: torch.save,
DCP save / async_save, safetensors save_file) on each rank's training thread
(MainThread), in the steady steps: the time each save kept the loop from
training. Impact: that time per steady step on the slowest rank (a save every N
steps costs its length / N per step; DCP synchronises its ranks inside save, so
every rank blocks as long as the slowest; torch.save on one rank shows in the
others at the next collective, as a straggler would); the title's share is of
the time the steady steps took (a save makes its step long). Threshold: the usual
severity, 3% of the step a warning, 15% critical: a 2 s save every 100 steps of
1 s is 2%. Evidence: saves and bytes, each rank's blocked time and throughput
(bytes / its save's length; not a disk figure: torch.save does not fsync,
DCP's writer does), the slowest rank against the others (a slow disk), and for
DCP async_save the staging it blocked on against the upload that ran behind
(done - return). An async upload is not free: it competes for the cores and
the GIL with the steps it overlaps; their excess over the rank's other steps
(median) is added to the impact (`upload_contention_ms_per_step`): without it
the impact was a tenth of the saving measured by running without saves.

The recommendation depends on what blocked: a synchronous save -> DCP
async_save (the caller then waits only for the copy to CPU; the next save waits
for the previous upload) or saving less often; one rank far slower than its
peers (>= 2x the median, its share of the waits) -> its disk or volume.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.detectors.finding_record import Finding

TRAINING_THREAD = "thread=MainThread"
SLOW_RANK_X = 2.0


def detect(ctx):
    events = ctx.run.events()
    saves = events[
        (events["kind"] == "checkpoint").to_numpy()
        & events["step"].isin(ctx.steady).to_numpy()
        & (events["detail"] == TRAINING_THREAD).to_numpy()
    ]
    if saves.empty or not ctx.steady or ctx.step_ms <= 0:
        return []
    saves = saves.assign(ms=(saves["end_ns"] - saves["start_ns"]) / 1e6, api=saves["name"].astype(str))
    n_steps = len(ctx.steady)
    per_rank = saves.groupby("rank").agg(
        blocked_ms=("ms", "sum"), saves=("ms", "size"), bytes=("bytes", "sum"), save_ms=("ms", "median")
    )
    # an async upload's cost is not the caller's wait: it competes for the cores (and the
    # GIL) with the steps it overlaps, which run longer than the others
    per_rank["contention_ms"] = upload_contention_ms(ctx, events, saves).reindex(per_rank.index).fillna(0.0)
    # the job waits for its slowest saver: DCP's ranks block together, a rank's own
    # torch.save holds the others at the next collective
    impact_ms = float(((per_rank["blocked_ms"] + per_rank["contention_ms"]) / n_steps).max())
    # of the time the steady steps took (a save makes its step long: the median step hides it)
    total_ms = ctx.breakdown.groupby("rank")["step_ms"].sum().reindex(per_rank.index)
    share = float((per_rank["blocked_ms"] / total_ms).max())
    slowest = int(per_rank["save_ms"].idxmax())
    others_ms = float(per_rank["save_ms"].drop(slowest).median()) if len(per_rank) > 1 else float("nan")
    slow_disk = bool(others_ms > 0 and per_rank.loc[slowest, "save_ms"] >= SLOW_RANK_X * others_ms)
    apis = sorted(saves["api"].unique())
    metrics = {
        "saves_per_rank": float(per_rank["saves"].median()),
        "bytes_per_save": float(saves["bytes"].median()),
        "blocked_ms_per_step": float((per_rank["blocked_ms"] / n_steps).max()),
        "upload_contention_ms_per_step": float((per_rank["contention_ms"] / n_steps).max()),
        "blocked_frac": share,
        "slowest_rank": slowest,
        "slowest_save_ms": float(per_rank.loc[slowest, "save_ms"]),
        "others_save_ms": others_ms,
        "apis": ",".join(apis),
    }
    for rank, row in per_rank.iterrows():
        metrics[f"rank{int(rank)}_mb_per_s"] = (
            row["bytes"] / 2**20 / (row["blocked_ms"] / 1e3) if row["blocked_ms"] > 0 else float("nan")
        )
    upload = _async_uploads(events, saves)
    if upload is not None:
        metrics["async_upload_ms"] = upload
    what = "/".join(apis)
    title = (
        f"checkpoint saves block training {share:.1%} of the time ({what}, "
        f"{int(metrics['saves_per_rank'])} saves of {metrics['bytes_per_save'] / 2**20:.1f} MiB, "
        f"{impact_ms:.1f} ms/step)"
    )
    if slow_disk:
        title += (
            f": rank {slowest}'s take {per_rank.loc[slowest, 'save_ms']:.0f} ms, "
            f"{per_rank.loc[slowest, 'save_ms'] / others_ms:.0f}x its peers' {others_ms:.0f} ms"
        )
    advice = []
    if slow_disk:
        advice.append(
            f"check rank {slowest}'s disk or volume: its saves are {per_rank.loc[slowest, 'save_ms'] / others_ms:.0f}x "
            "its peers', and the others wait for it"
        )
    if any(api != "dcp.async_save" for api in apis):
        advice.append(
            "save asynchronously (torch.distributed.checkpoint.async_save: the loop then waits only "
            "for the copy to CPU, the write runs behind training) or less often"
        )
    else:
        advice.append(
            "the staging copy to CPU still blocks: pin its buffers or save less often; the next "
            "save waits for the previous upload"
        )
    return [
        Finding(
            kind="checkpoint_stall",
            ranks=sorted(int(r) for r in per_rank.index),
            impact_ms_per_step=impact_ms,
            title=title,
            recommendation="; ".join(advice).capitalize() + ".",
            metrics=metrics,
        )
    ]


def upload_contention_ms(ctx, events: pd.DataFrame, saves: pd.DataFrame) -> pd.Series:
    """rank -> ms the steps overlapping its async uploads took beyond its other steps'
    median (the upload's window: from async_save's return for upload_ns, its k-th
    done row to its k-th call)."""
    done = events[(events["kind"] == "done").to_numpy() & (events["name"] == "dcp.async_save").to_numpy()]
    calls = saves[saves["api"] == "dcp.async_save"]
    out = {}
    steps = ctx.breakdown
    for rank, mine in calls.groupby("rank"):
        ups = done[done["rank"] == rank]["detail"].astype(str).str.extract(r"upload_ns=(\d+)")[0]
        ups = ups.astype(float).to_numpy()
        start = np.sort(mine["end_ns"].to_numpy(np.int64))[: len(ups)]
        end = start + ups[: len(start)]
        st = ctx.run.steps()
        st = st[(st["rank"] == rank) & st["step"].isin(ctx.steady)]
        overlap = np.zeros(len(st), bool)
        for s0, s1 in zip(start, end):
            overlap |= (st["start_ns"].to_numpy() < s1) & (st["end_ns"].to_numpy() > s0)
        b = steps[steps["rank"] == rank].set_index("step")["step_ms"].reindex(st["step"]).to_numpy()
        if overlap.any() and (~overlap).any():
            out[rank] = float(np.clip(b[overlap] - np.median(b[~overlap]), 0, None).sum())
    return pd.Series(out, dtype=float)


def _async_uploads(events: pd.DataFrame, saves: pd.DataFrame) -> float | None:
    """Median upload time (ms) of DCP async saves (their done rows' upload_ns), or None."""
    done = events[(events["kind"] == "done").to_numpy() & (events["name"] == "dcp.async_save").to_numpy()]
    if done.empty:
        return None
    upload = done["detail"].astype(str).str.extract(r"upload_ns=(\d+)")[0].astype(float).to_numpy()
    upload = upload[np.isfinite(upload)]
    return float(np.median(upload) / 1e6) if len(upload) else None
