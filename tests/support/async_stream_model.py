"""Test aid: a model of asynchronous CUDA streams for an N-rank data-parallel
job, written as the Kineto traces the PyTorch profiler would record.

Per rank and step the host launches forward and backward kernels on the
compute stream, an all-reduce on the NCCL stream and an optimizer kernel, then
blocks in cudaStreamSynchronize. Each stream is a queue: a kernel starts when
it is launched and the kernel before it on its stream is done. The all-reduce
waits for the backward (an event on the compute stream), and every member's
NCCL kernel ends together, `transfer_us` after the last member's kernel could
start; the optimizer waits for it. So a rank whose GPU computes slower makes
everyone's NCCL kernel wait on the device, while on the hosts every rank
launches the all-reduce at the same moment (each resumes when its sync
returns, which is when the collective is done everywhere).

This model checks the analysis against a known cause; the real traces in
tests/data are the judge.
"""

T0_US = 1_700_000_000_000_000.0
LAUNCH_US = 20.0


def traces(
    world: int,
    steps: int,
    slow_rank: int,
    slow_factor: float,
    fwd_us=(5000.0,) * 4,
    bwd_us=(10000.0,) * 4,
    transfer_us=5000.0,
    optimizer_us=2000.0,
) -> tuple[list, list]:
    """(one Kineto trace per rank, one host-side view per rank: the collective
    calls and syncs as a host-side recorder sees them)."""
    events = [[] for _ in range(world)]
    host = [[] for _ in range(world)]
    corr = [0]
    ranks = "[" + ", ".join(map(str, range(world))) + "]"

    def launch(rank, t_us, name, start_us, dur_us, stream, args=None):
        corr[0] += 1
        events[rank].append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": rank,
                "tid": 1,
                "ts": t_us,
                "dur": LAUNCH_US / 2,
                "args": {"correlation": corr[0]},
            }
        )
        events[rank].append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": rank,
                "tid": stream,
                "ts": start_us,
                "dur": dur_us,
                "args": {"stream": stream, "correlation": corr[0], "device": rank, **(args or {})},
            }
        )

    host_t = [T0_US] * world  # when each host starts its step
    device_t = [T0_US] * world  # when each compute stream is free
    for step in range(steps):
        arrival, launched = [], []
        for r in range(world):
            factor = slow_factor if r == slow_rank else 1.0
            t, d = host_t[r], max(device_t[r], host_t[r])
            for dur in (*fwd_us, *bwd_us):
                t += LAUNCH_US
                d = max(d, t)
                launch(r, t, "void gemm_kernel<float>(float*)", d, dur * factor, 7)
                d += dur * factor
            t += LAUNCH_US
            launched.append(t)
            arrival.append(max(d, t))  # the NCCL kernel waits for the backward on the device
            device_t[r] = d
            host_t[r] = t
        end = max(arrival) + transfer_us
        for r in range(world):
            t = launched[r]
            events[r].append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "nccl:all_reduce",
                    "pid": r,
                    "tid": 1,
                    "ts": t - 5,
                    "dur": LAUNCH_US,
                }
            )
            launch(
                r,
                t,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                arrival[r],
                end - arrival[r],
                20,
                {
                    "Collective name": "allreduce",
                    "Process Group Name": "0",
                    "Process Group Ranks": ranks,
                    "In msg nelems": 1 << 20,
                    "dtype": "Float",
                },
            )
            host[r].append(("collective", "all_reduce", t - 5, t - 5 + LAUNCH_US, step, ranks[1:-1].replace(" ", "")))
            t += LAUNCH_US
            launch(r, t, "void adam_kernel<float>(float*)", end, optimizer_us, 7)
            done = end + optimizer_us
            sync_start = t + LAUNCH_US
            events[r].append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaStreamSynchronize",
                    "pid": r,
                    "tid": 1,
                    "ts": sync_start,
                    "dur": done - sync_start,
                }
            )
            host[r].append(("sync", "cudaStreamSynchronize", sync_start, done, step, ""))
            step_start = host_t[r] - (len(fwd_us) + len(bwd_us) + 1) * LAUNCH_US
            events[r].append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": r,
                    "tid": 1,
                    "ts": step_start,
                    "dur": done + 100 - step_start,
                }
            )
            host[r].append(("step", "step", step_start, done + 100, step, ""))
            host_t[r] = done + 100
            device_t[r] = done
    return (
        [
            {
                "schemaVersion": 1,
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
                "traceEvents": sorted(events[r], key=lambda e: e["ts"]),
            }
            for r in range(world)
        ],
        host,
    )


DATA_NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def program_traces(world: int, steps: int, program: list) -> list:
    """One Kineto trace per rank of a job whose every rank runs `program` each
    step, on one compute stream (7) and one NCCL stream (20). Actions:

        ("kernel", us)      launch a compute kernel of `us` on the compute stream
        ("host", us)        Python work on the host
        ("data", us)        the host waits `us` in the DataLoader's __next__
        ("sync",)           cudaStreamSynchronize: the host blocks until the
                            compute stream has drained
        ("event_sync", k)   cudaEventSynchronize on the end of the kernel launched
                            k launches before the latest (k=0: the latest): kernels
                            launched after it stay queued
        ("all_reduce", us)  an NCCL all-reduce after the compute stream's work
                            (stream-ordered), `us` after the last member could
                            start; the compute stream then waits for it

    Host calls return at once unless they block (sync, event_sync, data).
    Where `us` is a dict {rank: us}, ranks not in it take its key None (else 0)."""
    events = [[] for _ in range(world)]
    corr = [0]
    ranks = "[" + ", ".join(map(str, range(world))) + "]"
    host_t, device_t = [T0_US] * world, [T0_US] * world
    kernel_ends = [[] for _ in range(world)]

    def runtime(rank, name, ts, dur, **args):
        events[rank].append(
            {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": rank, "tid": 1, "ts": ts, "dur": dur, "args": args}
        )

    def launch(rank, name, start_us, dur_us, stream, args=None):
        corr[0] += 1
        runtime(rank, "cudaLaunchKernel", host_t[rank], LAUNCH_US / 2, correlation=corr[0])
        events[rank].append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": rank,
                "tid": stream,
                "ts": start_us,
                "dur": dur_us,
                "args": {"stream": stream, "correlation": corr[0], "device": rank, **(args or {})},
            }
        )

    for step in range(steps):
        step_start = list(host_t)
        for action in program:
            what = action[0]
            if what == "all_reduce":
                arrival = []
                for r in range(world):
                    host_t[r] += LAUNCH_US
                    arrival.append(max(device_t[r], host_t[r]))
                end = max(arrival) + action[1]
                for r in range(world):
                    events[r].append(
                        {
                            "ph": "X",
                            "cat": "user_annotation",
                            "name": "nccl:all_reduce",
                            "pid": r,
                            "tid": 1,
                            "ts": host_t[r] - 5,
                            "dur": LAUNCH_US,
                        }
                    )
                    launch(
                        r,
                        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                        arrival[r],
                        end - arrival[r],
                        20,
                        {
                            "Collective name": "allreduce",
                            "Process Group Name": "0",
                            "Process Group Ranks": ranks,
                            "In msg nelems": 1 << 20,
                            "dtype": "Float",
                        },
                    )
                    device_t[r] = end
                continue
            for r in range(world):
                t = host_t[r]
                us = action[1] if len(action) > 1 else None
                if isinstance(us, dict):
                    us = us.get(r, us.get(None, 0))
                if what == "kernel":
                    host_t[r] = t + LAUNCH_US
                    start = max(device_t[r], host_t[r])
                    launch(r, "void gemm_kernel<float>(float*)", start, us, 7)
                    device_t[r] = start + us
                    kernel_ends[r].append(device_t[r])
                elif what == "host":
                    host_t[r] = t + us
                elif what == "data":
                    events[r].append(
                        {"ph": "X", "cat": "cpu_op", "name": DATA_NEXT, "pid": r, "tid": 1, "ts": t, "dur": us}
                    )
                    host_t[r] = t + us
                elif what in ("sync", "event_sync"):
                    k = action[1] if what == "event_sync" else 0
                    until = device_t[r] if what == "sync" else kernel_ends[r][-1 - k] if len(kernel_ends[r]) > k else t
                    done = max(t, until)
                    runtime(r, "cudaStreamSynchronize" if what == "sync" else "cudaEventSynchronize", t, done - t)
                    host_t[r] = done + 5
        for r in range(world):
            events[r].append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": r,
                    "tid": 1,
                    "ts": step_start[r],
                    "dur": host_t[r] - step_start[r],
                }
            )
    return [
        {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
            "traceEvents": sorted(events[r], key=lambda e: e["ts"]),
        }
        for r in range(world)
    ]


def pipeline_rows(stages: int, microbatches: int, steps: int, fwd_us=4000.0, bwd_us=8000.0) -> list:
    """Event rows (collectors.schema.event_row), one list per rank, of a GPipe
    pipeline of `stages` ranks as a CUDA run would record them with device
    rows: per micro-batch the host's forward/backward phases (stage-stamped)
    return as soon as their kernels are queued; the kernels run when the
    previous stage's activation (or the next stage's gradient) has arrived,
    through NCCL send/recv kernels (p2p rows on the device, detail "gpu"); the
    host then blocks in cudaStreamSynchronize until its device is done. So on
    the device each stage idles (p-1)/(m+p-1) of the step, while the host's
    phases cover almost none of it."""
    from collectors.schema import event_row

    ns = lambda us: int(us * 1000)  # noqa: E731
    rows = [[] for _ in range(stages)]
    t0 = T0_US
    sent = {}  # (src, dst) -> messages so far
    for step in range(steps):
        f_end = [[0.0] * microbatches for _ in range(stages)]
        b_end = [[0.0] * microbatches for _ in range(stages)]
        for s in range(stages):
            for i in range(microbatches):
                ready = max(f_end[s][i - 1] if i else t0, f_end[s - 1][i] if s else t0)
                f_end[s][i] = ready + fwd_us
        for s in reversed(range(stages)):
            for i in range(microbatches):
                ready = max(b_end[s][i - 1] if i else f_end[s][-1], b_end[s + 1][i] if s + 1 < stages else t0)
                b_end[s][i] = ready + bwd_us
        end = max(b_end[0][-1], max(row[-1] for row in b_end)) + 100
        for s in range(stages):
            out, host = rows[s], t0
            for phase, ends, dur in (("forward", f_end[s], fwd_us), ("backward", b_end[s], bwd_us)):
                for i in range(microbatches):
                    out.append(event_row("phase", phase, ns(host), ns(host + LAUNCH_US), step, i, s))
                    out.append(
                        event_row(
                            "kernel",
                            "void gemm_kernel<float>(float*)",
                            ns(ends[i] - dur),
                            ns(ends[i]),
                            step,
                            group="7",
                            detail="compute",
                        )
                    )
                    host += LAUNCH_US
                    peer = s + 1 if phase == "forward" else s - 1
                    if 0 <= peer < stages:  # the send of this micro-batch's output, and its matching recv
                        src, dst = s, peer
                        seq = sent[(src, dst)] = sent.get((src, dst), -1) + 1
                        t = ends[i]
                        for rank, op in ((src, "send"), (dst, "recv")):
                            common = dict(
                                group=f"{src}->{dst}", group_ranks=f"{src},{dst}", seq=seq, async_op=True, detail="gpu"
                            )
                            rows[rank].append(
                                event_row(
                                    "p2p",
                                    op,
                                    ns(t),
                                    ns(t),
                                    step,
                                    i,
                                    peer=dst if op == "send" else src,
                                    nbytes=1 << 20,
                                    **common,
                                )
                            )
                            rows[rank].append(event_row("done", op, ns(t + 50), ns(t + 50), step, i, **common))
                            rows[rank].append(
                                event_row(
                                    "kernel",
                                    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                                    ns(t),
                                    ns(t + 50),
                                    step,
                                    group="20",
                                    detail="communication",
                                )
                            )
            out.append(event_row("sync", "cudaStreamSynchronize", ns(host), ns(end), step, detail="cuda"))
            out.append(event_row("step", "step", ns(t0), ns(end + 50), step))
        t0 = end + 100
    return [sorted(r, key=lambda row: row[2]) for r in rows]
