"""Loading: a run directory -> `Run` (`diagnose.load`). loader merges the ranks
(rank_pass on an engine of rank_pass_engines; cut to the last steps by
event_budget when the run is too large) onto rank 0's clock (clock_align) into
pandas tables, and serves the derived ones (tables/) on demand (derived_tables).

May import: tables/, diagnose.rundir, diagnose.errors (tests/architecture/test_layout.py)."""
