"""memory_imbalance: peak memory differs widely across ranks (or stages).

Signal: per rank, the peak of the recorded memory samples (GPU memory used from
NVML when present, else host RSS). Threshold: max/median >= 1.3 and >= 256 MB
apart is a warning (the fullest rank limits batch size and risks OOM for all),
>= 1.6 critical; memory costs no time, so severity is set here, not from impact.
"""
from diagnose.analysis.detectors.run_structure import rank_stages
from diagnose.analysis.findings import Finding

RATIO_WARNING, RATIO_CRITICAL, MIN_GAP_MB = 1.3, 1.6, 256.0
METRICS = ("gpu_mem_used_mb", "rss_mb")


def detect(ctx):
    samples = ctx.run.samples()
    if samples.empty:
        return []
    metric = next((m for m in METRICS if (samples["metric"] == m).any()), None)
    if metric is None:
        return []
    peaks = samples[samples["metric"] == metric].groupby("rank")["value"].max()
    if len(peaks) < 2:
        return []
    median, top = float(peaks.median()), int(peaks.idxmax())
    ratio = float(peaks.max() / median) if median > 0 else 1.0
    if ratio < RATIO_WARNING or peaks.max() - median < MIN_GAP_MB:
        return []
    stage = rank_stages(ctx.run.events()).get(top)
    where = "GPU memory" if metric.startswith("gpu") else "host memory (RSS)"
    return [Finding(
        kind="memory_imbalance", ranks=[top], stage=stage,
        severity="critical" if ratio >= RATIO_CRITICAL else "warning",
        title=f"rank {top} peaks at {peaks.max():.0f} MB of {where}, {ratio:.2f}x the median rank",
        recommendation=("Balance what each rank holds: shard optimizer state (ZeRO), move layers off "
                        "the fullest pipeline stage, or use activation checkpointing there."),
        metrics={"peak_mb": float(peaks.max()), "median_peak_mb": median, "peak_ratio_x": ratio})]
