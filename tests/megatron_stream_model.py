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
                        then cudaDeviceSynchronize

The device: each stream is a queue in launch order. A compute kernel waits for
the exchanges launched before it (Megatron waits on the p2p requests); an NCCL
kernel waits for the compute launched before it (NCCL's stream waits on the
current stream). A fused SendRecv kernel starts when its stream is free and its
inputs are ready; each of its messages moves `transfer_us` after both its
kernel and the partner's kernel are running, and the kernel ends when its last
message has moved, so a pair of exchanges ends together. An all-reduce ends
`transfer_us` after its last member starts. The host never blocks before the
step's final sync, so it runs ahead of the device, as a real one does.

distributedInfo carries pg_config with Megatron's descriptions (ranks laid out
tensor-data-pipeline: pipeline groups [d, d+dp, ...], data-parallel groups of
consecutive ranks).
"""
import numpy as np

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


def interleaved(stage: int, stages: int, microbatches: int, chunks: int) -> list:
    """A virtual-stage schedule: chunk c of stage s is virtual stage
    c * stages + s, so the last stage sends chunk c's output to the first stage
    (offset +1 wraps round). Micro-batches go in groups of `stages` through each
    chunk in turn (Megatron's interleaved order), forwards then backwards; a
    send and the receive after it are one exchange (send_forward_recv_forward:
    lone blocking sends round the ring would deadlock the in-order p2p streams)."""
    last = chunks * stages - 1
    groups = [range(g, min(g + stages, microbatches)) for g in range(0, microbatches, stages)]
    out = []
    for group in groups:
        for c in range(chunks):
            v = c * stages + stage
            for i in group:
                out += [("X", [("recv", -1)] if v > 0 else []), ("F", i), ("X", [("send", +1)] if v < last else [])]
    for group in groups:
        for c in reversed(range(chunks)):
            v = c * stages + stage
            for i in group:
                out += [("X", [("recv", +1)] if v < last else []), ("B", i), ("X", [("send", -1)] if v > 0 else [])]
    fused = []
    for a in out:
        if a[0] == "X" and fused and fused[-1][0] == "X":
            fused[-1] = ("X", fused[-1][1] + a[1])
        else:
            fused.append(a)
    return [a for a in fused if a[0] != "X" or a[1]]


def traces(pp: int, dp: int, microbatches: int, steps: int, seed: int = 0, fwd_us: float = 3000.0,
           stage_factor: dict | None = None, length=None, jitter_sigma: float = 0.0, delay_every: int = 0,
           delay_us: float = 20000.0, peer_args: bool = True, kernels=(4, 8), transfer_us: float = 200.0,
           chunks: int = 1) -> list:
    """One Kineto trace (dict) per rank. A micro-batch's forward is `fwd_us`
    (x stage_factor[stage], x length(rng, rank, step, mb) when given), its
    backward twice that, split into kernels[0] / kernels[1] equal kernels; each
    kernel x lognormal(0, jitter_sigma), and 1 kernel in `delay_every` (at
    random) `delay_us` longer. chunks > 1: the interleaved schedule above."""
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
    model.names = {tuple(g["ranks"]): g["pg_name"] for g in groups}
    host = [T0_US] * world
    for step in range(steps):
        sizes = {(r, i): (length(rng, r, step, i) if length else 1.0) * (stage_factor or {}).get(stage_of[r], 1.0)
                 for r in range(world) for i in range(microbatches)}
        starts = list(host)
        for r in range(world):
            model.rank, model.t = r, host[r]
            program = (interleaved(stage_of[r], pp, microbatches, chunks) if chunks > 1
                       else one_f_one_b(stage_of[r], pp, microbatches) if pp > 1
                       else [(p, i) for i in range(microbatches) for p in "FB"])
            for what, arg in program:
                if what == "X":
                    ops = [(op, pipeline_of[r][(stage_of[r] + off) % pp]) for op, off in arg]
                    model.exchange(ops, pipeline_of[r], peer_args)
                else:
                    n = kernels[0] if what == "F" else kernels[1]
                    dur = fwd_us * sizes[(r, arg)] * (1 if what == "F" else 2) / n
                    for _ in range(n):
                        model.compute(dur, what == "B")
            if dp > 1:
                model.all_reduce(data_of[r])
            model.optimizer()
            host[r] = model.t
        ends = model.run()
        for r in range(world):
            sync_start = host[r]
            done = max(sync_start, ends[r]) + 5
            model.cpu(r, "cudaDeviceSynchronize", sync_start, done - sync_start, cat="cuda_runtime")
            model.cpu(r, f"ProfilerStep#{step}", starts[r] - 1, done + 20 - starts[r], cat="user_annotation")
            host[r] = done + 30
    out = []
    for r in range(world):
        mine = [g for g in groups if r in g["ranks"]]
        out.append({"schemaVersion": 1, "traceEvents": sorted(model.events[r], key=lambda e: e["ts"]),
                    "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world, "pg_config": mine}})
    return out


class _Model:
    """The host's launches (events) and the device's queues (ops), per rank."""

    def __init__(self, world, rng, jitter_sigma, delay_every, delay_us, transfer_us):
        self.events = [[] for _ in range(world)]
        self.ops = [[] for _ in range(world)]  # this step's device ops, in launch order
        self.rng, self.sigma, self.every, self.delay_us = rng, jitter_sigma, delay_every, delay_us
        self.transfer_us, self.corr, self.rank, self.t = transfer_us, 0, 0, T0_US
        self.names = {}  # process group ranks (tuple) -> its name

    def cpu(self, rank, name, ts, dur, tid=1, cat="cpu_op", args=None):
        self.events[rank].append({"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts,
                                  "dur": dur, "args": args or {}})

    def _launch(self, tid, op, name, stream, args=None):
        self.corr += 1
        self.cpu(self.rank, "cudaLaunchKernel", self.t, LAUNCH_US / 2, tid, "cuda_runtime",
                 {"correlation": self.corr})
        op.update(launch=self.t, stream=stream, name=name, corr=self.corr, args=args or {}, start=None, end=None)
        self.ops[self.rank].append(op)
        self.t += LAUNCH_US

    def compute(self, dur_us, backward):
        dur = dur_us * (float(self.rng.lognormal(0.0, self.sigma)) if self.sigma else 1.0)
        if self.every and self.rng.random() < 1.0 / self.every:
            dur += self.delay_us
        if backward:
            self.cpu(self.rank, "autograd::engine::evaluate_function: MmBackward0", self.t - 1, LAUNCH_US, tid=2)
        self._launch(2 if backward else 1, {"kind": "compute", "dur": dur}, GEMM, 7)

    def exchange(self, ops, group, peer_args):
        t0 = self.t
        self.t += 2
        for op, peer in ops:  # one CPU op per message: the only place the peer is written
            args = {"Process Group Description": PIPELINE_DESC, "Process Group Ranks": str(group),
                    "In msg nelems": 1 << 20, "dtype": "BFloat16"}
            if peer_args:
                args["Dst Rank" if op == "send" else "Src Rank"] = peer
            args["Process Group Name"] = self.names[tuple(group)]
            self.cpu(self.rank, f"nccl:{op}", self.t, 6, args=args)
            self.t += 8
        args = {"Collective name": "coalesced", "Process Group Description": PIPELINE_DESC,
                "Process Group Ranks": str(group)}
        args["Process Group Name"] = self.names[tuple(group)]
        self._launch(1, {"kind": "p2p", "msgs": ops}, P2P_KERNEL, 24, args)
        self.cpu(self.rank, "nccl:coalesced", t0, self.t - t0, args={"Process Group Ranks": str(group)})

    def all_reduce(self, group):
        args = {"Collective name": "allreduce", "Process Group Description": DATA_DESC,
                "Process Group Ranks": str(group), "In msg nelems": 1 << 24, "dtype": "BFloat16"}
        args["Process Group Name"] = self.names[tuple(group)]
        self.cpu(self.rank, "nccl:all_reduce", self.t - 2, LAUNCH_US + 4)
        self._launch(1, {"kind": "all_reduce", "members": tuple(group)}, ALL_REDUCE_KERNEL, 21, args)

    def optimizer(self):
        self.cpu(self.rank, "Optimizer.step#FusedAdam.step", self.t - 2, LAUNCH_US + 4, cat="user_annotation")
        self._launch(1, {"kind": "compute", "dur": 1500.0}, ADAM, 7)

    def run(self) -> list:
        """Resolve this step's device ops of every rank; write the kernels; each rank's last end."""
        world = len(self.ops)
        waits = [self._waits(ops) for ops in self.ops]
        links = {}  # (src, dst, n) -> [send op, recv op]
        for r, ops in enumerate(self.ops):
            count = {}
            for op in ops:
                for kind, peer in op.get("msgs", ()):
                    pair = (r, peer) if kind == "send" else (peer, r)
                    n = count[(kind, pair)] = count.get((kind, pair), -1) + 1
                    links.setdefault((*pair, n), [None, None])[kind == "recv"] = op
                    op.setdefault("keys", []).append((*pair, n))
        pending = sum(len(ops) for ops in self.ops)
        while pending:
            progress = False
            for r in range(world):
                for i, op in enumerate(self.ops[r]):
                    if op["end"] is not None:
                        continue
                    if op["start"] is None:
                        deps = [self.ops[r][j]["end"] for j in waits[r][i]]
                        if any(d is None for d in deps):
                            continue
                        op["start"] = max([op["launch"], *deps])
                    end = self._end(op, links)
                    if end is not None:
                        op["end"], progress, pending = end, True, pending - 1
            assert progress, "the schedule deadlocks"
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

    @staticmethod
    def _waits(ops) -> list:
        """Per op, the ops it waits for: the one before it on its stream, and the
        latest launched before it on the streams it waits on."""
        out, latest = [], {}
        for op in ops:
            deps = [latest[op["stream"]]] if op["stream"] in latest else []
            for stream in ((24, 21) if op["kind"] == "compute" else (7,)):
                if stream in latest:
                    deps.append(latest[stream])
            out.append(deps)
            latest[op["stream"]] = len(out) - 1
        return out

    def _end(self, op, links):
        if op["kind"] == "compute":
            return op["start"] + op["dur"]
        if op["kind"] == "all_reduce":
            starts = [o["start"] for r in op["members"] for o in self.ops[r]
                      if o["kind"] == "all_reduce"]
            if len(starts) < len(op["members"]) or None in starts:
                return None
            return max(starts) + self.transfer_us
        ends = [op["start"] + 5.0]
        for key in op.get("keys", ()):
            send, recv = links[key]
            if send is None or recv is None or send["start"] is None or recv["start"] is None:
                return None
            ends.append(max(send["start"], recv["start"]) + self.transfer_us)
        return max(ends)
