"""The waits behind the straggler detector (diagnose.analysis.detectors.straggler):
per rank and steady step, how long the other members of its collectives waited
for it (waiting_caused: the typical member's union of [own arrival, last
arrival] intervals, same-stage groups only, each passed on to whom the late
rank was itself waiting for: pass_blame), and how many of a group's members
the trace holds (members_seen)."""

import numpy as np
import pandas as pd


def _same_stage_groups(arrivals, stages):
    if not stages:
        return arrivals
    member_stage = arrivals["rank"].map(stages)
    n_stages = member_stage.groupby(arrivals["group"]).nunique(dropna=False)
    return arrivals[arrivals["group"].isin(n_stages[n_stages <= 1].index)]


def union_ms(frame, keys, start, end) -> pd.Series:
    """Per group of `keys`, the length (ms) of the union of its [start, end]
    intervals: one sort and a running max instead of a Python loop per group
    (1,024 ranks x 200 steps is ~10^6 groups). Touching intervals merge."""
    frame = frame.sort_values([*keys, start], kind="stable")
    group = frame.groupby(keys, sort=False).ngroup().to_numpy()
    s, e = frame[start].to_numpy(np.int64), frame[end].to_numpy(np.int64)
    reach = pd.Series(e).groupby(group).cummax().to_numpy()  # furthest end so far in the group
    new = np.ones(len(s), dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (s[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    lengths = reach[last] - s[first]  # each merged interval: its start to its furthest end
    per_interval = frame.iloc[first][keys].assign(_ns=lengths)
    return (per_interval.groupby(keys)["_ns"].sum() / 1e6).rename(None)


def waiting_caused(ctx):
    """(rank x steady step) -> ms the other members spent waiting for this rank.

    Waits of overlapping async collectives (DDP buckets) overlap in time, so a
    member's waiting is the union of its [own arrival, last arrival] intervals,
    not their sum; the typical (median) member's union is what the rank caused.
    """
    arrivals = ctx.run.arrivals()
    if arrivals.empty:
        return None
    # Only the columns used here, and the group as an integer code: every filter
    # below then copies a few numeric columns, not the table's strings.
    arrivals = arrivals[
        [
            "kind",
            "group",
            "rank",
            "step",
            "members",
            "expected_members",
            "last_rank",
            "wait_ms",
            "arrival_ns",
            "last_arrival_ns",
            "blocked_from_ns",
            "exit_ns",
        ]
    ]
    # an instance counts when every member the run holds is in it (all of the
    # group on a whole run; the ranks seen, on a partial trace set)
    seen = arrivals.groupby("group")["rank"].transform("nunique")
    # sends and receives count where they are not a pipeline's (a ring, a halo
    # exchange: a late peer holds its neighbours there); in a pipeline a stage waits
    # for its upstream's work by design: that is stage_imbalance's and the bubble's
    kinds = ["collective"] if ctx.run.rank_stages() else ["collective", "p2p"]
    arrivals = arrivals[
        arrivals["kind"].isin(kinds)
        & arrivals["step"].isin(ctx.steady)
        & (arrivals["members"] == np.minimum(arrivals["expected_members"], seen))
    ]
    arrivals = arrivals.drop(columns="kind").assign(group=pd.factorize(arrivals["group"])[0])
    arrivals = _same_stage_groups(arrivals, ctx.run.rank_stages())
    others = arrivals[(arrivals["rank"] != arrivals["last_rank"]) & (arrivals["wait_ms"] > 0)]
    if others.empty:
        return None
    blocked = arrivals[arrivals["blocked_from_ns"].notna() & arrivals["exit_ns"].notna()]
    waited = (blocked["rank"] != blocked["last_rank"]) & (blocked["wait_ms"] > 0)
    parts = pass_blame(others, releases=blocked[["rank", "exit_ns"]].assign(waited=waited))
    per_member = union_ms(parts, ["last_rank", "step", "rank"], "arrival_ns", "last_arrival_ns")
    caused = per_member.groupby(["last_rank", "step"]).median()
    caused = caused.unstack("step").reindex(columns=ctx.steady).fillna(0.0)
    return caused.reindex(sorted(arrivals["rank"].unique())).fillna(0.0)


def pass_blame(waits: pd.DataFrame, rounds: int = 8, releases: pd.DataFrame | None = None) -> pd.DataFrame:
    """The waits (a member `rank` waiting [arrival_ns, last_arrival_ns] for
    `last_rank`), each part during which the late rank was itself blocked waiting
    for another rank passed on to that rank. With two kinds of groups (data x
    tensor parallel) the straggler's tensor-parallel partner waits for it, then
    arrives last at its own data-parallel collective: those members waited for the
    straggler, not for the partner, who on a loaded 4-rank dp2 x tp2 run came out
    causing ~60% of the straggler's waiting (the 2x gate then failed). Blocked: a
    sync call from its start, an async one from its wait (`blocked_from_ns`), to
    its last arrival; a bucket never waited (DDP's) blocks nothing. Each round
    looks at the late rank's last blocking wait that ended by the part's end; the
    part before it is looked at again, the part after it is the late rank's own.

    With `releases` (rank, exit_ns, waited: when each rank left a collective it
    was blocked in, and whether it waited there for another rank), a part the
    late rank holds is its own only as far as its time since it last left a
    collective where it waited exceeds the waiter's time since it last left any
    before waiting: the rest is lateness it brought out of a collective where it
    waited (that wait, or the transfer after it), which is no work of its own and
    is counted to nobody (kept from the cause too: added there,
    indirect waiters change the typical member's wait, bench.scale's 1,024-rank
    straggler fell from 8.4 to 2.1 ms/step). The part kept is the end of its span.
    Without it, the loaded dp2 x tp2 job (tests/interop/test_titan_style.py) had
    the straggler's FSDP peer 18.8 ms/step "late" to its tensor-parallel
    all-reduce, after it had waited 18.4 ms for the straggler in an all-gather.
    Returns rows of (last_rank, step, rank, arrival_ns, last_arrival_ns): parts."""
    blocked = waits[waits["blocked_from_ns"].notna()]
    held = pd.DataFrame(
        {
            "_holder": blocked["rank"].to_numpy(np.int64),
            "_from": np.maximum(blocked["blocked_from_ns"].to_numpy(np.float64), blocked["arrival_ns"].to_numpy()),
            "_to": blocked["last_arrival_ns"].to_numpy(np.int64),
            "_cause": blocked["last_rank"].to_numpy(np.int64),
        }
    )
    held = held[held["_to"] > held["_from"]].sort_values("_to", kind="stable")
    parts = pd.DataFrame(
        {
            "last_rank": waits["last_rank"].to_numpy(np.int64),
            "step": waits["step"].to_numpy(np.int64),
            "rank": waits["rank"].to_numpy(np.int64),
            "arrival_ns": waits["arrival_ns"].to_numpy(np.int64),
            "last_arrival_ns": waits["last_arrival_ns"].to_numpy(np.int64),
            "_waited_from": waits["arrival_ns"].to_numpy(np.int64),  # the waiter's own arrival
        }
    )
    done = []
    for _ in range(rounds):
        if parts.empty or held.empty:
            break
        j = pd.merge_asof(
            parts.sort_values("last_arrival_ns", kind="stable"),
            held,
            left_on="last_arrival_ns",
            right_on="_to",
            left_by="last_rank",
            right_by="_holder",
            direction="backward",
        )
        s, e = j["arrival_ns"].to_numpy(), j["last_arrival_ns"].to_numpy()
        matched = j["_cause"].notna().to_numpy()
        lo = np.where(matched, np.maximum(s, np.nan_to_num(j["_from"].to_numpy(np.float64))), s).astype(np.int64)
        hi = np.where(matched, np.minimum(e, np.nan_to_num(j["_to"].to_numpy(np.float64))), s).astype(np.int64)
        cause = j["_cause"].fillna(-1).to_numpy(np.int64)
        passed = (hi > lo) & matched & (cause != j["rank"].to_numpy()) & (cause != j["last_rank"].to_numpy())
        keep = ["last_rank", "step", "rank", "arrival_ns", "last_arrival_ns", "_waited_from"]
        whole = j.loc[~passed, keep]
        # while the late rank waited: passed on; after it was released: its own
        # (final); before it blocked: looked at again, for an earlier wait of its own
        j = j.loc[passed, keep].assign(_lo=lo[passed], _hi=hi[passed], _cause=cause[passed])
        after = j.assign(arrival_ns=j["_hi"])[keep]
        done += [whole, after[after["last_arrival_ns"] > after["arrival_ns"]]]
        before = j.assign(last_arrival_ns=j["_lo"])[keep]
        on = j.assign(last_rank=j["_cause"], arrival_ns=j["_lo"], last_arrival_ns=j["_hi"])[keep]
        parts = pd.concat([before[before["last_arrival_ns"] > before["arrival_ns"]], on], ignore_index=True)
    parts = pd.concat([*done, parts], ignore_index=True)
    if releases is not None and len(parts):
        parts = _own_work(parts, releases)
    return parts.drop(columns="_waited_from")


def _last_release(at: pd.DataFrame, who: str, when: str, releases: pd.DataFrame) -> np.ndarray:
    """Per row of `at`: the latest exit of rank `who` at or before `when` (NaN: none)."""
    releases = releases[["_rank", "_exit"]]
    order = np.argsort(at[when].to_numpy(), kind="stable")
    found = pd.merge_asof(
        pd.DataFrame({"_at": at[when].to_numpy(np.int64)[order], "_rank": at[who].to_numpy(np.int64)[order]}),
        releases,
        left_on="_at",
        right_on="_exit",
        by="_rank",
        direction="backward",
    )["_exit"].to_numpy(np.float64)
    out = np.empty(len(order))
    out[order] = found
    return out


def _own_work(parts: pd.DataFrame, releases: pd.DataFrame) -> pd.DataFrame:
    """Each part [a, b] that `last_rank` holds, cut to [b - own, b]: own = its work
    since its last release before b beyond the waiter's work since its last release
    before it began waiting (pass_blame's `releases`); no release known: all its own."""
    releases = pd.DataFrame(
        {
            "_rank": releases["rank"].to_numpy(np.int64),
            "_exit": releases["exit_ns"].to_numpy(np.int64),
            "_waited": releases["waited"].to_numpy(bool),
        }
    ).sort_values("_exit", kind="stable")
    a, b = parts["arrival_ns"].to_numpy(np.int64), parts["last_arrival_ns"].to_numpy(np.int64)
    # (the late rank's clock restarts only where others held it: after a collective
    # it was last into, its lateness there was its own work's, as is the transfer)
    late_left = _last_release(parts, "last_rank", "last_arrival_ns", releases[releases["_waited"]])
    waiter_left = _last_release(parts, "rank", "_waited_from", releases)
    extra = (b - late_left) - (parts["_waited_from"].to_numpy(np.int64) - waiter_left)
    own = np.clip(np.where(np.isnan(extra), b - a, extra), 0, b - a).astype(np.int64)
    parts = parts.assign(arrival_ns=b - own)
    return parts[own > 0]


def members_seen(ctx) -> tuple[int, int]:
    """(ranks the run holds, the largest group size its collectives name)."""
    arrivals = ctx.run.arrivals()
    group_size = int(arrivals["expected_members"].max()) if len(arrivals) else 0
    return len(ctx.run.ranks), max(group_size, len(ctx.run.ranks))
