"""The events table of one Kineto trace, built column by column.

A trace has tens of thousands of GPU activities but few distinct strings: 51
kernel names among 22k kernels in HTA's largest fixture, one kind, a handful of
streams and classes. So a string column travels as int32 codes into its
distinct values (`Strings`), and becomes Arrow as a take() of those values,
encoded once each (encoding every value, through numpy object arrays, was a
quarter of an import). Numeric columns are numpy arrays from start to end.

Rows, in start order (ties: CPU rows first, then the trace's GPU order, a
collective call's first NCCL kernel followed by its collective row and its
last kernel by its done row; stream_wait rows last):

    CPU rows          step, data, forward/backward/optimizer, sync (kineto._classify)
    kernel rows       one per GPU activity (docs/run-directory.md: what is what)
                      but a Stream Wait Event, which is a stream_wait row
    collective, done  one each per collective call (its NCCL kernels)
    p2p, done         instead, for a send or recv whose peer the kernel's args
                      name (PyTorch's "Dst Rank" / "Src Rank": global ranks)
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.schema import COMMUNICATION, EVENT_COLUMNS, EVENT_FIELDS, EVENT_SCHEMA, arrow_array, event_row
from diagnose.importers.gpu_activity import (
    DTYPE_BYTES,
    as_int,
    collective_op,
    kernel_class,
    launching_ranges,
    p2p_pair,
    ranks_string,
)
from diagnose.importers.kineto_scan import STREAM_WAIT, peer_rank
from diagnose.importers.kineto_structure import SOURCE as STRUCTURE_SOURCE
from diagnose.importers.kineto_structure import device_structure
from diagnose.importers.process_groups import process_groups
from diagnose.importers.run_writer import assign_steps, launch_bound_ns

_NUMPY_DTYPES = {pa.int32(): np.int32, pa.int64(): np.int64, pa.bool_(): np.bool_}
# what a row holds where nothing is said: event_row's defaults, step to detail
_DEFAULTS = dict(zip(EVENT_COLUMNS[4:], event_row.__defaults__))


class Strings:
    """A string column: `codes` (int32) into `values` (its distinct strings)."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list):
        self.codes, self.values = codes, values

    @classmethod
    def of(cls, items) -> "Strings":
        index = {}
        codes = np.fromiter([index.setdefault(v, len(index)) for v in items], np.int32, len(items))
        return cls(codes, list(index))

    @classmethod
    def concat(cls, parts) -> "Strings":
        index, codes = {}, []
        for part in parts:
            recode = np.array([index.setdefault(v, len(index)) for v in part.values], np.int32)
            codes.append(recode[part.codes])
        return cls(np.concatenate(codes), list(index))

    def arrow(self, order: np.ndarray) -> pa.Array:
        return pc.take(arrow_array(self.values, pa.string()), arrow_array(self.codes[order], pa.int32()))


def ns_from_us(ts: np.ndarray, base_ns: int) -> np.ndarray:
    """Microsecond floats -> integer ns without float64 rounding at epoch scale."""
    whole = np.floor(ts)
    return base_ns + whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000).astype(np.int64)


def table_and_facts(base_time, dist, cpu, gpu, launches, pids, ranges) -> tuple[pa.Table, dict]:
    """The events table (collectors.schema's, in start order) and the facts for
    meta.json, from a scan's CPU rows (kind, name, ts, dur, detail), GPU
    activities (name, ts, dur, stream, correlation, bytes, collective?, args),
    launches ((ts, tid) by correlation id), event counts by pid and "nccl:"
    CPU ranges (op, ts, dur, tid, bytes, peer). Exchanges and forward/backward
    passes the trace holds without naming them: kineto_structure.py."""
    base_ns = max(as_int(base_time, 0), 0)
    waits = [g for g in gpu if g[0] == STREAM_WAIT]
    if waits:  # not device work: a dependency between streams
        gpu = [g for g in gpu if g[0] != STREAM_WAIT]
    steps = {}
    for kind, _, ts, dur, detail in cpu:
        if kind == "step":
            steps.setdefault(int(detail), (ts, dur))
    step_numbers = np.array(sorted(steps), dtype=np.int64)
    step_starts = ns_from_us(np.array([steps[s][0] for s in step_numbers], dtype=np.float64), base_ns)
    cpu_block = _cpu_block(cpu, steps, base_ns, step_starts, step_numbers)
    kernel_block, start_order = _kernel_block(gpu, launches, base_ns, step_starts, step_numbers)
    dist = dist if isinstance(dist, dict) else {}
    structure = device_structure(
        gpu, launches, ranges, cpu, kernel_block, as_int(dist.get("rank"), -1), process_groups(dist.get("pg_config"))
    )
    first, last, collective_block, done_block = _collective_blocks(
        gpu,
        kernel_block,
        start_order,
        as_int(dist.get("world_size"), 0),
        launches,
        ranges,
        as_int(dist.get("rank"), -1),
        structure.exchanges,
    )
    pass_block = _pass_block(structure.rows)
    wait_block = _wait_block(waits, launches, base_ns, step_starts, step_numbers)
    blocks = (cpu_block, kernel_block, collective_block, done_block, pass_block, wait_block)
    n_cpu = len(cpu_block["start_ns"])
    place = np.empty(len(gpu), np.int64)  # kernel i is the place[i]-th to start
    place[start_order] = np.arange(len(gpu))
    tie_break = np.concatenate(
        [
            np.arange(-n_cpu, 0),
            3 * place,
            3 * place[first] + 1,
            3 * place[last] + 2,
            np.full(len(structure.rows), -1),
            3 * len(gpu) + np.arange(len(waits)),
        ]
    )
    order = np.lexsort((tie_break, np.concatenate([b["start_ns"] for b in blocks])))
    arrays = []
    for name, typ in EVENT_FIELDS:
        parts = [block[name] for block in blocks]
        arrays.append(
            Strings.concat(parts).arrow(order)
            if isinstance(parts[0], Strings)
            else arrow_array(np.concatenate(parts)[order], typ)
        )
    facts = {
        "pid": max(pids, key=pids.get) if pids else None,
        "world_size": as_int(dist.get("world_size"), None),
        "backend": dist.get("backend"),
        "steps": [int(s) for s in step_numbers],
        "gpu_activities": len(gpu),
        "base_time_ns": base_ns,
        "rank_in_trace": as_int(dist.get("rank"), None),
        "process_groups": process_groups(dist.get("pg_config")),
    }
    if structure.note:
        facts["device_structure"] = structure.note
    return pa.Table.from_arrays(arrays, schema=EVENT_SCHEMA), facts


def _wait_block(waits, launches, base_ns, step_starts, step_numbers) -> dict:
    """A Stream Wait Event's "stream_wait" row (docs/run-directory.md): group its
    stream, seq the correlation of its cudaStreamWaitEvent, peer the stream and
    bytes the correlation of the cudaEventRecord it waits for (libkineto's
    wait_on_stream and wait_on_cuda_event_record_corr_id; -1 where it wrote -1
    or nothing, as older versions do for the record)."""
    names, ts, durs, streams, correlations, _, _, args = zip(*waits) if waits else ((),) * 8
    ts = np.array(ts, dtype=np.float64)
    return _block(
        len(waits),
        kind="stream_wait",
        name=Strings.of(names),
        start_ns=ns_from_us(ts, base_ns),
        end_ns=ns_from_us(ts + np.array(durs, dtype=np.float64), base_ns),
        step=assign_steps(step_starts, step_numbers, _launch_ns(ts, correlations, launches, base_ns)),
        group=Strings.of([str(s) for s in streams]),
        seq=correlations,
        peer=[max(as_int(a.get("wait_on_stream")), -1) for a in args],
        bytes=[max(as_int(a.get("wait_on_cuda_event_record_corr_id")), -1) for a in args],
        detail="cuda",
    )


def _launch_ns(ts: np.ndarray, correlations, launches: dict, base_ns: int) -> np.ndarray:
    """Per GPU activity, its launch's (the runtime call's) start, or its own
    start where the launch is not in the trace: the time its step is chosen by."""
    return ns_from_us(
        np.array([launches[c][0] if c in launches else t for c, t in zip(correlations, ts.tolist())], dtype=np.float64),
        base_ns,
    )


def _pass_block(rows: list) -> dict:
    """The forward/backward rows kineto_structure inferred: device spans."""
    kinds, starts, ends, steps, microbatches = zip(*rows) if rows else ((),) * 5
    kind = Strings.of(kinds)
    return _block(
        len(rows),
        kind=kind,
        name=kind,
        start_ns=starts,
        end_ns=ends,
        step=steps,
        microbatch=microbatches,
        detail=STRUCTURE_SOURCE,
    )


def _block(n: int, **columns) -> dict:
    """Every column of n rows: numpy arrays, Strings, or one value for all."""
    block = {}
    for name, typ in EVENT_FIELDS:
        value = columns.get(name, _DEFAULTS.get(name))
        if isinstance(value, Strings):
            block[name] = value
        elif isinstance(value, str):
            block[name] = Strings(np.zeros(n, np.int32), [value])
        else:
            block[name] = (
                np.asarray(value, _NUMPY_DTYPES[typ])
                if isinstance(value, (np.ndarray, list, tuple))
                else np.full(n, value, _NUMPY_DTYPES[typ])
            )
    return block


def _cpu_block(cpu, steps, base_ns, step_starts, step_numbers) -> dict:
    """CPU rows: few (phases, steps, syncs), so built one by one."""
    rows = []
    if cpu:
        ts = np.array([c[2] for c in cpu], dtype=np.float64)
        starts = ns_from_us(ts, base_ns)
        ends = ns_from_us(ts + np.array([c[3] for c in cpu], dtype=np.float64), base_ns)
        step_of = assign_steps(step_starts, step_numbers, starts)
        for (kind, name, ts_us, _, detail), s, t, st in zip(cpu, starts.tolist(), ends.tolist(), step_of.tolist()):
            if kind == "step":
                if steps[int(detail)][0] != ts_us:
                    continue  # a second ProfilerStep#N (another thread): keep the first
                st, detail = int(detail), ""
            rows.append(event_row(kind, name, s, t, st, detail=detail))
    columns = list(zip(*rows)) if rows else [()] * len(EVENT_FIELDS)
    return _block(
        len(rows),
        **{
            name: Strings.of(values) if typ == pa.string() else values
            for (name, typ), values in zip(EVENT_FIELDS, columns)
        },
    )


def _kernel_block(gpu, launches, base_ns, step_starts, step_numbers) -> tuple:
    """(kernel rows, the kernels' indexes in start order (ties: trace order))."""
    n = len(gpu)
    names, ts, durs, streams, correlations, nbytes, collectives, _ = zip(*gpu) if gpu else ((),) * 8
    ts = np.array(ts, dtype=np.float64)
    starts = ns_from_us(ts, base_ns)
    launch_ns = _launch_ns(ts, correlations, launches, base_ns)
    known = np.fromiter((c in launches for c in correlations), bool, n)
    name = Strings.of(names)
    classes = {COMMUNICATION: 0}  # code 0: NCCL kernels, and any activity with a "Collective name"
    class_of_name = np.array([classes.setdefault(kernel_class(v), len(classes)) for v in name.values], np.int32)
    detail = np.where(np.array(collectives, bool), 0, class_of_name[name.codes]).astype(np.int32)
    stream_ids, stream_codes = np.unique(np.array(streams, np.int64), return_inverse=True)
    block = _block(
        n,
        kind="kernel",
        name=name,
        start_ns=starts,
        end_ns=ns_from_us(ts + np.array(durs, dtype=np.float64), base_ns),
        step=assign_steps(step_starts, step_numbers, launch_bound_ns(launch_ns, known, starts, streams)),
        group=Strings(stream_codes.astype(np.int32).ravel(), [str(s) for s in stream_ids.tolist()]),
        seq=[c if c in launches else -1 for c in correlations],  # -1: launched before the trace
        bytes=nbytes,
        detail=Strings(detail, list(classes)),
        # how long it waited from its launch (the runtime call's start) to its start: ~0
        # when the GPU's queue was empty; -1: launch not in the trace. Kineto maps GPU
        # times to the host's clock, so a few us either way are its error: clamped at 0
        queued_ns=np.where(known, np.maximum(starts - launch_ns, 0), -1),
    )
    return block, np.argsort(starts, kind="stable")


def _collective_blocks(
    gpu,
    kernels: dict,
    start_order: np.ndarray,
    world_size: int,
    launches: dict,
    ranges: list,
    rank: int = -1,
    exchanges: dict | None = None,
) -> tuple:
    """(each collective call's first NCCL kernel, and last; their collective
    (or p2p) rows; their done rows), calls in start order.

    A kernel's call is the "nccl:<op>" CPU range its launch ran inside, on the
    launching thread (launch correlation), where the kernel's own args do not
    name one: NCCL names the kernels of an all_to_all, and on some versions an
    all_reduce, SendRecv. The kernels of one call (one range, or one sequence
    number) that follow each other on a stream are one collective, from the
    first one's start to the last one's end.

    A group's calls that carry no sequence number are numbered in start order,
    and marked "gpu:order" (detail) so that matching checks the numbering
    across ranks (diagnose.analysis.tables.device_collectives). A kernel without
    process-group args is on communicator "nccl:comm<k>", k its NCCL stream's
    rank in order of first use (stream ids need not agree across processes),
    and its members are taken to be the world (docs/choices.md: traces of
    subgroups from PyTorch >= 2.0 carry their ranks).

    A send or recv whose peer is known (`_p2p_peer`) on a trace that says its
    own rank is a p2p row as a native run writes it (collectors/instrument/
    collectives.py): group "SRC->DST", seq its place among this rank's messages
    of that pair in start order, which is the order NCCL delivers them in. It
    is detail "gpu", not "gpu:order": the device checks want one op across an
    instance's members (diagnose.analysis.tables.device_collectives), and a send's
    partner is a recv, so they would unmatch every pair. (So a trace that lost
    a message, sampled or cut, shifts the pair's numbering unchecked.) Without
    a peer it stays a collective of its process group, as before. A fused
    exchange (`exchanges`: NCCL kernel index -> its messages with peers,
    kineto_structure.py) is one p2p row per message, each with the kernel's times."""
    detail = kernels["detail"]
    nccl = start_order[detail.codes[start_order] == 0]  # (_kernel_block: 0 is COMMUNICATION)
    streams = list(dict.fromkeys(gpu[j][3] for j in nccl.tolist()))
    world = ",".join(map(str, range(world_size))) if world_size > 0 else ""
    launched_in = launching_ranges(
        [launches.get(gpu[j][4]) for j in nccl.tolist()], [(ts, ts + dur, tid) for _, ts, dur, tid, *_ in ranges]
    )
    named = {}  # (Collective name, kernel name, group, stream, ranks) -> (op, group, ranks): a few distinct
    calls, next_seq, last_call = [], {}, {}  # [op, group, ranks, seq, bytes, inferred, first, last, key, peer]
    for position, (j, r) in enumerate(zip(nccl.tolist(), launched_in)):
        kernel_name, _, _, stream, _, _, _, a = gpu[j]
        collective_name = a.get("Collective name")
        if collective_name is None and r >= 0:
            collective_name = ranges[r][0]
        key = (collective_name, kernel_name, a.get("Process Group Name"), stream, a.get("Process Group Ranks"))
        try:
            op, group, group_ranks = named.get(key) or named.setdefault(key, _collective_names(*key, streams, world))
        except TypeError:  # an unhashable value (ranks as a list)
            op, group, group_ranks = _collective_names(*key, streams, world)
        peer = _p2p_peer(op, a, rank)
        if peer < 0 and exchanges and j in exchanges:
            for message, to, nbytes in exchanges[j]:
                pair, pair_ranks = p2p_pair(message, rank, to)
                seq = next_seq.get(pair, 0)
                next_seq[pair] = seq + 1
                calls.append([message, pair, pair_ranks, seq, nbytes, False, position, position, None, to])
            continue
        if peer >= 0:
            group, group_ranks = p2p_pair(op, rank, peer)
        seq = as_int(a.get("Seq", a.get("seq")))
        call = ("seq", seq) if seq >= 0 else ("range", r) if r >= 0 else None
        previous = last_call.get(group)
        if call is not None and previous is not None and previous[8] == call:
            previous[7] = position  # another kernel of the same call
            continue
        inferred = seq < 0 and peer < 0
        if inferred or peer >= 0:  # ("Seq" counts the process group's calls, not the pair's)
            seq = next_seq.get(group, 0)
            next_seq[group] = seq + 1
        elems = max(as_int(a.get("In msg nelems"), 0), 0)
        nbytes = elems * DTYPE_BYTES.get(str(a.get("dtype", "")).lower(), 1) if elems or r < 0 else ranges[r][4]
        last_call[group] = [op, group, group_ranks, seq, nbytes, inferred, position, position, call, peer]
        calls.append(last_call[group])
    ops, groups, ranks, seqs, sent, inferred, first, last, _, peers = zip(*calls) if calls else ((),) * 10
    first, last = nccl[list(first)], nccl[list(last)]
    op, group, group_ranks = Strings.of(ops), Strings.of(groups), Strings.of(ranks)
    starts, ends, steps = kernels["start_ns"][first], kernels["end_ns"][last], kernels["step"][first]
    how = Strings(np.array(inferred, np.int32), ["gpu", "gpu:order"])
    common = dict(
        name=op, step=steps, group=group, group_ranks=group_ranks, seq=seqs, peer=peers, async_op=True, detail=how
    )
    n = len(calls)
    kind = Strings(np.array([p >= 0 for p in peers], np.int32), ["collective", "p2p"])
    return (
        first,
        last,
        _block(n, kind=kind, start_ns=starts, end_ns=starts, bytes=sent, **common),
        _block(n, kind="done", start_ns=ends, end_ns=ends, **common),
    )


_PEER_KEYS = {"send": "Dst Rank", "recv": "Src Rank"}


def _p2p_peer(op: str, args, rank: int) -> int:
    """The global rank of a send's or recv's peer from the kernel's args
    (PyTorch writes it as a number or a numeric string), or -1: not a p2p
    row, for another op, an unknown peer or an unknown own rank."""
    key = _PEER_KEYS.get(op)
    if key is None or rank < 0:
        return -1
    return peer_rank(args.get(key))


def _collective_names(collective_name, kernel_name: str, group, stream: int, ranks, streams: list, world: str) -> tuple:
    if group:
        return collective_op(collective_name, kernel_name), str(group), ranks_string(ranks)
    return (
        collective_op(collective_name, kernel_name),
        f"nccl:comm{streams.index(stream)}",
        ranks_string(ranks) or world,
    )
