"""Issue 24: a collective's sequence number on NCCL is the process group's own
(`seqCollective_`, Flight Recorder's `collective_seq_id`), so a call diagnose does
not see on one rank (compiled there, or made on the process group directly) does
not shift that rank's numbers for the rest of the run. On gloo the group's counter
also counts sends and receives, so the seen calls are counted there (gloo's
numbering is what every multi-process test here runs on).

No GPU here: the process group is a stand-in that numbers as ProcessGroupNCCL
does (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: `seqCollective_` starts
at 0 and advances before each collective's work is made; `getSequenceNumberForGroup()`
returns it), behind the real method name. In `_coalescing_manager`'s fast path
the calls inside only queue and one `allreduce_coalesced` reaches the group at
the end (torch/distributed/distributed_c10d.py)."""

import contextlib
from types import SimpleNamespace

from collectors.instrument import collectives
from collectors.instrument.coalescing import wrap_coalescing_manager
from collectors.instrument.collective_tracker import Tracker
from collectors.recorder import Recorder


class NCCLGroup:
    group_name = "0"

    def __init__(self):
        self.seq_collective = 0
        self.coalescing = False

    def _get_sequence_number_for_group(self):
        return self.seq_collective

    def allreduce(self):  # what c10d's all_reduce reaches, seen by diagnose or not
        self.seq_collective += 1


def _rank(backend="nccl"):
    pg = NCCLGroup()
    dist = SimpleNamespace(
        get_backend=lambda group: backend,
        get_process_group_ranks=lambda group: [0, 1],
        distributed_c10d=SimpleNamespace(_get_default_group=lambda: pg),
    )
    rec = Recorder(None)
    tracker = Tracker(rec, dist)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if not pg.coalescing:  # inside the manager the call is only queued
            pg.allreduce()

    @contextlib.contextmanager
    def coalescing_manager(group=None, device=None, async_ops=False):  # c10d's, in its fast path
        pg.coalescing = True
        yield SimpleNamespace(works=[])
        pg.coalescing = False
        pg.allreduce()  # the batch's allreduce_coalesced

    return (
        pg,
        rec,
        collectives._wrap_collective(tracker, "all_reduce", all_reduce),
        wrap_coalescing_manager(tracker, coalescing_manager),
    )


def _seqs(rec):
    return [row[9] for row in rec.events if row[0] == "collective"]


def _job(backend):
    """Both ranks: one collective; then one that rank 1 makes unseen (compiled
    there); three more; two coalesced in one batch; one more."""
    ranks = [_rank(backend) for _ in range(2)]
    for r, (pg, _rec, all_reduce, coalescing_manager) in enumerate(ranks):
        all_reduce(None)
        if r == 0:
            all_reduce(None)
        else:
            pg.allreduce()
        for _ in range(3):
            all_reduce(None)
        with coalescing_manager():
            all_reduce(None)
            all_reduce(None)
        all_reduce(None)
    return [_seqs(rec) for _, rec, _, _ in ranks]


def test_nccl_numbers_come_from_the_process_group():
    rank0, rank1 = _job("nccl")
    # Flight Recorder's numbers (the first collective is 1; rank 1's unseen call
    # is 2); the coalesced batch is one row, numbered 6 as the group numbers it,
    # so the numbers stay the group's after it (before issue 44 the batch's two
    # calls were two rows, 6 and 7, and every number after it one ahead)
    assert rank0 == [1, 2, 3, 4, 5, 6, 7]
    assert rank1 == [1, 3, 4, 5, 6, 7]


def test_gloo_counts_the_calls_it_sees():
    rank0, rank1 = _job("gloo")
    assert rank0 == [0, 1, 2, 3, 4, 5, 6]
    assert rank1 == [0, 1, 2, 3, 4, 5]  # rank 1's unseen call shifts the rest by one


def test_a_collective_on_another_thread_hides_nothing_on_this_one():
    """Issue 44 B4: while a collective blocks on a second thread (DCP's async upload, a
    communication thread), the training thread's collectives are still rows and the
    hang dump lists both threads' blocking calls (before, the nesting count and the
    blocking call were one per process: the main thread's calls went unrecorded)."""
    import threading

    pg, rec, _, _ = _rank("gloo")
    tracker = Tracker(
        rec,
        SimpleNamespace(
            get_backend=lambda group: "gloo",
            get_process_group_ranks=lambda group: [0, 1],
            distributed_c10d=SimpleNamespace(_get_default_group=lambda: pg),
        ),
    )
    entered, release = threading.Event(), threading.Event()

    def blocking_all_reduce(tensor, op=None, group=None, async_op=False):
        entered.set()
        release.wait(30)

    upload = threading.Thread(
        target=collectives._wrap_collective(tracker, "all_reduce", blocking_all_reduce), args=(None,)
    )
    upload.start()
    try:
        assert entered.wait(30)
        collectives._wrap_collective(tracker, "broadcast", lambda *a, **k: None)(None)
        assert [row[1] for row in rec.events if row[0] == "collective"] == ["broadcast"]
        blocking = [r for r in tracker.in_flight()["in_flight"] if r["state"] == "blocking"]
        assert [r["op"] for r in blocking] == ["all_reduce"]
    finally:
        release.set()
        upload.join(30)
    assert [row[1] for row in rec.events if row[0] == "collective"] == ["broadcast", "all_reduce"]


def test_a_work_dropped_unwaited_leaves_no_rows_for_the_next_at_its_address():
    """Issue 44 W2: rows wait for their Work in a table keyed by id(work); ids are reused,
    so a Work dropped without a wait must take its entry with it (before, the next
    Work at that address inherited its rows: waits and completions put on the wrong op)."""

    class Work:  # takes weakrefs, as torch's Work does
        pass

    _, rec, _, _ = _rank("gloo")
    tracker = Tracker(rec, None)
    dropped = Work()
    tracker.watch(dropped, ("collective", "all_reduce"), True)
    del dropped
    kept = Work()
    tracker.watch(kept, ("collective", "broadcast"), True)
    assert tracker.pending == {id(kept): [("collective", "broadcast")]}
    assert tracker.done_at_wait == {id(kept)}


def test_the_backend_is_the_one_for_the_tensors_device():
    """Issue 44 W6: get_backend gives the string a group was made with; a group made
    with "cuda:nccl,cpu:gloo" runs a CPU tensor's collective on gloo (its completion
    seen at the wait, as gloo's is), and "cpu:gloo,cuda:gloo" a CUDA tensor's too.
    Before, only the exact string "gloo" counted: both were taken for NCCL."""
    cpu, cuda = (SimpleNamespace(device=SimpleNamespace(type=t)) for t in ("cpu", "cuda"))
    for backend, expected in (
        ("gloo", {"cpu": True, "cuda": True}),
        ("nccl", {"cpu": False, "cuda": False}),
        ("cuda:nccl,cpu:gloo", {"cpu": True, "cuda": False}),
        ("cpu:gloo,cuda:gloo", {"cpu": True, "cuda": True}),
    ):
        pg = NCCLGroup()
        tracker = Tracker(
            Recorder(None),
            SimpleNamespace(
                get_backend=lambda group, b=backend: b,
                get_process_group_ranks=lambda group: [0, 1],
                distributed_c10d=SimpleNamespace(_get_default_group=lambda pg=pg: pg),
            ),
        )
        assert {name: tracker.group_info(None, t)[3] for name, t in (("cpu", cpu), ("cuda", cuda))} == expected, backend
        assert tracker.group_info(None, [cpu])[3] == expected["cpu"]
    # "undefined" (a group made without a backend string): its config names them
    tracker = Tracker(
        Recorder(None),
        SimpleNamespace(
            get_backend=lambda group: "undefined",
            get_backend_config=lambda group: "cpu:gloo,cuda:nccl",
            get_process_group_ranks=lambda group: [0, 1],
            distributed_c10d=SimpleNamespace(_get_default_group=lambda: pg),
        ),
    )
    assert (tracker.group_info(None, cpu)[3], tracker.group_info(None, cuda)[3]) == (True, False)
