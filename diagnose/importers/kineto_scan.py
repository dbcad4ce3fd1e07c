"""The Kineto importer's fast path: decode only what the importer reads.

Building a Python dict for every event of a profiler trace (orjson) and then
walking them is what made the import slow: ~6 us per event, most of them CPU
operators that are skipped anyway. Here msgspec decodes the whole trace in one
call into small structs holding just the fields the importer reads, `args`
included (a struct of the dozen keys a GPU activity or launch can carry; every
other key is skipped by the decoder without building anything). On HTA's
216k-event fixture that is ~0.2 s instead of 1.3 s (0.35 s when each event's
args were decoded by a call of their own), and a fraction of the memory.

`scan` returns what kineto._scan_events returns for the same trace (the same
checks, in the same order; a GPU activity's args as a dict of the keys the
importer reads), or None whenever the input is not the plain case (msgspec not
installed, invalid JSON, NaN, a non-object event or args, no complete event):
the caller then takes the dict path, which also produces the precise error
message.

Before msgspec, the C scan (_kineto_c.c, built by setup.py where a compiler is)
gets the text when it is ASCII: the same result at ~0.10 s instead of ~0.25 s
per 216k-event file, as it builds objects only for the events it keeps. It
hands anything unusual to msgspec (native_scan returns None).
"""

from typing import Any, Union

from diagnose.importers.gpu_activity import as_int, collective_op, tensor_bytes

try:
    import msgspec
except ImportError:  # optional: the dict path is used without it
    msgspec = None

try:
    from diagnose.importers import _kineto_c  # built by setup.py where a C compiler is
except ImportError:
    _kineto_c = None

# What the importer keeps of a trace's CPU side (kineto.py classifies the rest):
# runtime calls that launch GPU work or block the host on it, and the first
# letters of the names kineto._classify can return a row for.
SYNC_CALLS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "hipMemcpy",
}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "privateuse1_runtime", "hip_runtime"}
PHASE_FIRST = frozenset("#fbFBoD")
# the CPU ranges PyTorch records around each NCCL call, "nccl:<op>" with the
# call's Input Dims and Input type: what launched a kernel that says nothing of
# itself (kineto_columns: launch correlation)
NCCL_RANGE_PREFIX = "nccl:"
NCCL_RANGE_CATS = ("user_annotation", "cpu_op")
CLASSIFIED_FIRST = PHASE_FIRST | {"P", "e", "O"}
# libkineto's name for a CUPTI STREAM_WAIT_EVENT sync (cupti_strings.cpp: syncTypeString):
# a "stream_wait" row, not a kernel (kineto_columns)
STREAM_WAIT = "Stream Wait Event"

# the phases of the Trace Event Format besides complete events ("X"); the C scan
# accepts the same ones
OTHER_PHASES = (
    "B",
    "E",
    "i",
    "I",
    "C",
    "b",
    "n",
    "e",
    "s",
    "t",
    "f",
    "P",
    "N",
    "O",
    "D",
    "M",
    "V",
    "v",
    "R",
    "c",
    "(",
    ")",
)

if msgspec is not None:
    UNSET = msgspec.UNSET

    # gc=False: these structs only ever hold strings, numbers and each other, so
    # they can never be part of a reference cycle; untracked, they cost 16%
    # less to decode and nothing to the collector.
    class _Args(msgspec.Struct, gc=False):
        """The args keys the importer reads; get() and `in` answer for the
        trace's own key names, as the args dict of the dict path does."""

        stream: int | None = None
        correlation: int | msgspec.UnsetType = UNSET
        collective_name: Any = msgspec.field(default=UNSET, name="Collective name")
        bytes: Any = UNSET
        group_name: Any = msgspec.field(default=UNSET, name="Process Group Name")
        group_ranks: Any = msgspec.field(default=UNSET, name="Process Group Ranks")
        Seq: Any = UNSET
        seq: Any = UNSET
        in_nelems: Any = msgspec.field(default=UNSET, name="In msg nelems")
        dtype: Any = UNSET
        # a send's / recv's peer (global rank), which makes it a p2p row (kineto_columns)
        dst_rank: Any = msgspec.field(default=UNSET, name="Dst Rank")
        src_rank: Any = msgspec.field(default=UNSET, name="Src Rank")
        # a Stream Wait Event's stream and event record (kineto_columns: "stream_wait" rows)
        wait_on_stream: Any = UNSET
        wait_on_record: Any = msgspec.field(default=UNSET, name="wait_on_cuda_event_record_corr_id")
        # (Raw: decoded only for the few nccl: ranges, not for every operator)
        input_dims: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=UNSET, name="Input Dims")
        input_type: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=UNSET, name="Input type")

        def get(self, key, default=None):
            field = _FIELD_OF_KEY.get(key)
            value = UNSET if field is None else getattr(self, field)
            return default if value is UNSET else value

        def __contains__(self, key) -> bool:  # (not exact for "stream", which no caller asks)
            return self.get(key, UNSET) is not UNSET

    _FIELD_OF_KEY = dict(zip(_Args.__struct_encode_fields__, _Args.__struct_fields__))

    # Typed where the importer tests types: an event that does not fit (a name
    # that is not a string, a string timestamp, args that are not an object, a
    # phase that is not in the format...) fails the whole decode, and the dict
    # path, which checks event by event, runs. Only complete (ph X) events are
    # read; the others (flows, instants, counters, metadata: ~45% of a trace)
    # decode to empty structs, their fields skipped unread (-30% decode time).
    class _Event(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        cat: Any = None
        name: str | None = None
        ts: int | float | None = None
        dur: int | float = 0
        pid: Any = None
        tid: Any = None
        args: _Args | None = None

    # every other phase of the Trace Event Format
    _OTHER_PHASES = tuple(
        msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False) for i, ph in enumerate(OTHER_PHASES)
    )

    class _Trace(msgspec.Struct):
        traceEvents: list[Union[(_Event, *_OTHER_PHASES)]]
        baseTimeNanoseconds: Any = None
        distributedInfo: Any = None

    class _RangeArgs(msgspec.Struct, gc=False):
        input_dims: Any = msgspec.field(default=None, name="Input Dims")
        input_type: Any = msgspec.field(default=None, name="Input type")
        dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
        src_rank: Any = msgspec.field(default=None, name="Src Rank")

    _TRACE = msgspec.json.Decoder(_Trace)
    _RANGE_ARGS = msgspec.json.Decoder(_RangeArgs)
    _ARGS = msgspec.json.Decoder(_Args)
    _NO_ARGS = _Args()  # a GPU activity's args when it has none of the collective keys
    _ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


def scan(raw: bytes, gpu_only: bool, classify):
    """(trace facts, cpu, gpu, launches, pids, nccl ranges) or None (take the dict path).
    `classify(kind_checks)` is kineto's per-event CPU classification."""
    if msgspec is None:
        return None
    try:  # (the caller, kineto.file_table, pauses the garbage collector)
        if _kineto_c is not None and raw.isascii():
            native = native_scan(raw, gpu_only, classify)
            if native is not None:
                return native or None  # (False: no complete event, which the dict path reports)
        return _scan(_TRACE.decode(raw), gpu_only, classify)
    except _ERRORS:
        return None


def native_scan(raw: bytes, gpu_only: bool, classify):
    """_scan's result through the C scan (_kineto_c.c); False for a trace
    with no complete event; None where the C scan leaves the text to msgspec.
    Raises msgspec's errors where _scan's decode would."""
    scanned = _kineto_c.scan(
        raw,
        gpu_only,
        "".join(OTHER_PHASES).encode(),
        tuple(c.encode() for c in LAUNCH_CATS),
        tuple(c.encode() for c in SYNC_CALLS),
        "".join(CLASSIFIED_FIRST).encode(),
        _NO_ARGS,
        msgspec.json.decode,
    )
    if scanned is None:
        return None
    any_complete, base_time, dist, gpu, args_to_decode, launches, candidates, pids, found = scanned
    if not any_complete:
        return False
    with memoryview(raw) as text:
        for index, start, end in args_to_decode:  # the activities with collective keys, or odd bytes
            args = _ARGS.decode(text[start:end])
            name, ts, dur, stream, correlation, _, collective, _ = gpu[index]
            gpu[index] = (name, ts, dur, stream, correlation, _bytes(args.bytes), collective, args)
        facts = {
            "baseTimeNanoseconds": None if base_time is None else msgspec.json.decode(text[slice(*base_time)]),
            "distributedInfo": None if dist is None else msgspec.json.decode(text[slice(*dist)]),
        }
        ranges = []
        for name, cat, ts, dur, tid, span in found:
            if cat in NCCL_RANGE_CATS:
                args = _RangeArgs() if span is None else _RANGE_ARGS.decode(text[slice(*span)])
                ranges.append(
                    nccl_range(name, ts, dur, tid, args.input_dims, args.input_type, args.dst_rank, args.src_rank)
                )
    cpu = []
    for candidate in candidates:
        row = candidate if len(candidate) == 5 else classify(*candidate)
        if row is not None:
            cpu.append(row)
    return facts, cpu, gpu, launches, pids, ranges


def nccl_range(name: str, ts, dur, tid, dims, types, dst=None, src=None) -> tuple:
    """(op, ts, dur, tid, bytes, peer) of a "nccl:<op>" CPU range: what every scan
    path keeps of one. peer: a send's "Dst Rank" or a recv's "Src Rank" (global
    ranks, a number or a numeric string), else -1. Megatron's batched p2p is one
    fused kernel under `nccl:coalesced`: its peers are only in these ops
    (diagnose/importers/kineto_structure.py)."""
    op = collective_op(name[len(NCCL_RANGE_PREFIX) :], "")
    return (
        op,
        ts,
        dur,
        tid,
        tensor_bytes(dims, types),
        peer_rank(dst if op == "send" else src if op == "recv" else None),
    )


def peer_rank(value) -> int:
    """A peer's global rank as PyTorch writes it (a number or a numeric string), or -1."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def _bytes(nbytes) -> int:
    """A GPU activity's args["bytes"] as the importer counts it."""
    return 0 if nbytes is UNSET else max(as_int(nbytes, 0), 0)


def _scan(trace, gpu_only: bool, classify):
    launches, cpu, gpu, pids, ranges = {}, [], [], {}, []
    classified_first = CLASSIFIED_FIRST
    any_complete = False
    complete = _Event
    for e in trace.traceEvents:
        if e.__class__ is not complete:
            continue
        any_complete = True
        name, ts, dur = e.name, e.ts, e.dur
        if name is None or ts is None:
            continue
        if dur < 0:
            dur = 0
        args = e.args
        stream = args.stream if args is not None else None
        if stream is not None and stream >= 0:
            correlation = args.correlation
            nbytes = args.bytes
            gpu.append(
                (
                    name,
                    ts,
                    dur,
                    stream,
                    -1 if correlation is UNSET else correlation,
                    _bytes(nbytes),
                    args.collective_name is not UNSET,
                    args,
                )
            )
            continue
        pid = e.pid
        if isinstance(pid, int):
            pids[pid] = pids.get(pid, 0) + 1
        cat = e.cat
        if cat in LAUNCH_CATS:
            if args is not None and args.correlation is not UNSET:
                launches[args.correlation] = (ts, e.tid)
            if not gpu_only and name in SYNC_CALLS:
                cpu.append(("sync", name, ts, dur, "cuda"))
            continue
        if not gpu_only and name.startswith(NCCL_RANGE_PREFIX):
            if cat in NCCL_RANGE_CATS:
                dims, types = (UNSET, UNSET) if args is None else (args.input_dims, args.input_type)
                dst, src = (UNSET, UNSET) if args is None else (args.dst_rank, args.src_rank)
                ranges.append(
                    nccl_range(
                        name,
                        ts,
                        dur,
                        e.tid,
                        None if dims is UNSET else msgspec.json.decode(dims),
                        None if types is UNSET else msgspec.json.decode(types),
                        None if dst is UNSET else dst,
                        None if src is UNSET else src,
                    )
                )
            continue
        if gpu_only or not name or name[0] not in classified_first or cat == "gpu_user_annotation":
            continue  # ("aten::..." and most operators: classify would say None)
        row = classify(name, cat, ts, dur)
        if row is not None:
            cpu.append(row)
    if not any_complete:
        return None
    facts = {"baseTimeNanoseconds": trace.baseTimeNanoseconds, "distributedInfo": trace.distributedInfo}
    return facts, cpu, gpu, launches, pids, ranges
