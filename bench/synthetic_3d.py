"""A synthetic DP x PP x TP run directory, written with the collectors' own
PartWriter and schema, for the scale benchmarks (bench/scale.py).

Why synthetic: 1,024 real ranks do not fit on a 2-core machine, but the
analyzer only sees files, so a run dir with the event mix of a Megatron-style
job exercises it exactly. The timeline is simulated, not drawn at random, so
that waiting is caused the way it is in a real job:

- rank = (dp_rank * pp + stage) * tp + tp_rank, as reference_trainer/mesh.py;
- each step: data wait, then a 1F1B schedule of `microbatches` per stage; every
  forward/backward is a phase row plus a forward/backward row, split by one
  blocking tensor-parallel all-reduce (members leave together, after the last
  arrives); activations/gradients go to the neighbouring stage by blocking
  send/recv (the recv ends after the matching send starts; seq per pair);
- during the last backward, 4 DDP-style async bucket all-reduces per DP group
  with completion ("done") rows; backward returns when the last bucket is done
  (a wait row on it from the gradients' end: the replicas' coupling);
- optimizer, a `.item()` sync, the step row;
- a slow stage (`slow_stage`, e.g. the last one with the loss head): every rank
  of it computes `stage_factor` times as long, so the other stages wait in p2p;
- the straggler rank's compute takes `factor` times as long: its TP peers wait
  in every TP all-reduce, its pipeline replica waits in p2p, its DP group
  waits in the bucket all-reduces. Every op has +-3% jitter.

Rows are produced per schedule slot for all ranks of a stage at once (numpy),
written as one part per rank every `flush_steps` steps (as the recorder's
periodic flushes), then compacted per rank as at a clean exit.
"""

import os

import numpy as np
import pyarrow as pa

from collectors.part_writer import PartWriter, atomic_write_json
from collectors.schema import EVENT_FIELDS, rank_dir_name

MS = 1_000_000
WALL0 = 1_800_000_000_000_000_000
COST = {"fwd": 4.0 * MS, "bwd": 8.0 * MS, "opt": 3.0 * MS, "data": 0.5 * MS}
T_TP, T_P2P, T_SEND, T_BUCKET = 0.15 * MS, 0.25 * MS, 0.05 * MS, 2.0 * MS
ACT_BYTES, BUCKET_BYTES = 4 << 20, 25 << 20
BUCKETS = (0.3, 0.55, 0.8, 0.97)  # issue points within the last backward
_STR = ("kind", "name", "group", "group_ranks", "callsite", "detail")


class _Rows:
    """Column blocks for one flush window; strings are codes into shared tables."""

    def __init__(self, strings):
        self.strings = strings
        self.blocks = []

    def code(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings))

    def add(
        self,
        ranks,
        kind,
        name,
        start,
        end,
        step,
        microbatch=-1,
        stage=-1,
        group=None,
        group_ranks=None,
        seq=-1,
        peer=-1,
        nbytes=0,
        async_op=False,
        callsite="",
        detail="",
    ):
        n = len(ranks)

        def col(v, dtype):
            return np.broadcast_to(np.asarray(v, dtype=dtype), (n,))

        def codes(v):
            return col(self.code(v), np.int32) if isinstance(v, str) else np.asarray(v, np.int32)

        self.blocks.append(
            {
                "rank": np.asarray(ranks, np.int64),
                "kind": codes(kind),
                "name": codes(name),
                "start_ns": col(start, np.int64),
                "end_ns": col(end, np.int64),
                "step": col(step, np.int32),
                "microbatch": col(microbatch, np.int32),
                "stage": col(stage, np.int32),
                "group": codes(group if group is not None else ""),
                "group_ranks": codes(group_ranks if group_ranks is not None else ""),
                "seq": col(seq, np.int64),
                "peer": col(peer, np.int32),
                "bytes": col(nbytes, np.int64),
                "async_op": col(async_op, np.bool_),
                "callsite": codes(callsite),
                "detail": codes(detail),
            }
        )

    def flush(self, writers) -> int:
        if not self.blocks:
            return 0
        cols = {k: np.concatenate([b[k] for b in self.blocks]) for k in self.blocks[0]}
        self.blocks = []
        order = np.argsort(cols["rank"], kind="stable")
        ranks = cols["rank"][order]
        dictionary = pa.array(sorted(self.strings, key=self.strings.get), pa.string())
        arrays = []
        for name, typ in EVENT_FIELDS:
            if name not in cols:  # a field the simulation has no value for (queued_ns): -1, as the recorder's default
                arrays.append(pa.array(np.full(len(ranks), -1, typ.to_pandas_dtype()), type=typ))
                continue
            values = cols[name][order]
            arrays.append(
                pa.DictionaryArray.from_arrays(pa.array(values), dictionary)
                if name in _STR
                else pa.array(values, type=typ)
            )
        table = pa.table(arrays, names=[n for n, _ in EVENT_FIELDS])
        bounds = np.searchsorted(ranks, np.arange(len(writers) + 1))
        for rank, writer in enumerate(writers):
            lo, hi = int(bounds[rank]), int(bounds[rank + 1])
            writer.write_events_table(table.slice(lo, hi - lo))
        return len(ranks)


class _Sim:
    """The simulated job: per-stage rank arrays, group names, sequence counters."""

    def __init__(self, out, dp, pp, tp, microbatches, straggler, factor, seed, slow_stage, stage_factor):
        self.dp, self.pp, self.tp, self.microbatches = dp, pp, tp, microbatches
        self.world, self.n = dp * pp * tp, dp * tp
        self.rng = np.random.default_rng(seed)
        d, t = np.divmod(np.arange(self.n), tp)  # position within a stage
        self.ranks = [(d * pp + s) * tp + t for s in range(pp)]  # reference_trainer/mesh.py
        self.slow = np.ones(self.world)
        if slow_stage is not None:
            self.slow[self.ranks[slow_stage]] *= stage_factor
        if straggler is not None:
            self.slow[straggler] *= factor
        self.writers = [PartWriter(os.path.join(out, "traces", rank_dir_name(r))) for r in range(self.world)]
        self.rows = _Rows({})
        code = lambda fmt: np.array([self.rows.code(fmt(i)) for i in range(self.n)], np.int32)  # noqa: E731
        members = lambda rs: ",".join(map(str, rs))  # noqa: E731
        self.tp_group = [code(lambda i, s=s: f"tp.{s}.{i // tp}") for s in range(pp)]
        self.tp_members = [
            code(lambda i, s=s: members(self.ranks[s][i // tp * tp : (i // tp + 1) * tp])) for s in range(pp)
        ]
        self.dp_group = [code(lambda i, s=s: f"dp.{s}.{i % tp}") for s in range(pp)]
        self.dp_members = [code(lambda i, s=s: members(self.ranks[s][i % tp :: tp])) for s in range(pp)]
        self.pair = {
            (a, b): (
                code(lambda i, a=a, b=b: f"{self.ranks[a][i]}->{self.ranks[b][i]}"),
                code(lambda i, a=a, b=b: f"{self.ranks[a][i]},{self.ranks[b][i]}"),
            )
            for a in range(pp)
            for b in (a - 1, a + 1)
            if 0 <= b < pp
        }
        self.tp_seq, self.dp_seq = [0] * pp, [0] * pp
        self.now = np.full(self.world, 10 * MS, np.int64)

    def jitter(self):
        return self.rng.uniform(0.97, 1.03, self.n)

    def schedule(self, s):
        """1F1B order of (op, micro-batch) on stage s."""
        warm = min(self.pp - s - 1, self.microbatches)
        ops = [("fwd", i) for i in range(warm)]
        for j in range(self.microbatches - warm):
            ops += [("fwd", warm + j), ("bwd", j)]
        return ops + [("bwd", j) for j in range(self.microbatches - warm, self.microbatches)]

    def step(self, step):
        rows, now, pp = self.rows, self.now, self.pp
        step_start = now.copy()
        for s in range(pp):
            r = self.ranks[s]
            end = now[r] + (COST["data"] * self.jitter()).astype(np.int64)
            rows.add(r, "data", "data_wait", now[r], end, step, stage=s, detail="workers=2")
            now[r] = end + 20_000
        order = [self.schedule(s) for s in range(pp)]
        sent = {}  # (op, sending stage, micro-batch) -> send start per sender
        pos = [0] * pp
        while any(pos[s] < len(order[s]) for s in range(pp)):
            for s in range(pp):
                while pos[s] < len(order[s]):
                    op, mb = order[s][pos[s]]
                    src = s - 1 if op == "fwd" else s + 1
                    if 0 <= src < pp and (op, src, mb) not in sent:
                        break  # its input comes from a neighbour that has not produced it yet
                    pos[s] += 1
                    self.slot(step, s, op, mb, src, sent, last=op == "bwd" and pos[s] == len(order[s]))
        for s in range(pp):
            r = self.ranks[s]
            end = now[r] + (COST["opt"] * self.slow[r] * self.jitter()).astype(np.int64)
            rows.add(r, "optimizer", "optimizer", now[r], end, step)
            rows.add(r, "sync", "item", end + 10_000, end + 60_000, step, callsite="train.py:212", detail="cuda")
            now[r] = end + 80_000
            rows.add(r, "step", "step", step_start[r], now[r], step)

    def slot(self, step, s, op, mb, src, sent, last):
        """Forward or backward of one micro-batch on every rank of stage s."""
        rows, now, r, tp = self.rows, self.now, self.ranks[s], self.tp
        if 0 <= src < self.pp:  # blocking recv of the neighbour's activation / gradient
            group, members = self.pair[(src, s)]
            arrive = now[r]
            end = np.maximum(arrive, sent[(op, src, mb)]) + int(T_P2P)
            rows.add(
                r,
                "p2p",
                "recv",
                arrive,
                end,
                step,
                mb,
                s,
                group,
                members,
                step * self.microbatches + mb,
                self.ranks[src],
                ACT_BYTES,
                callsite="pipeline.py:88",
            )
            now[r] = end + 10_000
        cost = COST[op] * self.slow[r]
        t0 = now[r] + 5_000
        arrive = t0 + (0.5 * cost * self.jitter()).astype(np.int64)  # first half, then TP all-reduce
        leave = arrive.reshape(-1, tp).max(axis=1).repeat(tp) + int(T_TP)
        end = leave + (0.5 * cost * self.jitter()).astype(np.int64)
        rows.add(
            r,
            "collective",
            "all_reduce",
            arrive,
            leave,
            step,
            mb,
            s,
            self.tp_group[s],
            self.tp_members[s],
            self.tp_seq[s],
            nbytes=ACT_BYTES,
            callsite="tp.py:38",
        )
        self.tp_seq[s] += 1
        if last:  # DDP buckets during the last backward; backward returns when all are done
            done = np.zeros(self.n, np.int64)
            for bucket, frac in enumerate(BUCKETS):
                issue = t0 + ((end - t0) * frac).astype(np.int64)
                last_issue = np.tile(issue.reshape(-1, tp).max(axis=0), self.dp)  # per DP group
                done = np.maximum(done, last_issue) + int(T_BUCKET)
                for kind, a, b in (("collective", issue, issue + 40_000), ("done", done, done)):
                    rows.add(
                        r,
                        kind,
                        "all_reduce",
                        a,
                        b,
                        step,
                        -1,
                        s,
                        self.dp_group[s],
                        self.dp_members[s],
                        self.dp_seq[s],
                        nbytes=BUCKET_BYTES if kind != "done" else 0,
                        async_op=True,
                        detail=f"ddp bucket {bucket}",
                    )
                self.dp_seq[s] += 1
            # the reducer waits for its last bucket once the gradients are computed
            # (a Work.wait row, as the collectors record it): the DP replicas' coupling
            rows.add(
                r,
                "wait",
                "all_reduce",
                end,
                np.maximum(end, done),
                step,
                -1,
                s,
                self.dp_group[s],
                self.dp_members[s],
                self.dp_seq[s] - 1,
                async_op=True,
                detail=f"ddp bucket {len(BUCKETS) - 1}",
            )
            end = np.maximum(end, done)
        kind = "forward" if op == "fwd" else "backward"
        rows.add(r, "phase", kind, t0 - 5_000, end + 5_000, step, mb, s)
        rows.add(r, kind, kind, t0, end, step, mb, s)
        now[r] = end + 10_000
        dst = s + 1 if op == "fwd" else s - 1
        if 0 <= dst < self.pp:  # blocking send: gloo returns once the bytes are handed over
            group, members = self.pair[(s, dst)]
            start = now[r]
            rows.add(
                r,
                "p2p",
                "send",
                start,
                start + int(T_SEND),
                step,
                mb,
                s,
                group,
                members,
                step * self.microbatches + mb,
                self.ranks[dst],
                ACT_BYTES,
                callsite="pipeline.py:92",
            )
            sent[(op, s, mb)] = start
            now[r] = start + int(T_SEND) + 10_000


def write_3d_run(
    out: str,
    dp: int,
    pp: int,
    tp: int,
    steps: int,
    microbatches: int = 4,
    straggler: int | None = None,
    factor: float = 1.5,
    flush_steps: int = 25,
    seed: int = 0,
    slow_stage: int | None = None,
    stage_factor: float = 1.3,
) -> dict:
    """Write the run dir; returns {"ranks", "events", "straggler"}."""
    sim = _Sim(out, dp, pp, tp, microbatches, straggler, factor, seed, slow_stage, stage_factor)
    events = 0
    for step in range(steps):
        sim.step(step)
        if (step + 1) % flush_steps == 0 or step == steps - 1:
            events += sim.rows.flush(sim.writers)
    for writer in sim.writers:
        writer.compact()  # as the recorder does at a clean exit
    _write_meta(out, sim.writers, sim.world, dp, pp, tp, steps, int(sim.now.max()))
    return {"ranks": sim.world, "events": events, "straggler": straggler}


def _write_meta(out, writers, world, dp, pp, tp, steps, end_ns):
    for rank, writer in enumerate(writers):
        writer.write_meta(
            {
                "rank": rank,
                "local_rank": rank % 8,
                "world_size": world,
                "host": f"node{rank // 8:04d}",
                "pid": 1000 + rank,
                "argv": ["train.py"],
                "cwd": "/work",
                "start_wall_ns": WALL0,
                "clock": {
                    "mono_anchor_ns": 0,
                    "wall_anchor_ns": WALL0,
                    "offset_to_rank0_ns": 0,
                    "offset_error_ns": 0,
                    "offset_method": "synthetic",
                },
            }
        )
    atomic_write_json(
        os.path.join(out, "manifest.json"),
        {
            "name": os.path.basename(os.path.abspath(out)),
            "world_size": world,
            "command": f"synthetic: dp {dp} x pp {pp} x tp {tp}, {steps} steps",
            "argv": ["torchrun", "train.py", "--dp", str(dp), "--pp", str(pp), "--tp", str(tp)],
            "cwd": "/work",
            "start_wall_ns": WALL0,
            "end_wall_ns": WALL0 + end_ns,
            "exit_status": 0,
            "layout": {"dp": dp, "pp": pp, "tp": tp},
            "ranks_seen": list(range(world)),
        },
    )
