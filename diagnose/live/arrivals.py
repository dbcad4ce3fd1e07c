"""The rank the others wait for, while the job runs: arrival lag at collectives.

Each collective call a rank records carries its group, its sequence number in
that group and its issue time (on a live CUDA run, also a device row: when the
device was ready for it; that one is the member's arrival, as in the analysis'
diagnose.analysis.tables.matching). One instance (group, seq) is matched across the
members this monitor reads (one node's ranks); a member's lag is its arrival
minus the first member's. The ranks of one node share CLOCK_MONOTONIC, so no
clock alignment is needed; ranks on other nodes are another monitor's.

Per rank and step, its lags over the step's collectives are summed: how long
the first arriver waited for it in that step. A rank's figure is the median of
that sum over its last LAG_STEPS complete steps (one scheduling hiccup is not a
straggler). The rank the others wait for is the one with the largest figure,
named only above WAITED_FOR_FRAC of the step (at least LAG_FLOOR_MS): on a
balanced 2-rank job on 2 cores one rank arrived 1-3 ms later than the other in
~35 ms steps, every step, from scheduling alone.

Not the lowest index among ranks tied on step count (what the progress line
said before): in a synchronous job every rank finishes every step, so step
counts tie and only arrivals tell the straggler."""

import collections
import statistics

LAG_STEPS = 8  # a rank's figure: the median over its last complete steps
MAX_OPEN = 4096  # instances waiting for a member; the oldest are dropped first
WAITED_FOR_FRAC = 0.10  # of the median step time, to name a rank the others wait for
LAG_FLOOR_MS = 1.0


class ArrivalLags:
    def __init__(self):
        self.open: dict = {}  # (group, seq) -> [expected ranks, {rank: arrival_ns}, step]
        self.step_lag: dict = collections.defaultdict(dict)  # step -> rank -> lag ms summed
        self.newest_step = -1

    def add(self, events, ranks) -> None:
        """Feed new event rows (a DataFrame with rank, kind, group, group_ranks, seq,
        start_ns, step, detail) of the ranks this monitor reads."""
        import pandas as pd  # (as compute_reader: the child imports pandas at its first poll)

        from diagnose.analysis.tables.device_collectives import timed_on_device

        rows = events[(events["kind"] == "collective") & (events["seq"] >= 0)]
        if rows.empty:
            return
        # a call recorded on the host and on the device arrives when the device was
        # ready: its host row leaves (as matching._one_row_per_call does)
        device = timed_on_device(rows["detail"])
        if device.any():
            keys = pd.MultiIndex.from_frame(rows[["rank", "group", "seq"]].astype(str))
            rows = rows[device | ~keys.isin(keys[device])]
        local = set(ranks)
        for rank, group, group_ranks, seq, start_ns, step in zip(
            rows["rank"].to_numpy(),
            rows["group"].to_numpy(),
            rows["group_ranks"].to_numpy(),
            rows["seq"].to_numpy(),
            rows["start_ns"].to_numpy(),
            rows["step"].to_numpy(),
        ):
            key = (str(group), int(seq))
            entry = self.open.get(key)
            if entry is None:
                expected = (_members(group_ranks) or local) & local
                if len(expected) < 2:
                    continue  # its other members are on other nodes: nobody here to compare with
                entry = self.open[key] = [expected, {}, int(step)]
            entry[1][int(rank)] = int(start_ns)
            entry[2] = min(entry[2], int(step))
            if entry[0] <= set(entry[1]):
                self._close(key)
        while len(self.open) > MAX_OPEN:
            del self.open[next(iter(self.open))]

    def _close(self, key) -> None:
        expected, arrivals, step = self.open.pop(key)
        first = min(arrivals[r] for r in expected)
        lags = self.step_lag[step]
        for rank in expected:
            lags[rank] = lags.get(rank, 0.0) + (arrivals[rank] - first) / 1e6
        self.newest_step = max(self.newest_step, step)
        for old in [s for s in self.step_lag if s < self.newest_step - 2 * LAG_STEPS]:
            del self.step_lag[old]

    def lags_ms(self) -> dict:
        """rank -> median over its last LAG_STEPS complete steps of its summed
        arrival lag (ms). The newest step may still miss collectives: left out."""
        steps = sorted(s for s in self.step_lag if s < self.newest_step)[-LAG_STEPS:]
        per_rank: dict = collections.defaultdict(list)
        for step in steps:
            for rank, lag in self.step_lag[step].items():
                per_rank[rank].append(lag)
        return {rank: statistics.median(values) for rank, values in per_rank.items()}

    def waited_for(self, step_ms: float | None) -> tuple | None:
        """(rank, its lag ms) of the rank the others wait for, or None when no rank
        arrives late by more than WAITED_FOR_FRAC of step_ms (a median step)."""
        lags = self.lags_ms()
        if len(lags) < 2:
            return None
        rank = max(lags, key=lambda r: (lags[r], -r))
        floor = max(LAG_FLOOR_MS, WAITED_FOR_FRAC * (step_ms or 0.0))
        return (rank, lags[rank]) if lags[rank] >= floor else None


def _members(group_ranks) -> set:
    """The global ranks of a group ("0,1,2,3"); empty when not recorded."""
    try:
        return {int(r) for r in str(group_ranks).split(",") if r.strip()}
    except ValueError:
        return set()
