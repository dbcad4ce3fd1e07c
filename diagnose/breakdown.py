"""Where each rank's step time goes, as exclusive parts that sum to the step.

Every instant of a step is given to the highest-priority category active then:

    data_wait > exposed_comm > pipeline_wait > host_sync > optimizer > backward > forward > other

so a blocking all-reduce inside forward (tensor parallel) counts as exposed
communication, not forward, and whatever no range covers is "other" (Python
glue, logging, the user's own code). pipeline_wait is time blocked in
point-to-point sends/receives: in a pipeline that is mostly waiting for the
neighbouring stage (the bubble), not the cost of moving bytes, so it is kept
apart from collective communication. Communication that runs in the background
and is hidden behind compute does not appear; exposed_comm is the time the
training thread is blocked in communication: blocking calls, Work.wait, and
DDP's tail (from the last bucket's issue to the end of backward, while the
reducer waits for buckets still in flight).
"""
import numpy as np
import pandas as pd

CATEGORIES = ("data_wait", "exposed_comm", "pipeline_wait", "host_sync", "optimizer", "backward",
              "forward")
PART_COLUMNS = tuple(f"{c}_ms" for c in CATEGORIES) + ("other_ms",)
_PHASE_CATEGORY = {"forward": "forward", "backward": "backward", "optimizer": "optimizer",
                   "data": "data_wait", "data_wait": "data_wait", "send": "pipeline_wait",
                   "recv": "pipeline_wait", "p2p": "pipeline_wait", "grad_sync": "exposed_comm"}
_KIND_CATEGORY = {"data": "data_wait", "wait": "exposed_comm", "sync": "host_sync",
                  "optimizer": "optimizer", "backward": "backward", "forward": "forward"}


def categorize(events: pd.DataFrame) -> pd.Series:
    kind = events["kind"].astype(str)
    category = kind.map(_KIND_CATEGORY)
    is_phase = kind == "phase"
    category[is_phase] = events.loc[is_phase, "name"].astype(str).map(_PHASE_CATEGORY)
    blocking_call = (kind == "collective") & ~events["detail"].astype(str).str.startswith("ddp")
    category[blocking_call] = "exposed_comm"
    is_p2p = (kind == "p2p") | ((kind == "wait") & events["group"].astype(str).str.contains("->", regex=False))
    category[is_p2p] = "pipeline_wait"
    return category


def ddp_tail_intervals(events: pd.DataFrame) -> pd.DataFrame:
    """[last bucket issue, min(last bucket done, end of backward)] per backward with buckets."""
    buckets = events[(events["kind"] == "collective") & events["detail"].astype(str).str.startswith("ddp")]
    backward = events[events["kind"] == "backward"]
    if buckets.empty or backward.empty:
        return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": []})
    dones = events[(events["kind"] == "done") & events["detail"].astype(str).str.startswith("ddp")]
    rows = []
    for rank, rank_buckets in buckets.groupby("rank", observed=True):
        bwd = backward[backward["rank"] == rank].sort_values("start_ns")
        starts, ends = bwd["start_ns"].to_numpy(), bwd["end_ns"].to_numpy()
        issue = rank_buckets["start_ns"].to_numpy()
        which = np.searchsorted(starts, issue, side="right") - 1
        inside = (which >= 0) & (issue <= ends[np.clip(which, 0, None)])
        rank_done = dones[dones["rank"] == rank]["start_ns"].to_numpy()
        for b in np.unique(which[inside]):
            last_issue = issue[which == b].max()
            done_after = rank_done[(rank_done >= last_issue) & (rank_done <= ends[b] + 1)]
            end = min(ends[b], done_after.max()) if len(done_after) else ends[b]
            if end > last_issue:
                rows.append((rank, last_issue, end))
    return pd.DataFrame(rows, columns=["rank", "start_ns", "end_ns"])


def _paint(intervals: list, step_starts: np.ndarray, step_ends: np.ndarray) -> np.ndarray:
    """ms per (step, category) for one rank; intervals[c] = (starts, ends) in priority order."""
    bounds = np.unique(np.concatenate([step_starts, step_ends] +
                                      [a for s, e in intervals for a in (s, e)]))
    n_seg = len(bounds) - 1
    parts = np.zeros((len(step_starts), len(intervals)))
    if n_seg <= 0:
        return parts
    top = np.full(n_seg, -1)
    for prio in range(len(intervals) - 1, -1, -1):
        starts, ends = intervals[prio]
        if len(starts) == 0:
            continue
        cover = np.zeros(len(bounds) + 1, dtype=np.int64)
        np.add.at(cover, np.searchsorted(bounds, starts), 1)
        np.add.at(cover, np.searchsorted(bounds, ends), -1)
        top[np.cumsum(cover)[:n_seg] > 0] = prio
    seg_start, seg_len = bounds[:-1], np.diff(bounds)
    step_of = np.searchsorted(step_starts, seg_start, side="right") - 1
    in_step = (step_of >= 0) & (seg_start < step_ends[np.clip(step_of, 0, None)]) & (top >= 0)
    np.add.at(parts, (step_of[in_step], top[in_step]), seg_len[in_step] / 1e6)
    return parts


def step_breakdown(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    columns = ["rank", "step", "step_ms", *PART_COLUMNS]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    category = categorize(events)
    timed = pd.DataFrame({"rank": events["rank"], "start_ns": events["start_ns"],
                          "end_ns": events["end_ns"], "category": category}).dropna()
    tails = ddp_tail_intervals(events)
    if not tails.empty:
        tails["category"] = "exposed_comm"
        timed = pd.concat([timed, tails], ignore_index=True)
    by_rank = {rank: frame for rank, frame in timed.groupby("rank", observed=True)}
    out = []
    for rank, rank_steps in steps.groupby("rank"):
        rank_steps = rank_steps.sort_values("start_ns")
        step_starts = rank_steps["start_ns"].to_numpy(np.int64)
        step_ends = rank_steps["end_ns"].to_numpy(np.int64)
        frame = by_rank.get(rank)
        intervals = []
        for cat in CATEGORIES:
            sel = frame[frame["category"] == cat] if frame is not None else None
            if sel is None or sel.empty:
                intervals.append((np.empty(0, np.int64), np.empty(0, np.int64)))
            else:
                intervals.append((sel["start_ns"].to_numpy(np.int64), sel["end_ns"].to_numpy(np.int64)))
        parts = _paint(intervals, step_starts, step_ends)
        table = pd.DataFrame(parts, columns=[f"{c}_ms" for c in CATEGORIES])
        table.insert(0, "step_ms", (step_ends - step_starts) / 1e6)
        table.insert(0, "step", rank_steps["step"].to_numpy())
        table.insert(0, "rank", rank)
        table["other_ms"] = (table["step_ms"] - table[[f"{c}_ms" for c in CATEGORIES]].sum(axis=1)).clip(lower=0)
        out.append(table)
    return pd.concat(out, ignore_index=True)[columns]
