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

from diagnose.analysis.tables.device_collectives import timed_on_device
from diagnose.analysis.tables.per_rank import rank_slice, sorted_by_rank

CATEGORIES = ("data_wait", "exposed_comm", "pipeline_wait", "host_sync", "optimizer", "backward", "forward")
PART_COLUMNS = tuple(f"{c}_ms" for c in CATEGORIES) + ("other_ms",)
WAITING_CATEGORIES = ("data_wait", "exposed_comm", "pipeline_wait", "host_sync")
# The parts as shown (reports, compare): compute at the bottom of a stack, "other" on top.
PARTS = tuple(reversed(CATEGORIES)) + ("other",)
PART_LABELS = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "host_sync": "host sync",
    "pipeline_wait": "pipeline wait (p2p)",
    "exposed_comm": "exposed comm",
    "data_wait": "data wait",
    "other": "other",
}
_PHASE_CATEGORY = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "data": "data_wait",
    "data_wait": "data_wait",
    "send": "pipeline_wait",
    "recv": "pipeline_wait",
    "p2p": "pipeline_wait",
    "grad_sync": "exposed_comm",
}
_KIND_CATEGORY = {
    "data": "data_wait",
    "wait": "exposed_comm",
    "sync": "host_sync",
    "optimizer": "optimizer",
    "backward": "backward",
    "forward": "forward",
}
PRIORITY = {c: i for i, c in enumerate(CATEGORIES)}


def _codes(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values): series == values[codes], with code -1 (and a trailing
    sentinel in `values`) for missing. Categoricals cost nothing here; string
    tests then run once per distinct value instead of once per row."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        values = np.asarray(series.cat.categories.astype(str), dtype=object)
        codes = series.cat.codes.to_numpy()
    else:
        codes, uniques = pd.factorize(series.astype(str), use_na_sentinel=True)
        values = np.asarray(uniques, dtype=object)
    return codes, np.append(values, "nan")


def _lookup(codes: np.ndarray, values: np.ndarray, fn, dtype=bool) -> np.ndarray:
    """fn of each row's value, evaluated once per distinct value."""
    return np.array([fn(v) for v in values], dtype=dtype)[codes]


def priorities(events: pd.DataFrame) -> np.ndarray:
    """Index into CATEGORIES of each event's category, -1 for none (see categorize)."""
    kind_codes, kinds = _codes(events["kind"])
    prio = _lookup(kind_codes, kinds, lambda k: PRIORITY.get(_KIND_CATEGORY.get(k), -1), np.int8)
    is_phase = _lookup(kind_codes, kinds, lambda k: k == "phase")
    if is_phase.any():
        name_codes, names = _codes(events["name"])
        by_name = _lookup(name_codes, names, lambda n: PRIORITY.get(_PHASE_CATEGORY.get(n), -1), np.int8)
        prio[is_phase] = by_name[is_phase]
    collective = _lookup(kind_codes, kinds, lambda k: k == "collective")
    prio[collective & ~_is_ddp(events)] = PRIORITY["exposed_comm"]
    group_codes, groups = _codes(events["group"])
    p2p = _lookup(kind_codes, kinds, lambda k: k == "p2p") | (
        _lookup(kind_codes, kinds, lambda k: k == "wait") & _lookup(group_codes, groups, lambda g: "->" in g)
    )
    prio[p2p] = PRIORITY["pipeline_wait"]
    # rows timed on the device (a GPU trace's NCCL kernels, a live run's CUDA
    # events) are not the host's time: the breakdown is the host's
    prio[timed_on_device(events["detail"])] = -1
    return prio


def categorize(events: pd.DataFrame) -> pd.Series:
    """Each event's breakdown category (NaN: none): kind, or for explicit phases
    their name; blocking collectives are exposed_comm, point-to-point pipeline_wait."""
    names = np.array(list(CATEGORIES) + [np.nan], dtype=object)
    return pd.Series(names[priorities(events)], index=events.index)


def _is_ddp(events: pd.DataFrame) -> np.ndarray:
    codes, details = _codes(events["detail"])
    return _lookup(codes, details, lambda d: d.startswith("ddp"))


def ddp_tail_intervals(events: pd.DataFrame) -> pd.DataFrame:
    """[last bucket issue, min(last bucket done, end of backward)] per backward with buckets.
    A DDP row's end is when its issuing ended: the return of a bucket's async
    all-reduce (timing hook), or the last gradient computed (DDP's timer). A rank
    without backward rows (DIAGNOSE_COMPUTE_ROWS=0, or a trace stripped of them)
    uses its steps instead: DDP's backward returns only once its last bucket is
    done, so the step's last issue to that bucket's end is the wait all the same."""
    kind_codes, kinds = _codes(events["kind"])
    ddp = _is_ddp(events)
    bucket = _lookup(kind_codes, kinds, lambda k: k == "collective") & ddp
    backward = _lookup(kind_codes, kinds, lambda k: k == "backward")
    rank = events["rank"].to_numpy(np.int64)
    steps = _lookup(kind_codes, kinds, lambda k: k == "step")
    backward |= steps & ~np.isin(rank, np.unique(rank[backward]))
    if not bucket.any() or not backward.any():
        return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": []})
    done = _lookup(kind_codes, kinds, lambda k: k == "done") & ddp
    start, end = events["start_ns"].to_numpy(np.int64), events["end_ns"].to_numpy(np.int64)
    # each kind's rows sorted by (rank, time): a rank's rows are then one slice
    bwd_rank, bwd_start, bwd_end = sorted_by_rank(rank[backward], start[backward], end[backward])
    bucket_rank, bucket_issue = sorted_by_rank(rank[bucket], end[bucket])
    done_rank, done_at = sorted_by_rank(rank[done], start[done])
    rows = []
    for r in np.unique(bucket_rank):
        starts, ends = rank_slice(bwd_rank, r, bwd_start, bwd_end)
        if len(starts) == 0:
            continue
        (issue,) = rank_slice(bucket_rank, r, bucket_issue)
        which = np.searchsorted(starts, issue, side="right") - 1
        inside = (which >= 0) & (issue <= ends[np.clip(which, 0, None)])
        if not inside.any():
            continue
        # per backward holding a bucket: the last issue among buckets issued since it began
        held = np.unique(which[inside])
        last_issue = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_issue, which[which >= 0], issue[which >= 0])
        last_issue, bwd_end_held = last_issue[held], ends[held]
        # the latest bucket completion by the end of the backward, if after that issue
        tail_end = bwd_end_held
        (rank_done,) = rank_slice(done_rank, r, done_at)
        if len(rank_done):
            j = np.searchsorted(rank_done, bwd_end_held + 1, side="right") - 1
            latest = rank_done[np.clip(j, 0, None)]
            tail_end = np.where((j >= 0) & (latest >= last_issue), np.minimum(bwd_end_held, latest), bwd_end_held)
        keep = tail_end > last_issue
        rows.append((np.full(int(keep.sum()), r), last_issue[keep], tail_end[keep]))
    if not rows:
        return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": []})
    return pd.DataFrame(
        {name: np.concatenate(column) for name, column in zip(("rank", "start_ns", "end_ns"), zip(*rows))}
    )


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for int64 (numpy 2's hash-based unique is ~5x slower here)."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _paint(intervals: list, step_starts: np.ndarray, step_ends: np.ndarray) -> np.ndarray:
    """ms per (step, category) for one rank; intervals[c] = (starts, ends) in priority order."""
    bounds = _sorted_unique(np.concatenate([step_starts, step_ends] + [a for s, e in intervals for a in (s, e)]))
    n_seg = len(bounds) - 1
    parts = np.zeros((len(step_starts), len(intervals)))
    if n_seg <= 0:
        return parts
    top = np.full(n_seg, -1)
    for prio in range(len(intervals) - 1, -1, -1):
        starts, ends = intervals[prio]
        if len(starts) == 0:
            continue
        cover = np.bincount(np.searchsorted(bounds, starts), minlength=len(bounds) + 1) - np.bincount(
            np.searchsorted(bounds, ends), minlength=len(bounds) + 1
        )
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
    prio = priorities(events)
    keep = prio >= 0
    rank = events["rank"].to_numpy()[keep].astype(np.int64)
    start = events["start_ns"].to_numpy()[keep].astype(np.int64)
    end = events["end_ns"].to_numpy()[keep].astype(np.int64)
    prio = prio[keep]
    tails = ddp_tail_intervals(events)
    if not tails.empty:
        rank = np.concatenate([rank, tails["rank"].to_numpy(np.int64)])
        start = np.concatenate([start, tails["start_ns"].to_numpy(np.int64)])
        end = np.concatenate([end, tails["end_ns"].to_numpy(np.int64)])
        prio = np.concatenate([prio, np.full(len(tails), PRIORITY["exposed_comm"], np.int8)])
    # one sort by (rank, category): each rank's intervals per category are then slices
    order = np.lexsort((prio, rank))
    rank, start, end, prio = rank[order], start[order], end[order], prio[order]
    n_cat = len(CATEGORIES)
    key = rank * n_cat + prio
    step_rank, step_start, step_end, step_order = sorted_by_rank(
        steps["rank"].to_numpy(np.int64),
        steps["start_ns"].to_numpy(np.int64),
        steps["end_ns"].to_numpy(np.int64),
        np.arange(len(steps)),
    )
    ranks, first = np.unique(step_rank, return_index=True)
    last = np.append(first[1:], len(step_rank))
    category_bounds = np.searchsorted(key, ranks[:, None] * n_cat + np.arange(n_cat + 1))
    empty = (np.empty(0, np.int64), np.empty(0, np.int64))
    parts = np.zeros((len(step_rank), n_cat))
    for a, b, bounds in zip(first, last, category_bounds):
        intervals = [(start[i:j], end[i:j]) if j > i else empty for i, j in zip(bounds[:-1], bounds[1:])]
        parts[a:b] = _paint(intervals, step_start[a:b], step_end[a:b])
    table = pd.DataFrame(parts, columns=[f"{c}_ms" for c in CATEGORIES])
    table.insert(0, "step_ms", (step_end - step_start) / 1e6)
    table.insert(0, "step", steps["step"].to_numpy()[step_order])
    table.insert(0, "rank", step_rank)
    table["other_ms"] = (table["step_ms"] - parts.sum(axis=1)).clip(lower=0)
    return table[columns]


def busy_ms(breakdown: pd.DataFrame) -> pd.Series:
    """Time a rank was not waiting: the step minus data wait, exposed
    communication, pipeline (p2p) wait and host syncs (= forward + backward +
    optimizer + other)."""
    waiting = sum(breakdown[f"{c}_ms"] for c in WAITING_CATEGORIES if f"{c}_ms" in breakdown.columns)
    return breakdown["step_ms"] - waiting
