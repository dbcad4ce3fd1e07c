"""Derived tables: pure functions of the frames a loaded run holds (events,
samples, steps, rank meta), one table or figure each, testable on synthetic
frames. matching (every collective matched across its members: calls,
arrivals, waits), breakdown (where each step's time goes), step_tables (steady
steps, per-step summaries, pipeline blocks and bubbles), gpu_tables (kernel rows
of imported traces) and device_idle, device_collectives, stream_waits, inferred_compute,
pipeline_topology, trace_windows, per_rank (NumPy slicing by rank), mfu and its
gpu_peaks, and the hang's evidence (collective_divergence, stuck_frames).

May import: tables/ only, of diagnose.analysis (and collectors' constants, the
run directory's contract); nothing of diagnose.rundir: it reads no run
directory (tests/architecture/test_layout.py)."""
