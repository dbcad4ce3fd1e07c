"""A dependency model of the run's steps on host lanes, replayed with what-if
durations (after "Understanding Stragglers in Large Model Training Using What-if
Analysis", OSDI'25) on the op graph of diagnose/analysis/replay/op_graph.py.

The model, from the matched collectives table:
- each rank's training thread is one lane of points in recorded order: the
  issue of every collective or point-to-point call, the wait of every async
  one, and the end of every step. Between two points the rank works on its
  own: that gap (an edge's weight) keeps its recorded length unless a what-if
  changes it;
- an instance (group, seq: a collective, or the n-th message of a send/recv
  pair, whose two ends are a rendezvous) is two nodes: its arrival, when its
  last member arrived (its call's start), and its end, its recorded length
  after the later of that arrival and the end of the instance before it in its
  group (a group's calls run one after another: DDP's bucket all-reduces queue
  behind each other while backward goes on);
- a blocking point (a sync call, a wait) releases the rank at the later of its
  arrival and the instance's end, plus the recorded time it took to return
  (the point's own duration). DDP's gradient all-reduce on CPU, recorded once
  per backward from the reducer's own timestamps, has no wait call: the reducer
  blocks the end of the backward until its last bucket is done, so that is its
  wait (and, numbered late, it stays off its group's lane).
Replayed with the recorded durations this gives back the recorded step ends
(tests/analysis/test_step_replay.py holds it within 5% per step on the reference
trainer's scenarios); a what-if changes some gaps or instance lengths and
reads the step time off the replay.

Where it is wrong: the ranks' clocks are aligned with an error (an instance
can appear to end before its last member arrived: its length is kept signed,
and so is the gap before an arrival: calls issued together, as batched sends
and receives, start before the first one's return, and keep that offset); a
call whose end the host never saw is taken to end at its wait; work hidden in
a gap (a sync inside user code diagnose does not see) stays as long as
recorded. Device lanes (the GPUs' streams) are diagnose/analysis/replay/device_graph.py.
"""

import numpy as np
import pandas as pd

from diagnose.analysis.replay.instance_table import InstanceTable
from diagnose.analysis.replay.op_graph import NEG_INF, Cycle, OpGraph
from diagnose.analysis.tables.p2p_exchanges import exchange_partners

ISSUE, CALL, WAIT, STEP_END = 0, 1, 2, 3  # point kinds


class StepModel:
    """The lanes and instances of a run's steps (all steps of the recorded window).
    Points are flat arrays sorted by (rank, time); `gaps` and `posts` are per-rank
    views of them."""

    def __init__(self, calls: pd.DataFrame, steps: pd.DataFrame):
        self.ok, self.why = True, ""
        numbered = calls["seq"] >= 0
        calls = calls if numbered.all() else calls[numbered]  # no copy of the run's table when all are
        if calls.empty or steps.empty:
            self.ok, self.why = False, "no matched collectives or steps"
            return
        self._instances(calls)
        self._points(self.calls, steps)
        try:
            self._graph()
        except Cycle as cycle:
            self.ok, self.why = False, f"the recorded order has a cycle: {self.describe(cycle.nodes)}"

    def _instances(self, calls):
        t = InstanceTable(calls)
        self.calls, self.call_inst, self.call_exit = t.calls, t.inst, t.exit_ns
        self.members, self.length_ns, self.frozen = t.members, t.length_ns, t.frozen
        self.recorded_end, self.previous, self.reducer = t.recorded_end, t.previous, t.reducer
        self.last_arrival = t.last_arrival

    def _points(self, c, steps):
        asy = c["async_op"].to_numpy(bool)
        waited = c["wait_start_ns"].notna().to_numpy() & c["wait_end_ns"].notna().to_numpy()
        ddp = self.reducer[self.call_inst] & asy & ~waited
        ret, ext = c["return_ns"].to_numpy(np.int64), self.call_exit
        rank, inst, step = c["rank"].to_numpy(np.int64), self.call_inst, c["step"].to_numpy(np.int64)
        w = asy & waited
        # a blocking send that returned before its receiver arrived did not wait for it
        # (an eager send, buffered by the transport): on the lane it only arrives. A
        # collective cannot end before its last member arrives: there it is clock error
        eager = ~asy & (ret < self.last_arrival[inst]) & (c["name"] == "send").to_numpy(bool)
        row = np.arange(len(c))
        parts = [  # (rank, t, order, kind, release, inst, step, row of calls)
            (rank, c["issue_ns"].to_numpy(np.int64), 0, np.where(asy | eager, ISSUE, CALL), ret, inst, step, row),
            (
                rank[w],
                c["wait_start_ns"].to_numpy()[w].astype(np.int64),
                1,
                WAIT,
                c["wait_end_ns"].to_numpy()[w].astype(np.int64),
                inst[w],
                step[w],
                row[w],
            ),
            # DDP's reducer: a wait from the last gradient computed (the row's return) to its completion
            (rank[ddp], ret[ddp], 1, WAIT, np.maximum(ext[ddp], ret[ddp]), inst[ddp], step[ddp], row[ddp]),
            (
                steps["rank"].to_numpy(np.int64),
                steps["end_ns"].to_numpy(np.int64),
                2,
                STEP_END,
                steps["end_ns"].to_numpy(np.int64),
                -1,
                steps["step"].to_numpy(np.int64),
                -1,
            ),
        ]
        cols = [np.concatenate([np.broadcast_to(np.asarray(p[i]), len(p[0])) for p in parts]) for i in range(8)]
        r, t, o, kind, release, inst, step, row = cols
        order = np.lexsort((np.arange(len(r)), o, t, r))
        self.rank_p, self.t_p, self.kind_p = r[order], t[order], kind[order].astype(np.int8)
        self.release_p, self.inst_p, self.step_p = release[order], inst[order], step[order]
        self.row_p = row[order].astype(np.int32)  # the call row of each point (-1: a step end)
        self._deferrable(c, ddp)
        ranks, first_index = np.unique(self.rank_p, return_index=True)
        bounds = np.append(first_index, len(self.rank_p))
        self.slices = {int(rk): slice(int(a), int(b)) for rk, a, b in zip(ranks, bounds[:-1], bounds[1:])}
        first = steps.groupby("rank")["start_ns"].min()
        self.start_ns = {
            rk: int(min(first.get(rk, self.t_p[s.start]), self.t_p[s.start])) for rk, s in self.slices.items()
        }
        start = np.array([self.start_ns[int(x)] for x in ranks], np.int64)[np.searchsorted(ranks, self.rank_p)]
        blocking = (self.kind_p == CALL) | (self.kind_p == WAIT)
        own_end = np.where(blocking, self.recorded_end[np.maximum(self.inst_p, 0)], np.iinfo(np.int64).min)
        # the cursor is how far the rank's recorded time has got: before each point,
        # the running max of what the points before it reached
        reach = np.maximum.reduce([self.t_p, own_end, self.release_p])
        before = _shifted_running_max(reach, bounds, start)
        self.gap_p = (self.t_p - before).astype(np.float64)
        released_from = np.maximum.reduce([before, self.t_p, own_end])
        self.post_p = np.maximum(self.release_p - released_from, 0).astype(np.float64)
        # the recorded span of each gap, for what-ifs that scale the work inside it
        window_before = _shifted_running_max(np.maximum(self.t_p, self.release_p), bounds, start)
        self.window_p = (window_before, np.maximum(window_before, self.t_p))
        self.gaps = {rk: self.gap_p[s] for rk, s in self.slices.items()}
        self.posts = {rk: self.post_p[s] for rk, s in self.slices.items()}
        # the what-if interface (diagnose/analysis/replay/whatif.py): the units of work a
        # what-if scales are the gaps; the step ends are read off the step-end points
        self.unit_work, self.unit_rank, self.unit_step = self.gap_p, self.rank_p, self.step_p
        at = self.kind_p == STEP_END
        self.end_rank, self.end_step, self.recorded_end_ns = self.rank_p[at], self.step_p[at], self.t_p[at]

    def _deferrable(self, c, ddp):
        """The p2p waits a fix could move (p2p_exchanges.py), as `defer_p` over the
        points (their blocking point) and, per such point in order, `defer_to`: the
        point that would wait it instead: a send and the receive exchanged with it
        become one batch (the earlier's wait moves to the later's), a lone send is
        waited at the lane's last p2p point of its step (the end of its schedule);
        `joined_at`: the later op's issue point of a batch (else -1). Kept per
        deferrable point only: the graph's build is the analysis's peak memory."""
        is_send = (c["name"] == "send").to_numpy()
        partner = exchange_partners(c)
        has, row = self.row_p >= 0, np.maximum(self.row_p, 0)
        p2p = has & (is_send | (c["name"] == "recv").to_numpy())[row]
        blocking = has & ((self.kind_p == CALL) | (self.kind_p == WAIT)) & ~ddp[row]
        block_point = np.full(len(c), -1)
        block_point[self.row_p[blocking]] = np.flatnonzero(blocking)
        # the lane's last p2p point per (rank, step), on a dense (rank, step) grid
        steps = int(self.step_p.max(initial=0)) + 2
        key = self.rank_p * steps + (self.step_p + 1)
        last = np.full(int(key.max(initial=0)) + 1, -1)
        np.maximum.at(last, key[p2p], np.flatnonzero(p2p))
        schedule_end = last[key]
        paired = partner[row] >= 0
        later = np.zeros(len(c), bool)
        later[partner[partner >= 0]] = True
        lone_send = (is_send & ~later)[row] & ~paired
        defer_to = np.where(paired, block_point[np.maximum(partner[row], 0)], np.where(lone_send, schedule_end, -1))
        self.defer_p = blocking & (defer_to > np.arange(len(self.rank_p)))
        self.defer_to = defer_to[self.defer_p].astype(np.int32)
        # posted in the earlier op's call: the later op's own call (its issue point) and
        # the host time before it go with the batch
        arrives = has & ((self.kind_p == ISSUE) | (self.kind_p == CALL))
        issue_point = np.full(len(c), -1)
        issue_point[self.row_p[arrives]] = np.flatnonzero(arrives)
        at = self.defer_p
        self.joined_at = np.where(paired[at], issue_point[np.maximum(partner[row[at]], 0)], -1).astype(np.int32)

    def _graph(self):
        """Nodes: one start per rank, one per point, an arrival and an end per instance."""
        ranks = np.array(sorted(self.slices), np.int64)
        n_r, n_p, n_i = len(ranks), len(self.rank_p), len(self.length_ns)
        self._p0, self._a0, self._e0 = n_r, n_r + n_p, n_r + n_p + n_i
        self._n = n_r + n_p + 2 * n_i
        arrives = (self.kind_p == ISSUE) | (self.kind_p == CALL)
        blocks = (self.kind_p == CALL) | (self.kind_p == WAIT)
        live = ~self.frozen
        has_prev = (self.previous >= 0) & live
        self._masks = {"arrives": arrives, "blocks": blocks, "live": live, "has_prev": has_prev}
        src, dst = self._edge_arrays()
        floor = np.full(self._n, NEG_INF)
        floor[:n_r] = [self.start_ns[int(r)] for r in ranks]
        floor[self._e0 + np.flatnonzero(self.frozen)] = self.recorded_end[self.frozen]
        # weights and durations are set per replay: zero-stride zeros, no memory
        self.graph = OpGraph(self._n, src, dst, np.broadcast_to(0.0, len(src)), np.broadcast_to(0.0, self._n), floor)
        self._deferred_graph = None

    def _edge_arrays(self, deferred=False) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of every edge, in the order replay_points gives weights:
        lane, arrival, release, joined, group, then (`deferred`) each deferrable
        send's end to the point that would wait it. Made when a graph is built,
        not kept (270 MB at 1,024 ranks x 200 steps)."""
        m = self._masks
        index = np.int32 if self._n < 2**31 - 1 else np.int64
        points = (self._p0 + np.arange(len(self.rank_p))).astype(index)
        ranks = np.array(sorted(self.slices), np.int64)
        first = np.r_[True, self.rank_p[1:] != self.rank_p[:-1]]
        prev = np.where(first, np.searchsorted(ranks, self.rank_p), points - 1).astype(index)
        inst = self.inst_p
        insts = np.arange(len(self.length_ns))
        pairs = [
            (prev, points),  # lane
            (prev[m["arrives"]], self._a0 + inst[m["arrives"]]),  # arrival
            (self._e0 + inst[m["blocks"]], points[m["blocks"]]),  # release
            (self._a0 + insts[m["live"]], self._e0 + insts[m["live"]]),  # joined
            (self._e0 + self.previous[m["has_prev"]], self._e0 + insts[m["has_prev"]]),  # group
        ]
        if deferred:
            pairs.append((self._e0 + inst[self.defer_p], self._p0 + self.defer_to))
        return (
            np.concatenate([np.asarray(a, index) for a, _ in pairs]),
            np.concatenate([np.asarray(b, index) for _, b in pairs]),
        )

    def _with_deferred(self) -> OpGraph:
        """The graph plus an edge from each deferrable send's end to the point that
        would wait it (implied by its own wait as recorded). Built on the first replay
        that moves a wait: ~10% more edges, which the other what-ifs do without."""
        if self._deferred_graph is None:
            src, dst = self._edge_arrays(deferred=True)
            self._deferred_graph = OpGraph(
                self._n, src, dst, np.broadcast_to(0.0, len(src)), np.broadcast_to(0.0, self._n), self.graph.floor_ns
            )
        return self._deferred_graph

    def describe(self, nodes) -> str:
        """Graph nodes as the user would name them (a cycle's)."""
        out = []
        for v in nodes[:6]:
            if v >= self._e0:
                out.append(f"end of {self._inst_name(v - self._e0)}")
            elif v >= self._a0:
                out.append(f"arrival at {self._inst_name(v - self._a0)}")
            elif v >= self._p0:
                k = v - self._p0
                out.append(f"rank {self.rank_p[k]} step {self.step_p[k]}")
        return " -> ".join(out) + (" ..." if len(nodes) > 6 else "")

    def _inst_name(self, i) -> str:
        row = self.calls.iloc[int(np.flatnonzero(self.call_inst == i)[0])]
        return f"{row['name']} #{row['seq']} of group {row['group']}"

    def replay_points(self, gap_p=None, length_ns=None, skip=frozenset(), defer=None) -> np.ndarray:
        """Each point's replayed time (the rank's time after it), flat as the points.
        `defer`: points of `defer_p` whose send is waited at the end of the step's
        schedule instead (blocking_async's fix)."""
        gap = self.gap_p if gap_p is None else gap_p
        length = self.length_ns if length_ns is None else length_ns
        skipped = np.zeros(len(self.length_ns), bool)
        if skip:
            skipped[list(skip)] = True
        m, inst = self._masks, np.maximum(self.inst_p, 0)
        on_skipped = skipped[inst] & (self.inst_p >= 0)
        removed = np.where(on_skipped, NEG_INF, 0.0)
        moved = np.zeros(len(self.kind_p), bool) if defer is None else defer & self.defer_p
        joined = np.zeros(len(self.kind_p), bool)
        if moved.any():
            to = self.joined_at[moved[self.defer_p]]
            joined[to[to >= 0]] = True
        gap = np.where(joined, 0.0, gap)
        graph = self._with_deferred() if moved.any() else self.graph

        def weights():  # per edge block, in _edge_arrays' order, one at a time
            yield np.maximum(gap, 0.0)
            yield np.where(on_skipped[m["arrives"]], NEG_INF, gap[m["arrives"]])
            yield np.where(moved, NEG_INF, removed)[m["blocks"]]
            yield np.where(skipped[m["live"]], NEG_INF, 0.0)
            yield np.zeros(int(m["has_prev"].sum()))
            if graph is not self.graph:
                yield removed[self.defer_p]

        weight, at = np.empty(len(graph.edge_src)), 0
        for block in weights():
            weight[at : at + len(block)] = block
            at += len(block)
        dur = np.zeros(self._n)
        dur[self._p0 : self._a0] = np.where(on_skipped | moved | joined, 0.0, self.post_p)
        dur[self._e0 :] = np.where(skipped | self.frozen, 0.0, length)
        return graph.replay(dur_ns=dur, weight_ns=weight)[self._p0 : self._a0]

    def replay_units(self, work=None, length_ns=None, skip=frozenset(), defer=None) -> np.ndarray:
        """The replayed step ends (as end_rank, end_step) with these gaps."""
        return self.replay_points(work, length_ns, skip, defer)[self.kind_p == STEP_END]

    def replay(self, gaps=None, length_ns=None, skip=frozenset(), defer=None) -> dict:
        """rank -> {step: replayed end ns}. `gaps`: rank -> gap array to use;
        `length_ns`: instance lengths; `skip`: instances removed (a sync that goes);
        `defer`: waits moved (replay_points)."""
        gap_p = None
        if gaps is not None:
            gap_p = self.gap_p.copy()
            for r, g in gaps.items():
                gap_p[self.slices[r]] = g
        return self.step_ends(self.replay_points(gap_p, length_ns, skip, defer))

    def step_ends(self, times) -> dict:
        ends = {}
        at = self.kind_p == STEP_END
        for r, s, t in zip(self.rank_p[at], self.step_p[at], times[at]):
            ends.setdefault(int(r), {})[int(s)] = t
        return ends


def _shifted_running_max(values, bounds, start) -> np.ndarray:
    """Per lane (bounds: its first index, then the end), the max of `start` and
    every value before each position."""
    out = np.empty(len(values), np.int64)
    for a, b in zip(bounds[:-1], bounds[1:]):
        running = np.maximum.accumulate(np.maximum(values[a:b], start[a]))
        out[a] = start[a]
        out[a + 1 : b] = running[:-1]
    return out


def job_step_ms(ends: dict, steps: list[int]) -> dict[int, float]:
    """step -> ms from the previous step's last end (all ranks; a step outside
    `steps` too) to this step's last end."""

    def last_end(step):
        times = [e[step] for e in ends.values() if step in e]
        return max(times) if times else None

    out = {}
    for step in sorted(steps):
        t, prev = last_end(step), last_end(step - 1)
        if t is not None and prev is not None:
            out[step] = (t - prev) / 1e6
    return out


def recorded_ends(model: StepModel) -> dict:
    return model.step_ends(model.t_p)
