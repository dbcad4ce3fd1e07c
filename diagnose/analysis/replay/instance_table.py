"""The instances of a run's matched calls (group, seq: a collective, or the n-th
message of a send/recv pair), the rendezvous both replays are built on
(diagnose/analysis/replay/step_replay.py for host lanes, device_graph.py for
the GPUs' streams)."""

import numpy as np
import pandas as pd

REDUCER_DETAIL = "ddp backward"  # collectors/instrument/ddp.py: DDP's reducer, one row per backward


class InstanceTable:
    """The instances (group, seq) of matched calls: per call its instance (`inst`)
    and exit (`exit_ns`), as arrays beside `calls` (a copy of a 10^6-row table with
    three more columns was 580 MB at 1,024 ranks); per instance its members, signed length (from its last
    arrival, or its group's previous instance's end, to its first member out),
    recorded end, its group's previous instance, whether it is frozen (a member
    not traced: it keeps its recorded end) and whether it is DDP's reducer."""

    def __init__(self, calls: pd.DataFrame):
        group_code = _codes(calls["group"])
        seq = calls["seq"].to_numpy(np.int64)
        inst, _ = pd.factorize(group_code * (int(seq.max(initial=0)) + 1) + seq)
        n = int(inst.max(initial=-1)) + 1
        exit_ns = calls["exit_ns"].fillna(calls["return_ns"]).to_numpy(np.int64)
        arrival = calls["issue_ns"].to_numpy(np.int64)
        rank = calls["rank"].to_numpy(np.int64)
        self.inst, self.exit_ns = inst.astype(np.int64), exit_ns
        first = np.full(n, len(inst))
        np.minimum.at(first, inst, np.arange(len(inst)))
        self.members = np.bincount(
            np.unique(inst.astype(np.int64) * (int(rank.max(initial=0)) + 1) + rank) // (int(rank.max(initial=0)) + 1),
            minlength=n,
        )
        ranks_text = calls["group_ranks"]
        commas = (
            ranks_text.cat.categories.str.count(",").to_numpy()[ranks_text.cat.codes.to_numpy()]
            if isinstance(ranks_text.dtype, pd.CategoricalDtype)
            else ranks_text.astype(str).str.count(",").to_numpy()
        )
        expected = commas[first] + 1
        last_arrival = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(last_arrival, inst, arrival)
        end = np.full(n, np.iinfo(np.int64).max)  # the first member out: the instance is over
        np.minimum.at(end, inst, exit_ns)
        group, seq = group_code[first], seq[first]
        # each group's instances in seq order: a lane of their own. DDP's reducer rows
        # are numbered when the next forward reads them, after the calls that followed
        # the backward (a loss all-reduce): out of the group's order, so off its lane
        self.reducer = (
            calls["detail"].to_numpy()[first].astype(str) == REDUCER_DETAIL
            if "detail" in calls
            else np.zeros(len(seq), bool)
        )
        order = np.lexsort((seq, group))
        order = order[~self.reducer[order]]
        self.previous = np.full(len(seq), -1)
        same = group[order[1:]] == group[order[:-1]]
        self.previous[order[1:][same]] = order[:-1][same]
        # recorded start: the last arrival, or the previous instance's end
        prev_end = np.where(self.previous >= 0, end[np.maximum(self.previous, 0)], np.iinfo(np.int64).min)
        start = np.maximum(last_arrival, prev_end)
        # signed: an instance recorded as ending before its last member arrived is
        # the ranks' clocks disagreeing (the alignment's error, a few ms on a busy
        # host); the replay keeps that offset rather than inventing a delay
        self.length_ns = (end - start).astype(np.float64)
        self.frozen = self.members < expected
        self.recorded_end, self.last_arrival = end, last_arrival
        self.calls = calls


def _codes(column: pd.Series) -> np.ndarray:
    """Integer codes of a string column (a categorical's own)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(np.int64)
    return pd.factorize(column.astype(str))[0].astype(np.int64)
