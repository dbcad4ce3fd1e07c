"""How soon a live alert follows a mid-run slowdown (issue 25): a 4-rank job on
this 2-core box, one rank slowed from a known step, the live child at its own
low priority, as `diagnose run` starts it.

    .venv/bin/python -m bench.live_alert_latency [--rounds 3] [--ranks 4]

Each round runs samples/ddp_mlp.py under `diagnose run --no-analyze` (MLflow
tracking on, as by default) with rank R sleeping S ms per micro-batch from step
K on. The slowdown begins when step K does: every rank leaves step K-1's loss
all-reduce together, so it is rank 0's logged end of step K-1 (its wall clock,
the one alerts.jsonl's `wall_ns` is on: one machine). The latency is the first
alert's wall time minus that. Checked per round: the first alert names rank R,
no alert came before the slowdown, none names another rank.

The last line is machine-readable:
    alert_latency: rounds=N median_s=M max_s=X named=True|False early=K
Goal (issue 25): every round's first alert within 3 s, naming the rank, none before.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_S = 3.0


def one_round(work: str, args, index: int) -> dict:
    out = os.path.join(work, f"run{index}")
    steps_log = os.path.join(work, f"steps{index}.txt")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--out",
        out,
        "--no-analyze",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.ranks),
        os.path.join(ROOT, "samples", "ddp_mlp.py"),
        "--steps",
        str(args.steps),
        "--slow-rank",
        str(args.slow_rank),
        "--slow-ms",
        str(args.slow_ms),
        "--slow-from-step",
        str(args.slow_from),
        "--log-step-times",
        steps_log,
    ]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"round {index}: the job failed ({proc.returncode}): {proc.stderr[-800:]}")
    with open(steps_log) as f:
        step_ends_s = [float(line.split()[1]) for line in f if line.strip()]
    begins_s = step_ends_s[args.slow_from - 1]
    alerts = []
    path = os.path.join(out, "alerts.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            alerts = [json.loads(line) for line in f if line.strip()]
    early = [a for a in alerts if a["wall_ns"] / 1e9 < begins_s]
    late = [a for a in alerts if a["wall_ns"] / 1e9 >= begins_s]
    first = late[0] if late else None
    step_ms = (
        statistics.median(b - a for a, b in zip(step_ends_s[5 : args.slow_from - 1], step_ends_s[6 : args.slow_from]))
        * 1e3
    )
    return {
        "latency_s": (first["wall_ns"] / 1e9 - begins_s) if first else None,
        "first": first and {k: first[k] for k in ("rank", "kind", "step")},
        "named": bool(first) and first["rank"] == args.slow_rank,
        "others": sorted({a["rank"] for a in late if a["rank"] != args.slow_rank}),
        "early": len(early),
        "step_ms_before": step_ms,
        "notes": [line for line in (proc.stdout + proc.stderr).splitlines() if "diagnose: note:" in line],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--slow-from", type=int, default=35)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-ms", type=float, default=100.0, help="per micro-batch (2 per step)")
    p.add_argument("--keep", metavar="DIR", help="keep the runs here instead of a temporary folder")
    args = p.parse_args()
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="alert-latency-")
    os.makedirs(work, exist_ok=True)
    try:
        results = []
        for i in range(args.rounds):
            r = one_round(work, args, i)
            results.append(r)
            lat = "none" if r["latency_s"] is None else f"{r['latency_s']:.2f} s"
            print(
                f"round {i}: first alert {lat} after the slowdown began: {r['first']}; steps before "
                f"{r['step_ms_before']:.0f} ms; alerts before it {r['early']}; other ranks named "
                f"{r['others']}",
                flush=True,
            )
            for note in r["notes"]:
                print(f"  {note}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    latencies = [r["latency_s"] for r in results if r["latency_s"] is not None]
    named = all(r["named"] and not r["others"] for r in results)
    early = sum(r["early"] for r in results)
    worst = max(latencies) if len(latencies) == len(results) else float("inf")
    print(
        f"alert_latency: rounds={len(results)} median_s={statistics.median(latencies) if latencies else 'nan'} "
        f"max_s={worst:.2f} named={named} early={early}"
    )
    return 0 if worst <= GOAL_S and named and early == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
