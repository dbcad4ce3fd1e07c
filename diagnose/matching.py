"""Match every collective across its members, as Flight Recorder does.

collectives(): one row per (rank, call) of a collective or p2p op, with issue
(arrival), return, wait and completion times joined from the wait/done rows.
arrivals(): one row per member per instance (group, seq): its arrival, the last
arriver, its wait (last arrival - own arrival) and the transfer time (exit -
last arrival). A p2p instance is the n-th message of one src->dst pair, whose
two members are the send and the recv.
"""
import numpy as np
import pandas as pd

KEY = ["rank", "group", "seq", "name"]


def collectives_table(events: pd.DataFrame) -> pd.DataFrame:
    calls = events[events["kind"].isin(["collective", "p2p"]) & (events["seq"] >= 0)]
    calls = calls[["rank", "kind", "name", "group", "group_ranks", "seq", "peer", "bytes",
                   "async_op", "step", "microbatch", "stage", "callsite", "detail", "start_ns",
                   "end_ns"]].copy()
    for column in ("kind", "name", "group", "group_ranks", "callsite", "detail"):
        calls[column] = calls[column].astype(str)
    calls = calls.rename(columns={"start_ns": "issue_ns", "end_ns": "return_ns"})
    waits = events[events["kind"] == "wait"]
    waits = pd.DataFrame({"rank": waits["rank"], "group": waits["group"].astype(str),
                          "seq": waits["seq"], "name": waits["name"].astype(str),
                          "wait_start_ns": waits["start_ns"], "wait_end_ns": waits["end_ns"],
                          "wait_callsite": waits["callsite"].astype(str)})
    waits = waits.drop_duplicates(KEY)
    dones = events[events["kind"] == "done"]
    dones = pd.DataFrame({"rank": dones["rank"], "group": dones["group"].astype(str),
                          "seq": dones["seq"], "name": dones["name"].astype(str),
                          "done_ns": dones["start_ns"]}).drop_duplicates(KEY)
    table = calls.merge(waits, on=KEY, how="left").merge(dones, on=KEY, how="left")
    # When did this member's part end: sync -> return; async -> completion, else end of wait.
    exit_ns = np.where(table["async_op"], table["done_ns"], table["return_ns"])
    exit_ns = np.where(np.isnan(exit_ns.astype(float)), table["wait_end_ns"], exit_ns)
    table["exit_ns"] = exit_ns
    return table.reset_index(drop=True)


def arrivals_table(collectives: pd.DataFrame) -> pd.DataFrame:
    if collectives.empty:
        return pd.DataFrame(columns=["group", "seq", "name", "rank", "arrival_ns", "last_arrival_ns",
                                     "last_rank", "wait_ms", "transfer_ms", "members",
                                     "expected_members", "step", "bytes"])
    table = collectives[["group", "group_ranks", "seq", "name", "kind", "rank", "issue_ns",
                         "exit_ns", "step", "microbatch", "stage", "bytes", "callsite", "detail",
                         "async_op"]].copy()
    table = table.rename(columns={"issue_ns": "arrival_ns"})
    instance = [table["group"], table["seq"]]
    grouped = table.groupby(instance, sort=False)
    table["last_arrival_ns"] = grouped["arrival_ns"].transform("max")
    table["members"] = grouped["rank"].transform("size")
    table["expected_members"] = table["group_ranks"].str.count(",") + 1
    last_idx = grouped["arrival_ns"].idxmax()
    last_rank = table.loc[last_idx, ["group", "seq", "rank"]].rename(columns={"rank": "last_rank"})
    table = table.merge(last_rank, on=["group", "seq"], how="left")
    table["wait_ms"] = (table["last_arrival_ns"] - table["arrival_ns"]) / 1e6
    exit_median = table.groupby(["group", "seq"])["exit_ns"].transform("median")
    table["transfer_ms"] = (exit_median - table["last_arrival_ns"]) / 1e6
    return table
