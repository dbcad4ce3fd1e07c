"""What a finding is worth per day of this job, in GPU-hours (and money).

    gpu_hours_per_day = impact_ms_per_step / step_ms x 24 h x world_size

the share of each step the fix saves, of every GPU of the job, over a day at
this step time. Synchronous training makes a step the job's: time the fix takes
off the critical path is time every rank stops waiting, so the world size
multiplies it (a straggler's 10 ms of a 100 ms step on 1,024 GPUs is 2,458
GPU-hours a day). It assumes the job runs all day at the measured step time;
for a shorter job scale by its hours / 24. With DIAGNOSE_GPU_HOUR_COST (or
`diagnose analyze --gpu-hour-cost`) set, the same in money per day.
"""

import os

COST_ENV = "DIAGNOSE_GPU_HOUR_COST"
HOURS_PER_DAY = 24.0


def gpu_hours_per_day(impact_ms: float, step_ms: float, world_size: int) -> float | None:
    if not step_ms or step_ms <= 0 or impact_ms is None or impact_ms != impact_ms or world_size <= 0:
        return None
    return max(float(impact_ms), 0.0) / step_ms * HOURS_PER_DAY * world_size


def gpu_hour_cost(environ=os.environ) -> float | None:
    """The price of one GPU-hour the user gave, or None."""
    text = environ.get(COST_ENV, "").strip()
    if not text:
        return None
    try:
        cost = float(text)
    except ValueError:
        return None
    return cost if cost > 0 and cost == cost and cost != float("inf") else None


def worth_line(findings: list, cost: float | None = None) -> str | None:
    """ "Worth most: straggler (rank 2), 12.3 GPU-hours/day ($30.75/day at $2.50/GPU-hour)"."""
    worth = [f for f in findings if (f.get("metrics") or {}).get("gpu_hours_per_day")]
    if not worth:
        return None
    top = max(worth, key=lambda f: f["metrics"]["gpu_hours_per_day"])
    hours = float(top["metrics"]["gpu_hours_per_day"])
    ranks = top.get("ranks") or []
    who = f" (rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))})" if 0 < len(ranks) <= 8 else ""
    money = f" (${hours * cost:,.2f}/day at ${cost:,.2f}/GPU-hour)" if cost else ""
    return f"Worth most: {top['kind']}{who}, {hours:,.1f} GPU-hours/day of this job{money}"
