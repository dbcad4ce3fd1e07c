"""Analysis time of a real 8-rank x 100-step run (issue 4: under 5 s here).

    .venv/bin/python -m bench.analyze_8x100 [--run DIR] [--repeat 3]

Without --run it first records one: the reference trainer, dp 2 x pp 2 x tp 2,
4 micro-batches, 100 steps, under `diagnose run --no-analyze` (about a minute
on 2 cores). Then, interleaved `--repeat` times, each in its own process:

    full   `diagnose analyze RUN`: load, align, match, breakdown, detectors,
           analysis/*.parquet + findings.json, the merged Chrome trace, the HTML
           report and the MLflow run, exactly what a user types
    core   `diagnose analyze RUN --no-outputs`: the analysis alone

and prints the medians (wall time from process start to exit, imports included).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = ["-m", "reference_trainer", "--dp", "2", "--pp", "2", "--tp", "2", "--microbatches", "4", "--steps", "100"]
TARGET_S = 5.0


def record(out: str) -> None:
    command = [
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
        "8",
        *TRAINER,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if proc.returncode:
        raise SystemExit(f"recording failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(f"recorded 8 ranks x 100 steps in {time.perf_counter() - t0:.0f} s: {out}")


def analyze_s(run_dir: str, extra=()) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", "analyze", run_dir, "--quiet", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"analyze failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="", help="an existing 8-rank run dir (default: record one)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    work = None
    run_dir = args.run
    if not run_dir:
        work = tempfile.mkdtemp(prefix="diagnose-8x100-")
        run_dir = os.path.join(work, "run")
        record(run_dir)
    try:
        import diagnose

        run = diagnose.load(run_dir, warn=lambda m: None)
        print(f"{len(run.ranks)} ranks x {run.steps()['step'].nunique()} steps, {len(run.events()):,} events")
        full, core = [], []
        for _ in range(args.repeat):
            full.append(analyze_s(run_dir))
            core.append(analyze_s(run_dir, ("--no-outputs",)))
        print(f"full `diagnose analyze`: {' '.join(f'{x:.2f}' for x in full)} s")
        print(f"core (--no-outputs):     {' '.join(f'{x:.2f}' for x in core)} s")
        median = statistics.median(full)
        print(
            f"analyze_8x100: events={len(run.events())} analyze_s={median:.2f} "
            f"core_s={statistics.median(core):.2f} target_s={TARGET_S:.0f}"
        )
        return 0 if median < TARGET_S else 1
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
