"""Import PyTorch-profiler (Kineto) Chrome traces, one file per rank, into a run dir.

What becomes what (times: the trace's own clock, made absolute with
`baseTimeNanoseconds` when the file has one):

    ProfilerStep#N                          -> "step" N
    enumerate(DataLoader)#...__next__       -> "data" (name "data_wait"; detail "workers=0"
                                               for a single-process loader), so the
                                               breakdown's data_wait and the
                                               input_stall signal work as on a native run
    Optimizer.step#..., "## optimizer ##"   -> "optimizer"
    "## forward ##", DDP.forward            -> "forward";  "## backward ##" -> "backward"
    cudaDeviceSynchronize / cudaStreamSynchronize / cudaEventSynchronize / cudaMemcpy
                                            -> "sync" (detail "cuda")
    GPU kernels, memcpy, memset, GPU syncs  -> "kernel" rows (diagnose.importers.common)
    NCCL kernels                            -> also "collective" + "done" rows, from the
                                               kernel's "Collective name", "Process Group
                                               Name/Ranks", "In msg nelems", "dtype", "Seq"

Other CPU ops are skipped: they are what HTA and TensorBoard already show, and
the detectors need phases, not operators. A file that is not a Kineto trace is
refused with a one-line reason (diagnose.errors.UserError).

Files are read and parsed by kineto_io.py, through msgspec when installed
(kineto_scan.py: 3-4x faster than building a dict per event), several at once
in worker processes.
"""
import glob
import os
import re

import numpy as np

from collectors.schema import events_table
from diagnose.errors import UserError
from diagnose.importers import kineto_scan
from diagnose.importers.kineto_io import (_display, load_trace, map_files, parse_trace,  # noqa: F401 (load_trace: API)
                                          read_trace_bytes)
from diagnose.importers.common import (COMMUNICATION, DTYPE_BYTES, RunDirWriter, append_rank_events,
                                       assign_steps, clock_meta, collective_op, kernel_class,
                                       ranks_string)

PROFILER_DIR = "torch_profiler"  # per-rank folder the torch_profiler collector writes
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_DATA_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
_SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "privateuse1_runtime", "hip_runtime"}
_PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer",
                "distributeddataparallel.forward": "forward"}
_PHASE_FIRST = frozenset("#fbFBoD")
_CLASSIFIED_FIRST = _PHASE_FIRST | {"P", "e", "O"}  # first letters _classify can return a row for


def file_rows(path: str, gpu_only: bool = False) -> tuple[list, dict]:
    """trace_rows of a trace file: through the msgspec scan when it applies
    (diagnose/importers/kineto_scan.py), else through the parsed dicts."""
    raw = read_trace_bytes(path)
    fast = kineto_scan.scan(raw, gpu_only, _classify)
    if fast is not None:
        top, cpu, gpu, launches, pids = fast
        return _rows_and_facts(top["baseTimeNanoseconds"], top["distributedInfo"], cpu, gpu, launches, pids)
    return trace_rows(parse_trace(raw, _display(path)), gpu_only)


def _ns(ts: np.ndarray, base_ns: int) -> np.ndarray:
    """Microsecond floats -> integer ns without float64 rounding at epoch scale."""
    whole = np.floor(ts)
    return base_ns + whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000).astype(np.int64)


def _int(value, default=-1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def trace_rows(trace: dict, gpu_only: bool = False) -> tuple[list, dict]:
    """Event rows (collectors.schema order) and facts for meta.json."""
    cpu, gpu, launches, pids = _scan_events(trace["traceEvents"], gpu_only)
    return _rows_and_facts(trace.get("baseTimeNanoseconds"), trace.get("distributedInfo"),
                           cpu, gpu, launches, pids)


def _scan_events(events, gpu_only: bool):
    """(cpu, gpu, launches, pids) from parsed event dicts; kineto_scan mirrors it."""
    launches = {}
    cpu, gpu = [], []        # (kind, name, ts, dur, detail) ; (name, ts, dur, stream, corr, args)
    pids = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        name = e.get("name")
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(name, str) or not isinstance(ts, (int, float)):
            continue
        if not isinstance(dur, (int, float)) or dur < 0:
            dur = 0
        stream = args.get("stream")
        if stream is not None and _int(stream) >= 0:
            gpu.append((name, ts, dur, int(stream), _int(args.get("correlation")), args))
            continue
        cat = e.get("cat")
        pid = e.get("pid")
        if isinstance(pid, int):
            pids[pid] = pids.get(pid, 0) + 1
        if cat in _LAUNCH_CATS:
            if "correlation" in args:
                launches[_int(args["correlation"])] = ts
            if not gpu_only and name in _SYNC_CALLS:
                cpu.append(("sync", name, ts, dur, "cuda"))
            continue
        if gpu_only or not name or cat == "gpu_user_annotation":  # GPU-side copies of CPU ranges
            continue
        row = _classify(name, cat, ts, dur)
        if row is not None:
            cpu.append(row)
    return cpu, gpu, launches, pids


def _classify(name: str, cat, ts, dur):
    """The CPU row (kind, name, ts, dur, detail) a complete CPU event becomes, if any."""
    first = name[0]
    if first == "P" and name.startswith("ProfilerStep"):
        m = _STEP_RE.match(name)
        if m:
            return ("step", "step", ts, dur, m.group(1))
    elif first == "e" and _DATA_RE.match(name):
        # as the native dataloader collector: "workers=0" for a single-process loader
        return ("data", "data_wait", ts, dur,
                "workers=0" if "_SingleProcessDataLoaderIter" in name else name)
    elif first == "O" and name.startswith("Optimizer.step#"):
        return ("optimizer", "optimizer", ts, dur, name)
    elif first in _PHASE_FIRST and cat in ("user_annotation", "cpu_op", "Operator"):
        kind = _PHASE_NAMES.get(name.strip("# ").lower())
        if kind:
            return (kind, kind, ts, dur, name)
    return None


def _rows_and_facts(base_time, dist, cpu, gpu, launches, pids) -> tuple[list, dict]:
    base_ns = _int(base_time, 0)
    if base_ns < 0:
        base_ns = 0
    steps = {}
    for kind, _, ts, dur, detail in cpu:
        if kind == "step":
            steps.setdefault(int(detail), (ts, dur))
    step_numbers = np.array(sorted(steps), dtype=np.int64)
    step_starts = _ns(np.array([steps[s][0] for s in step_numbers], dtype=np.float64), base_ns)
    rows = []
    if cpu:
        ts = np.array([c[2] for c in cpu], dtype=np.float64)
        starts = _ns(ts, base_ns)
        ends = _ns(ts + np.array([c[3] for c in cpu], dtype=np.float64), base_ns)
        step_of = assign_steps(step_starts, step_numbers, starts)
        for (kind, name, ts_us, _, detail), s, t, st in zip(cpu, starts.tolist(), ends.tolist(),
                                                            step_of.tolist()):
            if kind == "step":
                if steps[int(detail)][0] != ts_us:
                    continue  # a second ProfilerStep#N (another thread): keep the first
                st, detail = int(detail), ""
            rows.append((kind, name, s, t, st, -1, -1, "", "", -1, -1, 0, False, "", detail))
    rows.extend(_gpu_rows(gpu, launches, base_ns, step_starts, step_numbers))
    rows.sort(key=lambda r: r[2])
    dist = dist if isinstance(dist, dict) else {}
    facts = {"pid": max(pids, key=pids.get) if pids else None,
             "world_size": _int(dist.get("world_size"), None), "backend": dist.get("backend"),
             "steps": [int(s) for s in step_numbers], "gpu_activities": len(gpu),
             "base_time_ns": base_ns, "rank_in_trace": _int(dist.get("rank"), None)}
    return rows, facts


def _gpu_rows(gpu, launches, base_ns, step_starts, step_numbers) -> list:
    if not gpu:
        return []
    ts = np.array([g[1] for g in gpu], dtype=np.float64)
    starts = _ns(ts, base_ns)
    ends = _ns(ts + np.array([g[2] for g in gpu], dtype=np.float64), base_ns)
    launch_ts = np.array([launches.get(g[4], g[1]) for g in gpu], dtype=np.float64)
    step_of = assign_steps(step_starts, step_numbers, _ns(launch_ts, base_ns)).tolist()
    rows, seqs, classes = [], {}, {}
    order = np.argsort(starts, kind="stable")
    starts, ends = starts.tolist(), ends.tolist()
    for i in order.tolist():
        name, _, _, stream, corr, args = gpu[i]
        if "Collective name" in args:
            cls = COMMUNICATION
        else:  # a few hundred distinct kernel names among tens of thousands of kernels
            cls = classes.get(name)
            if cls is None:
                cls = classes[name] = kernel_class(name)
        nbytes = _int(args.get("bytes"), 0)
        launched = corr if corr in launches else -1  # -1: launched before the trace began
        rows.append(("kernel", name, starts[i], ends[i], step_of[i], -1, -1, str(stream), "",
                     launched, -1, max(nbytes, 0), False, "", cls))
        if cls != COMMUNICATION:
            continue
        op = collective_op(args.get("Collective name"), name)
        group = str(args.get("Process Group Name") or f"nccl:stream{stream}")
        seq = _int(args.get("Seq", args.get("seq")))
        if seq < 0:
            seq = seqs.get(group, 0)
            seqs[group] = seq + 1
        nelems = _int(args.get("In msg nelems"), 0)
        nbytes = max(nelems, 0) * DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 1)
        ranks = ranks_string(args.get("Process Group Ranks"))
        rows.append(("collective", op, starts[i], starts[i], step_of[i], -1, -1, group, ranks, seq,
                     -1, nbytes, True, "", "gpu"))
        rows.append(("done", op, ends[i], ends[i], step_of[i], -1, -1, group, ranks, seq, -1, 0, True,
                     "", "gpu"))
    return rows


def _file_table(path: str):
    """file_rows as an Arrow table: built in the worker process, and cheap to
    send back (Arrow IPC) and to write."""
    rows, facts = file_rows(path)
    return events_table(rows), facts


def import_kineto(paths: list, out_dir: str) -> tuple[str, dict]:
    """Import trace files (rank from distributedInfo.rank, else their order)."""
    if not paths:
        raise UserError("no trace files given")
    parsed = []
    for index, (path, (rows, facts)) in enumerate(zip(paths, map_files(_file_table, paths))):
        rank = facts["rank_in_trace"] if facts["rank_in_trace"] is not None else index
        parsed.append((rank, path, rows, facts))
    seen = {}
    for rank, path, _, _ in parsed:
        if rank in seen:
            raise UserError(f"rank {rank} is in both {_display(seen[rank])} and {_display(path)}; "
                            "import traces of different jobs separately")
        seen[rank] = path
    writer = RunDirWriter(out_dir, "kineto", paths)
    for rank, path, rows, facts in parsed:
        writer.write_rank(rank, rows, {
            "world_size": facts["world_size"] or len(parsed), "pid": facts["pid"], "host": "",
            "clock": clock_meta(), "source": {"format": "kineto", "file": os.path.abspath(path)},
            "profiler_steps": facts["steps"], "gpu_activities": facts["gpu_activities"]})
    run_dir = writer.finish()
    return run_dir, {"ranks": writer.ranks, "events": writer.events_total}


def import_profiler_windows(run_dir: str, warn=print) -> dict:
    """After `diagnose run --torch-profiler`: add each rank's GPU activity from
    its own Kineto trace to its rank folder (the CPU side is already recorded
    natively). Kineto's wall-clock times are put on the rank's monotonic clock
    through its meta.json anchors. Idempotent: a rank already done is skipped."""
    from diagnose import rundir, trace_reader
    done = {}
    for rank_dir in rundir.rank_dirs(run_dir):
        files = sorted(glob.glob(os.path.join(glob.escape(rank_dir), PROFILER_DIR, "*.json*")))
        if not files or any(n.startswith("events-kineto-") for n in os.listdir(rank_dir)):
            continue
        clock = trace_reader.read_meta(rank_dir, lambda m: None).get("clock") or {}
        shift = int(clock.get("mono_anchor_ns", 0)) - int(clock.get("wall_anchor_ns", 0))
        rows = []
        for path in files:
            try:
                kernel_rows, _ = file_rows(path, gpu_only=True)
            except UserError as exc:
                warn(f"diagnose: warning: {exc}")
                continue
            rows.extend(r[:2] + (r[2] + shift, r[3] + shift) + r[4:] for r in kernel_rows
                        if r[0] == "kernel")
        append_rank_events(rank_dir, rows, "kineto")
        done[trace_reader.rank_of_dir(rank_dir)] = len(rows)
    return done
