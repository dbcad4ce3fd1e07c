"""Scale benchmark: analyze a synthetic DP x PP x TP run of many ranks.

    .venv/bin/python bench/scale.py --ranks 1024 --steps 200

Writes the run with the collectors' own PartWriter (bench/synthetic_3d.py: a
simulated Megatron-style timeline with one planted straggler whose compute is
1.5x), reports its size on disk per event, then times `diagnose analyze RUN
--no-outputs` in a subprocess (wall time and that process's peak RSS) and
checks that findings.json names the planted straggler. `--no-outputs` keeps
the analysis (tables, findings.json) and skips the merged Chrome trace, the
HTML report and the MLflow run, whose size grows with every event: a 10^7-event
Chrome trace is gigabytes that no trace viewer opens.

The last line is machine-readable:
    scale: ranks=R events=N analyze_s=S peak_rss_mb=M straggler_found=True|False
Targets (issue 8): 1,024 ranks x 200 steps in under 60 s and 4 GB on 2 cores.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]

from synthetic_3d import write_3d_run  # noqa: E402


def layout(ranks: int, tp: int, pp: int) -> tuple[int, int, int]:
    """(dp, pp, tp) for `ranks`, shrinking tp then pp until they divide it."""
    while tp > 1 and ranks % (tp * pp):
        tp //= 2
    while pp > 1 and ranks % (tp * pp):
        pp -= 1
    return ranks // (tp * pp), pp, tp


def trace_bytes(run_dir: str) -> int:
    total = 0
    for folder, _, files in os.walk(os.path.join(run_dir, "traces")):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total


def analyze(run_dir: str, extra=()) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (MB) of `diagnose analyze` in its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "diagnose", "analyze", run_dir, "--quiet", *extra],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kb <= before:  # ru_maxrss is the max over children: an earlier bigger child hides it
        peak_kb = float("nan")
    return wall, peak_kb / 1024, proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--straggler", type=int, default=None, help="planted rank (default: ranks * 3 // 10)")
    p.add_argument("--outputs", action="store_true",
                   help="also write the Chrome trace, report and MLflow run (plain `diagnose analyze`)")
    p.add_argument("--keep", default="", help="write the run here and keep it")
    args = p.parse_args()
    dp, pp, tp = layout(args.ranks, args.tp, args.pp)
    straggler = args.straggler if args.straggler is not None else args.ranks * 3 // 10
    out = args.keep or tempfile.mkdtemp(prefix="diagnose-scale-")
    try:
        t0 = time.perf_counter()
        written = write_3d_run(out, dp=dp, pp=pp, tp=tp, steps=args.steps,
                               microbatches=args.microbatches, straggler=straggler)
        events = written["events"]
        size = trace_bytes(out)
        print(f"wrote dp {dp} x pp {pp} x tp {tp} = {args.ranks} ranks x {args.steps} steps: "
              f"{events:,} events in {time.perf_counter() - t0:.1f} s; {size / 2**20:.1f} MiB on disk, "
              f"{size / events:.1f} bytes/event (incl. meta.json)", flush=True)
        wall, peak_mb, proc = analyze(out, () if args.outputs else ("--no-outputs",))
        if proc.returncode:
            print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n")
        found = False
        try:
            with open(os.path.join(out, "analysis", "findings.json"), encoding="utf-8") as f:
                findings = json.load(f)
            for finding in findings:
                print(f"  {finding['severity']:8s} {finding['kind']:16s} {finding['title'][:110]}")
            found = any(f["kind"] == "straggler" and f["ranks"] == [straggler] for f in findings)
        except (OSError, ValueError) as exc:
            print(f"no findings.json: {exc}")
        print(f"scale: ranks={args.ranks} events={events} analyze_s={wall:.1f} "
              f"peak_rss_mb={peak_mb:.0f} straggler_found={found}")
        return 0 if found and proc.returncode == 0 else 1
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
