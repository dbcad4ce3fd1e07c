"""Step table and the choice of steady-state steps."""
import pandas as pd

WARMUP_STEPS = 2


def steps_table(events: pd.DataFrame) -> pd.DataFrame:
    steps = events.loc[events["kind"] == "step", ["rank", "step", "start_ns", "end_ns"]]
    steps = steps.drop_duplicates(["rank", "step"]).sort_values(["rank", "step"])
    steps = steps.reset_index(drop=True)
    steps["dur_ms"] = (steps["end_ns"] - steps["start_ns"]) / 1e6
    return steps


def steady_state_steps(steps: pd.DataFrame) -> list[int]:
    """Steps every rank completed, minus warm-up (the first 2 when there are at
    least 6, else the first one): allocator growth, autotuning and lazy init
    make early steps unrepresentative."""
    if steps.empty:
        return []
    n_ranks = steps["rank"].nunique()
    per_step = steps.groupby("step")["rank"].nunique()
    complete = sorted(int(s) for s in per_step[per_step == n_ranks].index)
    if not complete:
        complete = sorted(int(s) for s in per_step.index)
    skip = WARMUP_STEPS if len(complete) >= 6 else min(1, len(complete) - 1)
    return complete[skip:]
