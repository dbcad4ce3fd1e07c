"""Per-rank work on NumPy arrays sorted by rank: a rank's rows are one slice,
found by binary search. On 1,024 ranks a pandas groupby loop costs seconds of
overhead alone (frames built and sliced per rank); these loops cost milliseconds."""

import numpy as np
import pandas as pd


def sorted_by_rank(rank: np.ndarray, time: np.ndarray, *more: np.ndarray) -> tuple:
    """(rank, time, *more) sorted by rank, then time."""
    order = np.lexsort((time, rank))
    return tuple(a[order] for a in (rank, time, *more))


def rank_slice(sorted_rank: np.ndarray, r: int, *columns: np.ndarray) -> tuple:
    """Rank r's rows of columns sorted by rank (sorted_rank is their rank column)."""
    a, b = np.searchsorted(sorted_rank, [r, r + 1])
    return tuple(c[a:b] for c in columns)


def started_inside(rows: pd.DataFrame, windows: pd.DataFrame) -> np.ndarray:
    """Whether each row's start_ns falls in a window of its own rank: the last
    window begun by then has not ended (a row at a window's end is inside)."""
    rank, start = rows["rank"].to_numpy(np.int64), rows["start_ns"].to_numpy(np.int64)
    w_rank, w_start, w_end = sorted_by_rank(
        windows["rank"].to_numpy(np.int64), windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64)
    )
    inside = np.zeros(len(rows), dtype=bool)
    by_rank = np.argsort(rank, kind="stable")
    ranks, first = np.unique(rank[by_rank], return_index=True)
    for r, mine in zip(ranks, np.split(by_rank, first[1:])):
        starts, ends = rank_slice(w_rank, r, w_start, w_end)
        if len(starts):
            idx = np.searchsorted(starts, start[mine], side="right") - 1
            inside[mine] = (idx >= 0) & (start[mine] <= ends[np.clip(idx, 0, None)])
    return inside
