"""The replay: a dependency model of the run's steps, replayed with what-if
durations. op_graph is the engine (longest path through a graph of ops);
step_replay builds it from host lanes, device_graph from kernels on streams;
whatif asks either what a fix saves.

May import: tables/ (tests/architecture/test_layout.py); it gets a loaded run's tables and
reads no run directory."""
