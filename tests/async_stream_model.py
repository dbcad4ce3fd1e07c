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


def traces(world: int, steps: int, slow_rank: int, slow_factor: float, fwd_us=(5000.0,) * 4,
           bwd_us=(10000.0,) * 4, transfer_us=5000.0, optimizer_us=2000.0) -> tuple[list, list]:
    """(one Kineto trace per rank, one host-side view per rank: the collective
    calls and syncs as a host-side recorder sees them)."""
    events = [[] for _ in range(world)]
    host = [[] for _ in range(world)]
    corr = [0]
    ranks = "[" + ", ".join(map(str, range(world))) + "]"

    def launch(rank, t_us, name, start_us, dur_us, stream, args=None):
        corr[0] += 1
        events[rank].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": rank,
                             "tid": 1, "ts": t_us, "dur": LAUNCH_US / 2, "args": {"correlation": corr[0]}})
        events[rank].append({"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": stream,
                             "ts": start_us, "dur": dur_us,
                             "args": {"stream": stream, "correlation": corr[0], "device": rank, **(args or {})}})

    host_t = [T0_US] * world       # when each host starts its step
    device_t = [T0_US] * world     # when each compute stream is free
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
            events[r].append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": r,
                              "tid": 1, "ts": t - 5, "dur": LAUNCH_US})
            launch(r, t, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                   arrival[r], end - arrival[r], 20,
                   {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": ranks,
                    "In msg nelems": 1 << 20, "dtype": "Float"})
            host[r].append(("collective", "all_reduce", t - 5, t - 5 + LAUNCH_US, step, ranks[1:-1].replace(" ", "")))
            t += LAUNCH_US
            launch(r, t, "void adam_kernel<float>(float*)", end, optimizer_us, 7)
            done = end + optimizer_us
            sync_start = t + LAUNCH_US
            events[r].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": r,
                              "tid": 1, "ts": sync_start, "dur": done - sync_start})
            host[r].append(("sync", "cudaStreamSynchronize", sync_start, done, step, ""))
            step_start = host_t[r] - (len(fwd_us) + len(bwd_us) + 1) * LAUNCH_US
            events[r].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": r,
                              "tid": 1, "ts": step_start, "dur": done + 100 - step_start})
            host[r].append(("step", "step", step_start, done + 100, step, ""))
            host_t[r] = done + 100
            device_t[r] = done
    return ([{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
              "traceEvents": sorted(events[r], key=lambda e: e["ts"])} for r in range(world)], host)
