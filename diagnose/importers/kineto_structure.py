"""A trace's pipeline exchanges and forward/backward passes from what a Kineto
trace of someone else's job holds: no forward/backward rows of our hooks, no
phase names, and (Megatron) no peer on the kernels that move activations.

Exchanges. Megatron's batched p2p (`batch_isend_irecv`) is one fused
`ncclDevKernel_SendRecv` kernel per exchange, launched under `nccl:coalesced`;
the messages and their peers are only in the CPU `nccl:send` / `nccl:recv` ops
(PyTorch's record_param_comms: "Dst Rank" / "Src Rank", global ranks) issued
on the launching thread since its previous NCCL launch. Each becomes one p2p
row sharing the kernel's device times (kineto_columns._collective_blocks).

Passes. PyTorch runs a CUDA backward on the autograd engine's device thread,
not the thread that called backward(): a compute kernel launched from the main
thread (the one launching each step's first compute kernel) is forward work,
one launched from another thread backward work. Kernels launched inside
`Optimizer.step#` are neither. A pass is a run of kernels of one kind in launch
order that no p2p exchange launch splits; its row is the DEVICE span of its
kernels (first start to last end: on the device a launch returns at once, so
host times would be launch times). A forward run with no backward after it in
its step (optimizer bookkeeping, a forward-only trace) is left out. Rows are
kind forward/backward, detail "gpu:inferred"; none where the trace records its
passes (`## forward ##`, DDP.forward: kineto._classify's rows win).

Micro-batches. On a rank without p2p, forward and backward runs alternate per
micro-batch of gradient accumulation: the n-th forward/backward pair of a step
is micro-batch n (a step whose runs do not alternate so is not numbered). On a pipeline rank they are left to the traffic
(diagnose/analysis/tables/pipeline_topology.py), which also gives the stages.

Peers the ops do not name: from the pipeline group (the exchange kernel's
"Process Group Name" in pg_config, its "Process Group Ranks", else the group
described as a pipeline group), whose ranks are in stage order (torch sorts a
group's ranks; Megatron's layout puts stage s+1 above s). A send goes
downstream after a forward run (an activation) and upstream after a backward
run (a gradient); a receive comes from upstream before a forward run and from
downstream before a backward one: Megatron's combined exchanges
(send_forward_recv_backward...) obey both. An end stage has one neighbour, and
traffic a plain pipeline's end stage does not have (the first stage receiving
an activation: the ring of an interleaved schedule) is refused. So is an
exchange with two sends or two receives (the interleaved schedule's fused
exchange with both neighbours), and a trace without a pipeline group: every
unnamed exchange then stays a collective ("coalesced"), with the reason in
`note`, and pipeline_topology reads no pipeline while one rank's batched p2p is
unread: never a guessed peer, so never a wrong stage.
"""

import bisect
from dataclasses import dataclass, field

from collectors.schema import COMMUNICATION, COMPUTE
from diagnose.importers.gpu_activity import ranks_string

SOURCE = "gpu:inferred"
PIPELINE_DESC_WORDS = ("PIPELINE", "PIPE_PARALLEL")
_P2P_OPS = ("send", "recv")


@dataclass
class Structure:
    exchanges: dict = field(default_factory=dict)  # NCCL kernel index -> [(op, peer, bytes)]
    rows: list = field(default_factory=list)  # (kind, start_ns, end_ns, step, microbatch)
    notes: list = field(default_factory=list)  # what could not be read, one line each

    @property
    def note(self) -> str:
        return "; ".join(self.notes)


def device_structure(gpu, launches: dict, ranges: list, cpu: list, kernels: dict, rank: int, groups: dict) -> Structure:
    """The exchanges and passes of one trace (see the module docstring).
    gpu/launches/ranges/cpu: a scan's; kernels: kineto_columns' kernel block;
    groups: process_groups() of the trace's pg_config."""
    out = Structure()
    classes = kernels["detail"].values
    codes = kernels["detail"].codes
    launch = [launches.get(g[4]) for g in gpu]
    nccl = [j for j in range(len(gpu)) if classes[codes[j]] == COMMUNICATION and launch[j] is not None]
    ops_of = _exchange_ops(nccl, launch, ranges)
    exchange_ts = sorted(launch[j][0] for j in ops_of)
    # a trace that records its passes (## forward ##, DDP.forward) keeps its own rows
    recorded = any(kind in ("forward", "backward") for kind, *_ in cpu)
    blocks = _blocks(gpu, launch, kernels, classes, codes, cpu, exchange_ts, [] if recorded else out.notes)
    for kind, members, _, _, mb in [] if recorded else blocks:
        out.rows.append(
            (
                kind,
                int(min(kernels["start_ns"][j] for j in members)),
                int(max(kernels["end_ns"][j] for j in members)),
                int(kernels["step"][members[0]]),
                mb,
            )
        )
    if not ops_of:
        return out
    unnamed = [j for j, ops in ops_of.items() if any(peer < 0 for _, peer, _ in ops)]
    if unnamed:
        why = _resolve(unnamed, ops_of, gpu, launch, blocks, rank, groups)
        if why:
            out.notes.append(f"p2p peers not resolved: {why}; those exchanges stay collectives")
            for j in unnamed:
                del ops_of[j]
    if rank < 0 and ops_of:
        out.notes.append("the trace does not say its own rank: exchanges stay collectives")
        return out
    out.exchanges = ops_of
    return out


def _exchange_ops(nccl: list, launch: list, ranges: list) -> dict:
    """NCCL kernel index -> [(op, peer, bytes)] of the send/recv ops its
    launching thread issued after its previous NCCL launch, up to this one."""
    by_thread = {}
    for op, ts, _, tid, nbytes, *peer in ranges:
        if op in _P2P_OPS:
            by_thread.setdefault(tid, []).append((ts, op, peer[0] if peer else -1, nbytes))
    if not by_thread:
        return {}
    starts = {}
    for tid, spans in by_thread.items():
        spans.sort(key=lambda s: s[0])
        starts[tid] = [s[0] for s in spans]
    out, previous = {}, {}  # previous: per thread, where its last NCCL launch's ops ended
    for j in sorted(nccl, key=lambda j: launch[j][0]):
        ts, tid = launch[j]
        if tid not in by_thread:
            continue
        upto = bisect.bisect_right(starts[tid], ts)
        ops = [(op, peer, nbytes) for _, op, peer, nbytes in by_thread[tid][previous.get(tid, 0) : upto]]
        previous[tid] = upto
        if ops:
            out[j] = ops
    return out


def _blocks(gpu, launch, kernels, classes, codes, cpu, exchange_ts, notes) -> list:
    """[(kind, kernel indexes, first launch ts, last launch ts, micro-batch)] in launch order."""
    optimizer = sorted((ts, ts + dur) for kind, _, ts, dur, _ in cpu if kind == "optimizer")
    compute = [
        j
        for j in range(len(gpu))
        if classes[codes[j]] == COMPUTE
        and launch[j] is not None
        and kernels["step"][j] >= 0
        and not _inside(launch[j][0], optimizer)
    ]
    if not compute:
        return []
    compute.sort(key=lambda j: launch[j][0])
    first = {}  # step -> the thread that launched its first compute kernel
    for j in compute:
        first.setdefault(int(kernels["step"][j]), launch[j][1])
    threads = list(first.values())
    main = max(set(threads), key=threads.count)
    if all(launch[j][1] == main for j in compute):
        notes.append("one thread launches every kernel (no autograd thread): forward and backward not told apart")
        return []
    blocks = []
    for j in compute:
        kind = "forward" if launch[j][1] == main else "backward"
        ts, step = launch[j][0], int(kernels["step"][j])
        last = blocks[-1] if blocks else None
        if (
            last is not None
            and last[0] == kind
            and last[5] == step
            and bisect.bisect_right(exchange_ts, last[3]) == bisect.bisect_left(exchange_ts, ts)
        ):
            last[1].append(j)
            last[3] = ts
        else:
            blocks.append([kind, [j], ts, ts, -1, step])
    # a forward with no backward after it in its step is not a micro-batch's
    backward_after, seen = [False] * len(blocks), {}
    for i in range(len(blocks) - 1, -1, -1):
        backward_after[i] = seen.get(blocks[i][5], False)
        if blocks[i][0] == "backward":
            seen[blocks[i][5]] = True
    blocks = [b for b, keep in zip(blocks, backward_after) if b[0] == "backward" or keep]
    if not exchange_ts:  # gradient accumulation: forward, backward, forward... is micro-batch 0, 0, 1...
        by_step = {}
        for b in blocks:
            by_step.setdefault(b[5], []).append(b)
        for passes in by_step.values():
            kinds = [b[0] for b in passes]
            if kinds == ["forward", "backward"] * (len(kinds) // 2):  # else: not numbered (-1)
                for i, b in enumerate(passes):
                    b[4] = i // 2
    return [tuple(b[:5]) for b in blocks]


def _inside(ts, spans) -> bool:
    i = bisect.bisect_right(spans, (ts, float("inf"))) - 1
    return i >= 0 and spans[i][0] <= ts <= spans[i][1]


def _resolve(unnamed: list, ops_of: dict, gpu, launch, blocks, rank: int, groups: dict) -> str | None:
    """Fill in the peers of `unnamed` exchanges in place, or say why not (then
    nothing is changed)."""
    if rank < 0:
        return "the trace does not say its own rank"
    filled, first_launches = {}, [b[2] for b in blocks]
    for j in unnamed:
        ranks = _pipeline_ranks(gpu[j][7], groups, rank)
        if ranks is None:
            return "no pipeline group (pg_config, Process Group Ranks) holds this rank"
        pos = ranks.index(rank)
        up = ranks[pos - 1] if pos > 0 else None
        down = ranks[pos + 1] if pos + 1 < len(ranks) else None
        ops = ops_of[j]
        sends, recvs = [o for o in ops if o[0] == "send"], [o for o in ops if o[0] == "recv"]
        if len(sends) > 1 or len(recvs) > 1:
            return "an exchange with two sends or two receives (an interleaved schedule's)"
        before, after = _kinds_around(launch[j][0], blocks, first_launches)
        if up is None or down is None:  # an end stage: one neighbour, if the traffic is a plain pipeline's
            # (the first stage sends activations and receives gradients, the last the
            # reverse; anything else goes round a ring: an interleaved schedule's)
            produces, consumes = ("forward", "backward") if up is None else ("backward", "forward")
            if (sends and before != produces) or (recvs and not sends and after != consumes):
                return (
                    f"rank {rank}, an end stage of its pipeline group, exchanges what only a ring "
                    "carries (an interleaved schedule?)"
                )
            filled[j] = [(op, up if down is None else down, b) for op, _, b in ops]
            continue
        if (sends and before is None) or (recvs and after is None):
            return "a send before any compute, or a receive with none after it"
        send_to = down if before == "forward" else up
        recv_from = up if after == "forward" else down
        filled[j] = [(op, send_to if op == "send" else recv_from, b) for op, _, b in ops]
    for j, ops in filled.items():
        ops_of[j] = ops
    return None


def _kinds_around(ts, blocks, first_launches: list) -> tuple:
    """(kind of the last pass launched before ts, kind of the first launched
    after): passes do not overlap in launch time, and an exchange splits them."""
    at = bisect.bisect_left(first_launches, ts)
    return (blocks[at - 1][0] if at > 0 else None), (blocks[at][0] if at < len(blocks) else None)


def _pipeline_ranks(args, groups: dict, rank: int) -> list | None:
    """The ranks (stage order) of the pipeline group holding `rank`."""
    name = args.get("Process Group Name") if args is not None else None
    if name is not None and str(name) in groups and rank in groups[str(name)]["ranks"]:
        return sorted(groups[str(name)]["ranks"])
    listed = ranks_string(args.get("Process Group Ranks")) if args is not None else ""
    if listed:
        ranks = sorted(int(r) for r in listed.split(","))
        if rank in ranks and len(ranks) >= 2:
            return ranks
    for group in groups.values():
        if any(w in group["desc"].upper() for w in PIPELINE_DESC_WORDS) and rank in group["ranks"]:
            return sorted(group["ranks"])
    return None
