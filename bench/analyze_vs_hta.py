"""Kineto import + temporal breakdown: diagnose vs Holistic Trace Analysis (HTA).

    .venv/bin/python -m bench.analyze_vs_hta [--ranks 8,64] [--hta-python /tmp/hta-venv/bin/python]

The same trace files go to both, each measured in its own process: wall time,
interleaved diagnose/HTA `--repeat` times (medians); then one more run each for
the peak memory of the process tree, sampled every 20 ms (HTA parses ranks in a
pool of worker processes; sampling in the timed runs would slow them):

    diagnose  import_kineto(files) into a run dir + diagnose.load(run).temporal_breakdown()
              (what `diagnose import kineto FILES --out RUN` and the notebook API do)
    HTA       TraceAnalysis(trace_dir=...).get_temporal_breakdown(visualize=False)

Sets: every real fixture directory under tests/data/kineto that HTA can
analyse, and one real trace (--source) replicated to 8 and 64 ranks by
rewriting distributedInfo.rank. The breakdowns are compared as well (max
absolute difference of idle/compute/non-compute fractions; see
diagnose/analysis/tables/gpu_tables.py for the known sub-microsecond rounding difference).

HTA is not a dependency of diagnose: install it in a throwaway venv first
(bench/hta_reference.py says how). Target (issue 8): >= 10x faster than HTA on
the 8-rank files, with lower peak memory.
"""

import argparse
import compileall
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench.hta_reference import kineto_files
from bench.measure import run_measured

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIXTURES = os.path.join(ROOT, "tests", "data", "kineto")
# The largest real trace, whole: the figures in bench/results were measured on it. The copy
# in tests/data lacks its flow and instant events (the importer reads neither; tests/data/README.md).
_TRACE = os.path.join("kineto", "hta", "df_index_resolver", "df_index_resolver.json.gz")
_WHOLE = os.path.join(os.path.dirname(ROOT), "shared", "data", _TRACE)
SOURCE = _WHOLE if os.path.exists(_WHOLE) else os.path.join(ROOT, "tests", "data", _TRACE)
FRACS = ("idle_frac", "compute_frac", "non_compute_frac")

DIAGNOSE = """
import json, sys, tempfile, os
from diagnose.importers.kineto import import_kineto
from diagnose.analysis.load.loader import load
out = os.path.join(tempfile.mkdtemp(prefix="diagnose-vs-hta-"), "run")
run_dir, _ = import_kineto(sys.argv[1:], out)
table = load(run_dir, warn=lambda m: None).temporal_breakdown()
print(json.dumps({str(r): {k: float(row[k]) for k in %r} for r, row in table.iterrows()}))
""" % (FRACS,)

HTA = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
table = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
print(json.dumps({str(int(r["rank"])): {
    "idle_frac": float(r["idle_time(us)"] / r["kernel_time(us)"]),
    "compute_frac": float(r["compute_time(us)"] / r["kernel_time(us)"]),
    "non_compute_frac": float(r["non_compute_time(us)"] / r["kernel_time(us)"])} for _, r in table.iterrows()}))
"""


def replicate(source: str, ranks: int, out_dir: str) -> None:
    """`ranks` copies of one trace, rank i's distributedInfo saying rank i."""
    from diagnose.importers.kineto import load_trace

    trace = load_trace(source)
    info = dict(trace.get("distributedInfo") or {})
    os.makedirs(out_dir, exist_ok=True)
    for rank in range(ranks):
        trace["distributedInfo"] = {**info, "rank": rank, "world_size": ranks}
        with gzip.open(os.path.join(out_dir, f"rank-{rank}.pt.trace.json.gz"), "wt", compresslevel=1) as f:
            json.dump(trace, f)


def compare(trace_dir: str, hta_python: str, repeat: int, timeout: float) -> dict:
    files = [os.path.join(trace_dir, n) for n in sorted(os.listdir(trace_dir))]
    env = dict(os.environ, PYTHONPATH=ROOT)
    commands = {
        "diagnose": ([sys.executable, "-c", DIAGNOSE, *files], dict(cwd=ROOT, env=env)),
        "hta": ([hta_python, "-c", HTA, trace_dir], dict(cwd=trace_dir)),
    }
    timed, sampled = {tool: [] for tool in commands}, {}
    for _ in range(repeat):  # timed without the memory sampler (measure.py says why)
        for tool, (command, where) in commands.items():
            timed[tool].append(run_measured(command, timeout=timeout, interval_s=None, **where))
    for tool, (command, where) in commands.items():
        sampled[tool] = run_measured(command, timeout=timeout, **where)
    result = {}
    for tool, measured in timed.items():
        ok = [m for m in measured if m["returncode"] == 0 and not m["timed_out"]]
        memory_ok = sampled[tool]["returncode"] == 0 and not sampled[tool]["timed_out"]
        result[tool] = {
            "wall_s": statistics.median(m["wall_s"] for m in ok) if ok else float("nan"),
            "peak_mb": sampled[tool]["peak_mb"] if memory_ok else float("nan"),
            "table": json.loads(ok[-1]["stdout"].strip().splitlines()[-1]) if ok else None,
            "error": None if ok else _error(measured[-1]),
        }
    a, b = result["diagnose"]["table"], result["hta"]["table"]
    result["max_frac_diff"] = (
        max(abs(a[r][k] - b[r][k]) for r in b if r in a for k in FRACS) if a and b and set(a) & set(b) else float("nan")
    )
    return result


def _error(measured: dict) -> str:
    if measured["timed_out"]:
        return "timed out"
    lines = (measured["stderr"] or "").strip().splitlines()
    return lines[-1][:120] if lines else f"exit {measured['returncode']}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    p.add_argument("--source", default=SOURCE, help="the real trace replicated to --ranks")
    p.add_argument("--ranks", default="8,64")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-fixtures", action="store_true", help="only the replicated sets")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    if not os.path.exists(args.hta_python):
        print(f"{args.hta_python} not found: install HTA in a throwaway venv (see bench/hta_reference.py)")
        return 2
    # as `pip install` does for HTA's venv: diagnose's own modules byte-compiled
    # up front (PYTHONDONTWRITEBYTECODE, set on some machines, would have
    # every timed run compile them again: ~0.1 s)
    compileall.compile_dir(os.path.join(ROOT, "diagnose"), quiet=1)
    compileall.compile_dir(os.path.join(ROOT, "collectors"), quiet=1)
    work = tempfile.mkdtemp(prefix="diagnose-vs-hta-")
    sets = []
    try:
        if not args.no_fixtures:
            for directory in sorted({os.path.dirname(p) for p in kineto_files_under(FIXTURES)}):
                name = os.path.relpath(directory, FIXTURES)
                target = os.path.join(work, name.replace(os.sep, "_"))
                os.makedirs(target)
                for path in kineto_files(directory):
                    shutil.copy(path, target)
                sets.append((name, target, 1))
        for n in (int(x) for x in args.ranks.split(",") if x):
            target = os.path.join(work, f"replicated_{n}")
            replicate(args.source, n, target)
            sets.append((f"{os.path.basename(args.source)} x {n} ranks", target, args.repeat if n <= 8 else 1))
        print(
            f"{'set':58s} {'files':>5s} {'MB':>6s} {'diagnose s':>10s} {'HTA s':>8s} {'speedup':>8s} "
            f"{'diag MB':>8s} {'HTA MB':>8s} {'mem x':>6s} {'max|dfrac|':>10s}"
        )
        for name, target, repeat in sets:
            size = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target)) / 2**20
            r = compare(target, args.hta_python, repeat, args.timeout)
            d, h = r["diagnose"], r["hta"]
            note = f"  HTA: {h['error']}" if h["error"] else ""
            note += f"  diagnose: {d['error']}" if d["error"] else ""
            print(
                f"{name[:58]:58s} {len(os.listdir(target)):5d} {size:6.1f} {d['wall_s']:10.2f} {h['wall_s']:8.2f} "
                f"{h['wall_s'] / d['wall_s']:7.1f}x {d['peak_mb']:8.0f} {h['peak_mb']:8.0f} "
                f"{h['peak_mb'] / d['peak_mb']:5.1f}x {r['max_frac_diff']:10.4f}{note}",
                flush=True,
            )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kineto_files_under(root: str) -> list:
    return [p for d in sorted({os.path.dirname(p) for p in _all_json(root)}) for p in kineto_files(d)]


def _all_json(root: str) -> list:
    out = []
    for folder, _, files in os.walk(root):
        out += [os.path.join(folder, f) for f in files if ".json" in f]
    return out


if __name__ == "__main__":
    sys.exit(main())
