"""The per-rank pass: one rank's folder in, that rank's tables out, touching no
other rank. It is what an engine (diagnose/analysis/rank_pass_engines.py) maps over the
ranks, in this process, in local worker processes or on Dask workers: so it is
a module-level function of plain arguments whose result pickles (Arrow tables,
dicts, strings), and it never raises for bad data (the readers turn every bad
part into a note; the notes travel back and are said in rank order).

Out, per rank: its meta.json, its events and samples as Arrow tables with a
`rank` column (the string columns dictionary-encoded, as the readers hand them
over, except the samples' metric name, which the loader keeps as plain text),
and the warnings reading it produced. With `from_step` (a run over the
loader's event budget), the events of earlier steps are dropped here, on the
worker, so that they never reach the cross-rank pass.
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diagnose.rundir import rank_reader

# string columns the loader turns into pandas categoricals; other dictionary
# columns become plain strings here, on the worker
CATEGORICAL_COLUMNS = ("kind", "name", "group", "group_ranks", "callsite", "detail")


def rank_tables(rank: int, rank_dir: str, from_step: int | None = None) -> tuple:
    """(meta, events or None, samples or None, notes) of one rank; with from_step,
    only the events of steps >= from_step and those outside any step (step -1)."""
    notes = []
    if not os.path.isdir(rank_dir):  # a worker of a cluster that does not share the run's storage
        return {}, None, None, [f"{rank_dir}: not found where the per-rank pass ran "
                                "(do the workers see the run directory at this path?)"]
    meta = rank_reader.read_meta(rank_dir, notes.append)
    events = rank_reader.read_events(rank_dir, notes.append)
    samples = rank_reader.read_samples(rank_dir, lambda message: None)
    if from_step is not None and events is not None:
        step = events.column("step")
        events = events.filter(pc.or_(pc.less(step, 0), pc.greater_equal(step, from_step)))
    return meta, _with_rank(events, rank), _with_rank(samples, rank), notes


def _with_rank(table: pa.Table | None, rank: int) -> pa.Table | None:
    if table is None:
        return None
    for index, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type) and field.name not in CATEGORICAL_COLUMNS:
            table = table.set_column(index, field.name, table.column(index).cast(pa.string()))
    return table.append_column("rank", pa.array(np.full(table.num_rows, rank, np.int32)))
