"""input_stall: the training loop waits for the input pipeline.

Signal: time inside the DataLoader iterator's __next__ as a fraction of the
steady step, per rank. Threshold: >= 10% of the step on a rank (a prefetching
loader should make it ~0); impact is the data wait itself, which the step
would lose if the input were ready. "periodic" when the wait comes in spikes
(the slowest steps wait >= 4x the median step's), the signature of workers
that cannot keep up and drain the prefetch queue; "constant" otherwise, the
signature of loading on the training thread.

On device traces (collectives seen on the device, kernels recorded; the
steady steps the kernels cover) the wait that counts is the
part of it during which no kernel runs (device_idle.device_data_wait): a host
that waits for its input while the device still works through the queue it
was given loses nothing, and a GPU is never "stalled" by a host that is ahead
of it. Same threshold and pattern rule, on that device idle.
"""

import numpy as np

from diagnose.analysis.detectors.finding_record import Finding

STALL_FRAC = 0.10
PERIODIC_SPIKE_X = 4.0
ON_DEVICE_NOTE = " with the GPU idle (on the GPUs' clocks)"


def _num_workers(ctx) -> int | None:
    events = ctx.run.events()
    details = events.loc[events["kind"] == "data", "detail"].astype(str)
    counts = details[details.str.startswith("workers=")].str.slice(8).str.split(" ").str[0]
    counts = counts[counts.str.lstrip("-").str.isdigit()].astype(int)
    return int(counts.mode().iloc[0]) if len(counts) else None


def detect(ctx):
    b = ctx.breakdown
    if b.empty:
        return []
    on_device = bool(ctx.kernel_steady)
    if on_device:
        device = ctx.run.device_data_wait()[["rank", "step", "idle_in_data_wait_ms"]]
        b = b[b["step"].isin(ctx.kernel_steady)].merge(device, on=["rank", "step"], how="left")
        b = b.assign(host_data_wait_ms=b["data_wait_ms"], data_wait_ms=b["idle_in_data_wait_ms"].fillna(0.0))
    per_rank = b.groupby("rank")[["data_wait_ms", "step_ms"]].median()
    if on_device:  # what the host waited, for comparison
        host = b.groupby("rank")[["host_data_wait_ms", "step_ms"]].median()
        host_frac = host["host_data_wait_ms"] / host["step_ms"]
    frac = per_rank["data_wait_ms"] / per_rank["step_ms"]
    stalled = frac[frac >= STALL_FRAC]
    if stalled.empty:
        return []
    ranks = sorted(int(r) for r in stalled.index)
    series = b[b["rank"].isin(ranks)].groupby("step")["data_wait_ms"].median()
    typical = float(np.median(series)) if len(series) else 0.0
    periodic = bool(typical > 0 and series.quantile(0.9) >= PERIODIC_SPIKE_X * typical)
    impact_ms = float(per_rank.loc[ranks, "data_wait_ms"].median())
    workers = _num_workers(ctx)
    if workers == 0:
        advice = (
            "the DataLoader has num_workers=0, so samples load on the training thread: set "
            "num_workers to 2-8 with pin_memory=True and persistent_workers=True"
        )
    elif periodic:
        advice = (
            f"the {workers if workers is not None else ''} workers cannot keep up and the "
            "prefetch queue drains: raise num_workers or prefetch_factor, or make __getitem__ cheaper"
        )
    else:
        advice = (
            "raise num_workers and prefetch_factor, use pin_memory=True, and make "
            "__getitem__ cheaper (decode/augment offline or on the GPU)"
        )
    pattern = "periodic" if periodic else "constant"
    everyone = len(ranks) == len(frac)
    return [
        Finding(
            kind="input_stall",
            ranks=ranks,
            impact_ms_per_step=impact_ms,
            title=(
                f"the input pipeline stalls {float(stalled.median()):.0%} of each step "
                f"({pattern}) on {'all ranks' if everyone else 'ranks ' + ','.join(map(str, ranks))}"
                f"{ON_DEVICE_NOTE if on_device else ''}"
            ),
            recommendation=advice[0].upper() + advice[1:] + ".",
            metrics={
                "data_wait_frac": float(stalled.median()),
                "data_wait_ms_per_step": impact_ms,
                "periodic": float(periodic),
                "num_workers": -1 if workers is None else workers,
                "ranks_affected": len(ranks),
                "device_time": float(on_device),
                **({"host_data_wait_frac": float(host_frac.loc[ranks].median())} if on_device else {}),
            },
        )
    ]
