"""Issue 44, device rows beyond c10d's own calls (O5) and across Works that die
unwaited (W2), on the fake GPU and stand-ins of tests/collectors/test_collective_events.py."""

from tests.support.fake_cuda_collectives import MS, FakeGPU, Tensor, device_rows, queue


def test_functional_collectives_get_device_rows_as_c10d_calls_do(traced, monkeypatch):
    """Issue 44, O5: DTensor's and TP layers' collectives (_functional_collectives)
    bypass torch.distributed's functions; on CUDA they get the same device rows:
    the arrival before the call and, for an AsyncCollectiveTensor, the end and the
    stream's stall where its wait_tensor returns. funcol is faked by the names
    the wrapper reads (_resolve_group_name, AsyncCollectiveTensor, wait_tensor)."""
    import types

    from collectors.instrument import functional_collectives

    rec, timer, tracker = traced["rec"], traced["timer"], traced["tracker"]

    class Storage:
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

    class CudaTensor(Tensor):
        def untyped_storage(self):
            return Storage(id(self))

    class AsyncCollectiveTensor:
        def __init__(self, elem):
            self.elem = elem

    def all_reduce(tensor, reduceOp, group, tag=""):  # on the NCCL stream; waited when used
        FakeGPU.nccl_end_ms = max(FakeGPU.nccl_end_ms, FakeGPU.queue_end_ms, FakeGPU.now_ms) + 3.0
        return AsyncCollectiveTensor(CudaTensor())

    def wait_tensor(tensor):  # the current stream waits for NCCL's
        FakeGPU.queue_end_ms = max(FakeGPU.queue_end_ms, FakeGPU.nccl_end_ms)
        return tensor

    funcol = types.SimpleNamespace(
        _resolve_group_name=lambda group, tag="": "0", AsyncCollectiveTensor=AsyncCollectiveTensor
    )
    c10d = types.SimpleNamespace(_resolve_process_group=lambda name: None)
    waits = functional_collectives._Waits()
    wrapped = functional_collectives._wrap(tracker, waits, funcol, c10d, "all_reduce", all_reduce, lambda: False)
    wait = functional_collectives._wrap_wait(tracker, waits, wait_tensor, lambda: False)
    timer.set_anchor()  # anchor: GPU 100 ms <-> host 10 s
    queue(5.0)  # the call arrives at 105 ms and runs 105-108
    result = wrapped(CudaTensor(), "sum", "tp")
    queue(1.0)  # 106: the stream is there when the result is used
    wait(result.elem)
    FakeGPU.now_ms = 200.0
    for row in timer.poll():
        rec.add(row)
    rows = [(r[0], r[2] // MS - 10_000, r[14]) for r in device_rows(rec) if r[0] != "wait"]
    assert rows == [("collective", 5, "gpu:wait"), ("done", 8, "gpu:wait")]
    stalls = [(r[2] // MS - 10_000, r[3] // MS - 10_000) for r in rec.events if r[14] == "gpu:wait" and r[0] == "wait"]
    assert stalls == [(6, 8)]  # the stream stalled 2 ms behind the all-reduce


def test_a_dropped_works_device_events_never_attach_to_the_next_work_at_its_address(traced):
    """Issue 44, W2: works never waited (dropped by the job) leave no entry behind:
    CPython gives a new Work the address of one just freed, and entries keyed by
    id(work) handed the dead work's arrival to the next one's wait (two device rows
    for one call, the first at the dropped call's time)."""
    import gc

    rec, timer, all_reduce = traced["rec"], traced["timer"], traced["all_reduce"]
    timer.set_anchor()  # anchor: GPU 100 ms <-> host 10 s
    for _ in range(50):  # dropped unwaited, as a job may
        all_reduce(Tensor(), async_op=True)
    gc.collect()
    # their entries went with them (keyed by id they stayed, 50 of them, for the
    # next Work at one of those addresses to find)
    assert len(traced["tracker"].device.by_work) == 0
    queue(20.0)  # later: the next call arrives at 120 ms
    work = all_reduce(Tensor(), async_op=True)
    work.wait()
    FakeGPU.now_ms = 300.0
    for row in timer.poll():
        rec.add(row)
    arrivals = [r[2] // MS - 10_000 for r in device_rows(rec) if r[0] == "collective"]
    assert arrivals == [20], arrivals
