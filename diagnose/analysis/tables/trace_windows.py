"""Trace windows: a rank whose trace marks no steps is analysed as one window.

An imported trace need not mark steps: an Nsight capture cut from the middle
of a forward pass, a profile of an inference server, a profiler window that
stopped before its first ProfilerStep. Without steps every per-step table was
empty and the analysis said "no completed steps recorded" over thousands of
kernels. So a rank with GPU kernels and no step row gets one window: a row of
the steps table from its first kernel's start to its last kernel's end,
numbered WINDOW_STEP, with `trace_window` True, and the loader gives that
number to its rows that fall in no step (stamp). Every consumer of steps (the
host and device breakdowns, the device tables, compare, the detectors) then
sees it as it sees a step, without a case of its own.

A window is not a step: it is where the capture began and ended, not an
iteration of the job, so its time is not a step time and no warm-up is cut
from it. The steps table marks it, and compare labels its figures "per window"
(note()). Not a loader warning: a trace without steps is a normal input, not
a part gone missing. A rank with steps never gets a window; a live run records
no kernels, so a run that never completed a step (a hang) gets none.
"""

import pandas as pd

WINDOW_STEP = 0
WINDOW_COLUMN = "trace_window"  # bool in the steps table: the row is a window, not a step


def windows(events: pd.DataFrame, stepped) -> pd.DataFrame:
    """Steps-table rows (rank, step, start_ns, end_ns, trace_window) of one
    window per rank of `events` that has kernel rows and is not in `stepped`
    (the ranks with steps): its first kernel's start to its last one's end."""
    kernels = events.loc[events["kind"] == "kernel", ["rank", "start_ns", "end_ns"]]
    kernels = kernels[~kernels["rank"].isin(list(stepped))]
    if kernels.empty:
        return pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns", WINDOW_COLUMN])
    span = kernels.groupby("rank").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()
    span.insert(1, "step", WINDOW_STEP)
    span[WINDOW_COLUMN] = True
    return span


def window_ranks(steps: pd.DataFrame) -> list[int]:
    """The ranks analysed as a window (the loader's steps table)."""
    if steps.empty or WINDOW_COLUMN not in steps.columns:
        return []
    return sorted(int(r) for r in steps.loc[steps[WINDOW_COLUMN].astype(bool), "rank"].unique())


def stamp(events: pd.DataFrame, steps: pd.DataFrame) -> list[int]:
    """Give the rows of each window rank that fall in no step (all of them)
    the window's number, in place. Returns the window ranks."""
    ranks = window_ranks(steps)
    if not ranks:
        return ranks
    step = events["step"].to_numpy().copy()  # a new column: the loader's come read-only from Arrow
    step[events["rank"].isin(ranks).to_numpy() & (step < 0)] = WINDOW_STEP
    events["step"] = step
    return ranks


def note(ranks: list, total: int) -> str:
    """What a window is, for the output of a run with `ranks` of `total` analysed as windows."""
    who = (
        f"rank {ranks[0]}"
        if len(ranks) == 1
        else ("every rank" if len(ranks) == total else f"ranks {','.join(map(str, ranks))}")
    )
    return (
        f"{who}: the trace marks no steps; analysed as one window per rank, from its first kernel's "
        f"start to its last one's end (step {WINDOW_STEP} in the tables): a window is the capture's "
        "span, not a training step, so its times are not step times"
    )
