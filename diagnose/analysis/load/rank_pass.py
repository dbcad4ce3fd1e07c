"""The per-rank pass: a few ranks' folders in, their tables out, touching no
other rank. It is what an engine (diagnose/analysis/load/rank_pass_engines.py) maps
over the run's ranks, a task per batch of ranks (ranks_per_task), in this
process, in local worker processes or on Dask workers: so it is a module-level
function of plain arguments whose result pickles (Arrow tables, pandas frames,
dicts, strings), and it never raises for bad data (the readers turn every bad
part into a note; the notes travel back and are said in rank order).

Out, per rank: its meta.json, its events and samples as Arrow tables with a
`rank` column (the string columns dictionary-encoded, as the readers hand them
over, except the samples' metric name, which the loader keeps as plain text),
and the warnings reading it produced. Out, per batch: the compact step tables
of its ranks, the steps and the breakdown (a rank's breakdown needs only its
own events: diagnose/analysis/tables/breakdown.py), over every step the ranks
recorded. With `from_step` (a run over the loader's event budget), the events
of earlier steps are dropped here, on the worker, after the step tables are
made: they never reach the cross-rank pass, and the step tables still cover
the whole run.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from diagnose.analysis.tables.breakdown import step_breakdown
from diagnose.analysis.tables.inferred_compute import with_inferred_rows
from diagnose.analysis.tables.matching import CATEGORICAL_COLUMNS
from diagnose.analysis.tables.step_tables import steps_table
from diagnose.rundir import rank_reader, storage

# dictionary columns not in CATEGORICAL_COLUMNS (the ones the loader turns into
# pandas categoricals) become plain strings here, on the worker


# the columns the step tables read
STEP_TABLE_COLUMNS = ("rank", "kind", "name", "group", "detail", "step", "start_ns", "end_ns")
# Ranks per task: the step tables cost ~7 ms per rank made one rank at a time (pandas'
# fixed costs) and ~2.4 ms per rank made 256 at once; one task per rank up to 64 ranks
# (a lost worker costs the fewest ranks), then up to 32 per task.
MAX_RANKS_PER_TASK = 32


def ranks_per_task(ranks: int) -> int:
    return max(1, min(MAX_RANKS_PER_TASK, ranks // 64))


def rank_batch(batch: list, from_step: int | None = None, to_step: int | None = None) -> tuple:
    """The pass over `batch`, (rank, rank_dir) pairs: (per rank (meta, has events,
    notes) in batch order, the batch's events or None, samples or None, steps,
    breakdown). With from_step, only the events of steps >= from_step and those
    outside any step (step -1): the step tables keep every step (the event
    budget's last steps). With to_step too, only steps from_step-to_step, the
    step tables' too (one window of `diagnose analyze --every-step`)."""
    per_rank, events, samples = [], [], []
    for rank, rank_dir in batch:
        meta, rank_events, rank_samples, notes = rank_tables(rank, rank_dir)
        per_rank.append((meta, rank_events is not None, notes))
        if rank_events is not None:
            events.append(rank_events)
        if rank_samples is not None:
            samples.append(rank_samples)
    events = pa.concat_tables(events, promote_options="none") if events else None
    if to_step is not None:
        events = _steps_only(events, from_step, to_step)
    steps, breakdown = step_tables(events)
    if to_step is None:
        events = _steps_only(events, from_step, None)
    samples = pa.concat_tables(samples, promote_options="none") if samples else None
    return per_rank, events, samples, steps, breakdown


def _steps_only(events: pa.Table | None, from_step: int | None, to_step: int | None) -> pa.Table | None:
    """The rows of steps from_step-to_step (None: no bound) and those outside any step."""
    if events is None or from_step is None:
        return events
    step = events.column("step")
    inside = pc.greater_equal(step, from_step)
    if to_step is not None:
        inside = pc.and_(inside, pc.less_equal(step, to_step))
    return events.filter(pc.or_(pc.less(step, 0), inside))


def step_tables(events: pa.Table | None) -> tuple:
    """(steps, breakdown) of the ranks in `events` (None: none), as the loader's
    Run.steps() and Run.breakdown(), on each rank's own clock."""
    if events is None:
        return None, None
    frame = events.select(list(STEP_TABLE_COLUMNS)).unify_dictionaries().to_pandas(use_threads=False)
    steps = steps_table(frame)
    return steps, step_breakdown(frame, steps)


def rank_tables(rank: int, rank_dir: str) -> tuple:
    """(meta, events or None, samples or None, notes) of one rank."""
    notes = []
    if not storage.isdir(rank_dir):  # a worker of a cluster that does not share the run's storage
        return (
            {},
            None,
            None,
            [f"{rank_dir}: not found where the per-rank pass ran (do the workers see the run directory at this path?)"],
        )
    meta = rank_reader.read_meta(rank_dir, notes.append)
    events = rank_reader.read_events(rank_dir, notes.append)
    samples = rank_reader.read_samples(rank_dir, lambda message: None)
    events = _with_rank(events, rank)
    # a pipeline rank without compute rows: forward and backward from its traffic
    return meta, events if events is None else with_inferred_rows(events), _with_rank(samples, rank), notes


def _with_rank(table: pa.Table | None, rank: int) -> pa.Table | None:
    if table is None:
        return None
    for index, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type) and field.name not in CATEGORICAL_COLUMNS:
            table = table.set_column(index, field.name, table.column(index).cast(pa.string()))
    return table.append_column("rank", pa.array(np.full(table.num_rows, rank, np.int32)))


def in_rank_order(frames: list, empty, order: list) -> pd.DataFrame:
    """The per-task step tables as one, in rank order (a multi-node run's tasks
    need not come in it); empty() when there are none."""
    if not frames:
        return empty()
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(frames) > 1 and not frame["rank"].is_monotonic_increasing:
        frame = frame.sort_values(order, kind="stable", ignore_index=True)
    return frame
