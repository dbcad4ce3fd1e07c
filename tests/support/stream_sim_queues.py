"""Test aid: the simulated job of tests/support/megatron_stream_model.py, step by
step: each rank's host launches (its Kineto CPU records) and each device's
stream queues (its kernels), with the kernel names and Megatron's group
descriptions they carry. The model itself (what waits for what) is described in
megatron_stream_model.py's docstring."""

from tests.support.stream_sim_faults import COMPUTE_STREAM, DP_STREAM, NCCL_STREAMS, P2P_STREAM, HostCalls

T0_US = 1_700_000_000_000_000.0
LAUNCH_US = 8.0
P2P_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALL_REDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64(cutlass::Params)"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>(int, int*)"
PIPELINE_DESC, DATA_DESC = "PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP"


class StreamQueues(HostCalls):
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
        event = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}
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
        self.cpu(self.rank, "cudaLaunchKernel", self.t, launch_us / 2, tid, "cuda_runtime", {"correlation": self.corr})
        # it waits for the op before it on its stream and the latest launched on the
        # streams it waits on (compute on the NCCL streams, NCCL on compute)
        waits_on = (stream, *(op.pop("on", NCCL_STREAMS) if op["kind"] == "compute" else (COMPUTE_STREAM,)))
        op.update(
            launch=self.t,
            stream=stream,
            name=name,
            corr=self.corr,
            args=args or {},
            start=None,
            end=None,
            deps=[latest[s] for s in waits_on if s in latest],
        )
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
            self.cpu(
                self.rank,
                "autograd::engine::evaluate_function: MmBackward0",
                self.t - 1,
                self.launch_us[self.rank],
                tid=2,
            )
        self._launch(2 if backward else 1, {"kind": "compute", "dur": dur, "on": on}, GEMM, COMPUTE_STREAM)

    def exchange(self, ops, group, peer_args, desc=PIPELINE_DESC):
        t0 = self.t
        self.t += 2
        for op, peer in ops:  # one CPU op per message: the only place the peer is written
            args = {
                "Process Group Description": desc,
                "Process Group Ranks": str(group),
                "In msg nelems": 1 << 20,
                "dtype": "BFloat16",
            }
            if peer_args:
                args["Dst Rank" if op == "send" else "Src Rank"] = peer
            args["Process Group Name"] = self.names[tuple(group)]
            self.cpu(self.rank, f"nccl:{op}", self.t, 6, args=args)
            self.t += 8
        args = {"Collective name": "coalesced", "Process Group Description": desc, "Process Group Ranks": str(group)}
        args["Process Group Name"] = self.names[tuple(group)]
        self.order_streams(P2P_STREAM)
        kernel = {"kind": "p2p", "msgs": ops}
        self._launch(1, kernel, P2P_KERNEL, P2P_STREAM, args)
        self.end_event(kernel)
        self.cpu(self.rank, "nccl:coalesced", t0, self.t - t0, args={"Process Group Ranks": str(group)})

    def all_reduce(self, group):
        args = {
            "Collective name": "allreduce",
            "Process Group Description": DATA_DESC,
            "Process Group Ranks": str(group),
            "In msg nelems": 1 << 24,
            "dtype": "BFloat16",
        }
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
                self.events[r].append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": op["name"],
                        "pid": r,
                        "tid": op["stream"],
                        "ts": op["start"],
                        "dur": op["end"] - op["start"],
                        "args": {"stream": op["stream"], "correlation": op["corr"], "device": r, **op["args"]},
                    }
                )
            last.append(max(op["end"] for op in ops))
            self.ops[r] = []
        return last

    def _end(self, op):
        if op["kind"] == "compute":
            return op["start"] + op["dur"]
        if op["kind"] == "all_reduce":
            starts = [
                o["start"]
                for r in op["members"]
                for o in self.ops[r]
                if o["kind"] == "all_reduce" and o["n"] == op["n"]
            ]
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
