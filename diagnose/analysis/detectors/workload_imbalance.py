"""workload_imbalance: micro-batches that differ in work (variable sequence
lengths), so a different rank is the slowest at every step and its peers wait.

Signal: forward and backward time per micro-batch, per rank (CUDA-event spans
when the run has them, else the host phases less the time their thread queued
for a core, `queued_ns`: on a host with more busy ranks than cores that is the
neighbours' doing, not the micro-batch's work; on an imported GPU trace without
phases, the device spans of its forward and backward passes, which the importer
reads from the kernels' launching threads: diagnose/importers/kineto_structure.py;
never the host-gap rows of inferred_compute.py, one host interval cut in two), over
the steady steps; evidence `phases_from` says which. Ranks of
one pipeline stage are data-parallel peers: they meet at the step's gradient
all-reduce, so per step each waits for the peer whose micro-batches summed to
the most compute.

What tells work from jitter: a longer micro-batch makes BOTH its forward and
its backward longer (the backward ~2x the forward, each in proportion to the
tokens), while jitter (a descheduled thread, a page fault, a late interrupt)
hits one phase at random. A spread ratio cannot tell them apart: real lengths
are a long tail (a production job: p90/p50 1.66 but p50/p10 1.09; 1 micro-batch
in 10 at 7.5x has p50/p10 ~1), and so is jitter. The threshold before this
(p50/p10 >= 1.6) was fitted to the trainer's uniform draws and this box's
jitter and missed the tail: the rank that drew the most long micro-batches was
named an intermittent straggler.

Threshold (all three):
- the work signal, significant: the forward's and the backward's deviations
  from their rank's step (log time minus its mean over the step's micro-batches,
  one micro-batch per rank-step left out: the mean spent its degree of freedom)
  are rank-correlated, one-sided Spearman p <= ALPHA (0.01, the straggler's
  significance). Within the step, because a rank slowed for a whole step (a
  periodic stall on its host: an intermittent straggler) lengthens both phases
  of every micro-batch alike, which is no evidence of work; lengths drawn per
  micro-batch vary within it. With one micro-batch per step nothing varies
  within it: the deviation from the rank's own mean over steps is used.
- worth reporting: the wait the work alone explains is >= WARNING_FRAC (3%) of
  the median step, the findings' warning gate: less would be an info finding.
  A micro-batch's work is the smaller of its two phases, each over that rank's
  median of the phase (a delay of one phase cannot raise it, a longer
  micro-batch raises both: a lower bound of its length), times the stage's
  median micro-batch compute (a persistently slow rank adds nothing); summed
  per rank and step, the slowest peer's sum minus the peers' mean, largest over
  stages, averaged over steps. Significance alone is not enough: a 2-core box's
  contention is correlated too (the clean dp2 x pp2 run: rho 0.24, p 6e-7), but
  explains 1.4% of its step (the varlen run: 15%; accum_sync's, 3.3% at p 0.02).
- the slowest rank changes: at least two ranks take turns, and a rank slowest
  of its stage in more than MAX_SLOWEST_SHARE (half) of the steady steps (that
  is a `straggler`: its "persistent" bar is the same half) is one only if its
  work explains less than MOST_FRAC (half) of its excess over its peers on
  those steps (`explains_slowness`, which the straggler detector asks too). A
  rank that drew more long micro-batches than its peers is slowest in most
  steps by the luck of the draw (1 in 10 at 7.5x over 22 steps: 4 draws of
  100 of the tests' synthetic job, its work 95-97% of its excess; a rank 1.5x
  slower with equal micro-batches: under 1%).

Impact (`equalised_wait_ms_per_step`): per step and stage, the slowest peer's
compute minus the peers' mean (what the others wait at the all-reduce beyond
the work they all would do with token-balanced micro-batches), the largest over
stages (stages run side by side), averaged over steady steps; the step replay
(whatif.py) replaces it with a what-if replay of equal micro-batches. The tail,
p90/p50 of a rank's micro-batch compute over its median, is evidence.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.detectors.finding_record import WARNING_FRAC, Finding
from diagnose.analysis.detectors.significance import spearman_greater
from diagnose.analysis.tables.inferred_compute import DEVICE_SOURCE, phase_source

ALPHA = 0.01
MAX_SLOWEST_SHARE = 0.5
MOST_FRAC = 0.5
MIN_STEPS = 4
_KEYS = ["rank", "stage", "step", "microbatch"]


def microbatch_phases(ctx) -> tuple[pd.DataFrame, bool]:
    """(rank, stage, step, microbatch, forward_ms, backward_ms, compute_ms per
    micro-batch of the stages with two peers or more; on the device clock?)."""
    events = ctx.run.events()
    base = (events["kind"] == "phase") & (events["microbatch"] >= 0) & events["step"].isin(ctx.steady)
    # On CUDA the host phases time the launches, not the work: the CUDA-event
    # spans of the same phases are the device's time.
    device = base & events["name"].isin(["gpu:forward", "gpu:backward"]) & (events["detail"] == "cuda_event")
    on_device = bool(device.any())
    host = base & events["name"].isin(["forward", "backward"])
    if not on_device and not host.any():
        # an imported GPU trace without phases: the passes its kernels show, on
        # the device's clock (kineto_structure; never the host-gap rows, whose
        # two phases are cut from one host interval and cannot move apart)
        device = (
            events["kind"].isin(["forward", "backward"])
            & (events["detail"] == DEVICE_SOURCE)
            & (events["microbatch"] >= 0)
            & events["step"].isin(ctx.steady)
        )
        on_device = bool(device.any())
    rows = events.loc[device if on_device else host, [*_KEYS, "name", "start_ns", "end_ns", "queued_ns"]]
    # (device spans and rows without the reading have queued_ns -1: nothing to take off)
    ms = (rows["end_ns"] - rows["start_ns"] - rows["queued_ns"].clip(lower=0)) / 1e6
    rows = rows.assign(phase=rows["name"].astype(str).str.removeprefix("gpu:") + "_ms", ms=ms)
    per_mb = rows.pivot_table(index=_KEYS, columns="phase", values="ms", aggfunc="sum", observed=True)
    if not {"forward_ms", "backward_ms"} <= set(per_mb.columns):
        return pd.DataFrame(columns=[*_KEYS, "forward_ms", "backward_ms", "compute_ms"]), on_device
    # a micro-batch without both phases cannot say whether they move together
    per_mb = per_mb[["forward_ms", "backward_ms"]].dropna().reset_index()
    per_mb.columns.name = None
    per_mb = per_mb.assign(compute_ms=per_mb["forward_ms"] + per_mb["backward_ms"])
    # data-parallel peers: ranks of one stage, when there are at least two
    peers = per_mb.groupby("stage")["rank"].transform("nunique")
    return per_mb[peers >= 2].reset_index(drop=True), on_device


def phase_comovement(per_mb: pd.DataFrame) -> tuple[float, float, int]:
    """(Spearman rho, one-sided p, pairs) of the forward's and the backward's
    log-time deviations from their rank-step mean (the rank's own mean over
    steps when each step has one micro-batch), one micro-batch per rank-step
    left out when centred on the step."""
    logs = np.log(per_mb[["forward_ms", "backward_ms"]].clip(lower=1e-6))
    by_step = per_mb.groupby(["rank", "stage", "step"]).ngroup()
    per_step = by_step.map(by_step.value_counts())
    within = bool((per_step >= 2).any())
    group = by_step if within else per_mb.groupby(["rank", "stage"]).ngroup()
    dev = logs - logs.groupby(group).transform("mean")
    if within:  # a rank-step of n micro-batches holds n - 1 free deviations
        keep = (per_step >= 2) & (per_mb.groupby(group).cumcount() < per_step - 1)
        dev = dev[keep.to_numpy()]
    if len(dev) < 3 or dev["forward_ms"].nunique() < 2 or dev["backward_ms"].nunique() < 2:
        return 0.0, 1.0, len(dev)  # nothing varies: no evidence of work
    rho, p = spearman_greater(dev["forward_ms"], dev["backward_ms"])
    return rho, p, len(dev)


def work_ms(per_mb: pd.DataFrame) -> pd.Series:
    """Each micro-batch's work at its stage's speed: the smaller of its forward
    and backward, each over the rank's median of that phase (jitter that delays
    one phase does not raise it; a longer micro-batch raises both), times the
    stage's median micro-batch compute (a persistently slow rank adds nothing)."""
    med = per_mb.groupby("rank")[["forward_ms", "backward_ms"]].transform("median")
    relative = (per_mb[["forward_ms", "backward_ms"]] / med).min(axis=1)
    typical = per_mb.groupby("stage")["compute_ms"].transform("median")
    return relative * typical


def equalised_wait(per_mb: pd.DataFrame, column: str) -> tuple[pd.Series, pd.Series]:
    """(each rank's summed `column` per stage and step, complete steps only; per
    step, the slowest peer's sum minus its peers' mean, largest over stages)."""
    per_step = per_mb.groupby(["stage", "step", "rank"])[column].sum()
    # complete steps only: a step some peer lacks has no all-reduce to wait at
    peers = per_mb.groupby("stage")["rank"].nunique()
    present = per_step.groupby(level=["stage", "step"]).transform("size")
    per_step = per_step[present == peers.reindex(per_step.index.get_level_values("stage")).to_numpy()]
    by_step = per_step.groupby(level=["stage", "step"])
    excess = by_step.max() - by_step.mean()
    return per_step, excess.groupby(level="step").max()


def own_spread(per_mb: pd.DataFrame) -> tuple[float, float]:
    """(p50/p10, p90/p50) of per-micro-batch compute, each rank's over its own median."""
    own = per_mb["compute_ms"] / per_mb.groupby("rank")["compute_ms"].transform("median")
    p10, p50, p90 = own.quantile([0.1, 0.5, 0.9])
    return (float(p50 / p10) if p10 > 0 else float("inf")), float(p90 / p50) if p50 > 0 else float("inf")


def _slowest(per_step: pd.Series) -> pd.Series:
    """(stage, step) -> the rank with the most of the summed quantity."""
    return per_step.groupby(level=["stage", "step"]).idxmax().map(lambda key: key[2])


def work_signal(ctx) -> dict | None:
    """The evidence that micro-batches differ in work, once per analysis (the
    straggler detector asks too); None when the run has no micro-batches of two
    peers or fewer than MIN_STEPS complete steps."""
    cached = getattr(ctx, "_workload_signal", False)
    if cached is not False:
        return cached
    per_mb, on_device = microbatch_phases(ctx)
    signal = None
    if not per_mb.empty:
        per_mb = per_mb.assign(work_ms=work_ms(per_mb))
        per_step, wait = equalised_wait(per_mb, "compute_ms")
        work_step, work_wait = equalised_wait(per_mb, "work_ms")
        if len(wait) >= MIN_STEPS:
            rho, p, pairs = phase_comovement(per_mb)
            signal = {
                "per_mb": per_mb,
                "on_device": on_device,
                "per_step": per_step,
                "phases_from": phase_source(ctx.run.events()),
                "work_step": work_step.reindex(per_step.index),
                "slowest": _slowest(per_step),
                "rho": rho,
                "p": p,
                "pairs": pairs,
                "wait_ms": float(wait.mean()),
                "work_wait_ms": float(work_wait.reindex(wait.index).mean()),
                "steps": len(wait),
            }
            signal["varies"] = p <= ALPHA and signal["work_wait_ms"] >= WARNING_FRAC * ctx.step_ms > 0
    ctx._workload_signal = signal  # (an attribute of this analysis' Context: computed once)
    return signal


def _max_share(slowest: pd.Series) -> tuple[float, int, int]:
    """(the largest share of a stage's steps one rank is the slowest in, that rank, its stage)."""
    if slowest.empty:
        return 0.0, -1, -1
    shares = slowest.groupby(level="stage").value_counts(normalize=True)
    stage, rank = shares.idxmax()
    return float(shares.max()), int(rank), int(stage)


def work_explained_frac(signal: dict, rank: int) -> float:
    """Of `rank`'s compute beyond its peers' mean on the steps it was the slowest,
    the share its micro-batches' work explains (their work beyond the peers')."""
    slowest = signal["slowest"]
    keys = slowest.index[slowest == rank]
    if not len(keys):
        return 0.0
    excess = {}
    for name in ("per_step", "work_step"):
        table = signal[name].unstack("rank").loc[keys]  # (stage, step) x rank; a stage's own ranks
        excess[name] = float((table[rank] - table.drop(columns=rank).mean(axis=1)).sum())
    return excess["work_step"] / excess["per_step"] if excess["per_step"] > 0 else 0.0


def explains_slowness(ctx, rank: int) -> bool:
    """Is `rank`'s slowness its micro-batches' work? Yes when the run's lengths vary
    (forward and backward move together) and on the steps it was the slowest its work explains at least
    half (most) of its excess compute. A rank that drew more long micro-batches
    than its peers by chance is slowest in most steps and slow on the median step
    (straggler's persistent path), yet its excess is its work; a slower rank's
    excess is its pace (equal work: nothing explained)."""
    signal = work_signal(ctx)
    return bool(signal and signal["varies"]) and work_explained_frac(signal, rank) >= MOST_FRAC


def detect(ctx):
    signal = work_signal(ctx)
    if not signal or not signal["varies"]:
        return []
    per_mb, slowest = signal["per_mb"], signal["slowest"]
    max_share, worst_rank, worst_stage = _max_share(slowest)
    # (can pass 1 by jitter: the work is at the stage's median speed, the compute at the rank's)
    explained = work_explained_frac(signal, worst_rank)
    turns = int(slowest.nunique())
    # A rank slowest in most steps is a straggler unless its work explains most of
    # its excess: one that drew more long micro-batches than its peers is slowest
    # in most steps by the luck of the draw, not by its speed.
    if (max_share > MAX_SLOWEST_SHARE and explained < MOST_FRAC) or turns < 2:
        return []

    impact_ms = signal["wait_ms"]
    spread, tail = own_spread(per_mb)
    ms = per_mb["compute_ms"]
    p50_ms, p90_ms, max_ms = float(ms.quantile(0.5)), float(ms.quantile(0.9)), float(ms.max())
    ranks = sorted(int(r) for r in per_mb["rank"].unique())
    steps = signal["steps"]
    share_by_rank = slowest.value_counts(normalize=True)
    metrics = {
        "microbatch_p50_ms": p50_ms,
        "microbatch_p90_ms": p90_ms,
        "microbatch_max_ms": max_ms,
        "own_median_p90_over_p50_x": tail,
        "own_median_p50_over_p10_x": spread,
        "phase_rank_corr": signal["rho"],
        "phase_corr_p": signal["p"],
        "phase_pairs": signal["pairs"],
        "work_wait_ms_per_step": signal["work_wait_ms"],
        "slowest_rank_max_share_frac": max_share,
        "slowest_rank_max_share_rank": worst_rank,
        "ranks_taking_turns": turns,
        "slowest_rank_work_explained_frac": explained,
        "equalised_wait_ms_per_step": impact_ms,
        "steps_judged": steps,
        "device_time": float(signal["on_device"]),
        "phases_from": signal["phases_from"],
    }
    for rank in ranks:
        metrics[f"rank{rank}_slowest_frac"] = float(share_by_rank.get(rank, 0.0))
    clock = "on the GPUs' clocks" if signal["on_device"] else "on the hosts' clocks"
    title = (
        f"micro-batches differ in work: forward and backward of each micro-batch grow together "
        f"(rank correlation {signal['rho']:.2f} over {signal['pairs']} micro-batches, p {signal['p']:.1g}); "
        f"compute p50 {p50_ms:.1f} ms, p90 {p90_ms:.1f} ms ({tail:.2f}x), max {max_ms:.1f} ms, and the slowest "
        f"rank changes from step to step ({turns} ranks take turns; rank {worst_rank}, the most often, "
        f"in {max_share:.0%} of {steps} steps, {explained:.0%} of its excess its work): its peers wait {impact_ms:.1f} ms/step for it ({clock})"
    )
    return [
        Finding(
            kind="workload_imbalance",
            title=title,
            ranks=ranks,
            impact_ms_per_step=impact_ms,
            # a pipelined run names the stage whose peers take the most turns; plain DP, none
            stage=int(worst_stage) if per_mb["stage"].nunique() > 1 else None,
            recommendation=(
                "Micro-batches carry unequal work (variable sequence lengths): pack or sort "
                "sequences into token-balanced micro-batches (a fixed token budget per "
                "micro-batch, the same on every data-parallel rank) so that no rank waits "
                "at the gradient all-reduce for another's long batch."
            ),
            metrics=metrics,
        )
    ]
