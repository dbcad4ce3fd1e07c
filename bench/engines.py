"""The cross-rank join, three engines side by side: pandas (what diagnose uses),
DuckDB and Polars, each reading the same run directory's Parquet parts in its
own process (wall time, peak RSS of the process tree).

    .venv/bin/python -m bench.engines RUN [--engines-python /tmp/engines-venv/bin/python]

The join: every collective/p2p call matched with its completion ("done") row
by (rank, group, seq, name), then per instance (group, seq) the members'
arrivals, the last arrival and who it was, the member count and the median
exit: the arrivals table that the straggler and communication detectors read.

    pandas   diagnose.load(RUN) (read, align clocks) + run.arrivals()
    duckdb   one SQL query over read_parquet(...), window functions
    polars   scan_parquet(...) lazy query, window expressions

DuckDB and Polars are not dependencies of diagnose; install them in a
throwaway venv (python3 -m venv /tmp/engines-venv && /tmp/engines-venv/bin/pip
install duckdb polars pyarrow). Used to choose the engine (issue 8): see
bench/results/2026-11-29-scale-1024.md.
"""

import argparse
import os
import sys

from bench.measure import run_measured

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PANDAS = """
import sys
import diagnose
run = diagnose.load(sys.argv[1], warn=lambda m: None)
table = run.arrivals()
print(len(table), float(table["wait_ms"].sum()))
"""

DUCKDB = r"""
import sys, duckdb
files = sys.argv[1] + "/traces/rank-*/events-*.parquet"
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
table = con.execute(f'''
WITH ev AS (SELECT *, CAST(regexp_extract(filename, 'rank-(\d+)', 1) AS INTEGER) AS rank
            FROM read_parquet('{files}', filename = true)),
calls AS (SELECT rank, "group", seq, name, start_ns AS issue_ns, end_ns AS return_ns, async_op, step
          FROM ev WHERE kind IN ('collective', 'p2p') AND seq >= 0),
dones AS (SELECT rank, "group", seq, name, min(start_ns) AS done_ns FROM ev WHERE kind = 'done'
          GROUP BY ALL),
j AS (SELECT c.*, CASE WHEN c.async_op THEN d.done_ns ELSE c.return_ns END AS exit_ns
      FROM calls c LEFT JOIN dones d USING (rank, "group", seq, name))
SELECT *, max(issue_ns) OVER w AS last_arrival_ns, count(*) OVER w AS members,
       arg_max(rank, issue_ns) OVER w AS last_rank, median(exit_ns) OVER w AS exit_median,
       (max(issue_ns) OVER w - issue_ns) / 1e6 AS wait_ms
FROM j WINDOW w AS (PARTITION BY "group", seq)''')
table = table.to_arrow_table() if hasattr(table, "to_arrow_table") else table.arrow()
import pyarrow.compute as pc
print(table.num_rows, pc.sum(table.column("wait_ms")).as_py())
"""

POLARS = r"""
import glob, sys, polars as pl
files = sorted(glob.glob(sys.argv[1] + "/traces/rank-*/events-*.parquet"))
ev = pl.scan_parquet(files, include_file_paths="path").with_columns(
    pl.col("path").str.extract(r"rank-(\d+)", 1).cast(pl.Int32).alias("rank"))
calls = ev.filter(pl.col("kind").is_in(["collective", "p2p"]) & (pl.col("seq") >= 0)).select(
    "rank", "group", "seq", "name", pl.col("start_ns").alias("issue_ns"),
    pl.col("end_ns").alias("return_ns"), "async_op", "step")
dones = ev.filter(pl.col("kind") == "done").group_by("rank", "group", "seq", "name").agg(
    pl.col("start_ns").min().alias("done_ns"))
w = ["group", "seq"]
table = (calls.join(dones, on=["rank", "group", "seq", "name"], how="left")
         .with_columns(pl.when(pl.col("async_op")).then(pl.col("done_ns")).otherwise(pl.col("return_ns"))
                       .alias("exit_ns"))
         .with_columns(pl.col("issue_ns").max().over(w).alias("last_arrival_ns"),
                       pl.len().over(w).alias("members"),
                       pl.col("rank").sort_by("issue_ns").last().over(w).alias("last_rank"),
                       pl.col("exit_ns").median().over(w).alias("exit_median"))
         .with_columns(((pl.col("last_arrival_ns") - pl.col("issue_ns")) / 1e6).alias("wait_ms"))
         .collect())
print(table.height, table["wait_ms"].sum())
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run")
    p.add_argument(
        "--engines-python", default="/tmp/engines-venv/bin/python", help="a Python with duckdb and polars installed"
    )
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT)
    print(f"{'engine':8s} {'rows':>10s} {'wall s':>8s} {'peak MB':>8s}")
    for engine, python, code in (
        ("pandas", sys.executable, PANDAS),
        ("duckdb", args.engines_python, DUCKDB),
        ("polars", args.engines_python, POLARS),
    ):
        if not os.path.exists(python):
            print(f"{engine:8s} skipped: {python} not found")
            continue
        r = run_measured([python, "-c", code, args.run], cwd=ROOT, env=env, timeout=1800)
        rows = r["stdout"].split()[0] if r["returncode"] == 0 and r["stdout"].strip() else "error"
        note = "" if r["returncode"] == 0 else "  " + (r["stderr"].strip().splitlines() or ["?"])[-1][:100]
        print(f"{engine:8s} {rows:>10s} {r['wall_s']:8.1f} {r['peak_mb']:8.0f}{note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
