"""FSDP2 communication per unit: for each unit (rows whose detail is
`fsdp:<unit>`, collectors/instrument/fsdp2.py) and collective kind, the ms per
steady step the training thread was blocked in it (exposed: the call, and an
async one's wait) and the ms it was in flight while the thread
worked on (overlapped: from the call's return to its wait, which is what FSDP2's
prefetching buys), the median over ranks. On gloo a collective's completion is
seen at its wait, so overlapped time is the in-flight time before the wait, an
upper bound of the transfer hidden behind compute.
"""

import pandas as pd

FSDP_PREFIX = "fsdp:"
COLUMNS = ["unit", "op", "exposed_ms_per_step", "overlapped_ms_per_step", "overlapped_frac"]


def fsdp_unit_comm(calls: pd.DataFrame, steady: list) -> pd.DataFrame:
    """unit, op, exposed_ms_per_step, overlapped_ms_per_step, overlapped_frac (of
    exposed + overlapped); sorted by exposed time, the most exposed first; empty
    when the job has no FSDP2 rows in its steady steps."""
    calls = calls[calls["detail"].str.startswith(FSDP_PREFIX, na=False) & calls["step"].isin(steady)]
    if calls.empty or not steady:
        return pd.DataFrame(columns=COLUMNS)
    waited = calls["wait_start_ns"].notna()
    issuing = (calls["return_ns"] - calls["issue_ns"]).fillna(0).clip(lower=0)
    waiting = (calls["wait_end_ns"] - calls["wait_start_ns"]).where(waited, 0).fillna(0).clip(lower=0)
    exposed = (issuing + waiting) / 1e6
    overlapped = (calls["wait_start_ns"] - calls["return_ns"]).where(waited, 0).fillna(0).clip(lower=0) / 1e6
    # op as plain strings, as unit: a small table that dashboards and findings read
    table = pd.DataFrame(
        {
            "unit": calls["detail"].astype(str).str[len(FSDP_PREFIX) :],
            "op": calls["name"].astype(str),
            "rank": calls["rank"],
            "exposed": exposed,
            "overlapped": overlapped,
        }
    )
    per_rank = table.groupby(["unit", "op", "rank"])[["exposed", "overlapped"]].sum() / len(steady)
    out = (
        per_rank.groupby(level=[0, 1])
        .median()
        .reset_index()
        .rename(columns={"exposed": "exposed_ms_per_step", "overlapped": "overlapped_ms_per_step"})
    )
    total = out["exposed_ms_per_step"] + out["overlapped_ms_per_step"]
    out["overlapped_frac"] = (out["overlapped_ms_per_step"] / total.where(total > 0)).fillna(0.0)
    return out.sort_values("exposed_ms_per_step", ascending=False, kind="stable").reset_index(drop=True)[COLUMNS]
