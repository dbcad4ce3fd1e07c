"""Import Nsight Systems SQLite exports (`nsys export --type sqlite`) into a run dir.

Read, per profiled process (one process = one rank):

    CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET -> "kernel" rows (classes as in
        diagnose.importers.run_writer; names from StringIds via demangledName/shortName)
    NCCL kernels (ncclDevKernel_*, ncclKernel_*)   -> also "collective" + "done" rows,
        group "nccl:comm<k>" (k: the NCCL stream's rank in order of first use;
        stream ids need not agree across processes), seq = order on that
        stream, detail "gpu:order" (an export has no process-group metadata;
        one PG per NCCL stream, as torch creates them); its members are taken
        to be all the imported ranks (docs/choices.md). The op is the NCCL call
        whose NVTX range encloses the kernel's launch on the launching thread
        (NCCL's own ranges, domain "NCCL" or, where the export lacks the
        domain's creation (a window cut from a longer capture), named
        ncclAllReduce...); for ncclGroupEnd, which names no op, PyTorch's
        range around it (nccl:<op>, record_function and emit_nvtx text
        "nccl:all_to_all, op_id = 12": the op before the comma); else the
        kernel's name. A range whose
        payload (jsonText) carries NCCL's "NCCL communicator ID" names the
        group "nccl:<id>" instead (the same on every member) and its "Message
        size [bytes]" the bytes. Consecutive kernels of one call are one
        collective. An ncclSend / ncclRecv range whose payload says its
        "Peer rank" is a "p2p" row instead (group "SRC->DST", seq the n-th
        message of the pair, detail "gpu"): the peer's rank in its
        communicator, taken as its global rank (a world communicator).
    CUPTI_ACTIVITY_KIND_RUNTIME                    -> launch times (the step a kernel
        belongs to) and host syncs (cudaDeviceSynchronize & co.) as "sync" rows
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION rows of   -> "stream_wait" rows (docs/run-directory.md);
        syncType STREAM_WAIT_EVENT                   the stream waited on and the record's
        (cudaStreamWaitEvent)                        correlation: the CUDA_EVENT row (a
                                                     cudaEventRecord) of the same context and
                                                     event with the highest correlation below
                                                     the wait's, as libkineto pairs them; -1
                                                     without one (no --cuda-event-trace)
    NVTX_EVENTS push/pop and start/end ranges      -> our kinds: ranges from the
        collectors' own domain "diagnose" keep their category as the kind; other
        ranges by name ("step 12" / "ProfilerStep#12" -> step 12, "forward",
        "backward", "optimizer", "data_wait" / DataLoader __next__ -> data, the
        rest "phase"); text from `text` or `textId` -> StringIds

When no range names a step, steps are cut at the end of each "optimizer" range,
as the native recorder does. globalTid/globalPid are decoded as
pid = (id >> 24) & 0xFFFFFF, tid = id & 0xFFFFFF. Times are ns since the
capture started; TARGET_INFO_SESSION_START_TIME.utcEpochNs anchors them to wall
time, which is how ranks from separate reports are put on one clock.

Ranks: a file whose name says `rank<N>` (what `diagnose run --nsys` writes) and
holds one process is rank N; otherwise the processes with GPU kernels (else
with NVTX ranges) get the next free ranks, ordered by GPU then pid.

The export's tables are read in diagnose.importers.nsys_export; here they become rows.
"""

import bisect
import os
import re
from collections import namedtuple

import numpy as np

from collectors.schema import COMMUNICATION, KINDS, MEMORY, EventRow, event_row, new_row
from diagnose.errors import UserError
from diagnose.importers.gpu_activity import collective_op, kernel_class, launching_ranges, nccl_call_op, p2p_pair
from diagnose.importers.kineto_io import gc_paused
from diagnose.importers.kineto_scan import STREAM_WAIT
from diagnose.importers.nsys_export import (
    NVTX_RANGE_TYPES,
    Export,
    decode_global_id,
    display_name,
    pid_of,
    range_payload,
)
from diagnose.importers.run_writer import RunDirWriter, assign_steps, clock_meta, launch_bound_ns

_SYNC_CALLS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
}
_STEP_RE = re.compile(r"^(?:ProfilerStep\s*#\s*|(?:train[_ ])?step[ _:#-]*)(\d+)$", re.IGNORECASE)
_DATA_RE = re.compile(r"^(data_wait|data|enumerate\(DataLoader\)#.*__next__)$")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NCCL_API_RE = re.compile(r"^nccl[A-Z]\w*$")  # NCCL's own NVTX ranges: ncclAllReduce, ncclGroupEnd
_PHASES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer"}
NcclCall = namedtuple("NcclCall", "start end thread op group bytes peer own")  # own: NCCL's own range


def _rows_for(export, pid: int, single: bool, world: str = "", rank: int = -1) -> list:
    """The rows of one process (every process of the export if single), by start."""

    def mine(gid):
        return single or (gid is not None and decode_global_id(gid)[0] == pid)

    # calls: the NcclCall of each NCCL call's range
    cpu, calls = [], []
    launches = {}  # correlation -> (start, thread)
    for s, e, gtid, corr, name_id in export.runtime:
        if not mine(gtid) or s is None:
            continue
        if corr is not None:
            launches[corr] = (s, gtid)
        name = re.sub(r"_v\d+$", "", export.string(name_id))
        if name in _SYNC_CALLS and e is not None:
            cpu.append(("sync", name, s, e, "cuda"))
    for row in export.nvtx:
        if row.eventType in NVTX_RANGE_TYPES and row.end is not None and mine(row.globalTid):
            call = _nccl_call(export, row)
            if call is not None:
                calls.append(call)
                continue
            kind, name = _nvtx_kind(export, row)
            cpu.append((kind, name, row.start, row.end, "nvtx"))
    steps = _steps(cpu)
    cpu = [c for c in cpu if c[0] != "step"]
    numbers = np.array(sorted(steps), dtype=np.int64)
    starts = np.array([steps[n][0] for n in numbers], dtype=np.int64)
    rows = [event_row("step", "step", steps[n][0], steps[n][1], int(n)) for n in numbers]
    step_of = assign_steps(starts, numbers, np.array([c[2] for c in cpu], dtype=np.int64))
    for (kind, name, s, e, detail), st in zip(cpu, step_of.tolist()):
        rows.append(event_row(kind, name, s, e, st, detail=detail))
    rows.extend(_gpu_rows(export, pid, single, launches, calls, starts, numbers, world, rank))
    rows.extend(_wait_rows(export, pid, single, launches, starts, numbers))
    rows.sort(key=lambda r: r.start_ns)
    return rows


def _wait_rows(export, pid, single, launches, step_starts, step_numbers) -> list:
    """The process's cudaStreamWaitEvent calls as "stream_wait" rows, their
    step the one their call ran in, as a kernel's is its launch's."""
    waits = [w for w in export.waits if single or pid_of(w.globalPid) == pid]
    calls = np.array(
        [launches[w.correlationId][0] if w.correlationId in launches else w.start for w in waits], dtype=np.int64
    )
    rows = []
    for (s, e, stream, corr, gpid, context, event, _), st in zip(
        waits, assign_steps(step_starts, step_numbers, calls).tolist()
    ):
        corr = -1 if corr is None else corr
        recorded = export.records.get((pid_of(gpid), context, event), ())
        at = bisect.bisect_left(recorded, (corr,))  # the last record before the wait call
        record, peer = recorded[at - 1] if at else (-1, -1)
        rows.append(
            event_row(
                "stream_wait",
                STREAM_WAIT,
                s,
                e,
                st,
                group=str(stream),
                seq=corr,
                peer=-1 if peer is None else peer,
                nbytes=record,
                detail="nsys",
            )
        )
    return rows


def _nvtx_kind(export, row) -> tuple[str, str]:
    text = (export.text(row) or "").strip()
    domain = export.domains.get(row.domainId, "")
    category = export.categories.get((row.domainId, row.category), "")
    if domain == "diagnose" and category in KINDS:
        if category == "collective" and text == "wait":
            return "wait", text
        return category, text
    m = _STEP_RE.match(text)
    if m:
        return "step", m.group(1)
    if _DATA_RE.match(text):
        return "data", "data_wait"
    kind = _PHASES.get(text.strip("# ").lower())
    if kind:
        return kind, kind
    return "phase", text


def _nccl_call(export, row):
    """The NcclCall (group or "", peer or -1) if the NVTX range is an NCCL
    call's: NCCL's, or PyTorch's nccl:<op> around it."""
    text = (export.text(row) or "").strip()
    own = export.domains.get(row.domainId, "") == "NCCL" or bool(_NCCL_API_RE.match(text))
    if not own and not text.startswith("nccl:"):
        return None
    op = nccl_call_op(text if own else text.split(",")[0])
    if op is None:
        return None
    payload = range_payload(row.jsonText)
    comm = payload.get("NCCL communicator ID")
    group = f"nccl:{comm}" if isinstance(comm, (int, str)) and not isinstance(comm, bool) and comm != "" else ""
    nbytes = payload.get("Message size [bytes]")
    peer = payload.get("Peer rank") if op in ("send", "recv") else None
    return NcclCall(
        row.start,
        row.end,
        row.globalTid,
        op,
        group,
        nbytes if _count(nbytes) and nbytes > 0 else 0,
        peer if _count(peer) else -1,
        own,
    )


def _gpu_rows(export, pid, single, launches, calls, step_starts, step_numbers, world: str, rank: int) -> list:
    gpu = [g for g in export.gpu if single or (g.gpid is not None and decode_global_id(g.gpid)[0] == pid)]
    gpu.sort(key=lambda g: g.start)
    streams = list(dict.fromkeys(g.stream for g in gpu if kernel_class(g.name) == COMMUNICATION))
    launch = np.array([launches[g.corr][0] if g.corr in launches else g.start for g in gpu], dtype=np.int64)
    known = np.array([g.corr in launches for g in gpu], bool)
    starts = np.array([g.start for g in gpu], np.int64)
    launch = launch_bound_ns(launch, known, starts, np.array([g.stream for g in gpu], np.int64))
    step_of = assign_steps(step_starts, step_numbers, launch).tolist()
    nccl = [i for i, g in enumerate(gpu) if kernel_class(g.name) == COMMUNICATION]
    # NCCL's innermost range around the launch, and PyTorch's around that:
    # ncclGroupEnd launches a group's kernel and names no op, PyTorch's range does
    own, torch = [c for c in calls if c.own], [c for c in calls if not c.own]
    nccl_launches = [launches.get(gpu[i].corr) for i in nccl]
    call_of = dict(
        zip(
            nccl,
            zip(
                launching_ranges(nccl_launches, [(c.start, c.end, c.thread) for c in own]),
                launching_ranges(nccl_launches, [(c.start, c.end, c.thread) for c in torch]),
            ),
        )
    )
    rows, seqs, last_call = [], {}, {}  # last_call: stream -> (call, its done row's index)
    for i, ((s, e, _, stream, corr, _, name, nbytes), st) in enumerate(zip(gpu, step_of)):
        cls = MEMORY if name.startswith(("Memcpy", "Memset")) else kernel_class(name)
        launched = corr if corr in launches else -1
        # queued_ns: launch to start (~0: the GPU waited for the host), as Kineto imports keep it
        rows.append(
            new_row(
                EventRow,
                (
                    "kernel",
                    name,
                    s,
                    e,
                    st,
                    -1,
                    -1,
                    str(stream),
                    "",
                    launched,
                    -1,
                    int(nbytes),
                    False,
                    "",
                    cls,
                    max(s - int(launch[i]), 0) if launched >= 0 else -1,
                ),
            )
        )
        if cls != COMMUNICATION:
            continue
        c = call_of[i]  # (NCCL's range, PyTorch's range), -1: none
        previous = last_call.get(stream)
        if max(c) >= 0 and previous is not None and previous[0] == c:  # another kernel of the same call
            done = rows[previous[1]]
            rows[previous[1]] = done._replace(start_ns=e, end_ns=e)
            continue
        call = own[c[0]] if c[0] >= 0 else NcclCall(0, 0, 0, "nccl", "", 0, -1, True)
        op, group, sent, peer = call.op, call.group, call.bytes, call.peer
        if op == "nccl" and c[1] >= 0:  # a range that names no collective (ncclGroupEnd): PyTorch's does
            op = torch[c[1]].op
        if op == "nccl":  # nor PyTorch's: the kernel says more
            op = collective_op(None, name)
        kind, members, detail = "collective", world, "gpu:order"
        if peer >= 0 and rank >= 0:  # a send/recv to a known peer: matched as the pair's n-th message
            (group, members), kind, detail = p2p_pair(op, rank, peer), "p2p", "gpu"
        else:
            peer = -1
        group = group or f"nccl:comm{streams.index(stream)}"
        seq = seqs.get(group, 0)
        seqs[group] = seq + 1
        rows.append(
            event_row(
                kind,
                op,
                s,
                s,
                st,
                group=group,
                group_ranks=members,
                seq=seq,
                peer=peer,
                nbytes=sent,
                async_op=True,
                detail=detail,
            )
        )
        rows.append(
            event_row(
                "done", op, e, e, st, group=group, group_ranks=members, seq=seq, peer=peer, async_op=True, detail=detail
            )
        )
        last_call[stream] = (c, len(rows) - 1)
    return rows


def _count(value) -> bool:
    """Whether a payload value is a non-negative integer (JSON true is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _steps(cpu: list) -> dict:
    """step number -> (start, end): from step ranges, else cut at optimizer ends."""
    named = {}
    for kind, number, s, e, _ in cpu:
        if kind == "step":
            named.setdefault(int(number), (s, e))
    if named:
        return named
    ends = sorted(e for kind, _, s, e, _ in cpu if kind == "optimizer")
    if not ends:
        return {}
    first = min(s for _, _, s, _, _ in cpu)
    starts = [first] + ends[:-1]
    return {i: (s, e) for i, (s, e) in enumerate(zip(starts, ends))}


@gc_paused()  # its rows: 10^5-10^6 namedtuples (never untracked, as plain tuples are), no cycle to collect
def import_nsys(paths: list, out_dir: str) -> tuple[str, dict]:
    if not paths:
        raise UserError("no SQLite exports given")
    exports = [Export(p) for p in paths]
    planned, taken = [], set()  # (rank or None, export, pid, the file's only process)
    for export in exports:
        pids = export.processes()
        if not pids:
            raise UserError(f"{display_name(export.path)}: no process with GPU kernels or NVTX ranges")
        m = _RANK_RE.search(os.path.basename(export.path))
        if m and len(pids) == 1 and int(m.group(1)) not in taken:
            taken.add(int(m.group(1)))
            planned.append((int(m.group(1)), export, pids[0], True))
        else:
            planned.extend((None, export, pid, len(pids) == 1) for pid in pids)
    ranks, free = [], 0
    for rank, export, pid, single in planned:
        if rank is None:
            while free in taken:
                free += 1
            rank = free
            taken.add(rank)
        ranks.append((rank, export, pid, single))
    writer = RunDirWriter(out_dir, "nsys", paths)
    world = ",".join(str(r) for r in sorted(r for r, _, _, _ in ranks))
    for rank, export, pid, single in sorted(ranks, key=lambda x: x[0]):
        rows = _rows_for(export, pid, single, world, rank)
        writer.write_rank(
            rank,
            rows,
            {
                "world_size": len(ranks),
                "pid": pid,
                "host": "",
                "clock": clock_meta(wall_anchor_ns=export.session_start_ns),
                "source": {"format": "nsys", "file": os.path.abspath(export.path)},
            },
        )
    run_dir = writer.finish()
    return run_dir, {"ranks": writer.ranks, "events": writer.events_total}
