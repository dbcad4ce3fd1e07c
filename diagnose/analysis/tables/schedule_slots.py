"""The idle a pipeline schedule implies by itself: its per-rank action order
(torch.distributed.pipelining's `pipeline_order`, recorded into meta.json by
collectors/instrument/pipelining.py) played with unit costs.

Each pp rank runs its actions in their order; an action starts when its rank
is free and its inputs are ready: a stage's forward of micro-batch i after the
previous stage's forward of i; a backward (full "B", or the input half "I")
after the next stage's backward of i and its own forward of i; the weight half
"W" after its own "I". Costs: F 1, B 2, I 1, W 1 (a backward is about twice a
forward; zero-bubble splits it in two halves). Send/receive, unshard and
reduce actions cost nothing here. A rank's idle is the makespan minus its busy
time, over the makespan; the schedule's bubble is the mean over ranks. For
1F1B and GPipe with p stages and m micro-batches this is (p - 1) / (m + p - 1);
interleaved and zero-bubble orders give their own, smaller, figure.

An order that does not run every stage's forward and backward of every
micro-batch exactly once is not what the schedule executes (torch 2.13's
Schedule1F1B writes rank 1's as 1F1 1B0 1F2 1B1 for 2 micro-batches; its
single-stage schedules run from their own loop, not from that order): for
ScheduleGPipe and Schedule1F1B the order their loop runs is played instead
(`canonical_order`), otherwise there is no figure.
"""

import re

COST = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")


def _compute_actions(text: str) -> list[tuple[int, str, int]]:
    """'0F1' -> [(0, 'F', 1)]; '(0F1;1B0)OVERLAP_F_B' -> both; anything else -> []."""
    if text.startswith("("):
        inner = text[1 : text.index(")")]
        return [a for part in inner.split(";") for a in _compute_actions(part)]
    m = _ACTION.match(text)
    return [(int(m.group(1)), m.group(2), int(m.group(3)))] if m else []


def _inputs(action, last_stage: int, present) -> list:
    stage, kind, mb = action
    if kind == "F":
        return [(stage - 1, "F", mb)] if stage > 0 else []
    if kind == "W":
        return [(stage, "I", mb)]
    needs = [(stage, "F", mb)]
    if stage < last_stage:
        needs += [a for a in ((stage + 1, "B", mb), (stage + 1, "I", mb)) if a in present]
    return needs


def _complete(lanes: dict, microbatches: int) -> bool:
    """Every stage's forward and backward (B or I) of every micro-batch, once each."""
    actions = [a for lane in lanes.values() for a in lane]
    stages = {a[0] for a in actions}
    if not actions:
        return False
    for kind in ("F", "B|I"):
        done = sorted((a[0], a[2]) for a in actions if a[1] in kind.split("|"))
        if done != sorted((s, mb) for s in stages for mb in range(microbatches)):
            return False
    return True


def canonical_order(schedule: str, stages: int, microbatches: int) -> dict | None:
    """The order torch's single-stage schedules run (one stage per rank): GPipe all
    forwards then all backwards; 1F1B min(m, p - 1 - rank) warm-up forwards, then
    one forward one backward, then the remaining backwards."""
    p, m = stages, microbatches
    order = {}
    for rank in range(p):
        if schedule == "ScheduleGPipe":
            order[str(rank)] = [f"{rank}F{i}" for i in range(m)] + [f"{rank}B{i}" for i in range(m)]
        elif schedule == "Schedule1F1B":
            warm = min(m, p - 1 - rank)
            actions = [f"{rank}F{i}" for i in range(warm)]
            for i in range(m - warm):
                actions += [f"{rank}F{warm + i}", f"{rank}B{i}"]
            order[str(rank)] = actions + [f"{rank}B{i}" for i in range(m - warm, m)]
        else:
            return None
    return order


def recorded_schedule_idle_frac(recorded: dict) -> float | None:
    """The bubble of a schedule as collectors/instrument/pipelining.py recorded it
    ({schedule, microbatches, order}); None when it cannot be known."""
    order, m = recorded.get("order"), int(recorded.get("microbatches") or 0)
    if not isinstance(order, dict) or m <= 0:
        return None
    lanes = {rank: [a for text in actions for a in _compute_actions(str(text))] for rank, actions in order.items()}
    if not _complete(lanes, m):
        order = canonical_order(str(recorded.get("schedule")), len(order), m)
        if order is None:
            return None
    return schedule_idle_frac(order)


def schedule_idle_frac(order: dict) -> float | None:
    """The mean idle fraction over the pp ranks of `order` (rank -> action strings);
    None when the order has no compute actions or cannot be played (an action
    waiting on one no rank runs, or ranks waiting on each other)."""
    lanes = {rank: [a for text in actions for a in _compute_actions(str(text))] for rank, actions in order.items()}
    present = {a for lane in lanes.values() for a in lane}
    if not present:
        return None
    last_stage = max(a[0] for a in present)
    end: dict = {}
    free = {rank: 0.0 for rank in lanes}
    cursor = {rank: 0 for rank in lanes}
    progress = True
    while progress:
        progress = False
        for rank, lane in lanes.items():
            while cursor[rank] < len(lane):
                action = lane[cursor[rank]]
                needs = _inputs(action, last_stage, present)
                if any(n in present and n not in end for n in needs):
                    break
                start = max([free[rank]] + [end[n] for n in needs if n in end])
                end[action] = free[rank] = start + COST[action[1]]
                cursor[rank] += 1
                progress = True
    if any(cursor[r] < len(lane) for r, lane in lanes.items()):
        return None
    makespan = max(free.values())
    if makespan <= 0:
        return None
    busy = [sum(COST[a[1]] for a in lane) for lane in lanes.values()]
    return sum(1.0 - b / makespan for b in busy) / len(busy)
