"""The rank's record of torch.distributed calls: per-group sequence numbers,
the group cache (name, ranks, backend per device), the blocking call each
thread is inside and the table of async work not yet waited, whose wait rows
and, on gloo, "done" rows it writes (collectives.py patches the calls and
reports through the `Tracker`; ddp.py, fsdp2.py and functional_collectives.py
too). How calls are numbered: collectives.py's docstring.
"""

import threading
import weakref

from collectors.instrument.collective_events import follow_up
from collectors.schema import EventRow, fields, new_row

_INSTANCE_DETAIL = fields("name", "step", "microbatch", "stage", "group", "group_ranks", "seq", "peer", "detail")

MAX_PENDING_WORKS = 65536


def backends_of(dist, pg) -> dict:
    """device type -> backend name of a group. get_backend gives the string the group
    was made with: "gloo", "nccl", or per device "cuda:nccl,cpu:gloo" (and "undefined"
    for some groups made without a backend, where get_backend_config says it)."""
    text = ""
    for read in (dist.get_backend, getattr(dist, "get_backend_config", None)):
        try:
            text = str(read(pg)) if read is not None else text
        except Exception:
            continue
        if text and text != "undefined":
            break
    if ":" not in text:
        return {"cpu": text, "cuda": text}
    return dict(part.strip().split(":", 1) for part in text.split(",") if ":" in part)


def on_gloo(backends: dict, tensor) -> bool:
    """Whether a call on `tensor` (or its first tensor) runs on gloo in this group:
    the backend of the tensor's device (cpu when it has none)."""
    if isinstance(tensor, (list, tuple)):
        tensor = tensor[0] if tensor else None
    device = getattr(getattr(tensor, "device", None), "type", "cpu")
    return backends.get(device, backends.get("cpu")) == "gloo"


class PerThread(threading.local):
    depth = 0  # patched calls this thread is inside (an outer op's inner calls are not rows)
    coalescing = None  # the _coalescing_manager batch this thread has open (coalescing.py)


class Tracker:
    """Per-group counters, the group cache and the table of unwaited async work."""

    def __init__(self, rec, dist):
        self.rec = rec
        self.dist = dist
        self.seq: dict = {}
        self.groups: dict = {}  # id(pg) -> (pg, name, ranks_str, is_gloo)
        self.pg_counters: dict = {}  # id(pg) -> the group's own collective counter (NCCL), or None
        self.pending: dict = {}  # id(work) -> list of issue rows
        self.done_at_wait: set = set()  # id(work) of gloo work: its wait also records "done"
        # per thread: a collective on another thread (DCP's async upload, a communication
        # thread) must not hide this thread's calls or its blocking state
        self.local = PerThread()  # .depth (nesting of patched calls), .coalescing (an open batch)
        self.blocked_in = {}  # thread id -> the blocking call that thread is inside
        self.waiting_on = {}  # thread id -> the pending rows of the Work it waits on
        self.device = None  # collective_events.CollectiveEvents once CUDA timing is on
        self.context = ""  # a row's default detail: the FSDP unit being served (fsdp2.py)
        self.work_cls = object  # torch's Work class (install)

    def in_flight(self) -> dict:
        """For hang dumps: the blocking call in progress and async work not yet waited."""

        def describe(row, state):
            row = new_row(EventRow, row)  # names the fields of a blocked_in tuple
            return {
                "op": row.name,
                "kind": row.kind,
                "group": row.group,
                "group_ranks": row.group_ranks,
                "seq": row.seq,
                "peer": row.peer,
                "step": row.step,
                "callsite": row.callsite,
                "since_mono_ns": row.start_ns,
                "state": state,
            }

        rows = [describe(row, "blocking") for row in list(self.blocked_in.values())]
        waited = [id(p) for p in list(self.waiting_on.values())]
        for pending in list(self.pending.values()):
            state = "blocking" if id(pending) in waited else "issued, not waited"
            rows.extend(describe(row, state) for row in pending)
        return {"in_flight": rows}

    def group_info(self, pg, tensor=None):
        """(group, its name, its ranks "0,1,...", whether a call on `tensor` runs on gloo)."""
        dist = self.dist
        if pg is None:
            pg = dist.distributed_c10d._get_default_group()
        info = self.groups.get(id(pg))
        if info is None or info[0] is not pg:
            ranks = dist.get_process_group_ranks(pg)
            name = getattr(pg, "group_name", None) or dist.distributed_c10d._get_process_group_name(pg)
            backends = backends_of(dist, pg)
            info = (pg, str(name), ",".join(map(str, ranks)), backends)
            self.groups[id(pg)] = info
            self.pg_counters[id(pg)] = (
                getattr(pg, "_get_sequence_number_for_group", None) if set(backends.values()) == {"nccl"} else None
            )
        pg, name, ranks, backends = info
        return pg, name, ranks, on_gloo(backends, tensor)

    def next_seq(self, key: str) -> int:
        n = self.seq.get(key, 0)
        self.seq[key] = n + 1
        return n

    def collective_seq(self, pg, key: str) -> int:
        """The number of the collective about to be issued on `pg` (group_info
        first): the group's own counter + 1 where it has one (NCCL numbers its
        first collective 1), never below the last number given here + 1, so a
        counter that does not advance per call (coalesced ops) still numbers each
        row apart, the same way on every member."""
        n = self.seq.get(key, 0)
        count = self.pg_counters.get(id(pg))
        if count is not None:
            try:
                n = max(n, int(count()) + 1)
            except Exception:
                self.pg_counters[id(pg)] = None
        self.seq[key] = n + 1
        return n

    def issued(self, kind, name, group, ranks, seq, peer, nbytes, callsite, t0, t1, work, track_done, detail=""):
        """The row, written as a plain tuple (EVENT_COLUMNS order: the cheapest to
        build, and orjson writes it natively); async work's is kept for its wait,
        which reads it by field name (collective_events.fields)."""
        st = self.rec.state
        row = (
            kind,
            name,
            t0,
            t1,
            st.step,
            st.microbatch,
            st.stage,
            group,
            ranks,
            seq,
            peer,
            nbytes,
            work is not None,
            callsite,
            detail or self.context,
            -1,
        )
        self.rec.add(row)
        if work is not None:
            self.watch(work, row, track_done)
        return row

    def watch(self, work, row, track_done):
        """File `row` under its Work until the Work is waited. Keyed by id(work), so
        the entry must go when the Work does: ids are reused (2,000 dropped Works
        had 2 distinct ids), and a never-waited Work's rows would attach to the next
        Work at that address. A weakref finalizer drops it (Works take weakrefs;
        the functional collectives' tokens do not, and are bounded below)."""
        key = id(work)
        rows = self.pending.get(key)
        if rows is None:
            if len(self.pending) >= MAX_PENDING_WORKS:
                # never waited: forget rather than grow, and say so
                # its own name: record_error says each collector's first error only
                self.rec.record_error(
                    "collectives.unwaited",
                    RuntimeError(f"{len(self.pending)} async ops were never waited: their wait rows are dropped"),
                )
                self.pending.clear()
                self.done_at_wait.clear()
            rows = self.pending[key] = []
            try:
                weakref.finalize(work, self.forget, key)
            except TypeError:
                pass
        rows.append(row)
        if track_done:
            self.done_at_wait.add(key)

    def forget(self, key):
        """The Work is gone unwaited (a finalizer: it runs when the last reference drops)."""
        self.pending.pop(key, None)
        self.done_at_wait.discard(key)

    def done(self, row, t):
        self.rec.add(follow_up(row, "done", t, t, ""))

    def waited(self, work, t0, t1, callsite, completed_before):
        rows = self.pending.pop(id(work), None)
        track_done = id(work) in self.done_at_wait
        self.done_at_wait.discard(id(work))
        if rows:
            # the rows built here, not through follow_up: this runs per async call,
            # and two calls per row cost it ~0.25 us (bench.event_rows)
            add, t = self.rec.add, t0 if completed_before else t1
            for row in rows:
                name, step, mb, stage, group, ranks, seq, peer, detail = _INSTANCE_DETAIL(row)
                add(("wait", name, t0, t1, step, mb, stage, group, ranks, seq, peer, 0, True, callsite, detail, -1))
                if track_done:
                    add(("done", name, t, t, step, mb, stage, group, ranks, seq, peer, 0, True, "", detail, -1))
