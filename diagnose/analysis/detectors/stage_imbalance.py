"""stage_imbalance: one pipeline stage computes more per micro-batch than the rest.

Signal: forward+backward time per micro-batch, per rank (median over steady
steps and micro-batches); a stage's cost is its fastest rank's, so that one
straggling data-parallel replica reads as a straggler, not as a heavy stage. A pipeline runs at the pace of
its slowest stage, so the cost is about (m + p - 1) x (max - mean) per step.
Threshold: max/mean >= 1.2 (below that, run-to-run noise and the last stage's
loss head dominate) and impact >= 3% of the step for a warning. When layer
counts are known (--layers-per-stage, or --layers split evenly), the finding
proposes the layer move that minimises the slowest stage.

Without phases, the forward/backward rows are read: recorded, inferred from
host gaps (inferred_compute.py), or, on an imported GPU trace, the device spans
of the passes its kernels show (diagnose/importers/kineto_structure.py: main
thread forward, autograd thread backward, split at p2p exchanges), so that a
micro-batch's compute is device time. Evidence `phases_from` says which.
"""

import pandas as pd

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.detectors.run_structure import layers_per_stage
from diagnose.analysis.tables.inferred_compute import phase_source

IMBALANCE_RATIO = 1.2


def compute_per_microbatch(ctx) -> pd.DataFrame:
    """rank, stage, microbatch_ms: median forward+backward per micro-batch."""
    # Rows are picked on the categorical columns before anything is copied:
    # the events table of 1,024 ranks is ~10^7 rows.
    events = ctx.run.events()
    passes = events["name"].isin(["forward", "backward"]) & (events["kind"] == "phase")
    if not passes.any():
        passes = events["kind"].isin(["forward", "backward"])
    passes &= (events["stage"] >= 0) & (events["microbatch"] >= 0) & events["step"].isin(ctx.steady)
    phases = events.loc[passes, ["rank", "stage", "step", "microbatch", "start_ns", "end_ns"]]
    if phases.empty:
        return pd.DataFrame(columns=["rank", "stage", "microbatch_ms", "microbatches"])
    phases = phases.assign(dur_ms=(phases["end_ns"] - phases["start_ns"]) / 1e6)
    per_mb = phases.groupby(["rank", "stage", "step", "microbatch"])["dur_ms"].sum().reset_index()
    per_rank = (
        per_mb.groupby(["rank", "stage"])
        .agg(microbatch_ms=("dur_ms", "median"), microbatches=("microbatch", "nunique"))
        .reset_index()
    )
    return per_rank


def best_layer_move(layers: list, stage_ms: dict):
    """(k, src, dst, new_layers) moving k layers off the slowest stage, or None."""
    slow = max(stage_ms, key=stage_ms.get)
    fast = min(stage_ms, key=stage_ms.get)
    if slow == fast or layers[slow] <= 1:
        return None
    per_layer_ms = stage_ms[slow] / layers[slow]
    best, best_max = None, max(stage_ms.values())
    for k in range(1, layers[slow]):
        new_ms = dict(stage_ms)
        new_ms[slow] -= k * per_layer_ms
        new_ms[fast] += k * per_layer_ms
        if max(new_ms.values()) < best_max - 1e-9:
            best, best_max = k, max(new_ms.values())
    if best is None:
        return None
    new_layers = list(layers)
    new_layers[slow] -= best
    new_layers[fast] += best
    return best, slow, fast, new_layers


def detect(ctx):
    per_rank = compute_per_microbatch(ctx)
    if per_rank.empty or per_rank["stage"].nunique() < 2:
        return []
    stage_ms = per_rank.groupby("stage")["microbatch_ms"].min()
    mean_ms, max_ms = float(stage_ms.mean()), float(stage_ms.max())
    ratio = max_ms / mean_ms if mean_ms > 0 else 1.0
    if ratio < IMBALANCE_RATIO:
        return []
    bottleneck = int(stage_ms.idxmax())
    n_stages = int(per_rank["stage"].nunique())
    microbatches = int(per_rank["microbatches"].max())
    impact_ms = min((microbatches + n_stages - 1) * (max_ms - mean_ms), ctx.step_ms * (1 - 1 / ratio))
    recommendation = (
        f"Stage {bottleneck} sets the pipeline's pace: move work off it "
        "(fewer layers there, or a cheaper loss/head placement)."
    )
    metrics = {
        "imbalance_max_over_mean_x": ratio,
        "bottleneck_microbatch_ms": max_ms,
        "mean_stage_microbatch_ms": mean_ms,
        "phases_from": phase_source(ctx.run.events()),
    }
    for stage, ms in stage_ms.items():
        metrics[f"stage{int(stage)}_microbatch_ms"] = float(ms)
    layers = layers_per_stage(ctx.run.manifest, n_stages)
    if layers:
        move = best_layer_move(layers, {int(s): float(v) for s, v in stage_ms.items()})
        if move:
            k, src, dst, new_layers = move
            recommendation = (
                f"Move {k} layer{'s' if k > 1 else ''} from stage {src} to stage {dst}: "
                f"--layers-per-stage {','.join(map(str, new_layers))}."
            )
            metrics["layers_to_move"] = k
    ranks = per_rank.loc[per_rank["stage"] == bottleneck, "rank"].tolist()
    return [
        Finding(
            kind="stage_imbalance",
            stage=bottleneck,
            ranks=ranks,
            impact_ms_per_step=impact_ms,
            title=(
                f"pipeline stage {bottleneck} computes {ratio:.2f}x the mean stage per micro-batch "
                f"({max_ms:.1f} vs {mean_ms:.1f} ms)"
            ),
            recommendation=recommendation,
            metrics=metrics,
        )
    ]
