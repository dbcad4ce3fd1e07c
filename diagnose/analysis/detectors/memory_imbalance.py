"""memory_imbalance: peak memory differs widely across ranks (or stages).

Signal: per rank, the peak of the recorded memory samples: device memory used
(NVML's `mem_used_mb`, the name nvml_sampler writes) when any rank has it, else
host RSS (`rss_mb`), and then the title says so and the metrics are named
`peak_rss_mb`, never passed off as GPU memory. Threshold: max/median >= 1.3 and
>= 256 MB apart is a warning (the fullest rank limits batch size and risks OOM
for all), >= 1.6 critical; memory costs no time, so severity is set here, not
from impact. No callsite: 1 Hz samples of memory held say how much, not which
line allocated it (and NVML counts the caching allocator's reserve, which only
grows).
"""

from collectors.instrument.gpu_common import GPU_MEM_USED_MB
from diagnose.analysis.detectors.finding_record import Finding

RATIO_WARNING, RATIO_CRITICAL, MIN_GAP_MB = 1.3, 1.6, 256.0
HOST_RSS_MB = "rss_mb"  # collectors/instrument/host_sampler.py
# (metric, what the title calls it, prefix of the finding's metric names)
SOURCES = (
    (GPU_MEM_USED_MB, "GPU memory (NVML)", "peak_device_mem_mb"),
    (HOST_RSS_MB, "host memory (RSS; no NVML device memory was recorded)", "peak_rss_mb"),
)


def detect(ctx):
    samples = ctx.run.samples()
    if samples.empty:
        return []
    source = next((s for s in SOURCES if (samples["metric"] == s[0]).any()), None)
    if source is None:
        return []
    metric, where, name = source
    peaks = samples[samples["metric"] == metric].groupby("rank")["value"].max()
    if len(peaks) < 2:
        return []
    median, top = float(peaks.median()), int(peaks.idxmax())
    ratio = float(peaks.max() / median) if median > 0 else 1.0
    if ratio < RATIO_WARNING or peaks.max() - median < MIN_GAP_MB:
        return []
    stage = ctx.run.rank_stages().get(top)
    return [
        Finding(
            kind="memory_imbalance",
            ranks=[top],
            stage=stage,
            severity="critical" if ratio >= RATIO_CRITICAL else "warning",
            title=f"rank {top} peaks at {peaks.max():.0f} MB of {where} [{metric}], {ratio:.2f}x the median rank",
            recommendation=(
                "Balance what each rank holds: shard optimizer state (ZeRO), move layers off "
                "the fullest pipeline stage, or use activation checkpointing there."
            ),
            # metrics are numbers only (findings.json), so the source is in their names
            metrics={name: float(peaks.max()), f"median_{name}": median, "peak_ratio_x": ratio},
        )
    ]
