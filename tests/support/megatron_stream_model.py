"""Test aid: Megatron-shaped Kineto traces from a model of asynchronous CUDA
streams, for a pipeline-parallel x data-parallel job (or plain data parallel).

Per rank and step the host runs Megatron's non-interleaved 1F1B schedule
(warm-up forwards, one-forward-one-backward, cool-down backwards) and launches:

    forward kernels     from the main thread (tid 1) on the compute stream (7)
    backward kernels    from the autograd engine's thread (tid 2), each inside an
                        `autograd::engine::evaluate_function: ...` op, on stream 7
    each p2p exchange   one fused `ncclDevKernel_SendRecv` on the p2p stream (24),
                        launched inside a CPU `nccl:coalesced` op that holds one
                        `nccl:send` / `nccl:recv` op per message: the peer ("Dst
                        Rank" / "Src Rank", global ranks) is only there, and not at
                        all with peer_args=False. Megatron's combined exchanges
                        (send_forward_recv_backward...) are one kernel
    gradient all-reduce over the data-parallel group (stream 21), then the
                        optimizer kernel inside `Optimizer.step#FusedAdam.step`,
                        then cudaDeviceSynchronize; with buckets, DDP's bucketed
                        all-reduces during the last backward instead
                        (stream_sim_faults.bucketed)

The device: each stream is a queue in launch order. A compute kernel waits for
the exchanges and all-reduces launched before it (Megatron waits on the p2p
requests; with buckets only the optimizer waits for the all-reduces: DDP's
backward never does); an NCCL kernel waits for the compute launched before it
(NCCL's stream waits on the current stream). A fused SendRecv kernel starts
when its stream is free and its inputs are ready; each of its messages moves
`transfer_us` after both its kernel and the partner's kernel are running, and
the kernel ends when its last message has moved, so a pair of exchanges ends
together. An all-reduce ends `allreduce_us` (default transfer_us) after its
last member starts; the n-th all-reduce of a step on each rank is one
instance. The host never blocks before the step's final sync, so it runs ahead
of the device, as a real one does; unless told to (a loss.item() sync, blocking
p2p waits): then it waits for its device, and each step the hosts and the
devices of all ranks advance together, as far as each one's launches and waits
allow (StreamQueues.run_step, tests/support/stream_sim_queues.py).

Faults and host behaviour, all off by default (simulate's arguments; the host
calls that order or wait for streams, and their Kineto records, are in
tests/support/stream_sim_faults.py): a slow rank, per-rank launch cost, host work
between micro-batches, host syncs, blocking p2p, a ring of fused exchanges,
recorded cross-stream waits and some of them left out of the export.
simulate() also returns each step's end on the simulation's own clock: the
truth a what-if is measured against (tests/support/whatif_sim_cases.py).

distributedInfo carries pg_config with Megatron's descriptions (ranks laid out
tensor-data-pipeline: pipeline groups [d, d+dp, ...], data-parallel groups of
consecutive ranks).
"""

import numpy as np

from tests.support.stream_sim_faults import COMPUTE_STREAM, P2P_STREAM, bucketed, drop_waits, interleaved, ring_schedule
from tests.support.stream_sim_queues import DATA_DESC, LAUNCH_US, PIPELINE_DESC, T0_US, StreamQueues


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list:
    """Megatron's non-interleaved schedule for one stage: ("F"|"B", mb) compute
    and ("X", [(op, stage offset)]) exchanges (offset -1: the previous stage)."""
    first, last = stage == 0, stage == stages - 1
    recv_fwd = [] if first else [("recv", -1)]
    send_fwd = [] if last else [("send", +1)]
    recv_bwd = [] if last else [("recv", +1)]
    send_bwd = [] if first else [("send", -1)]
    warmup = min(stages - stage - 1, microbatches)
    out = []
    for i in range(warmup):
        out += [("X", recv_fwd), ("F", i), ("X", send_fwd)]
    remaining = microbatches - warmup
    if remaining:
        out.append(("X", recv_fwd))
    for i in range(remaining):
        out += [("F", warmup + i), ("X", send_fwd + recv_bwd), ("B", i)]
        out.append(("X", send_bwd if i == remaining - 1 else send_bwd + recv_fwd))
    for i in range(remaining, microbatches):
        out += [("X", recv_bwd), ("B", i), ("X", send_bwd)]
    return [a for a in out if a[0] != "X" or a[1]]


class Sim:
    """A simulated job: its Kineto traces (one dict per rank) and, per rank, each
    step's end (the ProfilerStep's end, us) on the simulation's own clock."""

    def __init__(self, traces: list, step_end_us: list):
        self.traces, self.step_end_us = traces, step_end_us


def traces(*args, **kwargs) -> list:
    """One Kineto trace (dict) per rank: simulate(...)'s."""
    return simulate(*args, **kwargs).traces


def simulate(
    pp: int,
    dp: int,
    microbatches: int,
    steps: int,
    seed: int = 0,
    fwd_us: float = 3000.0,
    stage_factor: dict | None = None,
    length=None,
    jitter_sigma: float = 0.0,
    delay_every: int = 0,
    delay_us: float = 20000.0,
    peer_args: bool = True,
    kernels=(4, 8),
    transfer_us: float = 200.0,
    chunks: int = 1,
    rank_factor: dict | None = None,
    launch_us: dict | float | None = None,
    host_gap_us: float = 0.0,
    host_sync_every_mb: int = 0,
    blocking_p2p: bool = False,
    ring: bool = False,
    record_waits: bool = False,
    drop_waits_frac: float = 0.0,
    buckets: int = 0,
    allreduce_us: float | None = None,
) -> Sim:
    """A micro-batch's forward is `fwd_us` (x stage_factor[stage], x
    rank_factor[rank], x length(rng, rank, step, mb) when given), its backward
    twice that, split into kernels[0] / kernels[1] equal kernels; each kernel x
    lognormal(0, jitter_sigma), and 1 kernel in `delay_every` (at random)
    `delay_us` longer. chunks > 1: the interleaved schedule (stream_sim_faults.py).
    The rest is off by default:
        rank_factor      {rank: x}: all that rank's compute kernels (the optimizer's too) x as long
        launch_us        host time per kernel launch, one value or {rank: us} (default LAUNCH_US)
        host_gap_us      host work (a "host_work" op) before each forward micro-batch
        host_sync_every_mb  k: after every k-th micro-batch's backward, loss.item():
                         the host waits for the compute stream (stream_sim_faults.py)
        blocking_p2p     the host waits for each exchange's kernel right after launching it
        ring             (pp=1) after each micro-batch's backward, one fused exchange round
                         the data-parallel group: send to the next rank, receive from the
                         previous (the gradient all-reduce still ends the step)
        record_waits     the cross-stream waits as Kineto records them (stream_sim_faults.py)
        drop_waits_frac  that share of the recorded waits left out of the export only
        buckets          (dp > 1) DDP's gradient buckets: that many all-reduces during the
                         last micro-batch's backward, overlapping it (stream_sim_faults.bucketed)
        allreduce_us     an all-reduce's transfer (default transfer_us)"""
    assert not ring or pp == 1, "a ring exchanges within the data-parallel group (pp=1)"
    assert 0 <= buckets <= kernels[1], "a bucket follows at least one backward kernel"
    rng = np.random.default_rng(seed)
    world = pp * dp
    stage_of = {r: r // dp for r in range(world)}
    pipeline_of = {r: [r % dp + s * dp for s in range(pp)] for r in range(world)}
    data_of = {r: [stage_of[r] * dp + d for d in range(dp)] for r in range(world)}
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": list(range(world))}]
    for d in range(dp):
        groups.append(
            {"pg_name": str(1 + d), "pg_desc": PIPELINE_DESC, "backend_config": "cuda:nccl", "ranks": pipeline_of[d]}
        )
    for s in range(pp):
        groups.append(
            {"pg_name": str(1 + dp + s), "pg_desc": DATA_DESC, "backend_config": "cuda:nccl", "ranks": data_of[s * dp]}
        )
    model = StreamQueues(world, rng, jitter_sigma, delay_every, delay_us, transfer_us)
    model.allreduce_us = transfer_us if allreduce_us is None else allreduce_us
    model.buckets = buckets if dp > 1 else 0
    model.names = {tuple(g["ranks"]): g["pg_name"] for g in groups}
    model.peer_args, model.record_waits = peer_args, record_waits
    per_rank = launch_us if isinstance(launch_us, dict) else {}
    everyone = LAUNCH_US if launch_us is None or isinstance(launch_us, dict) else launch_us
    model.launch_us = [per_rank.get(r, everyone) for r in range(world)]
    factor = {r: (rank_factor or {}).get(r, 1.0) for r in range(world)}
    host = [T0_US] * world
    step_end_us = [[] for _ in range(world)]
    for step in range(steps):
        # (x 1.0 is exact: without faults the floats, and so the traces, are as before them)
        sizes = {
            (r, i): (length(rng, r, step, i) if length else 1.0)
            * (stage_factor or {}).get(stage_of[r], 1.0)
            * factor[r]
            for r in range(world)
            for i in range(microbatches)
        }
        programs = []
        for r in range(world):  # drawn rank by rank, kernel by kernel: the draws' order of old
            schedule = (
                ring_schedule(microbatches)
                if ring
                else interleaved(stage_of[r], pp, microbatches, chunks)
                if chunks > 1
                else one_f_one_b(stage_of[r], pp, microbatches)
                if pp > 1
                else [(p, i) for i in range(microbatches) for p in "FB"]
            )
            peers, desc = (data_of[r], DATA_DESC) if ring else (pipeline_of[r], PIPELINE_DESC)
            program = []
            last_backward = max(j for j, (what, _) in enumerate(schedule) if what == "B")
            for j, (what, arg) in enumerate(schedule):
                if what == "X":
                    ops = [(op, peers[(peers.index(r) + off) % len(peers)]) for op, off in arg]
                    program.append(("X", ops, peers, desc))
                    if blocking_p2p:
                        program.append(("S", P2P_STREAM, "p2p"))
                    continue
                if what == "F" and host_gap_us:
                    program.append(("G", host_gap_us))
                n = kernels[0] if what == "F" else kernels[1]
                dur = fwd_us * sizes[(r, arg)] * (1 if what == "F" else 2) / n
                launches = [("C", model.draw(dur), what == "B") for _ in range(n)]
                program += bucketed(launches, model.buckets, data_of[r]) if j == last_backward else launches
                if what == "B" and host_sync_every_mb and (arg + 1) % host_sync_every_mb == 0:
                    program.append(("S", COMPUTE_STREAM, "item"))
            if dp > 1 and not model.buckets:
                program.append(("A", data_of[r]))
            program.append(("O", 1500.0 * factor[r]))
            programs.append(program)
        starts = list(host)
        ends = model.run_step(programs, host)
        for r in range(world):
            sync_start = host[r]
            done = max(sync_start, ends[r]) + 5
            model.cpu(r, "cudaDeviceSynchronize", sync_start, done - sync_start, cat="cuda_runtime")
            model.cpu(r, f"ProfilerStep#{step}", starts[r] - 1, done + 20 - starts[r], cat="user_annotation")
            step_end_us[r].append(done + 20)
            host[r] = done + 30
    out = []
    for r in range(world):
        mine = [g for g in groups if r in g["ranks"]]
        out.append(
            {
                "schemaVersion": 1,
                "traceEvents": sorted(model.events[r], key=lambda e: e["ts"]),
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world, "pg_config": mine},
            }
        )
    return Sim(drop_waits(out, drop_waits_frac, seed), step_end_us)
