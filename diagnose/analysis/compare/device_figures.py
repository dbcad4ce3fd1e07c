"""A run's GPU figures per analysed step (or trace window), for `diagnose compare`.

The host breakdown says little of an imported trace: its collectives are NCCL
kernels (device time, not the host's), and a capture without step markers
has no forward or backward ranges, so compare's parts read "other" on both
sides of a change that moved 46 ms of kernel time. These are the figures the
device shows, per step, summed over the ranks (the devices), over the steady
steps every rank has kernels in (device_collectives.kernel_steps; a window
is one such step):

    kernel_ms          GPU kernel time: the kernels' durations added up
                       (memory copies and sets are not kernels: memory_ms)
    comm_ms            communication kernels' time (union per rank)
    exposed_comm_ms    of that, the time no compute kernel on the same device
                       overlaps (gpu_tables.device_exposed_comm)
    memory_ms          memcpy and memset durations added up
    kernels            {kernel family: ms}: durations added up per family

A kernel family is the kernel's name without its return type, namespaces,
template arguments and parameters ("void flash::flash_fwd_kernel<Traits...>
(Flash_fwd_params)" -> "flash_fwd_kernel"): one templated kernel has many
instantiations, and a change of tile size must not read as one kernel gone
and another come.
"""

import re

import pandas as pd

from collectors.schema import MEMORY
from diagnose.analysis.tables.device_collectives import kernel_steps

FIGURES = ("kernel_ms", "comm_ms", "exposed_comm_ms", "memory_ms")
LABELS = {
    "kernel_ms": "GPU kernel time",
    "comm_ms": "communication kernels",
    "exposed_comm_ms": "exposed communication (no compute overlaps)",
    "memory_ms": "memory copies and sets",
}
TOP_KERNELS = 8  # the families whose time changed most, in compare
_NAMESPACE_MARKS = re.compile(r"<unnamed>|\(anonymous namespace\)")


def kernel_family(name: str) -> str:
    """The family of a (demangled) kernel name; the name itself where it has no parts to drop."""
    text = _NAMESPACE_MARKS.sub("anon", name.strip())
    cut = min((i for i in (text.find("<"), text.find("(")) if i > 0), default=len(text))
    head = text[:cut].split()
    return head[-1].rsplit("::", 1)[-1] if head else name


def device_figures(run, steps=None) -> dict | None:
    """FIGURES and kernels per step over `steps` (default: the steady steps),
    summed over ranks; None for a run without kernels in every rank's steps
    (a live run)."""
    steps = kernel_steps(run, list(run.steady_steps() if steps is None else steps))
    if not steps:
        return None
    kernels = run.kernels()
    kernels = kernels[kernels["step"].isin(steps)]
    memory = (kernels["kind"] == MEMORY).to_numpy()
    launched = kernels[~memory]
    exposed = run.device_exposed_comm()
    exposed = exposed[exposed["step"].isin(steps)]
    per_family = launched.groupby(launched["name"].astype(str).map(kernel_family))["dur_ms"].sum()
    n = len(steps)
    return {
        "steps": steps,
        "kernel_ms": float(launched["dur_ms"].sum()) / n,
        "comm_ms": float(exposed["comm_ms"].sum()) / n,
        "exposed_comm_ms": float(exposed["exposed_comm_ms"].sum()) / n,
        "memory_ms": float(kernels.loc[memory, "dur_ms"].sum()) / n,
        "kernels": {str(k): float(v) / n for k, v in per_family.items()},
    }


def compare_figures(a: dict | None, b: dict | None) -> dict | None:
    """Rows of FIGURES (a_ms, b_ms, delta_ms) and the TOP_KERNELS families by
    the size of their change; None unless both runs have device figures."""
    if a is None or b is None:
        return None
    rows = [{"figure": f, "label": LABELS[f], "a_ms": a[f], "b_ms": b[f], "delta_ms": b[f] - a[f]} for f in FIGURES]
    families = pd.DataFrame(
        {"a_ms": pd.Series(a["kernels"], dtype=float), "b_ms": pd.Series(b["kernels"], dtype=float)}
    ).fillna(0.0)
    families["delta_ms"] = families["b_ms"] - families["a_ms"]
    top = families.reindex(families["delta_ms"].abs().sort_values(ascending=False, kind="stable").index)
    kernels = [
        {"family": str(k), "a_ms": float(r.a_ms), "b_ms": float(r.b_ms), "delta_ms": float(r.delta_ms)}
        for k, r in top.head(TOP_KERNELS).iterrows()
    ]
    return {"figures": rows, "kernels": kernels}
