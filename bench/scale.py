"""Scale benchmark: analyze a synthetic DP x PP x TP run of many ranks.

    .venv/bin/python -m bench.scale --ranks 1024 --steps 200

Writes the run with the collectors' own PartWriter (bench/synthetic_3d.py: a
simulated Megatron-style timeline with one planted straggler whose compute is
1.5x and a slow last stage at 1.3x), reports its size on disk per event, then
times `diagnose analyze RUN --no-outputs` in a subprocess and checks that
findings.json names the planted straggler and the slow stage. `--no-outputs` keeps
the analysis (tables, findings.json) and skips the merged Chrome trace, the
HTML report and the MLflow run, whose size grows with every event: a 10^7-event
Chrome trace is gigabytes that no trace viewer opens.

`--engines in-process,processes,dask` analyzes the same run once per engine
(diagnose/analysis/load/rank_pass_engines.py; `--workers` local processes or LocalCluster
workers) and prints each one's wall time and the peak of the SUM of the
resident memory of every process involved (the CLI, its worker processes,
Dask's scheduler and nannies: bench/measure.py samples the process tree).

Over the analysis' event budget (`diagnose analyze --max-events`, default 25 M)
the run is analyzed over its last steps that fit; the loader's line saying
which is printed. `--max-events 0` analyzes every step at once, `--every-step`
in windows that fit the budget, one after the other; `--keep DIR --reuse`
analyzes a run an earlier call kept (16,384 ranks take ~220 s to write).

The last line per engine is machine-readable:
    scale: ranks=R events=N engine=E analyze_s=S peak_rss_mb=M straggler_found=B slow_stage_found=B
Targets (issue 8): 1,024 ranks x 200 steps in under 60 s and 4 GB on 2 cores.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from bench.measure import run_measured
from bench.synthetic_3d import write_3d_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENGINE_OPTIONS = {
    "in-process": lambda n: [],
    "processes": lambda n: ["--processes", str(n)],
    "dask": lambda n: ["--dask-workers", str(n)],
}


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


def analyze(run_dir: str, extra=()) -> dict:
    """`diagnose analyze` in its own process: wall seconds, peak of its process tree's RSS (MB)."""
    return run_measured(
        [sys.executable, "-m", "diagnose", "analyze", run_dir, "--quiet", *extra], cwd=ROOT, interval_s=0.05
    )


def planted_found(run_dir: str, straggler: int, slow_stage: int | None) -> tuple[bool, bool | None]:
    """(the straggler named, the slow stage named; None when none was planted)."""
    try:
        with open(os.path.join(run_dir, "analysis", "findings.json"), encoding="utf-8") as f:
            findings = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"no findings.json: {exc}")
        return False, False
    for finding in findings:
        print(f"  {finding['severity']:8s} {finding['kind']:16s} {finding['title'][:110]}")
    stage_found = (
        None
        if slow_stage is None
        else any(f["kind"] == "stage_imbalance" and f["stage"] == slow_stage for f in findings)
    )
    return any(f["kind"] == "straggler" and f["ranks"] == [straggler] for f in findings), stage_found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--straggler", type=int, default=None, help="planted rank (default: ranks * 3 // 10)")
    p.add_argument("--slow-stage", type=int, default=None, help="planted slow stage (default: the last; -1: none)")
    p.add_argument(
        "--outputs",
        action="store_true",
        help="also write the Chrome trace, report and MLflow run (plain `diagnose analyze`)",
    )
    p.add_argument("--keep", default="", help="write the run here and keep it")
    p.add_argument("--engines", default="in-process", help="comma-separated: in-process, processes, dask")
    p.add_argument("--workers", type=int, default=2, help="worker processes of the processes and dask engines")
    p.add_argument(
        "--max-events",
        type=int,
        default=None,
        help="the analysis' event budget (default: diagnose analyze's; 0: every step)",
    )
    p.add_argument(
        "--every-step",
        action="store_true",
        help="a run over the budget is analyzed in windows of steps, one after the other",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="analyze the run --keep holds (written with the same options) instead of writing it again",
    )
    args = p.parse_args()
    engines = args.engines.split(",")
    if unknown := [e for e in engines if e not in ENGINE_OPTIONS]:
        p.error(f"unknown engine(s) {unknown}; known: {', '.join(ENGINE_OPTIONS)}")
    dp, pp, tp = layout(args.ranks, args.tp, args.pp)
    straggler = args.straggler if args.straggler is not None else args.ranks * 3 // 10
    slow_stage = pp - 1 if args.slow_stage is None else args.slow_stage
    slow_stage = slow_stage if 0 <= slow_stage < pp and pp > 1 else None
    out = args.keep or tempfile.mkdtemp(prefix="diagnose-scale-")
    try:
        t0 = time.perf_counter()
        if args.reuse and args.keep:
            with open(os.path.join(out, "bench-events.json"), encoding="utf-8") as f:
                events = json.load(f)["events"]
        else:
            written = write_3d_run(
                out,
                dp=dp,
                pp=pp,
                tp=tp,
                steps=args.steps,
                microbatches=args.microbatches,
                straggler=straggler,
                slow_stage=slow_stage,
            )
            events = written["events"]
            with open(os.path.join(out, "bench-events.json"), "w", encoding="utf-8") as f:
                json.dump({"events": events}, f)
        size = trace_bytes(out)
        print(
            f"{'kept' if args.reuse else 'wrote'} dp {dp} x pp {pp} x tp {tp} = {args.ranks} ranks x "
            f"{args.steps} steps: {events:,} events in {time.perf_counter() - t0:.1f} s; "
            f"{size / 2**20:.1f} MiB on disk, {size / events:.1f} bytes/event (incl. meta.json)",
            flush=True,
        )
        budget = ([] if args.max_events is None else ["--max-events", str(args.max_events)]) + (
            ["--every-step"] if args.every_step else []
        )
        ok = True
        for engine in engines:
            extra = ENGINE_OPTIONS[engine](args.workers) + ([] if args.outputs else ["--no-outputs"]) + budget
            shutil.rmtree(os.path.join(out, "analysis"), ignore_errors=True)  # no earlier engine's findings
            result = analyze(out, extra)
            if result["returncode"]:
                print(result["stdout"][-2000:], result["stderr"][-2000:], sep="\n")
            for line in result["stderr"].splitlines():
                if "--max-events" in line:  # the loader cut the run to its last steps
                    print(f"  {line}")
            found, stage_found = planted_found(out, straggler, slow_stage)
            ok &= found and stage_found is not False and result["returncode"] == 0
            print(
                f"scale: ranks={args.ranks} events={events} engine={engine} analyze_s={result['wall_s']:.1f} "
                f"peak_rss_mb={result['peak_mb']:.0f} straggler_found={found} slow_stage_found={stage_found}",
                flush=True,
            )
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
