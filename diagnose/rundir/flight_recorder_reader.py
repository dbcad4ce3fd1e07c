"""Read PyTorch Flight Recorder dumps, safely: they are data, never a program.

A dump is one rank's ring buffer of collectives, written by the backend
(TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank, on a
watchdog timeout or on request) or by `_dump_fr_trace(_json)` in the rank.
Pickles are read with an unpickler that refuses every global: only dict, list,
tuple, str, bytes, int, float, bool and None can be built, so a `__reduce__`
payload is an error naming the file, not code that runs. Files over
MAX_DUMP_BYTES are refused before reading (a pickle can be a memory bomb), and
`pg_config` ranks, a string in the dump, are parsed as JSON, never evaluated.

Formats seen: 2.9 (NCCL: `nccl_version`, null timestamps, the default group
keyed "0") and 2.10 (torch 2.13, gloo too: `comm_lib_version`, an empty
placeholder group with no ranks; its JSON form has 0 timestamps, string
pg_status values and `process_group` as a list). A dump carries no rank: it is
the file name's trailing digits (after a .json/.pkl suffix), as PyTorch's own
loader takes it from the name after the prefix.
"""

import io
import json
import os
import pickle
import re

from diagnose.errors import UserError

MAX_DUMP_BYTES = 256 * 2**20
FOLDER = "flight_recorder"  # the run dir's: <run>/flight_recorder/rank_<N>[.json]
_RANK_SUFFIX = re.compile(r"(\d+)$")


class DumpError(UserError):
    """A dump that cannot be read: one line naming the file."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names a global ({module}.{name}): refused, a dump is data only")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent id: refused, a dump is data only")


def rank_of(path: str) -> int | None:
    stem = os.path.basename(path)
    for suffix in (".json", ".pkl", ".pickle"):
        stem = stem.removesuffix(suffix)
    match = _RANK_SUFFIX.search(stem)
    return int(match.group(1)) if match else None


def _int(value, what: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise ValueError(f"{what} is not an integer: {str(value)[:40]!r}")


def _ns_or_none(value) -> int | None:
    # 2.9 writes null for "not seen", the JSON form 0
    if value is None or value == 0 or value == "0":
        return None
    return _int(value, "a timestamp")


def _ranks(value) -> list[int] | None:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        raise ValueError("pg_config ranks are not a list of integers")
    return value or None


def _entry(raw: dict) -> dict:
    group = raw.get("process_group") or ("", "")
    if not isinstance(group, (list, tuple)) or len(group) < 2:
        raise ValueError("an entry's process_group is not (name, description)")
    sizes = raw.get("input_sizes") or []
    out_sizes = raw.get("output_sizes") or []
    if not isinstance(sizes, list) or not isinstance(out_sizes, list):
        raise ValueError("an entry's sizes are not lists")
    return {
        "record_id": _int(raw.get("record_id", -1), "record_id"),
        "pg_id": str(_int(raw.get("pg_id", -1), "pg_id")),
        "group": str(group[0]),
        "group_desc": str(group[1]),
        "seq": _int(raw.get("collective_seq_id", 0), "collective_seq_id"),
        "p2p_seq": _int(raw.get("p2p_seq_id", 0), "p2p_seq_id"),
        "is_p2p": bool(raw.get("is_p2p", False)),
        "op": str(raw.get("profiling_name", "")),
        "input_sizes": sizes,
        "output_sizes": out_sizes,
        "dtypes": [str(d) for d in (raw.get("input_dtypes") or [])],
        "state": str(raw.get("state", "")),
        # 2.10 keeps finished entries in the ring (retired); 2.9's active-only dumps hold none
        "retired": bool(raw.get("retired", False)),
        "created_ns": _ns_or_none(raw.get("time_created_ns")),
        "started_ns": _ns_or_none(raw.get("time_discovered_started_ns")),
        "completed_ns": _ns_or_none(raw.get("time_discovered_completed_ns")),
    }


def normalise(raw, rank: int) -> dict:
    """One rank's dump in one shape whatever the format; ValueError if it is not a dump."""
    if not isinstance(raw, dict) or "pg_status" not in raw or "version" not in raw:
        raise ValueError("it is not a Flight Recorder dump (no version / pg_status)")
    groups = {}
    for key, config in (raw.get("pg_config") or {}).items():
        if not isinstance(config, dict):
            raise ValueError("pg_config holds a non-object")
        name = str(config.get("name", key))
        if name == "" and not config.get("desc"):
            continue  # 2.10's placeholder for "no group configs recorded"
        groups[name] = {"desc": str(config.get("desc", "")), "ranks": _ranks(config.get("ranks", []))}
    status = {}
    for pg_id, s in (raw.get("pg_status") or {}).items():
        if not isinstance(s, dict):
            raise ValueError("pg_status holds a non-object")
        status[str(pg_id)] = {
            k: _int(s.get(f"last_{k}_collective", -1), f"last_{k}_collective")
            for k in ("enqueued", "started", "completed")
        }
    entries = raw.get("entries") or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("entries is not a list of objects")
    return {
        "rank": rank,
        "version": str(raw["version"]),
        "comm_lib_version": str(raw.get("comm_lib_version") or raw.get("nccl_version") or ""),
        "groups": groups,
        "pg_status": status,
        "entries": [_entry(e) for e in entries],
    }


def read_dump(path: str, rank: int | None = None) -> dict:
    """One dump file (pickle or JSON); DumpError with the file's name if it is not one."""
    name = os.path.basename(path)
    rank = rank_of(path) if rank is None else rank
    if rank is None:
        raise DumpError(f"{name}: no rank in the file name (a Flight Recorder dump is named <prefix><rank>)")
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise DumpError(
                f"{name}: {size / 2**20:.0f} MiB is over the {MAX_DUMP_BYTES >> 20} MiB "
                "a Flight Recorder dump may have: refused"
            )
        with open(path, "rb") as f:
            data = f.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise DumpError(f"{name}: cannot read it ({exc.strerror})") from None
    if not data:
        raise DumpError(f"{name}: empty file, not a Flight Recorder dump")
    try:
        form = "json" if data.lstrip()[:1] == b"{" else "pickle"
        raw = json.loads(data) if form == "json" else _DataOnly(io.BytesIO(data)).load()
        return {**normalise(raw, rank), "file": name, "format": form}
    except DumpError:
        raise
    except (
        pickle.UnpicklingError,
        ValueError,
        EOFError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        UnicodeDecodeError,
        RecursionError,
        MemoryError,
    ) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DumpError(f"{name}: not a readable Flight Recorder dump: {why}") from None


def dump_files(paths: list[str]) -> list[str]:
    """The dump files named, or inside the folders named (sorted; hidden files and
    the README-like .txt/.log files a dump set is shipped with are skipped)."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if (
                    os.path.isfile(full)
                    and not name.startswith(".")
                    and not name.endswith((".txt", ".log", ".md"))
                    and rank_of(name) is not None
                ):
                    files.append(full)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DumpError(f"{path}: no such file or folder")
    return files


def read_dumps(paths: list[str], on_error=None) -> dict[int, dict]:
    """rank -> dump. One dump per rank: where a rank has both a pickle and a JSON
    dump (diagnose asks for both), the pickle, the backend's own format. A bad
    file raises DumpError, or, given `on_error`, is handed to it and skipped."""
    dumps = {}
    for path in dump_files(paths):
        try:
            dump = read_dump(path)
        except DumpError as exc:
            if on_error is None:
                raise
            on_error(str(exc))
            continue
        previous = dumps.get(dump["rank"])
        if previous is not None and previous["format"] == dump["format"]:
            raise DumpError(
                f"{dump['file']}: a second dump of rank {dump['rank']} ({previous['file']}): "
                "give one dump set at a time"
            )
        if previous is None or dump["format"] == "pickle":
            dumps[dump["rank"]] = dump
    if not dumps and on_error is None:
        raise DumpError(f"no Flight Recorder dump in {', '.join(paths)}")
    return dumps
