"""`.nsys-rep` export through NVTXW (`nvtx.writer`, nvtx >= 0.2.16) and Nsight
Systems' writer backend, libNvtxwBackend.so.

The backend ships with Nsight Systems (<install>/host-linux-x64/). It is found
from NSYS_WRITER_BACKEND or NVTXW_BACKEND (a file or its folder), else next to
the `nsys` on PATH, else in the usual install places. Without it the export
stops with one line saying how to get it (exit 2); `--format nvtxt` needs no
backend.

Content: one NVTXW session (the output file, named without `.nsys-rep`), domain
"diagnose", one stream per rank ("rank N"), every recorded range as a start/end
range whose category is its kind (step, forward, collective, kernel...),
markers as marks. Timestamps are UTC ns (the backend's default time base):
the run's wall clock, rank 0's aligned time.
"""

import glob
import importlib
import os
import shutil

from diagnose.errors import UserError

BACKEND_ENV = ("NSYS_WRITER_BACKEND", "NVTXW_BACKEND")
BACKEND_FILE = "libNvtxwBackend.so"
INSTALL_GLOBS = (
    "/opt/nvidia/nsight-systems/*/host-linux-x64",
    "/usr/local/cuda*/nsight-systems-*/host-linux-x64",
    "/usr/lib/nsight-systems/host-linux-x64",
    "/opt/nvidia/nsight-systems-cli/*/host-linux-x64",
)


def find_backend() -> str | None:
    for var in BACKEND_ENV:
        value = os.environ.get(var)
        if value:
            path = os.path.join(value, BACKEND_FILE) if os.path.isdir(value) else value
            return path if os.path.isfile(path) else None
    candidates = []
    nsys = shutil.which("nsys")
    if nsys:
        base = os.path.dirname(os.path.realpath(nsys))
        candidates += [os.path.join(base, "..", "host-linux-x64"), os.path.join(base, "..", "..", "host-linux-x64")]
    for pattern in INSTALL_GLOBS:
        candidates += sorted(glob.glob(pattern), reverse=True)
    for folder in candidates:
        path = os.path.normpath(os.path.join(folder, BACKEND_FILE))
        if os.path.isfile(path):
            return path
    return None


def _writer_module():
    try:
        return importlib.import_module("nvtx.writer")
    except ImportError:
        raise UserError(
            "nsys-rep export needs nvtx >= 0.2.16 (nvtx.writer); pip install -U nvtx, or use --format nvtxt"
        ) from None


def write_nsys_rep(run, out: str | None = None) -> str:
    backend_path = find_backend()
    if backend_path is None:
        raise UserError(
            "nsys-rep export needs Nsight Systems' NVTXW backend (libNvtxwBackend.so), "
            "not found: set NSYS_WRITER_BACKEND=<nsys>/host-linux-x64/libNvtxwBackend.so, "
            "or use --format nvtxt and Nsight's ImportNvtxt"
        )
    if run.wall_t0_ns is None:
        raise UserError(f"{run.root}: no wall-clock anchor in meta.json; use --format nvtxt")
    writer = _writer_module()
    out = out or os.path.join(run.root, "trace.nsys-rep")
    name = out[: -len(".nsys-rep")] if out.endswith(".nsys-rep") else out
    try:
        backend = writer.load_backend(backend_path)
    except (OSError, getattr(writer, "WriterError", OSError)) as exc:
        raise UserError(f"{backend_path}: cannot load the NVTXW backend ({exc})") from None
    events = run.events()
    done = events[events["kind"] == "done"]
    done_at = {
        (int(r), str(g), int(s)): int(t)
        for r, g, s, t in zip(done["rank"], done["group"], done["seq"], done["start_ns"])
    }
    t0 = int(run.wall_t0_ns)
    spans = events[~events["kind"].isin(["wait", "done"])]
    try:
        _write(writer, backend, name, run, spans, done_at, t0)
    except getattr(writer, "WriterError", RuntimeError) as exc:
        raise UserError(f"{name}.nsys-rep: the NVTXW backend failed ({exc})") from None
    return f"{name}.nsys-rep"


def _write(writer, backend, name, run, spans, done_at, t0) -> None:
    with writer.Session(name, backend=backend) as session:
        domain = session.get_domain("diagnose")
        for rank in run.ranks:
            ev = spans[spans["rank"] == rank]
            with session.create_stream(f"rank {rank}", domain=domain) as stream:
                for kind, label, start, end, group, seq, async_op in zip(
                    ev["kind"].astype(str),
                    ev["name"].astype(str),
                    ev["start_ns"].tolist(),
                    ev["end_ns"].tolist(),
                    ev["group"].astype(str),
                    ev["seq"].tolist(),
                    ev["async_op"].tolist(),
                ):
                    if kind in ("collective", "p2p") and async_op:
                        end = max(end, done_at.get((rank, group, int(seq)), end))
                    if kind == "mark":
                        stream.write_mark(t0 + start, message=label, category=kind)
                    else:
                        stream.write_startend(t0 + start, t0 + max(end, start), message=label, category=kind)
