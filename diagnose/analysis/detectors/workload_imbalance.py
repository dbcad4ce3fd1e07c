"""workload_imbalance: micro-batches that differ in work (variable sequence
lengths), so a different rank is the slowest at every step and its peers wait.

Signal: forward+backward time per micro-batch, per rank (CUDA-event spans when
the run has them, else the host phases less the time their thread queued for a
core, `queued_ns`), over the steady steps. The queued time is left out because
on a host with more busy ranks than cores it is not the micro-batch's work but
its neighbours': slow_input on dp4 with 2 cores (identical micro-batches; a
rank computes alone while its peers sleep in data loading, else two to a core)
measured p50/p10 1.79-1.92 on wall time, which read as variable lengths. Ranks of one
pipeline stage are data-parallel peers: they meet at the step's gradient
all-reduce, so per step each waits for the peer whose micro-batches summed to
the most compute.

Threshold (all three):
- spread beyond jitter: each rank's per-micro-batch compute, divided by that
  rank's own median (so that a persistently slow rank adds nothing), has
  p50/p10 >= SPREAD_RATIO. The median over the 10th percentile, not p90: jitter
  is a long tail (a rank descheduled for 20 ms on a shared host: identical
  micro-batches on 4 ranks sharing 2 busy cores measured p90/p10 4.0 but
  p50/p10 1.42), while variable lengths spread the bulk (lengths drawn in 1-4x
  measured p50/p10 1.79; drawn in 1-7x, as the varlen scenario does, more).
- the slowest rank changes: no rank is the slowest of its stage in more than
  MAX_SLOWEST_SHARE (half) of the steady steps, and at least two ranks take
  turns. A rank slowest in most steps is a `straggler` (that detector's
  "persistent" bar is the same half), not an imbalance of the data.
- the impact, below, >= 3% of the step for a warning (findings.with_severity).

Impact (`equalised_wait_ms_per_step`): per step and stage, the slowest peer's
compute minus the peers' mean (what the others wait at the all-reduce beyond
the work they all would do with token-balanced micro-batches), the largest over
stages (stages run side by side), averaged over steady steps. It ignores how a
late micro-batch travels through a pipeline's sends and receives; the step
replay will replace it with a what-if replay of equal micro-batches.
"""
import pandas as pd

from diagnose.analysis.findings import Finding

SPREAD_RATIO = 1.6
MAX_SLOWEST_SHARE = 0.5
MIN_STEPS = 4


def microbatch_compute(ctx) -> tuple[pd.DataFrame, bool]:
    """(rank, stage, step, microbatch, compute_ms per micro-batch; on the device clock?)."""
    events = ctx.run.events()
    base = (events["kind"] == "phase") & (events["microbatch"] >= 0) & events["step"].isin(ctx.steady)
    # On CUDA the host phases time the launches, not the work: the CUDA-event
    # spans of the same phases are the device's time.
    device = base & events["name"].isin(["gpu:forward", "gpu:backward"]) & (events["detail"] == "cuda_event")
    on_device = bool(device.any())
    rows = events.loc[device if on_device else base & events["name"].isin(["forward", "backward"]),
                      ["rank", "stage", "step", "microbatch", "start_ns", "end_ns", "queued_ns"]]
    # (device spans and rows without the reading have queued_ns -1: nothing to take off)
    rows = rows.assign(compute_ms=(rows["end_ns"] - rows["start_ns"] - rows["queued_ns"].clip(lower=0)) / 1e6)
    per_mb = rows.groupby(["rank", "stage", "step", "microbatch"], observed=True)["compute_ms"].sum()
    return per_mb.reset_index(), on_device


def own_spread(per_mb: pd.DataFrame) -> float:
    """p50/p10 of per-micro-batch compute, each rank's over its own median."""
    own = per_mb["compute_ms"] / per_mb.groupby("rank")["compute_ms"].transform("median")
    p10, p50 = own.quantile(0.1), own.quantile(0.5)
    return float(p50 / p10) if p10 > 0 else float("inf")


def lengths_vary(ctx) -> bool:
    """Do micro-batches differ in work beyond jitter? (the straggler detector asks:
    a rank slow only on the steps its micro-batches were long is no straggler)"""
    per_mb, _ = microbatch_compute(ctx)
    return not per_mb.empty and own_spread(per_mb) >= SPREAD_RATIO


def detect(ctx):
    per_mb, on_device = microbatch_compute(ctx)
    if per_mb.empty:
        return []
    # data-parallel peers: ranks of one stage, when there are at least two
    peers = per_mb.groupby("stage")["rank"].transform("nunique")
    per_mb = per_mb[peers >= 2]
    if per_mb.empty:
        return []
    spread = own_spread(per_mb)

    per_step = per_mb.groupby(["stage", "step", "rank"])["compute_ms"].sum()
    # complete steps only: a step some peer lacks has no all-reduce to wait at
    per_step = per_step.unstack("rank").dropna(how="any", axis=0)
    if len(per_step.index.get_level_values("step").unique()) < MIN_STEPS:
        return []
    slowest = per_step.idxmax(axis=1)
    shares = slowest.groupby(level="stage").value_counts(normalize=True)
    worst_stage, worst_rank = shares.idxmax()
    max_share = float(shares.max())
    turns = int(slowest.nunique())
    if spread < SPREAD_RATIO or max_share > MAX_SLOWEST_SHARE or turns < 2:
        return []

    # per stage, only its own ranks are columns with values
    excess = per_step.max(axis=1) - per_step.mean(axis=1)
    impact_ms = float(excess.groupby(level="step").max().mean())
    ms = per_mb["compute_ms"]
    p50_ms, p90_ms, max_ms = float(ms.quantile(0.5)), float(ms.quantile(0.9)), float(ms.max())
    ranks = sorted(int(r) for r in per_mb["rank"].unique())
    steps = int(len(excess.index.get_level_values("step").unique()))
    share_by_rank = slowest.value_counts(normalize=True)
    metrics = {"microbatch_p50_ms": p50_ms, "microbatch_p90_ms": p90_ms, "microbatch_max_ms": max_ms,
               "own_median_p50_over_p10_x": spread, "slowest_rank_max_share_frac": max_share,
               "slowest_rank_max_share_rank": int(worst_rank), "ranks_taking_turns": turns,
               "equalised_wait_ms_per_step": impact_ms, "steps_judged": steps,
               "device_time": float(on_device)}
    for rank in ranks:
        metrics[f"rank{rank}_slowest_frac"] = float(share_by_rank.get(rank, 0.0))
    clock = "on the GPUs' clocks" if on_device else "on the hosts' clocks"
    title = (f"micro-batch compute varies {spread:.2f}x (p50/p10) within each rank "
             f"(p50 {p50_ms:.1f} ms, p90 {p90_ms:.1f} ms, max {max_ms:.1f} ms) and the slowest rank changes "
             f"from step to step ({turns} ranks take turns, none in more than {max_share:.0%} of {steps} steps): "
             f"its peers wait {impact_ms:.1f} ms/step for it ({clock})")
    return [Finding(
        kind="workload_imbalance", title=title, ranks=ranks, impact_ms_per_step=impact_ms,
        # a pipelined run names the stage whose peers take the most turns; plain DP, none
        stage=int(worst_stage) if per_mb["stage"].nunique() > 1 else None,
        recommendation=("Micro-batches carry unequal work (variable sequence lengths): pack or sort "
                        "sequences into token-balanced micro-batches (a fixed token budget per "
                        "micro-batch, the same on every data-parallel rank) so that no rank waits "
                        "at the gradient all-reduce for another's long batch."),
        metrics=metrics)]
