"""Report size and build time for a long synthetic run (default 8 ranks x 1,000
steps, DP 2 x PP 4, one slow rank): the report must stay under 10 MB.

    .venv/bin/python -m bench.report_size [--ranks 8] [--steps 1000] [--keep DIR]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from dashboards.report_page import write_report
from diagnose.analysis.load.loader import load
from tests.support.synthetic_run import write_synthetic_run

LIMIT_MB = 10.0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--keep", default="", help="write the run here and keep it")
    args = p.parse_args()
    out = args.keep or tempfile.mkdtemp(prefix="diagnose-bench-")
    try:
        t = time.perf_counter()
        write_synthetic_run(out, ranks=args.ranks, steps=args.steps, pp=args.pp, slow_rank=3, slow_factor=1.3)
        t_write = time.perf_counter() - t
        t = time.perf_counter()
        run = load(out)
        events = len(run.events())
        t_load = time.perf_counter() - t
        t = time.perf_counter()
        path = write_report(run, [])
        t_report = time.perf_counter() - t
        size_mb = os.path.getsize(path) / 2**20
        print(
            f"{args.ranks} ranks x {args.steps} steps, {events:,} events: report {size_mb:.2f} MB "
            f"(limit {LIMIT_MB:.0f} MB); synth {t_write:.1f} s, load {t_load:.1f} s, "
            f"report {t_report:.1f} s"
        )
        return 0 if size_mb < LIMIT_MB else 1
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
