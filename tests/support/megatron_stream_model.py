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
allow (_Model.run_step).

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

from tests.support.stream_sim_faults import (
    COMPUTE_STREAM,
    DP_STREAM,
    NCCL_STREAMS,
    P2P_STREAM,
    HostCalls,
    bucketed,
    drop_waits,
    interleaved,
    ring_schedule,
)

T0_US = 1_700_000_000_000_000.0
LAUNCH_US = 8.0
P2P_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALL_REDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64(cutlass::Params)"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>(int, int*)"
PIPELINE_DESC, DATA_DESC = "PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP"


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


def simulate(pp: int, dp: int, microbatches: int, steps: int, seed: int = 0, fwd_us: float = 3000.0,
             stage_factor: dict | None = None, length=None, jitter_sigma: float = 0.0, delay_every: int = 0,
             delay_us: float = 20000.0, peer_args: bool = True, kernels=(4, 8), transfer_us: float = 200.0,
             chunks: int = 1, rank_factor: dict | None = None, launch_us: dict | float | None = None,
             host_gap_us: float = 0.0, host_sync_every_mb: int = 0, blocking_p2p: bool = False,
             ring: bool = False, record_waits: bool = False, drop_waits_frac: float = 0.0, buckets: int = 0,
             allreduce_us: float | None = None) -> Sim:
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
        groups.append({"pg_name": str(1 + d), "pg_desc": PIPELINE_DESC, "backend_config": "cuda:nccl",
                       "ranks": pipeline_of[d]})
    for s in range(pp):
        groups.append({"pg_name": str(1 + dp + s), "pg_desc": DATA_DESC, "backend_config": "cuda:nccl",
                       "ranks": data_of[s * dp]})
    model = _Model(world, rng, jitter_sigma, delay_every, delay_us, transfer_us)
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
        sizes = {(r, i): (length(rng, r, step, i) if length else 1.0) * (stage_factor or {}).get(stage_of[r], 1.0)
                 * factor[r] for r in range(world) for i in range(microbatches)}
        programs = []
        for r in range(world):  # drawn rank by rank, kernel by kernel: the draws' order of old
            schedule = (ring_schedule(microbatches) if ring
                        else interleaved(stage_of[r], pp, microbatches, chunks) if chunks > 1
                        else one_f_one_b(stage_of[r], pp, microbatches) if pp > 1
                        else [(p, i) for i in range(microbatches) for p in "FB"])
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
        out.append({"schemaVersion": 1, "traceEvents": sorted(model.events[r], key=lambda e: e["ts"]),
                    "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world, "pg_config": mine}})
    return Sim(drop_waits(out, drop_waits_frac, seed), step_end_us)


class _Model(HostCalls):
    """The hosts' launches (events) and the device's queues (ops), per rank."""

    def __init__(self, world, rng, jitter_sigma, delay_every, delay_us, transfer_us):
        self.events = [[] for _ in range(world)]
        self.ops = [[] for _ in range(world)]  # this step's device ops, in launch order
        self.rng, self.sigma, self.every, self.delay_us = rng, jitter_sigma, delay_every, delay_us
        self.transfer_us, self.corr, self.rank, self.t = transfer_us, 0, 0, T0_US
        self.allreduce_us, self.buckets = transfer_us, 0
        self.names = {}  # process group ranks (tuple) -> its name
        self.launch_us, self.peer_args = [LAUNCH_US] * world, True

    def cpu(self, rank, name, ts, dur, tid=1, cat="cpu_op", args=None):
        event = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur,
                 "args": args or {}}
        self.events[rank].append(event)
        return event

    def draw(self, dur_us):
        dur = dur_us * (float(self.rng.lognormal(0.0, self.sigma)) if self.sigma else 1.0)
        if self.every and self.rng.random() < 1.0 / self.every:
            dur += self.delay_us
        return dur

    def run_step(self, programs, host) -> list:
        """Run every rank's host program for this step and the devices' queues
        along: a host that syncs waits for its device, whose ops may wait for
        other ranks' launches. Updates `host` (each host's time); returns each
        rank's last device end."""
        world = len(programs)
        pos = [0] * world
        self.latest = [{} for _ in range(world)]  # stream -> its last launched op
        self.waited = [{} for _ in range(world)]  # NCCL stream -> the op the compute stream last waited for
        self.count, self.links = [{} for _ in range(world)], {}  # (src, dst, n) -> [send op, recv op]
        self.blocked, self.pending = [None] * world, [[] for _ in range(world)]
        while True:
            moved = False
            for r in range(world):
                self.rank, self.t = r, host[r]
                while pos[r] < len(programs[r]) and self._do(programs[r][pos[r]]):
                    pos[r], moved = pos[r] + 1, True
                host[r] = self.t
            moved = self._resolve() or moved
            if all(p == len(prog) for p, prog in zip(pos, programs)) and not any(self.pending):
                return self._write_kernels()
            assert moved, "the schedule deadlocks"

    def _do(self, instruction) -> bool:
        what, *arg = instruction
        if what == "S":
            return self.host_sync(*arg)
        if what == "C":
            self.compute(*arg)
        elif what == "X":
            self.exchange(arg[0], arg[1], self.peer_args, arg[2])
        elif what == "A":
            self.all_reduce(arg[0])
        elif what == "O":
            self.optimizer(arg[0])
        else:  # "G": the host's own work between micro-batches
            self.cpu(self.rank, "host_work", self.t, arg[0])
            self.t += arg[0]
        return True

    def _launch(self, tid, op, name, stream, args=None):
        launch_us, latest = self.launch_us[self.rank], self.latest[self.rank]
        self.corr += 1
        self.cpu(self.rank, "cudaLaunchKernel", self.t, launch_us / 2, tid, "cuda_runtime",
                 {"correlation": self.corr})
        # it waits for the op before it on its stream and the latest launched on the
        # streams it waits on (compute on the NCCL streams, NCCL on compute)
        waits_on = (stream, *(op.pop("on", NCCL_STREAMS) if op["kind"] == "compute" else (COMPUTE_STREAM,)))
        op.update(launch=self.t, stream=stream, name=name, corr=self.corr, args=args or {}, start=None, end=None,
                  deps=[latest[s] for s in waits_on if s in latest])
        count = self.count[self.rank]
        for kind, peer in op.get("msgs", ()):
            pair = (self.rank, peer) if kind == "send" else (peer, self.rank)
            n = count[(kind, pair)] = count.get((kind, pair), -1) + 1
            self.links.setdefault((*pair, n), [None, None])[kind == "recv"] = op
            op.setdefault("keys", []).append((*pair, n))
        self.ops[self.rank].append(op)
        self.pending[self.rank].append(op)
        latest[stream] = op
        self.t += launch_us

    def compute(self, dur, backward):
        on = self.compute_waits_on()
        self.order_streams(COMPUTE_STREAM, on)
        if backward:
            self.cpu(self.rank, "autograd::engine::evaluate_function: MmBackward0", self.t - 1,
                     self.launch_us[self.rank], tid=2)
        self._launch(2 if backward else 1, {"kind": "compute", "dur": dur, "on": on}, GEMM, COMPUTE_STREAM)

    def exchange(self, ops, group, peer_args, desc=PIPELINE_DESC):
        t0 = self.t
        self.t += 2
        for op, peer in ops:  # one CPU op per message: the only place the peer is written
            args = {"Process Group Description": desc, "Process Group Ranks": str(group),
                    "In msg nelems": 1 << 20, "dtype": "BFloat16"}
            if peer_args:
                args["Dst Rank" if op == "send" else "Src Rank"] = peer
            args["Process Group Name"] = self.names[tuple(group)]
            self.cpu(self.rank, f"nccl:{op}", self.t, 6, args=args)
            self.t += 8
        args = {"Collective name": "coalesced", "Process Group Description": desc,
                "Process Group Ranks": str(group)}
        args["Process Group Name"] = self.names[tuple(group)]
        self.order_streams(P2P_STREAM)
        kernel = {"kind": "p2p", "msgs": ops}
        self._launch(1, kernel, P2P_KERNEL, P2P_STREAM, args)
        self.end_event(kernel)
        self.cpu(self.rank, "nccl:coalesced", t0, self.t - t0, args={"Process Group Ranks": str(group)})

    def all_reduce(self, group):
        args = {"Collective name": "allreduce", "Process Group Description": DATA_DESC,
                "Process Group Ranks": str(group), "In msg nelems": 1 << 24, "dtype": "BFloat16"}
        args["Process Group Name"] = self.names[tuple(group)]
        t0, call = self.t, self.cpu(self.rank, "nccl:all_reduce", self.t - 2, 0)
        self.order_streams(DP_STREAM)
        count = self.count[self.rank]  # the step's n-th all-reduce: its instance on every member
        count["all_reduce"] = count.get("all_reduce", -1) + 1
        kernel = {"kind": "all_reduce", "members": tuple(group), "n": count["all_reduce"]}
        self._launch(1, kernel, ALL_REDUCE_KERNEL, DP_STREAM, args)
        self.end_event(kernel)
        call["dur"] = self.t - t0 + 4

    def optimizer(self, dur):
        t0, call = self.t, self.cpu(self.rank, "Optimizer.step#FusedAdam.step", self.t - 2, 0, cat="user_annotation")
        self.order_streams(COMPUTE_STREAM)
        self._launch(1, {"kind": "compute", "dur": dur}, ADAM, COMPUTE_STREAM)
        call["dur"] = self.t - t0 + 4

    def _resolve(self) -> bool:
        """Resolve what the launches so far allow; whether anything was."""
        resolved = False
        while True:
            progress = False
            for r, ops in enumerate(self.pending):
                for op in ops:
                    if op["start"] is None:
                        deps = [d["end"] for d in op["deps"]]
                        if any(d is None for d in deps):
                            continue
                        op["start"] = max([op["launch"], *deps])
                    end = self._end(op)
                    if end is not None:
                        op["end"], progress = end, True
                self.pending[r] = [op for op in ops if op["end"] is None]
            if not progress:
                return resolved
            resolved = True

    def _write_kernels(self) -> list:
        """Write this step's kernels; each rank's last end."""
        last = []
        for r, ops in enumerate(self.ops):
            for op in ops:
                self.events[r].append({"ph": "X", "cat": "kernel", "name": op["name"], "pid": r, "tid": op["stream"],
                                       "ts": op["start"], "dur": op["end"] - op["start"],
                                       "args": {"stream": op["stream"], "correlation": op["corr"], "device": r,
                                                **op["args"]}})
            last.append(max(op["end"] for op in ops))
            self.ops[r] = []
        return last

    def _end(self, op):
        if op["kind"] == "compute":
            return op["start"] + op["dur"]
        if op["kind"] == "all_reduce":
            starts = [o["start"] for r in op["members"] for o in self.ops[r]
                      if o["kind"] == "all_reduce" and o["n"] == op["n"]]
            if len(starts) < len(op["members"]) or None in starts:
                return None
            return max(starts) + self.allreduce_us
        ends = [op["start"] + 5.0]
        for key in op.get("keys", ()):
            send, recv = self.links[key]
            if send is None or recv is None or send["start"] is None or recv["start"] is None:
                return None
            ends.append(max(send["start"], recv["start"]) + self.transfer_us)
        return max(ends)
