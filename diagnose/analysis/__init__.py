"""Run directory -> tables -> findings, in one process, with no side effects but
the files under <run>/analysis/.

Enters: a run directory, read through diagnose.rundir. loader merges the ranks
(rank_pass, on an engine; cut to the last steps by event_budget when the run is
too large) onto rank 0's clock (clock_align) into pandas tables and serves the derived ones
on demand: matching (every collective matched across its members, arrivals and
waits), breakdown (where each step's time goes), step_tables (the one home of
steady steps, step summaries, pipeline blocks and bubbles), gpu_tables (kernel
rows of imported traces), per_rank (NumPy slicing by rank). run_detectors runs
detectors/ and writes findings.json (the schema of findings) and the tables.
Leaves: `diagnose.load(RUN)` -> Run, findings as dicts, analysis/*.parquet;
run_compare compares two runs' summaries. Nothing here imports dashboards,
exporters, diagnose.run, diagnose.live or diagnose.cli (tests/test_layout.py)."""
