"""Read one rank's folder defensively: every part file that is readable is used,
every one that is not yields one warning line and is skipped. Trace content is
data: Parquet and JSON only, never pickle or eval. A running or killed rank's
newest parts are JSON rows (collectors.part_writer says why). The format:
docs/run-directory.md."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from collectors.part_writer import files_to_read, read_part, row_part_table
from collectors.schema import EVENT_FIELDS, EVENT_PART_GLOBS, SAMPLE_FIELDS, SAMPLE_PART_GLOBS, SCHEMA_VERSION
from diagnose.rundir import storage

_EVENT_DEFAULTS = {
    "step": -1,
    "microbatch": -1,
    "stage": -1,
    "group": "",
    "group_ranks": "",
    "seq": -1,
    "peer": -1,
    "bytes": 0,
    "async_op": False,
    "callsite": "",
    "detail": "",
    "queued_ns": -1,
}
REQUIRED_EVENT_COLUMNS = ("kind", "name", "start_ns", "end_ns")


def _safe_name(path: str) -> str:
    return os.fsencode(path).decode("utf-8", "replace")


def read_meta(rank_dir: str, warn) -> dict:
    path = storage.join(rank_dir, "meta.json")
    if not storage.exists(path):
        warn(f"{_safe_name(path)}: missing; clock offset taken as 0")
        return {}
    try:
        with storage.open(path) as f:
            meta = json.loads(f.read())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        warn(f"{_safe_name(path)}: unreadable ({type(exc).__name__}); clock offset taken as 0")
        return {}
    version = meta.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        warn(
            f"{_safe_name(path)}: schema version {version} is newer than {SCHEMA_VERSION}; "
            "reading the columns this version knows"
        )
    return meta


def _conform(table: pa.Table, fields, defaults) -> pa.Table:
    """Keep known columns in schema order, cast them, fill absent optional ones.
    String columns come out dictionary-encoded (see read_parts)."""
    columns = []
    for name, typ in fields:
        if name in table.column_names:
            column = table.column(name)
        else:
            column = pa.array([defaults[name]] * table.num_rows, type=typ)
        if typ == pa.string():
            column = _dictionary(column)
        elif column.type != typ:
            column = column.cast(typ)
        columns.append(column)
    return pa.table(columns, names=[n for n, _ in fields])


_DICT_STRING = pa.dictionary(pa.int32(), pa.string())


def _dictionary(column):
    if pa.types.is_dictionary(column.type):
        return column if column.type == _DICT_STRING else column.cast(_DICT_STRING)
    return column.cast(pa.string()).dictionary_encode()


def _read_part(path: str, strings: list, required) -> pa.Table:
    if not storage.is_url(path):
        return _read_part_from(path, path, strings, required)
    with storage.open(path) as f:  # a part at a URL: its bytes, or Parquet's ranged reads
        return _read_part_from(path, f.read() if path.endswith(".json") else f, strings, required)


def _read_part_from(path: str, source, strings: list, required) -> pa.Table:
    """source: the local path, the bytes of a JSON part, or an open Parquet file."""
    if path.endswith(".json"):
        table = read_part(source) if isinstance(source, str) else row_part_table(source)
        names = table.column_names
    else:
        part = pq.ParquetFile(source, read_dictionary=strings)
        table, names = None, part.schema_arrow.names
    missing = [c for c in required if c not in names]
    if missing:
        raise ValueError(f"not a diagnose trace part (no {', '.join(missing)})")
    return table if table is not None else part.read(use_threads=False)


def read_parts(rank_dir: str, patterns, fields, required, defaults, warn) -> pa.Table | None:
    """All readable parts of one rank, concatenated. String columns are read as
    dictionaries straight from Parquet's dictionary pages: a repeated name or
    callsite is never materialised per row, which halves the read time and the
    memory of a large run (the loader turns them into pandas categoricals)."""
    strings = [name for name, typ in fields if typ == pa.string()]
    tables = []
    paths = [p for pattern in patterns for p in storage.glob(rank_dir, pattern)]
    names = files_to_read(os.path.basename(p) for p in paths)  # a compacted range replaces its parts
    for path in (storage.join(rank_dir, n) for n in names):
        try:
            tables.append(_conform(_read_part(path, strings, required), fields, defaults))
        except Exception as exc:
            reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            warn(f"{_safe_name(path)}: skipped ({reason})")
    if not tables:
        return None
    return pa.concat_tables(tables)


def read_events(rank_dir: str, warn) -> pa.Table | None:
    return read_parts(rank_dir, EVENT_PART_GLOBS, EVENT_FIELDS, REQUIRED_EVENT_COLUMNS, _EVENT_DEFAULTS, warn)


def read_samples(rank_dir: str, warn) -> pa.Table | None:
    return read_parts(rank_dir, SAMPLE_PART_GLOBS, SAMPLE_FIELDS, ("ts_ns", "metric", "value"), {}, warn)
