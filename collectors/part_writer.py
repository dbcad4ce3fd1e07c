"""Crash-safe files of one rank's trace folder.

Every file is written to a temporary name and renamed into place, so a rank
killed at any instant leaves only whole, readable files behind. No fsync: the
threat is a killed process, not a lost machine, and the page cache survives the
former.

Size on disk. Every Parquet file carries a footer and per-column headers (about
2 KB for the event schema), so a 0.8 s part of a job that records little costs
hundreds of bytes per event. The writer therefore compacts: every
COMPACT_EVERY parts, and at a clean exit, the single parts written since the
last compaction are merged into one file named by the range it replaces,
`events-000001-000064.parquet`. The merged file is renamed into place before
the parts are deleted, so a kill in between leaves both; readers use
`files_to_read`, which drops any file whose range lies inside another's, and
so never count an event twice.

Encoding. The recorder's 0.8 s parts live for at most COMPACT_EVERY flushes,
so they are written for speed: JSON row parts, `events-000001.json` =
{"columns": [...], "rows": [[...], ...]}, one orjson call on the rows as the
hot path recorded them. Building an Arrow table and encoding a Parquet part of
250 rows cost the writer 1.2-1.5 ms warm (1.8-3.4 ms in a running job), the
JSON part 0.04 ms plus the file; the table is built once per COMPACT_EVERY
parts instead. JSON, not marshal or pickle: trace files are data, and a
corrupt one must be an error message, not a crash. A killed rank leaves at
most COMPACT_EVERY row parts; `diagnose run` merges them into Parquet when the
job ends (merge_row_parts), and every reader reads both kinds (read_part).
Merged files are written for size: timestamps delta-encoded (they rise almost
monotonically; dictionary-encoding them is both larger and slower to read),
everything else dictionary-encoded, zstd. No Arrow schema or statistics are
stored (the loader casts to collectors.schema anyway).
"""

import json
import mmap
import os
import re
import shutil
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq

try:
    import orjson
except ImportError:  # optional speed-up
    orjson = None

from collectors.schema import EVENT_COLUMNS, EVENT_SCHEMA, SAMPLE_COLUMNS, SCHEMA_VERSION, events_table, samples_table

COMPACT_EVERY = 64
_PART_NAME = re.compile(r"^(?P<prefix>[a-z]+)-(?P<lo>\d{6})(?:-(?P<hi>\d{6}))?\.(?:parquet|json)$")
_ROW_TABLES = {EVENT_COLUMNS: events_table, SAMPLE_COLUMNS: samples_table}
_DELTA_COLUMNS = ("start_ns", "end_ns", "ts_ns")


def atomic_write_bytes(path: str, data) -> None:
    # per thread: the writer thread and close() on the main thread may both
    # write progress.json at exit; a shared temporary name would race
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def atomic_write_json(path: str, obj, compact: bool = False) -> None:
    """compact: one line, via orjson when installed (indenting cost 4x the
    serialisation)."""
    data = _compact_json(obj) if compact else json.dumps(obj, indent=1, default=str).encode()
    atomic_write_bytes(path, data)


def _compact_json(obj) -> bytes:
    if orjson is not None:
        return orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(obj, default=str, separators=(",", ":")).encode()


def write_parquet_atomic(table: pa.Table, path: str, small: bool = True) -> None:
    """One Parquet file, written under a temporary name and renamed into place;
    `small`: encoded for size (merged files), else for speed (the recorder's parts).
    Encoded in memory and written with one write(): Arrow's own file output
    cost a recorder's part 0.15 ms more (0.96 against 0.81 ms for 350 events)."""
    sink = pa.BufferOutputStream()
    if small:
        delta = [c for c in table.column_names if c in _DELTA_COLUMNS]
        pq.write_table(
            table,
            sink,
            compression="zstd",
            write_statistics=False,
            store_schema=False,
            use_dictionary=[c for c in table.column_names if c not in delta],
            column_encoding={c: "DELTA_BINARY_PACKED" for c in delta},
            row_group_size=1 << 20,
        )
    else:
        pq.write_table(
            table, sink, compression="none", use_dictionary=False, write_statistics=False, store_schema=False
        )
    atomic_write_bytes(path, sink.getvalue())


def read_counter(path: str, opener=open) -> int | None:
    """The value of a file PartWriter.map_counter made, or None (absent, short, foreign).
    opener(path, "rb"): where the file is (diagnose.rundir.storage for a run at a URL)."""
    try:
        with opener(path, "rb") as f:
            data = f.read(9)
    except OSError:
        return None
    return int.from_bytes(data, "little", signed=True) if len(data) == 8 else None


def part_range(name: str):
    """(prefix, first, last) part index of a writer's file name, else None."""
    m = _PART_NAME.match(name)
    if not m:
        return None
    lo = int(m.group("lo"))
    return m.group("prefix"), lo, int(m.group("hi") or lo)


def files_to_read(names) -> list:
    """The names a reader should use, sorted: everything except writer parts
    whose range lies inside another file's range (already compacted there), and
    row parts whose Parquet file of the same range exists (a merge was cut short)."""
    names = sorted(names)
    ranges = {}
    for name in names:
        r = part_range(name)
        if r is not None:
            ranges.setdefault(r[0], []).append((r[1], r[2], name.endswith(".parquet")))

    def covered(name, r) -> bool:
        prefix, lo, hi = r
        return any(
            a <= lo and hi <= b and ((a, b) != (lo, hi) or (parquet and name.endswith(".json")))
            for a, b, parquet in ranges[prefix]
        )

    return [n for n in names if (r := part_range(n)) is None or not covered(n, r)]


def _row_part_bytes(columns, rows) -> bytes:
    try:
        # default=tuple: orjson writes exact tuples only, and a row may be a namedtuple (schema.EventRow)
        return orjson.dumps({"columns": columns, "rows": rows}, default=tuple)
    except (AttributeError, TypeError):  # no orjson, or a lone surrogate in a string (orjson refuses it)
        return json.dumps({"columns": columns, "rows": rows}, separators=(",", ":")).encode()


def _load_row_part(path: str) -> tuple[tuple, list]:
    """(columns, rows) of a JSON row part; ValueError for anything else."""
    with open(path, "rb") as f:
        return _parse_row_part(f.read())


def row_part_table(data: bytes) -> pa.Table:
    """A JSON row part's bytes as an Arrow table (read_part's, for a part not on a local disk)."""
    return _rows_table(*_parse_row_part(data))


def _parse_row_part(data: bytes) -> tuple[tuple, list]:
    try:
        part = orjson.loads(data) if orjson is not None else json.loads(data)
    except ValueError:  # orjson.JSONDecodeError is one; json also takes lone surrogates
        part = json.loads(data)
    if not (isinstance(part, dict) and isinstance(part.get("columns"), list) and isinstance(part.get("rows"), list)):
        raise ValueError("not a diagnose row part")
    return tuple(part["columns"]), part["rows"]


def _rows_table(columns: tuple, rows: list) -> pa.Table:
    build = _ROW_TABLES.get(columns)
    if build is not None:
        return build(rows)
    # a schema this version does not know: its columns as they come
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(columns)})


def read_part(path: str, columns=None) -> pa.Table:
    """One part file, Parquet or JSON rows, as an Arrow table of `columns` in
    that order (all by default; raises on a bad file or a missing column).
    ParquetFile, not pq.read_table: its dataset discovery cost more than the read."""
    if path.endswith(".json"):
        table = _rows_table(*_load_row_part(path))
        return table if columns is None else table.select(columns)
    return pq.ParquetFile(path).read(columns=columns)


def _read_parts(paths) -> pa.Table:
    """Parts as one table; consecutive row parts become one table, built once."""
    tables, columns, rows = [], None, []
    for path in paths:
        if path.endswith(".json"):
            part_columns, part_rows = _load_row_part(path)
            if rows and part_columns != columns:
                tables.append(_rows_table(columns, rows))
                rows = []
            columns = part_columns
            rows.extend(part_rows)
        else:
            if rows:
                tables.append(_rows_table(columns, rows))
                rows = []
            tables.append(pq.ParquetFile(path).read())
    if rows:
        tables.append(_rows_table(columns, rows))
    return pa.concat_tables(tables)


def _merge(rank_dir: str, names: list, target_name: str) -> None:
    """The named parts as one Parquet file, renamed into place before the parts
    are deleted (a kill in between leaves both; files_to_read picks the merge)."""
    paths = [os.path.join(rank_dir, n) for n in names]
    target = os.path.join(rank_dir, target_name)
    try:
        write_parquet_atomic(_read_parts(paths), target)
        for path in paths:
            if path != target:
                os.remove(path)
    except Exception:  # unreadable or unwritable: the parts stay as they are, nothing lost
        pass


def merged_name(prefix: str, lo: int, hi: int) -> str:
    # one part keeps its own range (a wider range would hide a part it does not hold)
    return f"{prefix}-{lo:06d}.parquet" if lo == hi else f"{prefix}-{lo:06d}-{hi:06d}.parquet"


def merge_row_parts(rank_dir: str) -> None:
    """After the job: the row parts a rank left (killed, or its exit cut short)
    merged, with any part inside their range, into one Parquet file; row parts
    a Parquet file already holds (a merge cut short) are deleted."""
    try:
        names = os.listdir(rank_dir)
        readable = set(files_to_read(names))
        for name in names:
            if name.endswith(".json") and part_range(name) is not None and name not in readable:
                os.remove(os.path.join(rank_dir, name))
    except OSError:
        return
    for prefix in ("events", "samples"):
        parts = [(r, n) for n in sorted(readable) if (r := part_range(n)) is not None and r[0] == prefix]
        row_parts = [r for r, n in parts if n.endswith(".json")]
        if not row_parts:
            continue
        lo, hi = min(r[1] for r in row_parts), max(r[2] for r in row_parts)
        _merge(rank_dir, [n for r, n in parts if lo <= r[1] and r[2] <= hi], merged_name(prefix, lo, hi))


class PartWriter:
    """Writes numbered event/sample part files and meta.json into one rank folder."""

    def __init__(self, rank_dir: str, live: bool = False):
        """live: parts are written for speed and compacted later (the recorder,
        inside the user's job); otherwise every file is written for size."""
        self.rank_dir = rank_dir
        self.live = live
        os.makedirs(rank_dir, exist_ok=True)
        self._part_index = {"events": 0, "samples": 0}
        self._uncompacted = {"events": [], "samples": []}  # part indexes since the last compaction
        self._open_in_place: dict = {}  # name -> (fd, bytes written) for overwrite_json

    def _write_part(self, prefix: str, write) -> str:
        """write(path without extension) -> the path it wrote."""
        self._part_index[prefix] += 1
        index = self._part_index[prefix]
        path = write(os.path.join(self.rank_dir, f"{prefix}-{index:06d}"))
        self._uncompacted[prefix].append(index)
        if len(self._uncompacted[prefix]) >= COMPACT_EVERY:
            self.compact(prefix)
        return path

    def _write_table(self, prefix: str, table) -> str:
        def write(stem):
            write_parquet_atomic(table, stem + ".parquet", small=not self.live)
            return stem + ".parquet"

        return self._write_part(prefix, write)

    def _write_rows(self, prefix: str, columns: tuple, rows) -> str:
        def write(stem):
            atomic_write_bytes(stem + ".json", _row_part_bytes(columns, rows))
            return stem + ".json"

        return self._write_part(prefix, write)

    def adopt_events_file(self, path: str) -> str:
        """Move an events Parquet file written elsewhere (an importer's worker
        process) in as the next events part."""
        self._part_index["events"] += 1
        target = os.path.join(self.rank_dir, f"events-{self._part_index['events']:06d}.parquet")
        shutil.move(path, target)
        return target

    def write_events(self, rows) -> str | None:
        """Row tuples in EVENT_COLUMNS order: a JSON row part when live, else Parquet."""
        if not rows:
            return None
        if self.live:
            return self._write_rows("events", EVENT_COLUMNS, rows)
        return self._write_table("events", events_table(rows))

    def write_events_table(self, table: pa.Table) -> str | None:
        """Columnar writers (importers, synthetic runs): a table in EVENT_SCHEMA."""
        if table.num_rows == 0:
            return None
        if not table.schema.equals(EVENT_SCHEMA):
            table = table.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
        return self._write_table("events", table)

    def write_samples(self, rows) -> str | None:
        if not rows:
            return None
        if self.live:
            return self._write_rows("samples", SAMPLE_COLUMNS, rows)
        return self._write_table("samples", samples_table(rows))

    def compact(self, prefix: str | None = None) -> None:
        """Merge the parts written since the last compaction into one Parquet file
        (see the module docstring for why a kill at any point is safe)."""
        for name in [prefix] if prefix else list(self._uncompacted):
            indexes, self._uncompacted[name] = self._uncompacted[name], []
            if len(indexes) < (1 if self.live else 2):
                continue
            names = files_to_read(
                n
                for n in os.listdir(self.rank_dir)
                if (r := part_range(n)) is not None and r[0] == name and indexes[0] <= r[1] and r[2] <= indexes[-1]
            )
            _merge(self.rank_dir, names, merged_name(name, indexes[0], indexes[-1]))

    def map_counter(self, name: str) -> memoryview:
        """An int64 file mapped into memory, as a one-item view: `view[0] = n` is a
        store, not a system call, and what is stored is in the page cache (readers
        see it at once, a killed process cannot take it back)."""
        if sys.byteorder != "little":
            raise ValueError("counter files are little-endian")
        fd = os.open(os.path.join(self.rank_dir, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, 8)
            mapped = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        return memoryview(mapped).cast("q")

    def write_meta(self, meta: dict) -> None:
        atomic_write_json(os.path.join(self.rank_dir, "meta.json"), {"schema_version": SCHEMA_VERSION, **meta})

    def write_json(self, name: str, obj, compact: bool = False) -> None:
        atomic_write_json(os.path.join(self.rank_dir, name), obj, compact)

    def overwrite_json(self, name: str, obj) -> None:
        """Rewrite a small JSON file in place with one pwrite on a file kept open
        (1.4 us here, against 280 us to write a temporary file and rename it):
        for progress.json, written several times a second. Shorter contents are padded
        with spaces, which JSON readers skip. A reader may catch a write half
        done and fail to parse it: it reads again (diagnose.rundir.progress.read_progress).
        A killed process cannot leave a half write: the syscall is whole or not at all."""
        data = _compact_json(obj)
        fd, length = self._open_in_place.get(name, (None, 0))
        if fd is None:
            fd = os.open(os.path.join(self.rank_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if len(data) < length:
            data += b" " * (length - len(data))
        os.pwrite(fd, data, 0)
        self._open_in_place[name] = (fd, len(data))
