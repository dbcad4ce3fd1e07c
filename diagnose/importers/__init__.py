"""Foreign traces -> run directories.

Enters: other tools' traces, one file per rank: PyTorch-profiler (Kineto) Chrome
traces (`kineto`, read by kineto_io, scanned by kineto_scan or the C scan, turned
into columns by kineto_columns) and Nsight Systems SQLite exports (`nsys`).
Leaves: an ordinary run directory (docs/run-directory.md) whose events are the
traces' GPU activity and host ranges, written by run_writer; gpu_activity holds
what both importers share (kernel classes, NCCL op names). The analysis reads an
imported run like a recorded one; nothing here imports the analysis."""
