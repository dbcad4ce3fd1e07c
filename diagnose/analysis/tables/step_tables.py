"""Step tables derived from the analysis tables: the one home of the step table,
the steady-state steps, per-step summaries, pipeline blocks and bubbles, and the
waiting at collectives per rank and step. The loader, the dashboards and the
MLflow exporter all read them from here.

Pure functions over pandas frames, so they can be tested on synthetic tables.
Times are ns on the run's aligned clock unless the column says otherwise.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.tables import trace_windows

WARMUP_STEPS = 2
PIPELINE_KINDS = ("forward", "backward")


# -- steps -------------------------------------------------------------------
def steps_table(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step); a rank with kernels and no step gets one
    window instead (diagnose/analysis/tables/trace_windows.py), trace_window True."""
    steps = events.loc[events["kind"] == "step", ["rank", "step", "start_ns", "end_ns"]]
    steps = steps.drop_duplicates(["rank", "step"]).assign(**{trace_windows.WINDOW_COLUMN: False})
    windows = trace_windows.windows(events, steps["rank"].unique())
    if len(windows):
        steps = pd.concat([steps, windows.astype(steps.dtypes.to_dict())], ignore_index=True)
    steps = steps.sort_values(["rank", "step"]).reset_index(drop=True)
    steps["dur_ms"] = (steps["end_ns"] - steps["start_ns"]) / 1e6
    return steps


def steady_state_steps(steps: pd.DataFrame, warmup: bool = True) -> list[int]:
    """Steps every rank completed, minus warm-up (the first 2 when there are at
    least 6, else the first one): allocator growth, autotuning and lazy init
    make early steps unrepresentative. warmup=False: the steps are a window
    from the middle of the run (the loader's event budget), none of them warm-up."""
    if steps.empty:
        return []
    n_ranks = steps["rank"].nunique()
    per_step = steps.groupby("step")["rank"].nunique()
    complete = sorted(int(s) for s in per_step[per_step == n_ranks].index)
    if not complete:
        complete = sorted(int(s) for s in per_step.index)
    skip = 0 if not warmup else WARMUP_STEPS if len(complete) >= 6 else min(1, len(complete) - 1)
    return complete[skip:]


def without_profiler_stop_step(steps: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """The steps less a profiler trace's stop artifact: a last step in which no kernel
    was launched, in a trace whose kernels were launched in every other step. A
    profiler used as a context manager, `prof.step()` at the end of each iteration,
    opens one more ProfilerStep that the exit closes at once (HTA's MI250 trace: a
    9.3 ms step, then a 0.05 ms one with no kernel, which was its only steady step).
    A live run's profiler window covers a few steps of many: nothing is dropped."""
    if steps.empty or kernels.empty:
        return steps
    last = int(steps["step"].max())
    launched = set(kernels.loc[kernels["step"] >= 0, "step"].astype(int))
    if last in launched or not launched or launched != set(steps["step"].astype(int)) - {last}:
        return steps
    return steps[steps["step"] != last]


WINDOW_SHIFT_FRAC = 0.10  # a job's step time drifts a few % over a run; 10% is a change of regime


def window_shift(steps: pd.DataFrame, from_step: int) -> str | None:
    """When the event budget analyzes a run's last steps only (from_step on): a
    line when the steps before the window, past warm-up, took a median step time
    more than WINDOW_SHIFT_FRAC off the window's (the step table covers every
    step: the per-rank pass makes it before the cut), else None. A cause
    confined to the earlier steps is then out of the findings' sight."""
    per_step = steps.groupby("step")["dur_ms"].median()
    before = per_step[per_step.index < from_step].iloc[WARMUP_STEPS:]
    window = per_step[per_step.index >= from_step]
    if before.empty or window.empty or not window.median() > 0:
        return None
    before_ms, window_ms = float(before.median()), float(window.median())
    if abs(before_ms / window_ms - 1) <= WINDOW_SHIFT_FRAC:
        return None
    return (
        f"steps {int(before.index[0])}-{from_step - 1}, before the analyzed window, took a median "
        f"{before_ms:.1f} ms per step, the window {window_ms:.1f} ms ({before_ms / window_ms - 1:+.0%}): "
        f"the findings describe the window (--max-events 0 analyzes every step)"
    )


# -- step summaries ----------------------------------------------------------
def step_summary(
    breakdown: pd.DataFrame, steps: pd.DataFrame | None = None, bubbles: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per step: step time p50/max across ranks, fractions of all ranks'
    step time spent in data wait / exposed comm, the pipeline's bubble_frac, and
    the step's end (latest rank) for timestamps."""
    if breakdown is None or breakdown.empty:
        return pd.DataFrame(
            columns=[
                "step",
                "ranks",
                "step_time_p50_ms",
                "step_time_max_ms",
                "data_wait_frac",
                "exposed_comm_frac",
                "end_ns",
            ]
        )
    grouped = breakdown.groupby("step")
    total = grouped["step_ms"].sum().replace(0, np.nan)
    out = pd.DataFrame(
        {
            "ranks": grouped["rank"].nunique(),
            "step_time_p50_ms": grouped["step_ms"].median(),
            "step_time_max_ms": grouped["step_ms"].max(),
            "data_wait_frac": grouped["data_wait_ms"].sum() / total,
            "exposed_comm_frac": grouped["exposed_comm_ms"].sum() / total,
        }
    )
    if bubbles is not None and not bubbles.empty:
        out["bubble_frac"] = bubble_frac(bubbles, by="step").reindex(out.index)
    if steps is not None and not steps.empty:
        out["end_ns"] = steps.groupby("step")["end_ns"].max().reindex(out.index)
    else:
        out["end_ns"] = np.nan
    return out.reset_index().rename(columns={"index": "step"})


def steady(frame: pd.DataFrame, steady_steps) -> pd.DataFrame:
    if frame is None or frame.empty or not steady_steps:
        return frame
    return frame[frame["step"].isin(list(steady_steps))]


# -- waiting -----------------------------------------------------------------
def waits_suffered(arrivals: pd.DataFrame) -> pd.DataFrame:
    """ms each rank spent waiting for the last member to arrive, per step."""
    if arrivals is None or arrivals.empty:
        return pd.DataFrame(columns=["rank", "step", "wait_ms"])
    return arrivals.groupby(["rank", "step"], as_index=False)["wait_ms"].sum()


def waits_caused(arrivals: pd.DataFrame) -> pd.DataFrame:
    """Every instance's total wait (all members) charged to its last arriver, per step."""
    if arrivals is None or arrivals.empty:
        return pd.DataFrame(columns=["rank", "step", "wait_ms"])
    per_instance = arrivals.groupby(["group", "seq"], as_index=False).agg(
        wait_ms=("wait_ms", "sum"), rank=("last_rank", "first")
    )
    last_rows = arrivals[arrivals["rank"] == arrivals["last_rank"]][["group", "seq", "step"]]
    last_rows = last_rows.drop_duplicates(["group", "seq"])
    per_instance = per_instance.merge(last_rows, on=["group", "seq"], how="left")
    per_instance = per_instance.dropna(subset=["step", "rank"])
    per_instance["rank"] = per_instance["rank"].astype(int)
    per_instance["step"] = per_instance["step"].astype(int)
    return per_instance.groupby(["rank", "step"], as_index=False)["wait_ms"].sum()


def arrival_skew(arrivals: pd.DataFrame) -> pd.DataFrame:
    """One row per collective instance: op, group, members, skew = last - first
    arrival (ms), the last rank, and the step."""
    columns = ["name", "group", "seq", "members", "skew_ms", "last_rank", "step"]
    if arrivals is None or arrivals.empty:
        return pd.DataFrame(columns=columns)
    frame = arrivals[arrivals["members"] > 1] if "members" in arrivals.columns else arrivals
    if frame.empty:
        return pd.DataFrame(columns=columns)
    out = frame.groupby(["group", "seq"], as_index=False).agg(
        name=("name", "first"),
        members=("rank", "size"),
        first=("arrival_ns", "min"),
        last=("arrival_ns", "max"),
        last_rank=("last_rank", "first"),
        step=("step", "min"),
    )
    out["skew_ms"] = (out["last"] - out["first"]) / 1e6
    return out[columns]


# -- pipeline ----------------------------------------------------------------
def pipeline_blocks(events: pd.DataFrame) -> pd.DataFrame:
    """Forward/backward blocks of pipeline stages: explicit phases carrying a stage
    (the trainer's `phase("forward", microbatch=m, stage=s)`), else module
    forward/backward events stamped with a stage."""
    columns = ["rank", "stage", "step", "microbatch", "kind", "start_ns", "end_ns"]
    if events is None or events.empty:
        return pd.DataFrame(columns=columns)
    staged = events[events["stage"] >= 0]
    if staged.empty:
        return pd.DataFrame(columns=columns)
    kind, name = staged["kind"].astype(str), staged["name"].astype(str)
    blocks = staged[(kind == "phase") & name.isin(PIPELINE_KINDS)]
    if blocks.empty:
        blocks = staged[kind.isin(PIPELINE_KINDS)]
        block_kind = blocks["kind"].astype(str)
    else:
        block_kind = blocks["name"].astype(str)
    out = pd.DataFrame(
        {
            "rank": blocks["rank"].astype(int),
            "stage": blocks["stage"].astype(int),
            "step": blocks["step"].astype(int),
            "microbatch": blocks["microbatch"].astype(int),
            "kind": block_kind,
            "start_ns": blocks["start_ns"],
            "end_ns": blocks["end_ns"],
        }
    )
    return out.sort_values(["rank", "start_ns"]).reset_index(drop=True)


def bubbles(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): the schedule window (first block start -> last block end),
    the time covered by forward/backward blocks, and the bubble (window - busy)."""
    columns = ["rank", "stage", "step", "window_ms", "busy_ms", "bubble_ms"]
    if blocks is None or blocks.empty:
        return pd.DataFrame(columns=columns)
    frame = blocks.sort_values(["rank", "step", "start_ns"])
    key = [frame["rank"], frame["step"]]
    prev_end = frame.groupby(["rank", "step"])["end_ns"].cummax().groupby(key).shift()
    covered = frame["end_ns"] - np.maximum(frame["start_ns"], prev_end.fillna(frame["start_ns"]))
    frame = frame.assign(covered=covered.clip(lower=0))
    out = frame.groupby(["rank", "step"], as_index=False).agg(
        stage=("stage", "first"), start=("start_ns", "min"), end=("end_ns", "max"), busy=("covered", "sum")
    )
    out["window_ms"] = (out["end"] - out["start"]) / 1e6
    out["busy_ms"] = out["busy"] / 1e6
    out["bubble_ms"] = (out["window_ms"] - out["busy_ms"]).clip(lower=0)
    return out[columns]


def bubble_frac(bubbles: pd.DataFrame, by: str | None = None):
    """The share of the pipeline schedule windows that stages sat idle: total
    bubble / total window, over all rows of `bubbles` (a float, NaN without any
    window) or per `by` group (a Series). The one definition that the report's
    per-stage view, the per-step metric and the run summary use."""
    if by is None:
        window = bubbles["window_ms"].sum()
        return float(bubbles["bubble_ms"].sum() / window) if window else float("nan")
    grouped = bubbles.groupby(by)[["bubble_ms", "window_ms"]].sum()
    return grouped["bubble_ms"] / grouped["window_ms"].replace(0, np.nan)
