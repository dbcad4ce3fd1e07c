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
    GPU kernels, memcpy, memset, GPU syncs  -> "kernel" rows (diagnose.importers.run_writer)
    "Stream Wait Event" (cuda_sync)         -> "stream_wait" instead: a stream waits for an event
                                               recorded on another (docs/run-directory.md)
    NCCL kernels                            -> also "collective" + "done" rows, from the
                                               kernel's "Collective name", "Process Group
                                               Name/Ranks", "In msg nelems", "dtype", "Seq";
                                               a send/recv whose args name its peer ("Dst
                                               Rank"/"Src Rank"): "p2p" + "done" instead
    fused exchange (ncclDevKernel_SendRecv  -> one "p2p" + "done" per nccl:send/nccl:recv op its
      under nccl:coalesced)                    thread issued before it, peer from the op's "Dst
                                               Rank"/"Src Rank" or the pipeline group in pg_config
    compute kernels launched from the main  -> "forward" (main) / "backward" (autograd thread),
      or the autograd thread, in a trace       device spans, detail "gpu:inferred"
      that records no forward/backward         (kineto_structure.py)

Other CPU ops are skipped: they are what HTA and TensorBoard already show, and
the detectors need phases, not operators. A file that is not a Kineto trace is
refused with a one-line reason (diagnose.errors.UserError).

Files are read by kineto_io.py and scanned by kineto_scan.py: in C when the
extension is built (_kineto_c.c, 2x faster again), else through msgspec
(3-4x faster than building a dict per event), several at once
in worker processes, each of which also writes its file's events as Parquet
(the parent only moves the files into the run dir). The table is built
column by column (kineto_columns.py), not as a tuple per kernel.
"""

import functools
import glob
import os
import re
import shutil
import tempfile

import pyarrow as pa
import pyarrow.compute as pc

from collectors.part_writer import write_parquet_atomic
from collectors.profiler_window import OUT_DIR as PROFILER_DIR
from collectors.schema import events_table
from diagnose.errors import UserError
from diagnose.importers import kineto_scan
from diagnose.importers.gpu_activity import as_int
from diagnose.importers.kineto_columns import table_and_facts
from diagnose.importers.kineto_io import _display, gc_paused, load_trace, map_files, parse_trace, read_trace_bytes  # noqa: F401 (load_trace: API)
from diagnose.importers.kineto_scan import (
    LAUNCH_CATS,
    NCCL_RANGE_CATS,
    NCCL_RANGE_PREFIX,
    PHASE_FIRST,
    SYNC_CALLS,
    nccl_range,
)
from diagnose.importers.run_writer import RunDirWriter, append_rank_events, clock_meta

_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_DATA_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
_PHASE_NAMES = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "distributeddataparallel.forward": "forward",
}


def file_table(path: str, gpu_only: bool = False) -> tuple[pa.Table, dict]:
    """trace_table of a trace file: through the msgspec scan when it applies
    (diagnose/importers/kineto_scan.py), else through the parsed dicts."""
    raw = read_trace_bytes(path)
    with gc_paused():
        fast = kineto_scan.scan(raw, gpu_only, _classify)
        if fast is not None:
            top, *scanned = fast
            return table_and_facts(top["baseTimeNanoseconds"], top["distributedInfo"], *scanned)
        return trace_table(parse_trace(raw, _display(path)), gpu_only)


def trace_table(trace: dict, gpu_only: bool = False) -> tuple[pa.Table, dict]:
    """The events (collectors.schema's table, in start order) and facts for meta.json."""
    return table_and_facts(
        trace.get("baseTimeNanoseconds"), trace.get("distributedInfo"), *_scan_events(trace["traceEvents"], gpu_only)
    )


def _scan_events(events, gpu_only: bool):
    """(cpu, gpu, launches, pids, nccl ranges) from parsed event dicts; kineto_scan mirrors it."""
    launches = {}  # correlation -> (ts, tid) of the runtime call that launched it
    cpu, gpu = [], []  # (kind, name, ts, dur, detail); (name, ts, dur, stream, corr, bytes, collective?, args)
    pids, ranges = {}, []  # ranges: (op, ts, dur, tid, bytes) of the "nccl:<op>" CPU ranges
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
        if stream is not None and as_int(stream) >= 0:
            gpu.append(
                (
                    name,
                    ts,
                    dur,
                    int(stream),
                    as_int(args.get("correlation")),
                    max(as_int(args.get("bytes"), 0), 0),
                    "Collective name" in args,
                    args,
                )
            )
            continue
        cat = e.get("cat")
        pid = e.get("pid")
        if isinstance(pid, int):
            pids[pid] = pids.get(pid, 0) + 1
        if cat in LAUNCH_CATS:
            if "correlation" in args:
                launches[as_int(args["correlation"])] = (ts, e.get("tid"))
            if not gpu_only and name in SYNC_CALLS:
                cpu.append(("sync", name, ts, dur, "cuda"))
            continue
        if gpu_only or not name or cat == "gpu_user_annotation":  # GPU-side copies of CPU ranges
            continue
        if name.startswith(NCCL_RANGE_PREFIX):
            if cat in NCCL_RANGE_CATS:
                ranges.append(
                    nccl_range(
                        name,
                        ts,
                        dur,
                        e.get("tid"),
                        args.get("Input Dims"),
                        args.get("Input type"),
                        args.get("Dst Rank"),
                        args.get("Src Rank"),
                    )
                )
            continue
        row = _classify(name, cat, ts, dur)
        if row is not None:
            cpu.append(row)
    return cpu, gpu, launches, pids, ranges


def _classify(name: str, cat, ts, dur):
    """The CPU row (kind, name, ts, dur, detail) a complete CPU event becomes, if any."""
    first = name[0]
    if first == "P" and name.startswith("ProfilerStep"):
        m = _STEP_RE.match(name)
        if m:
            return ("step", "step", ts, dur, m.group(1))
    elif first == "e" and _DATA_RE.match(name):
        # as the native dataloader collector: "workers=0" for a single-process loader
        return ("data", "data_wait", ts, dur, "workers=0" if "_SingleProcessDataLoaderIter" in name else name)
    elif first == "O" and name.startswith("Optimizer.step#"):
        return ("optimizer", "optimizer", ts, dur, name)
    elif first in PHASE_FIRST and cat in ("user_annotation", "cpu_op", "Operator"):
        kind = _PHASE_NAMES.get(name.strip("# ").lower())
        if kind:
            return (kind, kind, ts, dur, name)
    return None


def _stage_file(staging_dir: str, path: str) -> tuple[str, int, dict]:
    """Parse one trace and write its events as Parquet into staging_dir: run in
    the worker processes, so that neither the table nor its encoding passes
    through the parent. (staged file, events, facts)"""
    table, facts = file_table(path)
    fd, staged = tempfile.mkstemp(suffix=".parquet", dir=staging_dir)
    os.close(fd)
    write_parquet_atomic(table, staged)
    return staged, table.num_rows, facts


def import_kineto(paths: list, out_dir: str) -> tuple[str, dict]:
    """Import trace files (rank from distributedInfo.rank, else their order)."""
    if not paths:
        raise UserError("no trace files given")
    staging_dir = tempfile.mkdtemp(prefix="diagnose-import-")
    try:
        parsed = []
        for index, (path, staged) in enumerate(
            zip(paths, map_files(functools.partial(_stage_file, staging_dir), paths))
        ):
            facts = staged[2]
            rank = facts["rank_in_trace"] if facts["rank_in_trace"] is not None else index
            parsed.append((rank, path, staged))
        seen = {}
        for rank, path, _ in parsed:
            if rank in seen:
                raise UserError(
                    f"rank {rank} is in both {_display(seen[rank])} and {_display(path)}; "
                    "import traces of different jobs separately"
                )
            seen[rank] = path
        writer = RunDirWriter(out_dir, "kineto", paths)
        for rank, path, (staged, events, facts) in parsed:
            writer.adopt_rank(
                rank,
                staged,
                events,
                {
                    "world_size": facts["world_size"] or len(parsed),
                    "pid": facts["pid"],
                    "host": "",
                    "clock": clock_meta(),
                    "source": {"format": "kineto", "file": os.path.abspath(path)},
                    "profiler_steps": facts["steps"],
                    "gpu_activities": facts["gpu_activities"],
                    **({"process_groups": facts["process_groups"]} if facts.get("process_groups") else {}),
                    # what the trace's exchanges and passes could not say (kineto_structure.py)
                    **({"device_structure": facts["device_structure"]} if facts.get("device_structure") else {}),
                },
            )
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    run_dir = writer.finish()
    return run_dir, {"ranks": writer.ranks, "events": writer.events_total}


def import_profiler_windows(run_dir: str, warn=print) -> dict:
    """After `diagnose run --torch-profiler`: add each rank's GPU activity from
    its own Kineto trace to its rank folder (the CPU side is already recorded
    natively). Kineto's wall-clock times are put on the rank's monotonic clock
    through its meta.json anchors. Idempotent: a rank already done is skipped.
    {rank: its kernel rows}."""
    from diagnose import rundir
    from diagnose.rundir import rank_reader

    done = {}
    for rank_dir in rundir.rank_dirs(run_dir):
        files = sorted(glob.glob(os.path.join(glob.escape(rank_dir), PROFILER_DIR, "*.json*")))
        if not files or any(n.startswith("events-kineto-") for n in os.listdir(rank_dir)):
            continue
        clock = rank_reader.read_meta(rank_dir, lambda m: None).get("clock") or {}
        shift = int(clock.get("mono_anchor_ns", 0)) - int(clock.get("wall_anchor_ns", 0))
        tables = []
        for path in files:
            try:
                table, _ = file_table(path, gpu_only=True)
            except UserError as exc:
                warn(f"diagnose: warning: {exc}")
                continue
            # the GPU side: its activities, and the waits between its streams
            table = table.filter(pc.is_in(table.column("kind"), pa.array(["kernel", "stream_wait"])))
            for column in ("start_ns", "end_ns"):
                table = table.set_column(
                    table.schema.get_field_index(column), column, pc.add(table.column(column), shift)
                )
            tables.append(table)
        table = pa.concat_tables(tables) if tables else events_table([])
        append_rank_events(rank_dir, table, "kineto")
        done[rundir.rank_of_dir(rank_dir)] = pc.sum(pc.equal(table.column("kind"), "kernel")).as_py() or 0
    return done
