"""What the live monitor's child process costs the job, measured inside one run.

    .venv/bin/python -m bench.live_cost [--job reference] [--steps 1200] [--window-s 8]

Run-to-run comparisons (bench/overhead.py) carry this VM's drift: the same
plain job's median step moved 10% between runs a minute apart, more than the
effect sought. Here one job (overhead.py's, under `diagnose run --no-analyze`)
runs while this script stops the live monitor's child (SIGSTOP) and lets it go
(SIGCONT) in alternating windows of --window-s seconds, starting once the child
is up. Each of rank 0's steps that lies wholly inside a window (its trace's
step rows, on the same CLOCK_MONOTONIC as the windows) counts for that window's
state. Figures: the median step with the child running over the median with it
stopped, pooled, and the median over adjacent (running, stopped) pairs of
their ratio, which is what cancels the drift.

While stopped, the child falls behind and catches up in its next running
window (step metrics, one event poll, one bigger MLflow batch), so a running
window holds at least its share of the child's work: the figure errs high.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench.overhead_jobs import PY, jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def live_child(run_dir: str) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"diagnose.live.child" in argv and os.fsencode(run_dir) in argv:
            return int(pid)
    return None


def rank0_steps(run_dir: str) -> list:
    """(start_ns, end_ns) of rank 0's steps, on its monotonic clock."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from diagnose.rundir import rank_reader

    table = rank_reader.read_events(os.path.join(run_dir, "traces", "rank-00000"), print)
    step_rows = pc.equal(table.column("kind").cast(pa.string()), "step")
    rows = table.filter(step_rows).select(["start_ns", "end_ns"]).to_pydict()
    return sorted(zip(rows["start_ns"], rows["end_ns"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="reference", choices=("reference", "ddp_mlp"))
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--window-s", type=float, default=8.0)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="diagnose-live-cost-")
    run_dir = os.path.join(work, "run")
    command = jobs(args.steps, pin=False)[args.job][0](os.path.join(work, "steps.log"))
    proc = subprocess.Popen(
        [PY, "-m", "diagnose", "run", "--out", run_dir, "--no-analyze", "--", *command],
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    windows = []  # (start_ns, end_ns, running)
    child = None
    try:
        while proc.poll() is None and child is None:
            time.sleep(0.5)
            child = live_child(run_dir)
        time.sleep(2 * args.window_s)  # the child's start-up (imports, MLflow store) is not steady state
        running = True
        while proc.poll() is None:
            start = time.monotonic_ns()
            time.sleep(args.window_s)
            if proc.poll() is not None:
                break
            os.kill(child, signal.SIGSTOP if running else signal.SIGCONT)
            windows.append((start, time.monotonic_ns(), running))
            running = not running
    finally:
        if child is not None:
            try:
                os.kill(child, signal.SIGCONT)
            except ProcessLookupError:
                pass
        _, stderr = proc.communicate(timeout=600)
    if proc.returncode:
        print(f"job failed ({proc.returncode}): {stderr[-1500:]}")
        return 1
    if len(windows) < 2:
        print(
            f"the job ended before two windows ({'no live child seen' if child is None else 'too short'}): "
            "raise --steps"
        )
        return 1
    steps = rank0_steps(run_dir)
    by_window = [[(e - s) / 1e6 for s, e in steps if w0 <= s and e <= w1] for w0, w1, _ in windows]
    medians = [(statistics.median(ms), running) for ms, (_, _, running) in zip(by_window, windows) if ms]
    pooled = {
        state: statistics.median([m for ms, (_, _, r) in zip(by_window, windows) if r == state for m in ms])
        for state in (True, False)
    }
    pairs = [a / b for (a, ra), (b, rb) in zip(medians, medians[1:]) if ra and not rb]
    print(
        f"{args.job}: {len(steps)} steps of rank 0, {len(windows)} windows of {args.window_s:.0f} s "
        f"({sum(len(ms) for ms in by_window)} steps inside them)"
    )
    print(
        "window medians (ms, R = child running, S = stopped): "
        + " ".join(f"{m:.1f}{'R' if r else 'S'}" for m, r in medians)
    )
    print(
        f"median step: child running {pooled[True]:.2f} ms, stopped {pooled[False]:.2f} ms, "
        f"ratio {pooled[True] / pooled[False]:.4f}"
    )
    print(
        f"adjacent pairs running/stopped: median {statistics.median(pairs):.4f} over {len(pairs)} "
        f"({' '.join(f'{r:.3f}' for r in pairs)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
