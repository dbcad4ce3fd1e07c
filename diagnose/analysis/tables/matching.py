"""Match every collective across its members, as Flight Recorder does.

collectives(): one row per (rank, call) of a collective or p2p op, with issue
(arrival), return, wait and completion times joined from the wait/done rows.
arrivals(): one row per member per instance (group, seq): its arrival, the last
arriver, its wait (last arrival - own arrival) and the transfer time (exit -
last arrival). A p2p instance is the n-th message of one src->dst pair, whose
two members are the send and the recv. A call recorded both on the host and on
the device (a live CUDA run) is matched by its device row.
Both tables' string columns are categoricals of the values they hold, in
lexical order (_compact): compare them with strings; two such columns have
different categories, so compare or mix them as strings (as_str).
"""

import numpy as np
import pandas as pd

from diagnose.analysis.tables.device_collectives import timed_on_device

# the events table's string columns the loader turns into pandas categoricals
# (the per-rank pass, diagnose/analysis/load/rank_pass.py, keeps their Arrow
# dictionaries); the calls table keeps them compact
CATEGORICAL_COLUMNS = ("kind", "name", "group", "group_ranks", "callsite", "detail")
KEY = ["rank", "group", "seq", "name"]
_CODED_KEY = ["rank", "_group", "seq", "_name"]  # KEY with group and name as integer codes


def as_str(series: pd.Series) -> pd.Series:
    """series.astype(str), without a Python object per row for categoricals
    (the loader's string columns): 10-20x faster on millions of rows."""
    if not isinstance(series.dtype, pd.CategoricalDtype):
        return series.astype(str)
    values = series.cat.categories.astype(str).array.take(series.cat.codes.to_numpy(), allow_fill=True)
    return pd.Series(values, index=series.index, name=series.name)


def wait_site(calls: pd.DataFrame) -> pd.Series:
    """Where each call was waited (its wait's callsite), else where it was issued: the
    place a fix that moves a wait changes. As strings: the two callsite columns are
    categoricals of different categories, which neither compare nor mix."""
    waited_at = as_str(calls["wait_callsite"]).fillna("")
    return waited_at.where(waited_at != "", as_str(calls["callsite"]).fillna(""))


def _compact(series: pd.Series) -> pd.Series:
    """A string column of the collectives table: a categorical of only the values it
    holds, in lexical order, so that sorting and grouping order its rows as strings
    would (the loader's categories are in order of appearance), at an integer per
    row: as str columns the seven cost 1,024 ranks x 200 steps ~600 MB of the
    analysis' peak (bench/results/2026-12-05-categorical-collectives.md).
    Recoded by hand: pandas' remove_unused_categories and reorder_categories took
    4x as long (0.7 s for the seven columns). Not a categorical of strings: as_str."""
    categories = series.cat.categories if isinstance(series.dtype, pd.CategoricalDtype) else None
    if categories is None or not pd.api.types.is_string_dtype(categories):
        return as_str(series)
    codes = series.cat.codes.to_numpy()
    held = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(categories)))
    held = held[np.argsort(np.asarray(categories[held], dtype=object))]
    recode = np.full(len(categories) + 1, -1, codes.dtype)  # its last entry keeps code -1 (missing)
    recode[held] = np.arange(len(held))
    return pd.Series(pd.Categorical.from_codes(recode[codes], categories[held]), index=series.index, name=series.name)


def _codes(series: pd.Series) -> np.ndarray:
    """Integer codes with equal codes exactly where the strings are equal."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.codes.to_numpy()
    return pd.factorize(series.astype(str))[0]


def collectives_table(events: pd.DataFrame) -> pd.DataFrame:
    # The wait/done rows are joined on integer codes of group and name (shared
    # by all rows of the events table): joining on strings costs seconds per
    # million calls.
    events = events.assign(_group=_codes(events["group"]), _name=_codes(events["name"]))
    calls = _one_row_per_call(events[events["kind"].isin(["collective", "p2p"]) & (events["seq"] >= 0)])
    calls = calls[
        [
            "rank",
            "kind",
            "name",
            "group",
            "group_ranks",
            "seq",
            "peer",
            "bytes",
            "async_op",
            "step",
            "microbatch",
            "stage",
            "callsite",
            "detail",
            "start_ns",
            "end_ns",
            "_group",
            "_name",
        ]
    ]
    calls = calls.assign(**{column: _compact(calls[column]) for column in CATEGORICAL_COLUMNS})
    calls = calls.rename(columns={"start_ns": "issue_ns", "end_ns": "return_ns"})
    waits = _one_row_per_call(events[events["kind"] == "wait"])
    waits = pd.DataFrame(
        {
            "rank": waits["rank"],
            "_group": waits["_group"],
            "seq": waits["seq"],
            "_name": waits["_name"],
            "wait_start_ns": waits["start_ns"],
            "wait_end_ns": waits["end_ns"],
            "wait_callsite": _compact(waits["callsite"]),
        }
    )
    waits = waits.drop_duplicates(_CODED_KEY)
    dones = _one_row_per_call(events[events["kind"] == "done"])  # DDP's: the device's, not the callback's
    dones = pd.DataFrame(
        {
            "rank": dones["rank"],
            "_group": dones["_group"],
            "seq": dones["seq"],
            "_name": dones["_name"],
            "done_ns": dones["start_ns"],
        }
    ).drop_duplicates(_CODED_KEY)
    table = calls.merge(waits, on=_CODED_KEY, how="left").merge(dones, on=_CODED_KEY, how="left")
    table = table.drop(columns=["_group", "_name"])
    # When did this member's part end: sync -> return; async -> completion, else end of wait.
    exit_ns = np.where(table["async_op"], table["done_ns"], table["return_ns"])
    exit_ns = np.where(np.isnan(exit_ns.astype(float)), table["wait_end_ns"], exit_ns)
    table["exit_ns"] = exit_ns
    return table.reset_index(drop=True)


def _one_row_per_call(calls: pd.DataFrame) -> pd.DataFrame:
    """A live CUDA run records a call (and its wait) twice: on the host (issue
    -> return) and on the device (collectors/instrument/collective_events.py:
    when the device was ready for it; how long the stream stalled behind the
    wait). The device row is the member's; the host row of the same call leaves
    the matching (it stays in the events for the host's breakdown)."""
    device = timed_on_device(calls["detail"])
    if not device.any() or device.all():
        return calls

    def keys(rows):
        return pd.MultiIndex.from_arrays(
            [rows["rank"].to_numpy(), rows["_group"].to_numpy(), rows["seq"].to_numpy(), rows["_name"].to_numpy()]
        )

    twin = keys(calls).isin(keys(calls[device]))
    return calls[device | ~twin]


def arrivals_table(collectives: pd.DataFrame) -> pd.DataFrame:
    if collectives.empty:
        return pd.DataFrame(
            columns=[
                "group",
                "seq",
                "name",
                "rank",
                "arrival_ns",
                "last_arrival_ns",
                "last_rank",
                "wait_ms",
                "transfer_ms",
                "members",
                "expected_members",
                "step",
                "bytes",
            ]
        )
    table = collectives[
        [
            "group",
            "group_ranks",
            "seq",
            "name",
            "kind",
            "rank",
            "issue_ns",
            "exit_ns",
            "step",
            "microbatch",
            "stage",
            "bytes",
            "callsite",
            "detail",
            "async_op",
        ]
    ].reset_index(drop=True)
    table = table.rename(columns={"issue_ns": "arrival_ns"})
    # where the member's thread blocked on the call: a sync call at its start, an
    # async one in its wait (NaN: never waited, as DDP's buckets; it went on working)
    waited_from = collectives["wait_start_ns"] if "wait_start_ns" in collectives else np.nan
    table["blocked_from_ns"] = np.where(
        table["async_op"].to_numpy(bool), np.asarray(waited_from, np.float64), table["arrival_ns"].to_numpy(np.float64)
    )
    instance = _instance_ids(table)
    if instance is None:  # a missing group or seq; rare, so the slow path
        return _arrivals_by_merge(table)
    grouped = table.groupby(instance, sort=False)
    table["last_arrival_ns"] = grouped["arrival_ns"].transform("max")
    table["members"] = grouped["rank"].transform("size")
    table["expected_members"] = per_distinct(table["group_ranks"], lambda s: s.str.count(",") + 1)
    last_row = grouped["arrival_ns"].idxmax().to_numpy()  # the first member to arrive last
    table["last_rank"] = table["rank"].to_numpy()[last_row[instance]]
    table["wait_ms"] = (table["last_arrival_ns"] - table["arrival_ns"]) / 1e6
    exit_median = grouped["exit_ns"].transform("median")
    table["transfer_ms"] = (exit_median - table["last_arrival_ns"]) / 1e6
    return table


def _instance_ids(table: pd.DataFrame) -> np.ndarray | None:
    """One integer per instance (group, seq), numbered in order of first
    appearance (as groupby(sort=False).ngroup()), from integer codes."""
    group, _ = pd.factorize(table["group"])
    seq = table["seq"].to_numpy()
    if (group < 0).any() or table["seq"].isna().any() or len(seq) == 0:
        return None
    lo, span = int(seq.min()), int(seq.max()) - int(seq.min()) + 1
    if (int(group.max()) + 1) * span >= 2**62:
        return table.groupby(["group", "seq"], sort=False).ngroup().to_numpy()
    return pd.factorize(group.astype(np.int64) * span + (seq.astype(np.int64) - lo))[0]


def per_distinct(series: pd.Series, fn) -> pd.Series:
    """fn(series), evaluated once per distinct value (fn must be elementwise)."""
    codes, uniques = pd.factorize(series)
    if (codes < 0).any():
        return fn(series)
    values = fn(pd.Series(uniques)).to_numpy()
    return pd.Series(values[codes], index=series.index, name=series.name)


def _arrivals_by_merge(table: pd.DataFrame) -> pd.DataFrame:
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
