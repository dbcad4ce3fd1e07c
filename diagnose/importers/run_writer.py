"""Writing an imported run directory: the step each GPU activity belongs to, the
clock anchors of an imported rank, and the rank folders in the layout of
docs/run-directory.md (an imported run is analysed like a recorded one).

Each NCCL kernel also yields a "collective" row (start = end = kernel start,
async) and a "done" row at kernel end, keyed by process group and per-group
sequence number, so cross-rank matching (diagnose.analysis.tables.matching) runs on GPU
times: arrival = when the rank's GPU reached the collective.
"""

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.part_writer import PartWriter, atomic_write_json
from collectors.schema import events_table, rank_dir_name
from diagnose import rundir
from diagnose.errors import UserError


def assign_steps(step_starts_ns: np.ndarray, step_numbers: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Step in progress at each time: the last step that started at or before it
    (a step lasts until the next one starts), -1 before the first."""
    if len(step_starts_ns) == 0:
        return np.full(len(t_ns), -1, dtype=np.int64)
    order = np.argsort(step_starts_ns)
    starts, numbers = step_starts_ns[order], step_numbers[order]
    idx = np.searchsorted(starts, t_ns, side="right") - 1
    return np.where(idx >= 0, numbers[np.clip(idx, 0, None)], -1)


def launch_bound_ns(launch_ns: np.ndarray, known: np.ndarray, starts_ns: np.ndarray, streams) -> np.ndarray:
    """Per GPU activity, when it was launched, to choose its step by: its launch where
    the trace holds it (`known`), else the earlier of its own start and the launch of
    the next activity on its stream whose launch the trace holds (a stream runs in
    launch order). Where the GPU runs behind the host, an activity launched before
    the trace began starts in a later host step than its launch (TraceLens's MI300
    rank: NCCL kernels of the step before the first ran 2-30 ms into the trace; by
    their start, half of them were counted in the second step, whose kernels'
    span doubled)."""
    launch_ns = np.asarray(launch_ns, np.int64)
    if len(launch_ns) == 0 or np.all(known):
        return launch_ns
    streams, starts_ns, known = np.asarray(streams), np.asarray(starts_ns), np.asarray(known, bool)
    bound = np.full_like(launch_ns, np.iinfo(np.int64).max)
    for stream in np.unique(streams):  # a few streams a rank (the recorder's path has no pandas)
        on = np.flatnonzero(streams == stream)
        on = on[np.argsort(starts_ns[on], kind="stable")]
        later = np.where(known[on], launch_ns[on], np.iinfo(np.int64).max)
        bound[on] = np.minimum.accumulate(later[::-1])[::-1]
    return np.where(known, launch_ns, np.minimum(launch_ns, bound))


def clock_meta(wall_anchor_ns: int = 0, mono_anchor_ns: int = 0) -> dict:
    """Imported times are absolute (wall clock or the profiler's session base);
    ranks are put on one clock through these anchors (diagnose.analysis.load.clock_align)."""
    return {
        "mono_anchor_ns": int(mono_anchor_ns),
        "wall_anchor_ns": int(wall_anchor_ns),
        "offset_to_rank0_ns": None,
        "offset_error_ns": None,
        "offset_method": "import",
    }


class RunDirWriter:
    """Creates the run directory (refusing a non-empty one) and writes ranks."""

    def __init__(self, out_dir: str, fmt: str, sources: list):
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            raise UserError(f"--out {out_dir} is not empty; choose a new directory")
        self.run_dir = rundir.prepare_out_dir(out_dir)
        self.fmt = fmt
        self.sources = [os.path.abspath(s) for s in sources]
        self.ranks: dict = {}
        self.events_total = 0

    def write_rank(self, rank: int, rows, meta: dict) -> None:
        """rows: event tuples, or an Arrow table in collectors.schema's EVENT_SCHEMA."""
        writer = PartWriter(os.path.join(self.run_dir, rundir.TRACES, rank_dir_name(rank)))
        if isinstance(rows, list):
            writer.write_events(rows)
        else:
            writer.write_events_table(rows)
        self._add_meta(writer, rank, meta, len(rows))

    def adopt_rank(self, rank: int, events_file: str, events: int, meta: dict) -> None:
        """The rank's events as a Parquet file already written (by a worker process), moved in."""
        writer = PartWriter(os.path.join(self.run_dir, rundir.TRACES, rank_dir_name(rank)))
        writer.adopt_events_file(events_file)
        self._add_meta(writer, rank, meta, events)

    def _add_meta(self, writer: PartWriter, rank: int, meta: dict, events: int) -> None:
        writer.write_meta({"rank": rank, "imported": self.fmt, **meta})
        self.ranks[rank] = events
        self.events_total += events

    def finish(self, extra: dict | None = None) -> str:
        now = time.time_ns()
        rundir.write_manifest(
            self.run_dir,
            {
                "name": os.path.basename(self.run_dir),
                "command": f"diagnose import {self.fmt}",
                "argv": ["diagnose", "import", self.fmt, *self.sources],
                "imported_from": self.sources,
                "format": self.fmt,
                "world_size": len(self.ranks),
                "ranks_seen": sorted(self.ranks),
                "start_wall_ns": now,
                "end_wall_ns": now,
                "exit_status": 0,
                **(extra or {}),
            },
        )
        return self.run_dir


def append_rank_events(rank_dir: str, rows, tag: str) -> str | None:
    """Add rows (event tuples, or an Arrow table in collectors.schema's
    EVENT_SCHEMA) to an existing rank folder as `events-<tag>-NNNNNN.parquet`,
    beside the recorder's own parts (names that can never collide with them)."""
    if not len(rows):
        return None
    index = 1 + sum(1 for n in os.listdir(rank_dir) if n.startswith(f"events-{tag}-"))
    path = os.path.join(rank_dir, f"events-{tag}-{index:06d}.parquet")
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(rows if isinstance(rows, pa.Table) else events_table(rows), tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def write_json(path: str, obj) -> None:
    atomic_write_json(path, obj)
