"""The waits behind the straggler detector (diagnose.analysis.detectors.straggler):
per rank and steady step, how long the other members of its collectives waited
for it (waiting_caused: the typical member's union of [own arrival, last
arrival] intervals, same-stage groups only), and how many of a group's members
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
    per_member = union_ms(others, ["last_rank", "step", "rank"], "arrival_ns", "last_arrival_ns")
    caused = per_member.groupby(["last_rank", "step"]).median()
    caused = caused.unstack("step").reindex(columns=ctx.steady).fillna(0.0)
    return caused.reindex(sorted(arrivals["rank"].unique())).fillna(0.0)


def members_seen(ctx) -> tuple[int, int]:
    """(ranks the run holds, the largest group size its collectives name)."""
    arrivals = ctx.run.arrivals()
    group_size = int(arrivals["expected_members"].max()) if len(arrivals) else 0
    return len(ctx.run.ranks), max(group_size, len(ctx.run.ranks))
