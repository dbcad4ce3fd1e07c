"""Time each rank's training thread waited for a CPU core, per step: the
`queued_ns` of its compute rows (Linux's run delay over the span,
collectors/core_wait.py), summed per (rank, step).

Why: on a host with more busy threads than cores, a compute phase's wall time
is its work plus its wait for a core, and which rank waits depends on its
neighbours (another job, data-loader workers, the other ranks of the host).
The straggler detector judges a rank by its work, and names a rank that is late
because it waited for a core for that ("cpu contention").

Which rows: the explicit phases named forward, backward and optimizer where a
rank has them (collectors.phase), else the zero-code forward, backward and
optimizer rows: a job with both records one span twice. Rows without a reading
(-1: not Linux, an older run dir, an imported trace) count nothing; a rank with
no reading at all is absent from the table.
"""

import pandas as pd

COMPUTE_NAMES = ("forward", "backward", "optimizer")
COLUMNS = ["rank", "step", "core_wait_ms"]


def core_wait_per_step(events: pd.DataFrame) -> pd.DataFrame:
    """(rank, step, core_wait_ms) of the ranks with run-delay readings."""
    if "queued_ns" not in events.columns or events.empty:
        return pd.DataFrame(columns=COLUMNS)
    kind = events["kind"]
    read = (events["queued_ns"] >= 0) & (events["step"] >= 0)
    zero_code = read & kind.isin(COMPUTE_NAMES)
    phases = read & (kind == "phase") & events["name"].isin(COMPUTE_NAMES)
    if not (zero_code.any() or phases.any()):
        return pd.DataFrame(columns=COLUMNS)
    with_phases = events.loc[phases, "rank"].unique()
    rows = events.loc[phases | (zero_code & ~events["rank"].isin(with_phases)), ["rank", "step", "queued_ns"]]
    table = rows.groupby(["rank", "step"], as_index=False)["queued_ns"].sum()
    return pd.DataFrame(
        {"rank": table["rank"], "step": table["step"], "core_wait_ms": table["queued_ns"].to_numpy() / 1e6}
    )
