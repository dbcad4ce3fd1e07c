"""The `diagnose run` parent process around the user's job.

Enters: the job's command line and the run options. launcher bootstraps the
collectors into every rank (PYTHONPATH + collectors/bootstrap), runs the job in
its own process group and passes its exit status through; around it:
profiling_tools (--nsys wrapping through nsys_wrap, --torch-profiler windows and
their import after the job), watchdog (a hang: dumps requested, ranks ended),
rank_liveness (which rank died first), progress_line (the terminal line), and
the live child (diagnose.live). Leaves: a complete run directory
(manifest.json with the exit status) for diagnose.analysis."""
