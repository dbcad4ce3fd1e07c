"""host_bound: the GPUs wait for their hosts to give them work.

Signal (runs whose kernels carry their launch: imported Kineto and Nsight
traces, `queued_ns` >= 0): per rank and steady step, the device's idle that a
launch ended: time no kernel of the rank runs, up to a kernel that started
within LAUNCH_BOUND_NS of its launch (its queue was empty: it ran as soon as
the host launched it). Less what other findings already name: the idle while
the host waits for data (input_stall's: device_data_wait) and the idle a host
sync caused (hidden_sync's: device_idle_behind_syncs). The job's figure is the
median rank's median step: every rank's GPU waits for its host. One rank whose
host is late while the others' are not is a host-bound straggler (straggler.py).

Why it matters: a GPU-bound job keeps work queued, so a kernel starts when
the one before it ends, long after its launch; a kernel that starts as soon as
it is launched found the GPU idle. Python overhead, many small kernels (each
launch costs the host ~5-20 us), eager-mode dispatch and host work between
launches all show here; CUDA graphs (torch.compile's "reduce-overhead"),
fusion (torch.compile), larger micro-batches and moving host work off the
launching thread are the fixes. Real traces we hold: HTA's nccl_parser_config
rank 61% of the device step, its df_index_resolver rank 44%, TraceLens's B200
vLLM decode window 67%; GPU-bound ones (TraceLens MI300, HTA ns_resolution and
negative_queue_length) 0-0.3%.

Threshold: launch-bound idle >= WARNING_FRAC of the step (the share a warning
needs: below it no fix of this kind is worth a finding). Impact: the what-if
replay with the host's own work between its launches gone in the steady steps,
its data waits kept (what a host that launches at once, CUDA graphs' bound,
saves), where the device replay holds; else the launch-bound idle itself.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.detectors.finding_record import WARNING_FRAC, Finding
from diagnose.analysis.tables.device_idle import idle_before_launches


def launch_bound_idle(kernels: pd.DataFrame, steps: list) -> pd.DataFrame:
    """(rank, step, idle_ms, launches): per rank and step in `steps`, the device idle
    ended by a kernel launched onto an empty queue, and how many such kernels."""
    rows = []
    k = kernels[kernels["step"].isin(steps)]
    for rank, part in k.groupby("rank"):
        start, idle_from, step = idle_before_launches(part)
        # (before the rank's first kernel nothing is idle time of these steps)
        idle = np.clip(start - np.maximum(idle_from, part["start_ns"].min()), 0, None)
        table = pd.DataFrame({"step": step, "idle": idle, "n": 1})
        for s, r in table.groupby("step").sum().iterrows():
            rows.append((int(rank), int(s), float(r["idle"]) / 1e6, int(r["n"])))
    return pd.DataFrame(rows, columns=["rank", "step", "idle_ms", "launches"])


def _named_elsewhere(ctx) -> pd.Series:
    """(rank, step) -> device idle ms input_stall and hidden_sync already count."""
    parts = []
    data = ctx.run.device_data_wait()
    if len(data):
        parts.append(data.set_index(["rank", "step"])["idle_in_data_wait_ms"])
    syncs = ctx.run.device_idle_behind_syncs()
    if len(syncs):
        parts.append(syncs.groupby(["rank", "step"])["idle_caused_ms"].sum())
    if not parts:
        return pd.Series(dtype=float)
    return pd.concat(parts).groupby(level=[0, 1]).sum()


def detect(ctx):
    kernels = ctx.run.kernels()
    steps = ctx.kernel_covered
    if kernels.empty or not steps or not ctx.step_ms or not (kernels["queued_ns"] >= 0).any():
        return []
    idle = launch_bound_idle(kernels, steps)
    if idle.empty:
        return []
    elsewhere = _named_elsewhere(ctx).reindex(pd.MultiIndex.from_frame(idle[["rank", "step"]])).fillna(0.0)
    idle = idle.assign(own_ms=np.maximum(idle["idle_ms"].to_numpy() - elsewhere.to_numpy(), 0.0))
    per_rank = idle.groupby("rank").agg(own_ms=("own_ms", "median"), launches=("launches", "median"))
    job_ms = float(per_rank["own_ms"].median())
    if job_ms < WARNING_FRAC * ctx.step_ms:
        return []
    ranks = sorted(int(r) for r in per_rank.index[per_rank["own_ms"] >= WARNING_FRAC * ctx.step_ms])
    frac = job_ms / ctx.step_ms
    launches = int(per_rank["launches"].median())
    return [
        Finding(
            kind="host_bound",
            ranks=ranks,
            impact_ms_per_step=job_ms,
            title=(
                f"the GPUs wait for their hosts {frac:.0%} of the step ({job_ms:.1f} ms, median rank): "
                f"{launches} kernels a step start as soon as they are launched, onto an idle GPU"
            ),
            recommendation=(
                "The host launches too slowly for its GPU: capture the steady step in a CUDA graph "
                "(torch.compile(mode='reduce-overhead'), torch.cuda.graphs), fuse small kernels "
                "(torch.compile), raise the work per launch (larger micro-batches), and move host work "
                "(logging, Python bookkeeping) off the launching thread. Profile the host to see what it does."
            ),
            metrics={
                "launch_bound_idle_ms_per_step": job_ms,
                "launch_bound_idle_frac": frac,
                "launches_onto_idle_gpu_per_step": launches,
                "ranks_host_bound": len(ranks),
                "ranks_seen": int(len(per_rank)),
            },
        )
    ]
