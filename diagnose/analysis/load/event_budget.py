"""The analysis' event budget: the cross-rank pass holds every event it analyzes
(~240 B each at its peak, bench/results/2026-12-05-engines-scale.md), so a run
whose events would pass `max_events` is analyzed over its last steps only, as
many as fit and at least MIN_WINDOW_STEPS (docs/large-runs.md, "The event
budget"). The last steps, not the first: warm-up is at the start, and a hang or
a slowdown that grows shows at the end. Events outside any step (step -1) are
always kept; a run without step markers is never cut.
"""

import random

from diagnose import rundir
from diagnose.rundir import rank_reader

MAX_EVENTS = 25_000_000  # ~6 GB at the cross-rank pass' peak
MIN_WINDOW_STEPS = 8  # fewer steps say little about a step's usual shape
SIZING_RANKS = 8  # read to size the run (a half of the ranks missed by all 8: 1 in 256)


def window(ranks_todo: list, max_events: int | None) -> dict | None:
    """{"from_step", "last_step", "estimated_events", "message"} when the run's
    events would pass max_events (None: MAX_EVENTS; 0: no budget), else None."""
    size = _size(ranks_todo, max_events)
    if size is None:
        return None
    _, _, last, estimate, keep, _ = size
    from_step = last - keep + 1
    return {
        "from_step": from_step,
        "last_step": last,
        "estimated_events": estimate,
        "message": _over_budget(size) + f"analyzing the last {keep} steps ({from_step}-{last}) only",
    }


def windows(ranks_todo: list, max_events: int | None) -> tuple[list, str] | None:
    """([(first step, last step), ...], message): the run's steps cut into as few
    windows of near-equal length as fit the budget (diagnose analyze --every-step), in
    step order; None when the run fits it whole."""
    size = _size(ranks_todo, max_events)
    if size is None:
        return None
    _, first, last, _, keep, _ = size
    count = -(-(last - first + 1) // keep)
    bounds = [first + (last - first + 1) * i // count for i in range(count + 1)]
    spans = [(a, b - 1) for a, b in zip(bounds[:-1], bounds[1:])]
    return spans, (
        _over_budget(size)
        + f"analyzing it in {count} windows of steps, one after the other ("
        + ", ".join(f"{a}-{b}" for a, b in spans)
        + ")"
    )


def step_windows(*run_dirs, max_events=None) -> tuple[list, str] | None:
    """windows() of a run given by its directories (one per node)."""
    todo, _ = rundir.rank_folders([rundir.require_run_dir(str(d)) for d in run_dirs])
    return windows([item for item in todo if not isinstance(item, str)], max_events)


def _over_budget(size: tuple) -> str:
    """The start of the line that says a run is over the budget (_size's tuple)."""
    ranks, first, last, estimate, _, max_events = size
    return (
        f"{ranks} ranks x {last - first + 1} steps is ~{estimate:,} events, over the analysis' "
        f"budget of {max_events:,} (--max-events): "
    )


def _size(ranks_todo: list, max_events: int | None) -> tuple | None:
    """(ranks, first step, last step, estimated events, steps per window, budget) of a
    run over the budget, else None. Sized from SIZING_RANKS ranks drawn
    at random (their events read once more here, bad parts left for the pass to say),
    the most rows per step of them: ranks of different pipeline stages record
    different rows per step, and evenly spaced ranks can all fall on one stage
    (16,384 ranks as dp x pp4 x tp8: every 2,048th rank is a stage-0 rank).
    Seeded: the same run is always cut at the same steps."""
    max_events = MAX_EVENTS if max_events is None else max_events
    if not max_events or not ranks_todo:
        return None
    sampled = random.Random(0).sample(range(len(ranks_todo)), min(SIZING_RANKS, len(ranks_todo)))
    per_step = outside = 0.0
    first, last = None, None
    for index in sorted(sampled):
        events = rank_reader.read_events(ranks_todo[index][1], lambda message: None)
        if events is None:
            continue
        steps = events.column("step").to_numpy()
        in_steps = steps[steps >= 0]
        if not len(in_steps):
            continue
        low, high = int(in_steps.min()), int(in_steps.max())
        first = low if first is None else min(first, low)
        last = high if last is None else max(last, high)
        per_step = max(per_step, len(in_steps) / (high - low + 1))
        outside = max(outside, float(len(steps) - len(in_steps)))
    if first is None:  # no step markers: nothing to cut by
        return None
    ranks = len(ranks_todo)
    estimate = int(ranks * (per_step * (last - first + 1) + outside))
    if estimate <= max_events:
        return None
    keep = max(MIN_WINDOW_STEPS, int((max_events - ranks * outside) // (ranks * per_step)))
    if keep >= last - first + 1:
        return None
    return ranks, first, last, estimate, keep, max_events
