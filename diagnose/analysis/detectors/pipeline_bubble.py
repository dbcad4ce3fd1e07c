"""pipeline_bubble: pipeline stages sit idle for a large part of the step.

Signal: per pipeline rank, the part of the steady step not spent in forward or
backward compute, against the schedule's theoretical bubble: for a
torch.distributed.pipelining job the idle its own recorded action order implies
(diagnose/analysis/tables/schedule_slots.py: interleaved and zero-bubble orders too),
else (p-1)/(m+p-1) for p stages and m micro-batches. Threshold: the theoretical bubble is >= 20% (too few
micro-batches for the depth). Impact is a what-if at the schedule's theoretical
size: the same work in m' micro-batches (the count that brings theory under
10%) fills and drains the pipeline in (p-1)/m' of the bottleneck stage's busy
time B instead of (p-1)/m, so it saves B (p-1) (1/m - 1/m') per step. It
assumes a micro-batch's compute scales with its size (GPUs past a few thousand
tokens; not tiny CPU micro-batches, whose fixed overhead stays) and that idle
above theory stays (a slow stage, blocking p2p: findings of their own). A
schedule change is not a duration change, so this is arithmetic on measured
busy time, not a replay (diagnose/analysis/replay/whatif.py); severity from impact.
The old estimate (idle above 10%, times the step) is kept as evidence.
A bubble is the pipeline's, not a stage's: the finding names no stage (the
idlest one, `idlest_stage`, is evidence; with every stage idling about as much
it changed with noise, and compare matched findings by stage).
Measured idle far above theory (>= 30 points) with enough
micro-batches is reported as info only: its causes (a slow stage, blocking p2p,
CPU contention between co-located stages) have findings of their own. The
recommendation gives the micro-batch count that brings theory under 10%.

On device traces (collectives seen on the device, kernels recorded; the steady
steps the kernels cover) a stage's forward and backward
return when their kernels are queued, so the host's phases say nothing of the
bubble: a stage is busy while one of its compute kernels runs
(gpu_tables.device_compute) and idle otherwise, including while an NCCL
receive kernel spins waiting for the neighbouring stage. Stages come from the
phases' stage stamps, or from the p2p traffic (pipeline_topology.py): an
import's fused exchanges and device passes (diagnose/importers/
kineto_structure.py) give both; evidence `phases_from` says which phases.
"""

import math

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.inferred_compute import phase_source
from diagnose.analysis.tables.schedule_slots import recorded_schedule_idle_frac

THEORY_GATE_FRAC = 0.2
EXCESS_GATE_FRAC = 0.3
TARGET_FRAC = 0.1
ON_DEVICE_NOTE = "; idle: no compute kernel running, on the GPUs' clocks"


def detect(ctx):
    events = ctx.run.events()
    stages = ctx.run.rank_stages()
    n_stages = len(set(stages.values()))
    if n_stages < 2 or ctx.breakdown.empty:
        return []
    pipeline = ctx.breakdown[ctx.breakdown["rank"].isin(stages)]
    on_device = bool(ctx.kernel_steady)
    if on_device:
        pipeline = pipeline[pipeline["step"].isin(ctx.kernel_steady)].merge(
            ctx.run.device_compute(), on=["rank", "step"], how="left"
        )
        pipeline = pipeline.assign(busy_ms=pipeline["device_compute_ms"].fillna(0.0))
    else:
        pipeline = pipeline.assign(busy_ms=pipeline["forward_ms"] + pipeline["backward_ms"])
    per_rank = pipeline.groupby("rank")[["step_ms", "busy_ms"]].median()
    # the pipeline fills and drains at the pace of its slowest stage
    bottleneck_busy_ms = float(per_rank["busy_ms"].groupby(per_rank.index.map(stages)).median().max())
    idle_frac = (1 - per_rank["busy_ms"] / per_rank["step_ms"]).clip(lower=0.0)
    measured = float(idle_frac.mean())
    phases = events[(events["kind"] == "phase") & (events["microbatch"] >= 0)]
    if phases.empty:  # no phases: module forwards, micro-batches inferred (pipeline_topology.py)
        phases = events[(events["kind"] == "forward") & (events["microbatch"] >= 0)]
    phases = phases[phases["step"].isin(ctx.steady)]
    microbatches = int(phases.groupby(["rank", "step"])["microbatch"].nunique().median()) if len(phases) else 0
    if microbatches <= 0:
        return []
    schedule = _recorded_schedule(ctx.run.rank_meta)
    from_schedule = recorded_schedule_idle_frac(schedule) if schedule else None
    theory = from_schedule if from_schedule is not None else (n_stages - 1) / (microbatches + n_stages - 1)
    theory_of = (
        f"{schedule['schedule']}'s own action order"
        if from_schedule is not None
        else f"{n_stages} stages x {microbatches} micro-batches"
    )
    if theory < THEORY_GATE_FRAC and measured - theory < EXCESS_GATE_FRAC:
        return []
    severity = None if theory >= THEORY_GATE_FRAC else "info"
    needed_m = math.ceil((n_stages - 1) * (1 - TARGET_FRAC) / TARGET_FRAC)
    saving_ms = schedule_saving_ms(bottleneck_busy_ms, n_stages, microbatches, max(needed_m, microbatches))
    worst = int(idle_frac.idxmax())
    stalls = measured - theory >= EXCESS_GATE_FRAC
    recommendation = (
        f"Use at least {needed_m} micro-batches per step for {n_stages} stages "
        f"(now {microbatches}), or an interleaved schedule"
        + (
            "; the measured idle is well above theory, so also check stage balance and point-to-point waits."
            if stalls
            else "."
        )
    )
    return [
        Finding(
            kind="pipeline_bubble",
            severity=severity,
            ranks=sorted(int(r) for r in idle_frac.index),
            stage=None,
            impact_ms_per_step=saving_ms,
            title=(
                f"pipeline stages idle {measured:.0%} of the step (theory for {theory_of}: {theory:.0%})"
                + (ON_DEVICE_NOTE if on_device else "")
            ),
            recommendation=recommendation,
            metrics={
                "bubble_frac": measured,
                "theoretical_bubble_frac": theory,
                "microbatches": microbatches,
                "stages": n_stages,
                "theory_from_schedule": float(from_schedule is not None),
                "microbatches_for_10pct": needed_m,
                "worst_rank_bubble_frac": float(idle_frac.max()),
                "idlest_stage": stages.get(worst),
                "device_time": float(on_device),
                "bottleneck_busy_ms": bottleneck_busy_ms,
                "whatif_saving_ms_per_step": saving_ms,
                "phases_from": phase_source(events),
                "estimate_ms_per_step": max(measured - TARGET_FRAC, 0.0) * ctx.step_ms,
            },
        )
    ]


def _recorded_schedule(rank_meta: dict) -> dict | None:
    """The torch.distributed.pipelining schedule a rank recorded (every pipeline rank
    records the same whole order: the first found)."""
    for meta in rank_meta.values():
        schedule = meta.get("pipeline_schedule")
        if isinstance(schedule, dict):
            return schedule
    return None


def schedule_saving_ms(busy_ms: float, stages: int, microbatches: int, target_microbatches: int) -> float:
    """Per step, the fill and drain time saved by splitting the same work into
    `target_microbatches` (fill + drain = (p - 1) micro-batch times of the slowest stage)."""
    return busy_ms * (stages - 1) * (1.0 / microbatches - 1.0 / target_microbatches)
