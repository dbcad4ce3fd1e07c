"""What a fix saves, by replaying the run's steps (diagnose/analysis/replay/step_replay.py)
with the finding's cause removed; and the ideal step.

Per finding kind, what "removed" means:
- straggler: the rank's own work (its gaps: compute, and whatever else it does
  outside collectives) in each step brought down to the median of its
  pipeline-stage peers' in that step (a step it was faster stays as it was);
- workload_imbalance: every rank's compute in each step set to its stage's
  mean for that step (token-balanced micro-batches: same total work; the only
  what-if that lengthens some durations, so it can lengthen a step: hidden_sync
  on dp4 replayed 0.9 ms slower, a saving of 0);
- stage_imbalance: the stage's own work brought down to the other stages' mean;
- input_stall: the data waits removed;
- hidden_sync: the callsite's collectives and host syncs removed;
- exposed_comm: every collective takes no time (fully overlapped);
- host_bound (device lanes): the host's own work between its launches gone,
  its data waits kept;
- accumulation_sync: the gradient reductions of every backward but each step's
  last removed;
- pipeline_bubble: the bubble at the schedule's theoretical size for the
  recommended micro-batch count (the detector's arithmetic: a schedule change
  is not a duration change the replay can make).
- blocking_async (host lanes): the p2p ops waited at once at its site posted as
  the fix would: a send and the receive exchanged with it (same peer, nothing
  between) as one batch, a lone send waited at the end of its step's schedule
  (diagnose/analysis/tables/p2p_exchanges.py); a send still ends only once its
  receiver has arrived.
The saving is the replayed step time, as is, minus the what-if's, averaged over
the steady steps: the replay's own error cancels. A what-if changes only the
steady steps' durations, so the step before them ends as recorded and every
saving is measured from the same origin (changing earlier steps too would
shift it: a what-if that shortens only every step's durations could read as a
loss). The ideal step brings every rank's compute down to its stage's median
per step (no rank made slower).
"""

import numpy as np
import pandas as pd

from diagnose.analysis.replay.device_graph import DeviceModel
from diagnose.analysis.replay.step_replay import StepModel
from diagnose.analysis.tables.gpu_tables import merge_intervals
from diagnose.analysis.tables.matching import wait_site

COMPUTE_PHASES = ("forward", "backward", "optimizer")


class WhatIf:
    def __init__(self, run, steady: list[int], stages: dict[int, int], device: bool = False):
        """`device`: lanes of GPU streams, not host threads (diagnose/analysis/replay/device_graph.py)."""
        self.steady, self.stages, self.device = steady, stages, device
        self.model = DeviceModel(run) if device else StepModel(run.collectives(), run.in_window(run.steps()))
        self.ok, self.why = self.model.ok, self.model.why
        if not self.ok:
            return
        m = self.model
        # where a steady step has no step before it (one profiled step, a trace's
        # window) it is measured from its recorded start, which no what-if moves
        starts = run.in_window(run.steps())
        self._origin_ns = starts[starts["step"].isin(steady)].groupby("step")["start_ns"].min()
        self.base = self._step_ms(m.replay_units())
        self.ok = bool(self.base)
        if not self.ok:
            self.why = "no steady step to measure: none has a step before it or a recorded start"
        events = run.events()
        self._events = events
        # per unit, the ns of work to scale: the compute phases where the job has them
        # (workload, ideal), or all of the rank's own work (straggler, stage: a rank can
        # be slow outside its phases, in logging or Python overhead). On device a unit
        # is a kernel and its work is its duration
        self._own = np.maximum(m.unit_work, 0.0)
        if device:
            self._compute = np.where(m.unit_is_compute, self._own, 0.0)
        else:
            phases = events[(events["kind"] == "phase") & events["name"].isin(COMPUTE_PHASES)]
            self._compute = self._overlaps(phases) if len(phases) else self._own
        self._in_steady = np.isin(m.unit_step, steady)
        self._key = pd.MultiIndex.from_arrays([m.unit_rank, m.unit_step])
        inst_step = pd.Series(m.calls["step"].to_numpy()).groupby(m.call_inst).max().reindex(range(len(m.length_ns)))
        self._inst_steady = inst_step.isin(steady).to_numpy()

    def _step_ms(self, end_ns) -> dict[int, float]:
        """step -> ms from the previous step's last end (else the step's recorded
        start) to this one's last end (all ranks)."""
        last = pd.Series(end_ns).groupby(self.model.end_step).max()
        out = {}
        for s in self.steady:
            origin = last.get(s - 1, self._origin_ns.get(s))
            if s in last.index and origin is not None:
                out[int(s)] = float(last[s] - origin) / 1e6
        return out

    def _overlaps(self, rows: pd.DataFrame) -> np.ndarray:
        """Per unit (a host gap), the ns of these event rows inside its window."""
        m = self.model
        out = np.zeros(len(m.unit_work))
        start, end = m.window_p
        for r, part in rows.groupby("rank"):
            s = m.slices.get(int(r))
            if s is None:
                continue
            out[s] = covered_ns(
                part["start_ns"].to_numpy(np.int64), part["end_ns"].to_numpy(np.int64), start[s], end[s]
            )
        return out

    def step_ms(self) -> float:
        return float(np.mean(list(self.base.values())))

    def _saving(self, work=None, length_ns=None, skip=frozenset(), **device) -> tuple[float, float] | None:
        # the edit, as asked (before the steady-step masking), for combined(): the
        # fixes of several findings replayed together
        self.last_edit = dict(work=work, length_ns=length_ns, skip=frozenset(skip), **device)
        m = self.model
        if work is not None:  # the steady steps' only (see the module's docstring)
            work = np.where(self._in_steady, work, m.unit_work)
        if length_ns is not None:
            length_ns = np.where(self._inst_steady, length_ns, m.length_ns)
        skip = frozenset(i for i in skip if self._inst_steady[i])
        after = self._step_ms(m.replay_units(work, length_ns, skip, **device))
        common = [s for s in self.base if s in after]
        if not common:
            return None
        before_ms = float(np.mean([self.base[s] for s in common]))
        after_ms = float(np.mean([after[s] for s in common]))
        return before_ms - after_ms, after_ms

    def _per_step(self, basis=None) -> pd.Series:
        """(rank, step) -> ns of compute (or of `basis`) in the rank's units."""
        return pd.Series(self._compute if basis is None else basis, index=self._key).groupby(level=[0, 1]).sum()

    def _scaled(self, target: pd.Series, basis=None):
        """Unit work with each (rank, step)'s compute (or `basis`) scaled to target ns."""
        basis = self._compute if basis is None else basis
        own = self._per_step(basis)
        want = target.reindex(own.index)
        factor = np.where(want.notna() & (own > 0), 1.0 - want / own.where(own > 0, 1.0), 0.0)
        per_unit = factor[own.index.get_indexer(self._key)]
        # (work lies only in positive gaps: a negative one is left as it is)
        return self.model.unit_work - basis * per_unit

    def _peer_target(self, reduce, ranks=None, with_self=False, basis=None) -> pd.Series:
        """(rank, step) -> reduce(compute of the rank's stage peers in that step), the
        rank itself included or not; a rank with no peer is its own."""
        table = self._per_step(basis).unstack(fill_value=0.0)  # rank x step
        stage = np.array([self.stages.get(int(r), 0) for r in table.index])
        values = table.to_numpy()
        out = np.empty_like(values)
        for st in np.unique(stage):
            rows = np.flatnonzero(stage == st)
            if with_self or len(rows) == 1:
                out[rows] = reduce(values[rows], axis=0)
                continue
            for r in rows if ranks is None else [i for i in rows if table.index[i] in ranks]:
                out[r] = reduce(values[rows[rows != r]], axis=0)
        frame = pd.DataFrame(out, index=table.index, columns=table.columns)
        if ranks is not None:
            frame = frame.loc[list(ranks)]
        return frame.stack()

    def straggler(self, rank: int):
        own = self._per_step(self._own)
        median = self._peer_target(np.median, ranks=[rank], basis=self._own)
        target = np.minimum(median, own.reindex(median.index).fillna(median))
        return self._saving(work=self._scaled(target, basis=self._own))

    def host_bound_straggler(self, rank: int):
        """Device lanes: the rank's host work between launches, per step, down to its
        stage peers' median: its launch delay gone (a host-bound straggler's GPU is
        as fast as its peers'; its host is not)."""
        m = self.model
        gap = np.maximum(m.host_gap_ns, 0.0)
        key = pd.MultiIndex.from_arrays([m.host_gap_rank, m.host_gap_step])
        per = pd.Series(gap, index=key).groupby(level=[0, 1]).sum().unstack(fill_value=0.0)
        if rank not in per.index:
            return None
        stage = self.stages.get(rank, 0)
        peers = [r for r in per.index if r != rank and self.stages.get(int(r), 0) == stage] or [
            r for r in per.index if r != rank
        ]
        if not peers:
            return None
        want = np.minimum(per.loc[peers].median(axis=0), per.loc[rank])
        ratio = (want / per.loc[rank].where(per.loc[rank] > 0, 1.0)).reindex(m.host_gap_step).fillna(1.0).to_numpy()
        steady = np.isin(m.host_gap_step, self.steady)
        scaled = np.where(
            (m.host_gap_rank == rank) & steady & (m.host_gap_ns > 0), m.host_gap_ns * ratio, m.host_gap_ns
        )
        return self._saving(host_gap_ns=scaled)

    def host_bound(self):
        """Device lanes: the host's own work between its launches and syncs gone in the
        steady steps, the time it waited for data inside each gap kept (input_stall's):
        a host that launches at once, what CUDA graphs approach."""
        m = self.model
        g0, g1 = m.host_gap_window
        keep = np.zeros(len(g0))
        data = self._events[self._events["kind"] == "data"]
        for rank, rows in data.groupby("rank"):
            mine = np.flatnonzero(m.host_gap_rank == rank)
            keep[mine] = covered_ns(
                rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64), g0[mine], g1[mine]
            )
        steady = np.isin(m.host_gap_step, self.steady)
        return self._saving(host_gap_ns=np.where(steady, np.minimum(keep, m.host_gap_ns), m.host_gap_ns))

    def workload_imbalance(self):
        if self.device:
            return self._saving(work=self._equal_microbatches())
        return self._saving(work=self._scaled(self._peer_target(np.mean, with_self=True)))

    def _equal_microbatches(self) -> np.ndarray:
        """Kernel durations with every micro-batch's forward (and backward) as long as
        its stage's mean in that step: token-balanced micro-batches, the same total
        work. A kernel belongs to the forward/backward pass whose device span holds
        its start (recorded or inferred passes, diagnose/importers/kineto_structure.py)."""
        m, events = self.model, self._events
        passes = events[events["kind"].isin(["forward", "backward"]) & (events["microbatch"] >= 0)]
        mb = np.full(len(m.unit_work), -1)
        backward = np.zeros(len(m.unit_work), bool)
        for r, p in passes.groupby("rank"):
            p = p.sort_values("start_ns")
            sel = np.flatnonzero(m.unit_rank == r)
            starts, ends = p["start_ns"].to_numpy(np.int64), p["end_ns"].to_numpy(np.int64)
            i = np.searchsorted(starts, m.k_start[sel], side="right") - 1
            inside = (i >= 0) & (m.k_start[sel] < ends[np.maximum(i, 0)])
            mb[sel[inside]] = p["microbatch"].to_numpy()[i[inside]]
            backward[sel[inside]] = p["kind"].to_numpy()[i[inside]] == "backward"
        keep = mb >= 0
        if not keep.any():
            return m.unit_work
        stage = np.array([self.stages.get(int(r), 0) for r in m.unit_rank])
        units = pd.DataFrame(
            {"rank": m.unit_rank, "step": m.unit_step, "mb": mb, "bwd": backward, "stage": stage, "ns": self._compute}
        )[keep]
        per_pass = units.groupby(["rank", "step", "mb", "bwd", "stage"], as_index=False)["ns"].sum()
        per_pass["want"] = per_pass.groupby(["stage", "step", "bwd"])["ns"].transform("mean")
        factor = units.merge(per_pass, on=["rank", "step", "mb", "bwd", "stage"], how="left", suffixes=("", "_pass"))
        ratio = np.where(factor["ns_pass"] > 0, factor["want"] / factor["ns_pass"].where(factor["ns_pass"] > 0, 1), 1)
        work = m.unit_work.copy()
        work[np.flatnonzero(keep)] = m.unit_work[keep] * ratio
        return work

    def stage_imbalance(self, stage: int):
        """The stage's own work brought down to the other stages' mean: the stage as
        fast as the rest (the fix both benches emulate; a rebalance that moves its
        excess onto the other stages saves less, down to the mean stage's figure)."""
        per_rank = self._per_step(self._own).groupby(level=0).mean()
        stage_of = pd.Series([self.stages.get(int(r), 0) for r in per_rank.index], index=per_rank.index)
        means = per_rank.groupby(stage_of).mean()
        others = means.drop(stage, errors="ignore")
        if means.get(stage, 0.0) <= 0 or others.empty:
            return None
        factor = min(float(others.mean()) / float(means[stage]), 1.0)
        own = self._per_step(self._own)
        ranks = own.index.get_level_values(0)
        target = own[np.array([self.stages.get(int(r), 0) == stage for r in ranks], bool)] * factor
        return self._saving(work=self._scaled(target, basis=self._own))

    def input_stall(self):
        events = self._events
        waits = self._overlaps(events[events["kind"] == "data"])
        return self._saving(work=self.model.unit_work - waits)

    def hidden_sync(self, same_place):
        """same_place(callsite) -> bool: the finding's callsite (the run's are absolute)."""
        calls = self.model.calls
        mask = calls["callsite"].astype(str).map(same_place).astype(bool).to_numpy()
        skip = frozenset(int(i) for i in self.model.call_inst[mask])
        events = self._events
        syncs = self._overlaps(
            events[(events["kind"] == "sync") & events["callsite"].astype(str).map(same_place).astype(bool)]
        )
        return self._saving(work=self.model.unit_work - syncs, skip=skip)

    def deferred_sends(self, same_place):
        """The fix blocking_async recommends, for the p2p waits at this place
        (same_place(callsite) -> bool; the wait's callsite, else the call's): a send
        and the receive exchanged with it posted as one batch, a lone send waited at
        the end of its step's schedule (step_replay.py, p2p_exchanges.py). Either
        way the send still ends only once its receiver has arrived."""
        m = self.model
        here = wait_site(m.calls).map(same_place).astype(bool).to_numpy()
        at = np.flatnonzero(m.defer_p)
        moves = (here[m.row_p[at]] | here[m.row_p[m.defer_to]]) & np.isin(m.step_p[at], self.steady)
        defer = np.zeros(len(m.row_p), bool)
        defer[at[moves]] = True
        if not defer.any():
            return None
        return self._saving(defer=defer)

    def device_syncs(self, site: str):
        """The host syncs from this callsite (or of this name) removed: the host goes on
        launching at once (device_graph.py)."""
        m = self.model
        return self._saving(skip_syncs=(m.s_site == site) & np.isin(m.s_step, self.steady))

    def without_instances(self, rows: pd.DataFrame):
        """The collective instances named by rows' (group, seq) removed."""
        calls = self.model.calls
        named = pd.MultiIndex.from_arrays([rows["group"].astype(str), rows["seq"].astype(np.int64)])
        mask = pd.MultiIndex.from_arrays([calls["group"].astype(str), calls["seq"].astype(np.int64)]).isin(named)
        return self._saving(skip=frozenset(int(i) for i in self.model.call_inst[mask]))

    def exposed_comm(self):
        """Every collective's transfer takes no time (fully overlapped). On device
        pipeline p2p stays: its wait is the pipeline's, exposed_comm leaves it out."""
        m = self.model
        if not self.device:
            return self._saving(length_ns=np.zeros_like(m.length_ns))
        steady = np.isin(m.k_step, self.steady)
        return self._saving(tail_ns=np.where(steady & ~m.k_p2p, 0.0, m.k_tail))

    def ideal_step_ms(self) -> float | None:
        """Every rank's compute per step at most its stage's median: slowness removed,
        nobody made slower (the replay is monotone: the ideal is never above it;
        raising a fast rank to the median can lengthen a pipeline's critical path).
        The lower median: with two replicas per stage the median is the straggler's and
        its peer's mean (dp2 x pp4: an ideal 478 ms per step short of fixing the straggler)."""
        own = self._per_step()
        median = self._peer_target(lower_median, with_self=True)
        target = np.minimum(median, own.reindex(median.index).fillna(median))
        result = self._saving(work=self._scaled(target))
        return None if result is None else result[1]

    def combined(self, edits: list[dict]):
        """The saving of several what-ifs replayed together: work and host-gap changes
        add up (never below any one edit's), lengths and tails take the shortest,
        removed calls and syncs the union. What the findings' fixes save together,
        their overlaps counted once."""
        m = self.model
        if not edits:
            return 0.0, self.step_ms()
        out = {}
        for key, base in (("work", m.unit_work), ("host_gap_ns", getattr(m, "host_gap_ns", None))):
            mine = [e[key] for e in edits if e.get(key) is not None]
            if mine:
                out[key] = np.maximum(base + sum(x - base for x in mine), np.minimum.reduce(mine))
        for key in ("length_ns", "tail_ns"):
            mine = [e[key] for e in edits if e.get(key) is not None]
            if mine:
                out[key] = np.minimum.reduce(mine)
        out["skip"] = frozenset().union(*(e.get("skip", frozenset()) for e in edits))
        for key in ("skip_syncs", "defer"):
            masks = [e[key] for e in edits if e.get(key) is not None]
            if masks:
                out[key] = np.logical_or.reduce(masks)
        return self._saving(**out)


def covered_ns(starts, ends, window_start, window_end) -> np.ndarray:
    """For each [window_start, window_end] window, the ns the union of the
    [starts, ends) intervals covers inside it (vectorised: prefix sums of the union)."""
    order = np.argsort(starts, kind="stable")
    s, e = merge_intervals(starts[order], ends[order])
    if not len(s):
        return np.zeros(len(window_start))
    before = np.concatenate([[0], np.cumsum(e - s)])

    def covered_before(x):  # ns of the union before time x
        i = np.searchsorted(s, x, side="right")  # intervals starting at or before x
        partial = np.where(i > 0, np.minimum(x, e[np.maximum(i - 1, 0)]) - s[np.maximum(i - 1, 0)], 0)
        return before[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(partial, 0)

    return (covered_before(window_end) - covered_before(window_start)).astype(np.float64)


def lower_median(values, axis=None):
    """The median, or the lower middle value of an even count."""
    return np.percentile(values, 50, method="lower", axis=axis)
