"""The live monitor child's CPU time over a whole job, for one checkout or several.

    .venv/bin/python -m bench.live_child_cpu ROOT [ROOT ...] [--rounds 2] [--steps 600]

Each ROOT is a checkout (a `git worktree` of the commits to compare; the script
runs the job with PYTHONPATH=ROOT). Rounds interleave the roots. The job:
samples/ddp_mlp.py, 2 ranks, under `diagnose run --no-analyze`; the child's
utime+stime is read from /proc until it exits. Figures: the child's CPU seconds
and its share of one core over the job's wall time (bench/live_cost.py measures
what that costs the ranks' steps instead).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time


def child_cpu_s(out: str, proc) -> float:
    tick, seen = os.sysconf("SC_CLK_TCK"), {}
    while proc.poll() is None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if b"diagnose.live.child" not in argv or out.encode() not in argv:
                    continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seen[pid] = (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                pass
        time.sleep(0.2)
    return sum(seen.values())


def one(root: str, steps: int) -> tuple[float, float]:
    out = os.path.join(tempfile.mkdtemp(), "run")
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--no-analyze",
        "--out",
        out,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        os.path.join(root, "samples", "ddp_mlp.py"),
        "--steps",
        str(steps),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu = child_cpu_s(out, proc)
    return time.monotonic() - t0, cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="+")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for root in args.roots:
            wall, cpu = one(os.path.abspath(root), args.steps)
            print(
                f"{root}: job {wall:.1f} s, live child {cpu:.2f} s of CPU = {100 * cpu / wall:.1f}% of a core",
                flush=True,
            )


if __name__ == "__main__":
    main()
