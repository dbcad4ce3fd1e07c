"""Record HTA's temporal breakdown of the real Kineto fixtures, for tests/data/.

The acceptance test compares `diagnose.load(run).temporal_breakdown()` of each
imported fixture with the table this script writes. It runs HTA itself, which
is not a dependency of diagnose, so it is run by hand in a throwaway venv:

    python3 -m venv /tmp/hta-venv
    /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/hta-venv/bin/python -m bench.hta_reference tests/data/kineto \
        > tests/data/hta_temporal_breakdown.json

Each trace set (the files of one directory that are Kineto traces) is copied to
its own temporary directory, because HTA reads every file of the directory it
is given. A set HTA cannot analyse is recorded with its error.
"""

import glob
import gzip
import json
import logging
import os
import shutil
import sys
import tempfile


def kineto_files(directory):
    files = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json*"))):
        try:
            with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
                head = json.load(f)
        except Exception:
            continue
        if isinstance(head, dict) and "traceEvents" in head:
            files.append(path)
    return files


def main(root):
    logging.disable(logging.WARNING)
    import hta
    from hta.trace_analysis import TraceAnalysis

    out = {"hta_version": getattr(hta, "__version__", None) or _version(), "sets": {}}
    for directory in sorted(
        {os.path.dirname(p) for p in glob.glob(os.path.join(root, "**", "*.json*"), recursive=True)}
    ):
        files = kineto_files(directory)
        if not files:
            continue
        name = os.path.relpath(directory, root)
        with tempfile.TemporaryDirectory() as tmp:
            for path in files:
                shutil.copy(path, tmp)
            try:
                analyzer = TraceAnalysis(trace_dir=tmp)
                table = analyzer.get_temporal_breakdown(visualize=False)
                rows = {
                    str(int(r["rank"])): {
                        "idle_frac": float(r["idle_time(us)"] / r["kernel_time(us)"]),
                        "compute_frac": float(r["compute_time(us)"] / r["kernel_time(us)"]),
                        "non_compute_frac": float(r["non_compute_time(us)"] / r["kernel_time(us)"]),
                        "kernel_time_us": float(r["kernel_time(us)"]),
                    }
                    for _, r in table.iterrows()
                }
                out["sets"][name] = {"files": [os.path.basename(p) for p in files], "ranks": rows}
            except Exception as exc:
                out["sets"][name] = {
                    "files": [os.path.basename(p) for p in files],
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


def _version():
    from importlib.metadata import version

    return version("HolisticTraceAnalysis")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/kineto")
