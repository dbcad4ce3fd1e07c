"""Write a synthetic run directory (the on-disk contract of docs/run-directory.md) without
running a job: `ranks` ranks in `pp` pipeline stages (GPipe schedule,
`microbatches` per step), DDP-style async bucket all-reduces per data-parallel
group, a blocking loss all-reduce, a host sync, data wait, host/GPU samples, and
optionally one slow rank. Loaded with diagnose.load like a real run; used by
the report size bench and the report/compare tests."""

import os
import random

from collectors.part_writer import PartWriter, atomic_write_json
from collectors.schema import event_row, rank_dir_name

WALL0 = 1_800_000_000_000_000_000


def write_synthetic_run(
    out: str,
    ranks: int = 8,
    steps: int = 50,
    pp: int = 1,
    microbatches: int = 4,
    slow_rank: int | None = None,
    slow_factor: float = 1.5,
    data_ms: float = 1.0,
    seed: int = 0,
    name: str = "synthetic",
    extra_events: dict | None = None,
    slow_steps=None,
) -> str:
    """extra_events: {rank: [event tuples in EVENT_COLUMNS order]} appended verbatim;
    slow_steps: the steps slow_rank is slow in (None: all of them)."""
    rng = random.Random(seed)
    dp = ranks // pp
    stage_of = {r: r // dp for r in range(ranks)}  # ranks 0..dp-1 are stage 0
    dp_group_of = {r: r % dp for r in range(ranks)}  # replicas of one stage position
    rows = {r: [] for r in range(ranks)}
    samples = {r: [] for r in range(ranks)}
    seqs: dict = {}
    fwd_ms, bwd_ms, opt_ms = 6.0, 12.0, 3.0
    ms = 1_000_000

    def seq(group):
        seqs[group] = seqs.get(group, -1) + 1
        return seqs[group]

    t = 10 * ms
    for step in range(steps):
        slow_now = slow_steps is None or step in slow_steps
        factor = {
            r: (slow_factor if r == slow_rank and slow_now else 1.0) * rng.uniform(0.97, 1.03) for r in range(ranks)
        }
        for r in range(ranks):
            rows[r].append(event_row("data", "data_wait", t, int(t + data_ms * ms * rng.uniform(0.8, 1.2)), step=step))
        t0 = t + int(data_ms * 1.3 * ms)
        sched_end = {}
        for r in range(ranks):
            s, f = stage_of[r], factor[r]
            for mb in range(microbatches):
                a = t0 + int((s + mb) * fwd_ms * ms * f)
                b = a + int(fwd_ms * ms * f * 0.95)
                rows[r].append(event_row("phase", "forward", a, b, step=step, microbatch=mb, stage=s))
                rows[r].append(
                    event_row("forward", "forward", a + 10_000, b - 10_000, step=step, microbatch=mb, stage=s)
                )
            bwd0 = t0 + int((microbatches + pp - 1) * fwd_ms * ms * f)
            for i, mb in enumerate(reversed(range(microbatches))):
                a = bwd0 + int((pp - 1 - s + i) * bwd_ms * ms * f)
                b = a + int(bwd_ms * ms * f * 0.95)
                rows[r].append(event_row("phase", "backward", a, b, step=step, microbatch=mb, stage=s))
                rows[r].append(
                    event_row("backward", "backward", a + 10_000, b - 10_000, step=step, microbatch=mb, stage=s)
                )
                sched_end[r] = b
        # DDP bucket all-reduces per data-parallel group, issued in the last backward.
        issues = {}
        for r in range(ranks):
            issues[r] = [sched_end[r] - int(bwd_ms * ms * 0.5), sched_end[r] - int(bwd_ms * ms * 0.1)]
        for pos in range(dp):
            members = [r for r in range(ranks) if dp_group_of[r] == pos] if pp > 1 else list(range(ranks))
            group = f"dp{pos}" if pp > 1 else "0"
            group_ranks = ",".join(map(str, members))
            for bucket in range(2):
                n = seq(group)
                done = max(issues[r][bucket] for r in members) + 2 * ms
                for r in members:
                    a = issues[r][bucket]
                    rows[r].append(
                        event_row(
                            "collective",
                            "all_reduce",
                            a,
                            a + 50_000,
                            step=step,
                            group=group,
                            group_ranks=group_ranks,
                            seq=n,
                            nbytes=4 << 20,
                            async_op=True,
                            detail=f"ddp bucket {bucket}",
                        )
                    )
                    rows[r].append(
                        event_row(
                            "done",
                            "all_reduce",
                            done,
                            done,
                            step=step,
                            group=group,
                            group_ranks=group_ranks,
                            seq=n,
                            async_op=True,
                            detail=f"ddp bucket {bucket}",
                        )
                    )
            if pp == 1:
                break
        arrive = {r: max(sched_end[r], max(issues[r]) + 2 * ms) + int(0.2 * ms) for r in range(ranks)}
        leave = max(arrive.values()) + int(0.3 * ms)
        n = seq("world")
        for r in range(ranks):
            rows[r].append(
                event_row(
                    "collective",
                    "all_reduce",
                    arrive[r],
                    leave,
                    step=step,
                    group="world",
                    group_ranks=",".join(map(str, range(ranks))),
                    seq=n,
                    nbytes=4,
                    callsite="train.py:88",
                )
            )
            rows[r].append(
                event_row("sync", "item", leave, leave + 20_000, step=step, callsite="train.py:89", detail="cpu")
            )
            a = leave + 30_000
            b = a + int(opt_ms * ms * rng.uniform(0.95, 1.05))
            rows[r].append(event_row("optimizer", "optimizer", a, b, step=step))
        end = leave + int((opt_ms + 0.3) * ms)
        for r in range(ranks):
            rows[r].append(event_row("step", "step", t, end, step=step))
        t = end
    for r in range(ranks):
        for k in range(int(t / 1e9) + 1):
            ts = k * 1_000_000_000
            samples[r] += [
                (ts, "cpu_pct", 95.0 + rng.uniform(-5, 5)),
                (ts, "rss_mb", 2000.0 + 10 * k + r),
                (ts, "gpu_util_pct", 80.0 + rng.uniform(-10, 10)),
            ]
    for r, extra in (extra_events or {}).items():
        rows[r].extend(extra)
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    for r in range(ranks):
        writer = PartWriter(os.path.join(out, "traces", rank_dir_name(r)))
        chunk = 20_000
        for i in range(0, len(rows[r]), chunk):
            writer.write_events(rows[r][i : i + chunk])
        writer.write_samples(samples[r])
        writer.write_meta(
            {
                "rank": r,
                "local_rank": r % 8,
                "world_size": ranks,
                "host": f"node{r // 8}",
                "pid": 1000 + r,
                "argv": ["train.py"],
                "cwd": "/work",
                "clock": {
                    "mono_anchor_ns": 0,
                    "wall_anchor_ns": WALL0,
                    "offset_to_rank0_ns": 0,
                    "offset_error_ns": 0,
                    "offset_method": "synthetic",
                },
                "start_wall_ns": WALL0,
            }
        )
    layout = {"dp": dp, "pp": pp} if pp > 1 else {"dp": dp}
    atomic_write_json(
        os.path.join(out, "manifest.json"),
        {
            "name": name,
            "command": "torchrun --nproc-per-node 8 train.py (synthetic)",
            "argv": ["torchrun", "train.py"],
            "cwd": "/work",
            "start_wall_ns": WALL0,
            "end_wall_ns": WALL0 + t,
            "exit_status": 0,
            "layout": layout,
            "world_size": ranks,
            "ranks_seen": list(range(ranks)),
        },
    )
    return out


if __name__ == "__main__":
    import sys

    print(write_synthetic_run(sys.argv[1], steps=int(sys.argv[2]) if len(sys.argv) > 2 else 50))
