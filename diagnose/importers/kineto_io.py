"""Reading Kineto trace files: bytes (gunzipped), JSON, and parsing many files
at once. One-line UserErrors say why a file is not a profiler trace.

Parsing: orjson (stdlib json as fallback) with the garbage collector paused.
On the 216k-event fixture the pause alone takes the stdlib parse from 1.4 s to
0.4-0.8 s, and orjson takes it to about 0.45 s (median of 5, a busy 2-core box).
The importer itself scans in C or through msgspec when it can (kineto_scan.py).

Gunzip: libdeflate (`deflate`) when installed: 0.053 s for a 4 MB gzip of
47 MB of JSON here, against 0.087 s with ISA-L (`isal`) and 0.15 s with zlib;
a fifth of a file's import. libdeflate takes a whole buffer and decodes one
gzip member: unless the output's size and CRC are those in the file's last
trailer (a concatenation of several members), zlib reads the file again.
"""

import contextlib
import gc
import gzip
import json
import multiprocessing
import os
import sys
import warnings
import zlib
from concurrent.futures import ProcessPoolExecutor

try:
    import orjson
except ImportError:  # optional speed-up
    orjson = None

try:
    from deflate import DeflateError
    from deflate import crc32 as _libdeflate_crc32
    from deflate import gzip_decompress as _libdeflate_gunzip
except ImportError:  # optional speed-up
    _libdeflate_gunzip, DeflateError = None, zlib.error

from diagnose.errors import UserError

PARALLEL_MIN_BYTES = 4 << 20  # on disk: below this, starting worker processes costs more than it saves


def _display(path: str) -> str:
    return os.fsencode(path).decode("utf-8", "replace")


def _parse_json(raw: bytes):
    """orjson when installed (1.7x faster here), else the stdlib; the stdlib
    also gets the last word, since it accepts the NaN some traces contain."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except ValueError:
            pass
    return json.loads(raw)


def _gunzip(raw: bytes) -> bytes:
    if _libdeflate_gunzip is not None:
        try:
            out = _libdeflate_gunzip(raw)
        except DeflateError:
            pass  # zlib says what is wrong with it
        else:
            # one member, so all of it: its CRC and size are those of the file's last trailer
            if len(out) % 2**32 == int.from_bytes(raw[-4:], "little") and _libdeflate_crc32(out) == int.from_bytes(
                raw[-8:-4], "little"
            ):
                return out
    return gzip.decompress(raw)


def read_trace_bytes(path: str) -> bytes:
    """The file's JSON text (gunzipped), or UserError saying why there is none."""
    name = _display(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise UserError(f"{name}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(raw)
        except (EOFError, OSError, zlib.error, ValueError):
            raise UserError(f"{name}: truncated or corrupt gzip file") from None
    if not raw or raw.isspace():  # (strip() would copy a bytearray)
        raise UserError(f"{name}: empty file, not a PyTorch profiler trace")
    return raw


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside: parsing creates hundreds of thousands
    of objects and no cycles, and each collection would walk all of them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_trace(raw: bytes, name: str) -> dict:
    """The parsed trace, or UserError with one line saying why it is not one."""
    try:
        with gc_paused():
            trace = _parse_json(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise UserError(f"{name}: not JSON{where}, so not a PyTorch profiler trace") from None
    if isinstance(trace, dict) and "nodes" in trace and "traceEvents" not in trace:
        raise UserError(f"{name}: a PyTorch execution trace (nodes), not a profiler (Kineto) trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UserError(f"{name}: not a PyTorch profiler (Kineto) trace: no traceEvents")
    if not any(isinstance(e, dict) and e.get("ph") == "X" for e in trace["traceEvents"]):
        raise UserError(f"{name}: a trace with no complete (ph X) events; nothing to import")
    return trace


def load_trace(path: str) -> dict:
    """The parsed trace, or UserError with one line saying why it is not one."""
    return parse_trace(read_trace_bytes(path), _display(path))


def map_files(fn, paths: list):
    """fn(path) for each path, in order. Several big files are parsed by a pool
    of forked processes, one per core (parsing holds the GIL; HTA does the same):
    the first file that fails raises, as it would one by one."""
    try:
        total = sum(os.path.getsize(p) for p in paths)
    except OSError:
        total = 0  # fn says which one cannot be read
    workers = min(len(paths), os.cpu_count() or 1)
    if workers < 2 or total < PARALLEL_MIN_BYTES or sys.platform != "linux":
        return map(fn, paths)
    with warnings.catch_warnings():  # fork: the workers only parse JSON and use numpy
        warnings.simplefilter("ignore", DeprecationWarning)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(fn, paths))
