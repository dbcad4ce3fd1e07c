"""A dependency model of the run's steps, replayed with what-if durations
(after "Understanding Stragglers in Large Model Training Using What-if
Analysis", OSDI'25).

The model, from the matched collectives table:
- each rank's training thread is one lane of points in recorded order: the
  issue of every collective or point-to-point call, the wait of every async
  one, and the end of every step. Between two points the rank works on its
  own: that gap keeps its recorded length unless a what-if changes it;
- an instance (group, seq: a collective, or the n-th message of a send/recv
  pair, whose two ends are a rendezvous) starts when its last member has
  arrived (its call's start) and the instance before it in its group has ended (a group's calls
  run one after another: DDP's bucket all-reduces queue behind each other
  while backward goes on), and lasts its recorded length;
- a blocking point (a sync call, a wait) releases the rank at the later of its
  arrival and the instance's end, plus the recorded time it took to return.
  DDP's gradient all-reduce on CPU, recorded once per backward from the
  reducer's own timestamps, has no wait call: the reducer blocks the end of the
  backward until its last bucket is done, so that is its wait (and, numbered
  late, it stays off its group's lane).
Replayed with the recorded durations this gives back the recorded step ends
(tests/test_step_replay.py holds it within 5% per step on the reference
trainer's scenarios); a what-if changes some gaps or instance lengths and
reads the step time off the replay.

Where it is wrong: the ranks' clocks are aligned with an error (an instance
can appear to end before its last member arrived: its length is kept signed);
a call whose end the host never saw is taken to end at its wait; work hidden in a gap (a sync inside user code diagnose does not see)
stays as long as recorded. On GPU traces the lanes are the GPUs, built by
diagnose/analysis/device_lanes.py (a collective holds its lane until it ends:
communication the GPU overlapped with compute is serialised).
"""
from collections import defaultdict

import numpy as np
import pandas as pd

# beyond this the replay (a Python loop, ~1 s per 10^5 points) is skipped and the
# detectors' estimates stand (1,024 ranks x 200 steps has ~10^7)
MAX_POINTS = 400_000
REDUCER_DETAIL = "ddp backward"  # collectors/instrument/ddp.py: DDP's reducer, one row per backward


class StepModel:
    """The lanes and instances of a run's steps (all steps of the recorded window)."""

    def __init__(self, calls: pd.DataFrame, steps: pd.DataFrame):
        self.ok, self.why = True, ""
        calls = calls[calls["seq"] >= 0]
        if calls.empty or steps.empty:
            self.ok, self.why = False, "no matched collectives or steps"
            return
        if 2 * len(calls) + len(steps) > MAX_POINTS:
            self.ok, self.why = False, f"{len(calls)} calls: too many to replay"
            return
        self._instances(calls)
        self._lanes(self.calls, steps)

    def _instances(self, calls):
        key = list(zip(calls["group"], calls["seq"]))
        calls = calls.assign(_inst=pd.factorize(pd.Series(key, index=calls.index))[0])
        exit_ns = calls["exit_ns"].fillna(calls["return_ns"]).to_numpy(np.int64)
        calls = calls.assign(_exit=exit_ns, _arrival=calls["issue_ns"].astype(np.int64))
        per = calls.groupby("_inst")
        self.members = per["rank"].nunique().to_numpy()
        expected = per["group_ranks"].first().astype(str).str.count(",").to_numpy() + 1
        last_arrival = per["_arrival"].max().to_numpy(np.int64)
        end = per["_exit"].min().to_numpy(np.int64)  # the first member out: the instance is over
        group = per["group"].first().astype(str).to_numpy()
        seq = per["seq"].first().to_numpy()
        # each group's instances in seq order: a lane of their own. DDP's reducer rows
        # are numbered when the next forward reads them, after the calls that followed
        # the backward (a loss all-reduce): out of the group's order, so off its lane
        reducer = (per["detail"].first().astype(str).eq(REDUCER_DETAIL).to_numpy() if "detail" in calls
                   else np.zeros(len(seq), bool))
        self.reducer = reducer
        order = [i for i in np.lexsort((seq, group)) if not reducer[i]]
        self.previous = np.full(len(seq), -1)
        for a, b in zip(order[:-1], order[1:]):
            if group[a] == group[b]:
                self.previous[b] = a
        start = last_arrival.copy()
        for i in order:  # recorded start: the last arrival, or the previous instance's end
            p = self.previous[i]
            if p >= 0:
                start[i] = max(start[i], end[p])
        # signed: an instance recorded as ending before its last member arrived is
        # the ranks' clocks disagreeing (the alignment's error, a few ms on a busy
        # host); the replay keeps that offset rather than inventing a delay
        self.length_ns = (end - start).astype(np.float64)
        # a partial trace set (a member not traced): the instance keeps its recorded end
        self.frozen_end = np.where(self.members < expected, end, -1)
        self.recorded_end = end
        self.calls = calls

    def _lanes(self, calls, steps):
        rows = []  # (rank, time_rec, order, kind, release_rec, inst, step)
        c = calls
        # DDP's reducer on CPU (one row per backward, collectors/instrument/ddp.py's timer)
        # blocks the backward's end until its last bucket is done: a wait from the last
        # gradient computed (the row's return) to that completion (its exit)
        reducer = self.reducer[c["_inst"].to_numpy()]
        for r, issue, ret, ws, we, inst, asy, step, exit_ns, ddp in zip(
                c["rank"], c["issue_ns"], c["return_ns"], c["wait_start_ns"], c["wait_end_ns"],
                c["_inst"], c["async_op"], c["step"], c["_exit"], reducer):
            if asy:
                rows.append((r, issue, 0, "issue", ret, inst, step))
                if ws == ws and we == we:  # waited (not NaN)
                    rows.append((r, int(ws), 1, "wait", int(we), inst, step))
                elif ddp:
                    rows.append((r, int(ret), 1, "wait", max(int(exit_ns), int(ret)), inst, step))
            else:
                rows.append((r, issue, 0, "call", ret, inst, step))
        for r, step, end in zip(steps["rank"], steps["step"], steps["end_ns"]):
            rows.append((r, end, 2, "step_end", end, -1, step))
        rows.sort(key=lambda x: (x[0], x[1], x[2]))
        self.lanes = defaultdict(list)
        for r, t, _, kind, release, inst, step in rows:
            self.lanes[int(r)].append((kind, int(t), int(release), int(inst), int(step)))
        first = steps.groupby("rank")["start_ns"].min()
        self.start_ns = {int(r): int(min(first.get(r, lane[0][1]), lane[0][1])) for r, lane in self.lanes.items()}
        # per point: the gap before it (own work) and what it takes to return after release
        # (the cursor is how far the rank's recorded time has got. A gap is signed:
        # calls issued together, as batched sends and receives, start before the
        # first one's return, and keep that offset in a replay)
        self.gaps, self.posts = {}, {}
        for r, lane in self.lanes.items():
            cursor, gaps, posts = self.start_ns[r], [], []
            for kind, t, release, inst, _ in lane:
                gaps.append(t - cursor)
                cursor = max(cursor, t)
                if kind in ("call", "wait"):
                    cursor = max(cursor, int(self.recorded_end[inst]))
                posts.append(max(release - cursor, 0))
                cursor = max(cursor, release)
            self.gaps[r], self.posts[r] = np.array(gaps, np.float64), np.array(posts, np.float64)

    def gap_windows(self, rank: int):
        """[start, end] recorded ns of each gap of the rank's lane (for what-ifs)."""
        lane, cursor, out = self.lanes[rank], self.start_ns[rank], []
        for kind, t, release, inst, _ in lane:
            out.append((cursor, max(cursor, t)))
            cursor = max(cursor, t, release)
        return out

    def replay(self, gaps=None, length_ns=None, skip=frozenset(), trace=None) -> dict:
        """rank -> {step: replayed end ns}. `gaps`: rank -> gap array to use;
        `length_ns`: instance lengths; `skip`: instances removed (a sync that goes);
        `trace`: a dict to fill with rank -> each point's replayed time (diagnosis)."""
        gaps = gaps or self.gaps
        length = self.length_ns if length_ns is None else length_ns
        n = len(length)
        arrived = np.zeros(n, np.int64)
        last = np.full(n, -np.inf)
        end = np.full(n, np.nan)
        for i in np.flatnonzero(self.frozen_end >= 0):
            end[i] = self.frozen_end[i]
        state = {r: [0, float(self.start_ns[r]), None] for r in self.lanes}  # idx, t, pending ready
        ends = defaultdict(dict)

        def resolve(i):
            """The instance's end, once every member arrived and its group's previous
            instance ended (a chain walked back, then forward: no recursion)."""
            chain, j = [], i
            while j >= 0 and np.isnan(end[j]):
                if j not in skip and arrived[j] < self.members[j]:
                    return None
                chain.append(j)
                j = self.previous[j]
            for j in reversed(chain):
                p = self.previous[j]
                before = end[p] if p >= 0 else -np.inf
                # a removed call takes no time on its group's lane
                end[j] = before if j in skip else max(last[j], before) + length[j]
            return end[i]

        progress = True
        while progress:
            progress = False
            for r, lane in self.lanes.items():
                st = state[r]
                g, post = gaps[r], self.posts[r]
                while st[0] < len(lane):
                    kind, _, _, inst, step = lane[st[0]]
                    k = st[0]
                    ready = st[2] if st[2] is not None else st[1] + g[k]
                    if kind == "step_end":
                        ends[r][step] = st[1] = max(st[1], ready)
                    elif inst in skip:
                        st[1] = max(st[1], ready)  # the call is gone, its return with it
                    elif kind == "issue":
                        arrived[inst] += 1
                        last[inst] = max(last[inst], ready)
                        st[1] = max(st[1], ready) + post[k]
                    elif kind == "call" and st[2] is None:
                        arrived[inst] += 1
                        last[inst] = max(last[inst], ready)
                    if kind in ("call", "wait") and inst not in skip:
                        done = resolve(inst)
                        if done is None:
                            st[2] = ready  # blocked: come back when the others arrive
                            break
                        st[1] = max(st[1], ready, done) + post[k]
                    if trace is not None:
                        trace.setdefault(r, []).append(st[1])
                    st[0], st[2] = k + 1, None
                    progress = True
        if any(state[r][0] < len(lane) for r, lane in self.lanes.items()):
            return {}  # the model deadlocked: the recorded order has a dependency it lacks
        return ends


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
    ends = defaultdict(dict)
    for r, lane in model.lanes.items():
        for kind, t, _, _, step in lane:
            if kind == "step_end":
                ends[r][step] = t
    return ends


def overlap_ns(windows, intervals) -> np.ndarray:
    """For each [a, b] window, the ns of `intervals` ((start, end) sorted by start) inside it."""
    out = np.zeros(len(windows))
    if not len(intervals):
        return out
    starts = np.array([s for s, _ in intervals], np.int64)
    # the first interval that can reach into a window: the running furthest end passes its start
    reach = np.maximum.accumulate(np.array([e for _, e in intervals], np.int64))
    for i, (a, b) in enumerate(windows):
        first, stop = int(np.searchsorted(reach, a, side="right")), int(np.searchsorted(starts, b))
        out[i] = sum(max(0, min(e, b) - max(s, a)) for s, e in intervals[first:stop])
    return out
