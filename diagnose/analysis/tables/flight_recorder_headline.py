"""What a Flight Recorder hang finding leads with: the op the job stalled on, the
other ops its culprits left peers waiting in, and what an empty-buffer culprit's
`pg_status` says.

The stalled op is the earliest-created (`time_created_ns`) pending entry among
the waiting ranks, over the (group, seq) ops some culprit never reached; the
others follow in that order. Ranking by "most culprits, then the smallest
group" put a tensor-parallel `_reduce_scatter_base` one GIL-holding rank stopped
ahead of the expert-parallel `all_to_all` every waiter had entered first (a
later op is a consequence: a rank's host runs on past a collective it enqueued).
Ops no culprit stops are left out: there every member arrived, and they wait
on something else (on lock_gil_1st, ranks 0-7's tensor-parallel broadcasts,
created before the all_to_all by those ranks' clocks, where no one is behind).
`time_created_ns` is each host's wall clock: ops whose waiters share no host are
ordered across clocks, good to NTP's skew only.
"""

_NOT_CREATED = float("inf")  # an entry without a creation time sorts after those with one


def headline(groups, culprits, waiting, waited, pending) -> dict | None:
    """The stalled op with its culprits and waiters, `also_pending` the others.
    `pending`: group -> waiting rank -> its entry of (group, waited[group])."""
    ops = []
    for name, ranks in waiting.items():
        mine = sorted(r for r, c in culprits.items() if name in c["groups"])
        if not mine:
            continue
        held = pending[name]
        created_ns = min((e["created_ns"] or _NOT_CREATED for e in held.values()), default=_NOT_CREATED)
        # without creation times, the old order: most culprits, then the smallest group
        key = (created_ns, -len(mine), len(groups[name]["ranks"]), name)
        # shown: the lowest waiting rank's entry (all_to_all sizes differ by rank)
        ops.append((key, _op(groups, name, waited[name], mine, ranks, held[min(held)] if held else None)))
    if not ops:
        return None
    ops.sort(key=lambda op: op[0])
    first = ops[0][1]
    return {**first, "also_pending": [op for _, op in ops[1:]]}


def _op(groups, name, seq, mine, waiters, entry) -> dict:
    return {
        "group": name,
        "desc": groups[name]["desc"],
        "ranks": groups[name]["ranks"],
        "seq": seq,
        "culprits": mine,
        "waiting": sorted(waiters),
        "op": (entry or {}).get("op"),
        "sizes": "x".join(map(str, entry["input_sizes"][0])) if entry and entry["input_sizes"] else None,
        "dtype": (entry["dtypes"] or [None])[0] if entry else None,
    }


def pg_status_sentence(rank: int, name: str, status: dict | None, role: str, seq: int) -> str:
    """What a culprit with an empty buffer shows of group `name`: its counters
    there (`status`), or, when they cannot be tied to the group, that it is unknown."""
    if status is None:
        return (
            f"rank {rank} {role} at #{seq}: its buffer is empty and its pg_status cannot be tied to "
            f"group {name}, so how far it got there is unknown"
        )
    done, enqueued, started = status["completed"], status["enqueued"], status["started"]
    if enqueued <= done:
        said = f"rank {rank} completed #{done} and never enqueued #{done + 1}"
    elif started > done:
        said = f"rank {rank} started #{started} and completed only #{done}"
    else:
        said = f"rank {rank} enqueued #{enqueued} and completed only #{done}"
    return f"{said} ({role}; its buffer is empty, its pg_status says so)"
