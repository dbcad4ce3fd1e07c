"""The on-disk event and sample schema shared by writers (collectors, importers) and the loader.

One row per recorded thing. Times are the rank's own monotonic clock in ns; the
loader aligns them to rank 0 with the offsets in meta.json. Integer "absent"
values are -1, string ones "". Strings are dictionary-encoded by Parquet, so a
repeated callsite costs a few bits per row.

The format reference is docs/run-directory.md (what each column means per kind,
and SCHEMA_VERSION: a bump is described there in the change that makes it).
"""

from collections import namedtuple
from operator import itemgetter

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1

# Event kinds. A "collective"/"p2p" row is the call (issue -> return); for async
# work, a "wait" row (the Work.wait call) and a "done" row (completion seen by a
# future callback, start_ns == end_ns) follow with the same group and seq.
# "stream_wait" (imported traces): one stream told to wait for an event recorded
# on another (cudaStreamWaitEvent), the replay's cross-stream edge
# (docs/run-directory.md). Appended last: exporters number kinds by position.
KINDS = (
    "step",
    "forward",
    "backward",
    "optimizer",
    "data",
    "collective",
    "p2p",
    "wait",
    "done",
    "sync",
    "phase",
    "kernel",
    "error",
    "mark",
    "checkpoint",
    "stream_wait",
)
# The class of a "kernel" row (its `detail`): HTA's kernel types, so that HTA's
# temporal breakdown can be reproduced (diagnose.importers.gpu_activity).
COMPUTE, COMMUNICATION, MEMORY, OTHER = "compute", "communication", "memory", "other"
KERNEL_CLASSES = (COMPUTE, COMMUNICATION, MEMORY, OTHER)

EVENT_FIELDS = (
    ("kind", pa.string()),
    ("name", pa.string()),
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("step", pa.int32()),
    ("microbatch", pa.int32()),
    ("stage", pa.int32()),
    ("group", pa.string()),  # process-group name, or "SRC->DST" for p2p
    ("group_ranks", pa.string()),  # "0,1,2,3": global ranks of the group
    ("seq", pa.int64()),  # per-group sequence number (Flight Recorder style)
    ("peer", pa.int32()),  # p2p peer global rank
    ("bytes", pa.int64()),
    ("async_op", pa.bool_()),
    ("callsite", pa.string()),  # "path/to/file.py:LINE" of the first user frame
    ("detail", pa.string()),  # free-form: device of a sync, "ddp" for bucket hooks, error text
    ("queued_ns", pa.int64()),  # phase, forward, backward, optimizer: ns its thread waited for a core (core_wait)
)
EVENT_SCHEMA = pa.schema(EVENT_FIELDS)
EVENT_COLUMNS = tuple(name for name, _ in EVENT_FIELDS)
# One event row, its fields named after the columns (a field added anywhere moves
# no reader: they read row.seq, or fields("seq")(row), never a position). Rows are
# written as plain tuples in EVENT_COLUMNS order (orjson writes them natively); the
# hot paths that read their own rows back read them with `fields`, code off the hot
# path as an EventRow: new_row(EventRow, row), one C call (EventRow(...) runs a
# Python __new__; bench/results/2026-12-06-typed-event-records.md).
EventRow = namedtuple("EventRow", EVENT_COLUMNS)
new_row = tuple.__new__
COLUMN_INDEX = {name: i for i, name in enumerate(EVENT_COLUMNS)}


def fields(*names):
    """A getter of these fields, by name, of an event row (a plain tuple in
    EVENT_COLUMNS order, or an EventRow): one itemgetter call. For the hot paths
    that read back their own rows (a wait reads its call's), which then keep them
    plain: an EventRow copy and named reads cost async work +0.45 us a call."""
    return itemgetter(*(COLUMN_INDEX[name] for name in names))


SAMPLE_FIELDS = (
    ("ts_ns", pa.int64()),
    ("metric", pa.string()),
    ("value", pa.float64()),
)
SAMPLE_SCHEMA = pa.schema(SAMPLE_FIELDS)
SAMPLE_COLUMNS = tuple(name for name, _ in SAMPLE_FIELDS)

# parts are Parquet, or JSON row parts while a rank runs (collectors.part_writer)
EVENT_PART_GLOBS = ("events-*.parquet", "events-*.json")
SAMPLE_PART_GLOBS = ("samples-*.parquet", "samples-*.json")
# a rank's steps done, kept current at every step end: 8 bytes, a little-endian
# int64, in a file the recorder maps into memory (PartWriter.map_counter)
STEPS_DONE_FILE = "steps_done.bin"


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


SOLO_DIR_PREFIX = "solo-"


def solo_dir_name(pid: int) -> str:
    """A process recorded before its rank is known (no launcher): named after the job."""
    return f"{SOLO_DIR_PREFIX}{pid}"


def event_row(
    kind,
    name,
    start_ns,
    end_ns,
    step=-1,
    microbatch=-1,
    stage=-1,
    group="",
    group_ranks="",
    seq=-1,
    peer=-1,
    nbytes=0,
    async_op=False,
    callsite="",
    detail="",
    queued_ns=-1,
):
    """Build one EventRow, absent fields at their defaults (for code off the hot path)."""
    return new_row(
        EventRow,
        (
            kind,
            name,
            start_ns,
            end_ns,
            step,
            microbatch,
            stage,
            group,
            group_ranks,
            seq,
            peer,
            nbytes,
            async_op,
            callsite,
            detail,
            queued_ns,
        ),
    )


def arrow_array(values, typ: pa.DataType) -> pa.Array:
    """values (a sequence or numpy array) as an Arrow array of a string, integer,
    float or bool type, built from buffers: pa.array() imports pandas at its first
    call (0.3-0.4 s of CPU, holding the GIL), which in a rank's writer thread
    stalled the training thread once, and in every Kineto parse worker cost a
    quarter of its file's time. Anything unusual (None, a wrong type) goes to
    pa.array, which says what is wrong."""
    try:
        n = len(values)
        if pa.types.is_string(typ):
            # ASCII (nearly always): one join and one encode in C, and a str's
            # length is its byte length (4x faster than encoding each value)
            text = "".join(values)
            if text.isascii():
                data, lengths = text.encode(), map(len, values)
            else:
                encoded = [v.encode() for v in values]
                data, lengths = b"".join(encoded), map(len, encoded)
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(np.fromiter(lengths, np.int64, n), out=offsets[1:])
            return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        if pa.types.is_boolean(typ):
            bits = np.packbits(np.asarray(values, np.bool_), bitorder="little")
            return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(bits)])
        column = np.ascontiguousarray(values, _NUMPY_DTYPES[typ])
        if column.ndim != 1:
            raise TypeError(column.shape)
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(column)])
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
        return pa.array(values, type=typ)


_NUMPY_DTYPES = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def events_table(rows) -> pa.Table:
    # Table.from_arrays: pa.table(..., schema=) costs 4x as much for a recorder's part
    columns = list(zip(*rows)) if rows else [[] for _ in EVENT_FIELDS]
    return pa.Table.from_arrays(
        [arrow_array(col, typ) for col, (_, typ) in zip(columns, EVENT_FIELDS)], schema=EVENT_SCHEMA
    )


def samples_table(rows) -> pa.Table:
    columns = list(zip(*rows)) if rows else [[] for _ in SAMPLE_FIELDS]
    return pa.Table.from_arrays(
        [arrow_array(col, typ) for col, (_, typ) in zip(columns, SAMPLE_FIELDS)], schema=SAMPLE_SCHEMA
    )
