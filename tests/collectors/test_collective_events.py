"""Device rows of collectives on CUDA (issue 21, collectors/instrument/collective_events.py):
built from CUDA event times through the GPU-to-host anchor, re-anchored with
its residual and drift recorded, skipped during graph capture and on gloo,
and preferred by the matching to the host row of the same call.

No GPU here: CUDA events are faked as torch.cuda.Event behaves, name for name,
over a device clock and one stream's queue (tests/support/fake_cuda_collectives.py,
with the `traced` fixture, tests/collectors/conftest.py); the torch.distributed
calls and Work are stand-ins with the real signatures the wrappers read."""

import pytest

from collectors.instrument import collectives
from collectors.instrument.cuda_event_timer import REANCHOR_S
from collectors.schema import event_row
from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.run_writer import RunDirWriter, clock_meta
from tests.support.fake_cuda_collectives import MS, FakeGPU, Tensor, Work, device_rows, queue
from tests.support.jobs import load_run


def test_device_rows_come_from_event_times_through_the_anchor(traced):
    rec, timer, all_reduce = traced["rec"], traced["timer"], traced["all_reduce"]
    timer.set_anchor()  # anchor: GPU 100 ms <-> host 10 s
    queue(5.0)  # a forward still queued: the device is ready at 105 ms
    all_reduce(Tensor())  # synchronous: ends at 108 ms on the device
    work = all_reduce(Tensor(), async_op=True)  # arrives at 108, its kernel runs 108-111 on NCCL's stream
    queue(4.0)  # compute queued before the host waits: the stream is at 112
    work.wait()  # no stall: the all-reduce was over by then
    work = all_reduce(Tensor(), async_op=True)  # arrives at 112, runs 112-115
    work.wait()  # waited at once: the stream stalls 3 ms
    FakeGPU.capturing = True  # a CUDA graph being captured: no events recorded
    all_reduce(Tensor())
    FakeGPU.capturing = False
    all_reduce(Tensor(), group="gloo")  # gloo's work is the host's: no device rows
    assert timer.poll() == [] and device_rows(rec) == []  # nothing has run: nothing waited for
    FakeGPU.now_ms = 200.0
    for row in timer.poll():
        rec.add(row)
    hosts = [r for r in rec.events if r[0] == "collective" and r[14] == ""]
    assert [r[9] for r in hosts] == [0, 1, 2, 3, 0]  # the host rows, all five calls
    rows = [(r[0], r[9], r[2] // MS - 10_000, r[3] // MS - 10_000, r[14]) for r in device_rows(rec)]
    assert rows == [
        ("collective", 0, 5, 5, "gpu"),
        ("done", 0, 8, 8, "gpu"),
        ("collective", 1, 8, 8, "gpu:wait"),
        ("done", 1, 12, 12, "gpu:wait"),
        ("wait", 1, 12, 12, "gpu:wait"),  # the stream did not stall
        ("collective", 2, 12, 12, "gpu:wait"),
        ("done", 2, 15, 15, "gpu:wait"),
        ("wait", 2, 12, 15, "gpu:wait"),
    ]  # it stalled 3 ms behind the wait
    device = device_rows(rec)
    assert all(r[7] == "0" and r[8] == "0,1" and r[12] for r in device)  # group, ranks, async
    assert device[0][11] == 4096 and device[1][11] == 0


@pytest.mark.parametrize("group_timed", [True, False])
def test_nccl_timing_narrows_an_async_end_to_its_kernel(traced, monkeypatch, group_timed):
    """TORCH_NCCL_ENABLE_TIMING on: two async all-reduces queued back to back
    run 100-103 and 103-106 on the group's NCCL stream; the host waits for
    both after 10 ms of queued compute (the events' bound: 110). NCCL's
    durations put their ends at 103 and 106 (detail gpu:nccl); a group whose
    work has no timing keeps the bound (gpu:wait)."""
    rec, timer, tracker, all_reduce = traced["rec"], traced["timer"], traced["tracker"], traced["all_reduce"]
    tracker.device.nccl_timing = True
    monkeypatch.setattr(Work, "timing", group_timed)
    timer.set_anchor()
    works = [all_reduce(Tensor(), async_op=True) for _ in range(2)]
    queue(10.0)
    for work in works:
        work.wait()
    FakeGPU.now_ms = 200.0
    for row in timer.poll():
        rec.add(row)
    ends = [(r[9], r[2] // MS - 10_000, r[14]) for r in device_rows(rec) if r[0] == "done"]
    stalls = [(r[2] // MS - 10_000, r[3] // MS - 10_000) for r in rec.events if r[0] == "wait" and r[14]]
    if group_timed:
        assert ends == [(0, 3, "gpu:nccl"), (1, 6, "gpu:nccl")]
    else:
        assert ends == [(0, 10, "gpu:wait"), (1, 10, "gpu:wait")]
    assert stalls == [(10, 10), (10, 10)]  # the compute stream never stalled: both were over


def test_the_anchor_is_renewed_with_its_residual_and_the_drift_recorded(traced):
    timer, host, anchors = traced["timer"], traced["host"], traced["anchors"]
    timer.set_anchor()
    assert anchors == [(10_000 * MS, 0, None, 0)] and timer.residual_ns == 0
    # a minute later on the host, and 1 ms less on the GPU's clock: drift 1 ms
    host[0] += int(REANCHOR_S * 1e9) + MS
    FakeGPU.now_ms += REANCHOR_S * 1e3
    timer.poll()  # renews the anchor of every device it has
    assert len(anchors) == 2 and anchors[1][2] == 1 * MS


class Future:
    """torch.futures.Future as a CUDA work's future: `then` calls back inline (NCCL
    marks it completed once the work is queued), "with some dedicated streams set
    as current (fetched from a global pool) which will be synchronized with those
    kernels" (torch.futures.Future.then): an idle stream that waits for NCCL's."""

    def __init__(self, value):
        self._value = value

    def then(self, callback):
        current = FakeGPU.queue_end_ms
        FakeGPU.queue_end_ms = max(FakeGPU.nccl_end_ms, FakeGPU.now_ms)  # the pool stream
        try:
            return Future(callback(self))
        finally:
            FakeGPU.queue_end_ms = current

    def value(self):
        return self._value


class GradBucket:  # torch.distributed.GradBucket, as a comm hook receives it
    def __init__(self, index, tensor):
        self._index, self._tensor = index, tensor

    def index(self):
        return self._index

    def buffer(self):
        return self._tensor


class ProcessGroup:
    def size(self):
        return 2


def test_ddp_bucket_completion_comes_from_an_event_not_the_callback(traced, monkeypatch, tmp_path):
    """DDP's comm hook on CUDA: NCCL calls the future back as soon as the bucket's
    all-reduce is queued, so the host's done row says nothing of the device; the
    event recorded in the callback, on the stream torch made wait for the
    all-reduce, completes when the all-reduce ends on the device."""
    from collectors.instrument import ddp

    rec, timer, tracker = traced["rec"], traced["timer"], traced["tracker"]
    pg = ProcessGroup()
    monkeypatch.setattr(tracker, "group_info", lambda group, tensor=None: (pg, "0", "0,1", False))
    monkeypatch.setattr(collectives, "TRACKER", tracker)
    monkeypatch.setattr(ddp, "now_ns", lambda: traced["host"][0])  # the host clock the anchor reads
    called = []

    def all_reduce(tensor, op=None, group=None, async_op=False):  # c10d's, not our wrapper
        called.append((tensor.scaled_by, group, async_op))
        FakeGPU.nccl_end_ms = max(FakeGPU.nccl_end_ms, FakeGPU.queue_end_ms, FakeGPU.now_ms) + 3.0
        work = Work(3.0)
        work.get_future = lambda: Future([tensor])
        return work

    hook = ddp.bucket_timing_hook(all_reduce)
    state = ddp._HookState(type("Module", (), {"process_group": pg})())
    timer.set_anchor()  # anchor: GPU 100 ms <-> host 10 s
    queue(5.0)  # bucket 0's gradients: ready on the device at 105 ms
    bucket = Tensor()
    assert hook(state, GradBucket(0, bucket)).value() is bucket  # DDP gets the reduced bucket back
    queue(5.0)  # the rest of the backward: bucket 1 ready at 110 ms
    hook(state, GradBucket(1, Tensor()))
    assert called == [(0.5, pg, True)] * 2  # scaled by 1/world, async, on the module's group
    FakeGPU.now_ms = 200.0
    for row in timer.poll():
        rec.add(row)
    host_done = [r[2] // MS - 10_000 for r in rec.events if r[0] == "done" and r[14].startswith("ddp")]
    assert host_done == [0, 0]  # the callbacks: at the host time of queuing
    rows = [(r[0], r[9], r[2] // MS - 10_000) for r in device_rows(rec)]
    assert rows == [("collective", 0, 5), ("done", 0, 8), ("collective", 1, 10), ("done", 1, 13)]
    assert {r[14] for r in device_rows(rec)} == {"gpu"}  # the end is the device's (exact)
    # the matching takes each bucket's call and completion from its device rows
    writer = RunDirWriter(str(tmp_path / "run"), "test", [])
    for rank in (0, 1):
        writer.write_rank(rank, sorted(rec.events, key=lambda r: r[2]), {"world_size": 2, "clock": clock_meta()})
    calls = load_run(writer.finish()).collectives()
    assert len(calls) == 4 and set(calls["detail"]) == {"gpu"}
    assert ((calls["done_ns"] - calls["issue_ns"]) / MS).tolist() == [3.0] * 4


def test_a_live_cuda_straggler_is_judged_on_its_device_rows_and_spans(tmp_path):
    """Two ranks call each all-reduce at the same host time (their hosts run
    ahead); on the device rank 1's forward+backward take 1.5x as long (its
    gpu:forward/gpu:backward event spans), so it is ready 3 ms later every time."""
    writer = RunDirWriter(str(tmp_path / "run"), "test", [])
    for rank in (0, 1):
        rows = []
        for step in range(8):
            t = (10 + 20 * step) * MS
            compute = 6 * MS if rank == 0 else 9 * MS
            rows.append(event_row("step", "step", t - MS, t + 19 * MS, step))
            rows.append(event_row("forward", "forward", t, t + MS // 10, step))
            rows.append(event_row("phase", "gpu:forward", t, t + compute // 3, step, detail="cuda_event"))
            rows.append(event_row("phase", "gpu:backward", t + compute // 3, t + compute, step, detail="cuda_event"))
            rows.append(
                event_row(
                    "collective",
                    "all_reduce",
                    t + MS // 5,
                    t + MS // 4,
                    step,
                    group="0",
                    group_ranks="0,1",
                    seq=step,
                    nbytes=4096,
                )
            )
            common = dict(group="0", group_ranks="0,1", seq=step, async_op=True, detail="gpu")
            rows.append(event_row("collective", "all_reduce", t + compute, t + compute, step, nbytes=4096, **common))
            rows.append(event_row("done", "all_reduce", t + 12 * MS, t + 12 * MS, step, **common))
        writer.write_rank(rank, sorted(rows, key=lambda r: r[2]), {"world_size": 2, "clock": clock_meta()})
    run = load_run(writer.finish())
    arrivals = run.arrivals()
    assert len(arrivals) == 16 and (arrivals["members"] == 2).all()  # one row per member: the device's
    assert set(arrivals["detail"]) == {"gpu"} and (arrivals["last_rank"] == 1).all()
    assert arrivals.groupby("rank")["wait_ms"].median().to_dict() == {0: 3.0, 1: 0.0}
    assert arrivals["transfer_ms"].median() == pytest.approx(3.0)
    # the host rows stay in the events (the host's breakdown reads them)
    events = run.events()
    assert ((events["kind"] == "collective") & (events["detail"].astype(str) == "")).sum() == 16
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    (f,) = found  # and nothing else
    assert f["kind"] == "straggler" and f["severity"] == "critical"
    assert f["ranks"] == [1] and f["stage"] is None and f["callsite"] is None
    assert f["metrics"]["device_time"] == 1.0 and f["metrics"]["busy_ratio_x"] == pytest.approx(1.5, rel=0.01)


def test_blocking_async_on_a_live_cuda_run_is_the_compute_stream_stalled(tmp_path):
    """Per step two async all-reduces: one waited at once (train.py:20), the
    compute stream stalls 3 ms behind it; one waited after 5 ms of queued
    compute (train.py:30), no stall. On the host both waits return at once."""
    writer = RunDirWriter(str(tmp_path / "run"), "test", [])
    for rank in (0, 1):
        rows = []
        for step in range(8):
            t = (10 + 20 * step) * MS
            rows.append(event_row("step", "step", t - MS, t + 19 * MS, step))
            for k, (site, queued_ms, stall_ms) in enumerate((("train.py:20", 0, 3), ("train.py:30", 5, 0))):
                seq, host_t = 2 * step + k, t + k * MS // 10
                common = dict(group="0", group_ranks="0,1", seq=seq, async_op=True)
                rows.append(
                    event_row(
                        "collective", "all_reduce", host_t, host_t + 20_000, step, nbytes=4096, callsite=site, **common
                    )
                )
                rows.append(
                    event_row("wait", "all_reduce", host_t + 30_000, host_t + 40_000, step, callsite=site, **common)
                )  # the host's wait: returns at once
                arrival = t + (2 + 9 * k) * MS
                waited_at = arrival + queued_ms * MS
                device = dict(common, detail="gpu:wait")
                rows.append(
                    event_row("collective", "all_reduce", arrival, arrival, step, nbytes=4096, callsite=site, **device)
                )
                rows.append(
                    event_row("wait", "all_reduce", waited_at, waited_at + stall_ms * MS, step, callsite=site, **device)
                )
                rows.append(
                    event_row(
                        "done", "all_reduce", waited_at + stall_ms * MS, waited_at + stall_ms * MS, step, **device
                    )
                )
        writer.write_rank(rank, sorted(rows, key=lambda r: r[2]), {"world_size": 2, "clock": clock_meta()})
    run = load_run(writer.finish())
    assert run.breakdown()["exposed_comm_ms"].max() == pytest.approx(0.06)  # the host: 2 x 30 us
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    (f,) = found  # and nothing else: one call per step and site is no hidden sync
    assert f["kind"] == "blocking_async" and f["callsite"] == "train.py:20" and f["ranks"] == [0, 1]
    assert f["stage"] is None and f["metrics"]["device_time"] == 1.0
    assert f["impact_ms_per_step"] == pytest.approx(3.0) and "compute stream stalled" in f["title"]
