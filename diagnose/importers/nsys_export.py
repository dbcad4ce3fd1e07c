"""Read a Nsight Systems SQLite export (`nsys export --type sqlite`) into per-process
lists: the kernel, memcpy, memset, runtime, synchronization, CUDA event and NVTX
tables, read by column name (absent columns None), and how Nsight's serialized
globalTid/globalPid decode. diagnose.importers.nsys turns them into a run
directory's rows."""

import json
import os
import pathlib
import sqlite3
from collections import namedtuple

from collectors.schema import new_row
from diagnose.errors import UserError

NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
NVTX_CATEGORY, NVTX_DOMAIN = 33, 75
_MEMCPY_NAMES = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
_STREAM_WAIT_EVENT = 2  # CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT (the export's ENUM_CUPTI_SYNC_TYPE)
MASK24 = 0xFFFFFF
# the columns of a GPU activity (kernel, memcpy, memset) read first, as a GpuActivity's
_ACTIVITY = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid"]
# rows read by name: a column added to a query moves no reader (SQLite's names where read from it)
NvtxRange = namedtuple("NvtxRange", "start end eventType text textId globalTid category domainId jsonText")
StreamWait = namedtuple("StreamWait", "start end streamId correlationId globalPid contextId eventId syncType")
GpuActivity = namedtuple("GpuActivity", "start end device stream corr gpid name bytes")  # corr: correlationId


def decode_global_id(gid: int) -> tuple[int, int]:
    """Nsight's serialized globalTid/globalPid -> (pid, tid)."""
    return (gid >> 24) & MASK24, gid & MASK24


def display_name(path: str) -> str:
    return os.fsencode(path).decode("utf-8", "replace")


def open_export(path: str) -> sqlite3.Connection:
    name = display_name(path)
    if not os.path.isfile(path):
        raise UserError(f"{name}: no such file")
    try:
        con = sqlite3.connect(pathlib.Path(os.path.abspath(path)).as_uri() + "?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError:
        raise UserError(f"{name}: not an SQLite database (export a report with `nsys export --type sqlite`)") from None
    if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"}:
        con.close()
        raise UserError(f"{name}: an SQLite file without Nsight Systems kernel or NVTX tables")
    return con


def _columns(con, table) -> set:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _select(con, table, wanted) -> list:
    """Rows of the wanted columns (a namedtuple type: its fields, rows of it); absent columns None."""
    have = _columns(con, table)
    if not have:
        return []
    columns = getattr(wanted, "_fields", wanted)
    exprs = [f'"{c}"' if c in have else "NULL" for c in columns]
    rows = con.execute(f'SELECT {", ".join(exprs)} FROM "{table}"')
    return rows.fetchall() if columns is wanted else [new_row(wanted, row) for row in rows]


class Export:
    """One SQLite export, read into per-process lists."""

    def __init__(self, path: str):
        self.path = path
        con = open_export(path)
        try:
            self.strings = dict(con.execute("SELECT id, value FROM StringIds")) if _columns(con, "StringIds") else {}
            start = _select(con, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"])
            self.session_start_ns = int(start[0][0]) if start and start[0][0] is not None else 0
            self.gpu = _select(con, "CUPTI_ACTIVITY_KIND_KERNEL", _ACTIVITY + ["demangledName", "shortName"])
            memcpy = _select(con, "CUPTI_ACTIVITY_KIND_MEMCPY", _ACTIVITY + ["bytes", "copyKind"])
            memset = _select(con, "CUPTI_ACTIVITY_KIND_MEMSET", _ACTIVITY + ["bytes"])
            self.waits = [
                w
                for w in _select(con, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", StreamWait)
                if w.syncType == _STREAM_WAIT_EVENT
            ]
            events = _select(
                con,
                "CUPTI_ACTIVITY_KIND_CUDA_EVENT",
                ["globalPid", "contextId", "eventId", "correlationId", "streamId"],
            )
            self.runtime = _select(
                con, "CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end", "globalTid", "correlationId", "nameId"]
            )
            self.nvtx = _select(con, "NVTX_EVENTS", NvtxRange)
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{display_name(path)}: unreadable Nsight export ({exc})") from None
        finally:
            con.close()
        self.gpu = [
            new_row(GpuActivity, (s, e, d, st, c, gp, self.string(dn) or self.string(sn), 0))
            for s, e, d, st, c, gp, dn, sn in self.gpu
        ]
        self.gpu += [
            new_row(GpuActivity, (s, e, d, st, c, gp, f"Memcpy {_MEMCPY_NAMES.get(k, 'copy')}", b or 0))
            for s, e, d, st, c, gp, b, k in memcpy
        ]
        self.gpu += [new_row(GpuActivity, (s, e, d, st, c, gp, "Memset", b or 0)) for s, e, d, st, c, gp, b in memset]
        self.domains = {r.domainId: self.text(r) for r in self.nvtx if r.eventType == NVTX_DOMAIN}
        self.categories = {(r.domainId, r.category): self.text(r) for r in self.nvtx if r.eventType == NVTX_CATEGORY}
        # cudaEventRecord's activities: (pid, context, event) -> [(correlation, stream recorded on)]
        # in call order (an event is recorded again and again: eventId is the handle, not the record)
        self.records = {}
        for gpid, context, event, corr, stream in events:
            if corr is not None:
                self.records.setdefault((pid_of(gpid), context, event), []).append((corr, stream))
        for recorded in self.records.values():
            recorded.sort()

    def string(self, string_id) -> str:
        return self.strings.get(string_id, "") if string_id is not None else ""

    def text(self, row: NvtxRange) -> str:
        return row.text if row.text is not None else self.string(row.textId)

    def processes(self) -> list[int]:
        """pids that are ranks: with GPU work, else with NVTX ranges; by (GPU, pid)."""
        with_gpu = {}
        for g in self.gpu:
            if g.gpid is not None:
                pid = decode_global_id(g.gpid)[0]
                with_gpu[pid] = min(with_gpu.get(pid, 1 << 30), g.device if g.device is not None else 0)
        if with_gpu:
            return sorted(with_gpu, key=lambda p: (with_gpu[p], p))
        pids = {
            decode_global_id(r.globalTid)[0]
            for r in self.nvtx
            if r.eventType in NVTX_RANGE_TYPES and r.globalTid is not None
        }
        if not pids and self.gpu:
            return [0]  # an older export without globalPid: the whole file is one process
        return sorted(pids)


def pid_of(gpid):
    return None if gpid is None else decode_global_id(gpid)[0]


def range_payload(json_text) -> dict:
    """An NVTX range's payload as nsys exports it (jsonText), {} if none or unreadable."""
    if not isinstance(json_text, str) or not json_text.startswith("{"):
        return {}
    try:
        payload = json.loads(json_text)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}
