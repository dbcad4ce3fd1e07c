"""The live monitor: a low-priority child process of `diagnose run`, in a session
of its own, so that its MLflow imports, store writes and part reads never slow
the launcher or the ranks.

Enters: the run directory while the job runs (each rank's progress and event
parts, read through diagnose.rundir). child is the process (and the launcher's
handle on it); monitor ticks alerts and per-step metrics; compute_reader reads
each rank's own compute per step from its parts; mlflow_stream sends the metrics
to the job's MLflow run in batches; arrivals names the rank the others wait for
(arrival lag at collectives); rank_gauges holds what is known of each rank now,
which prometheus_metrics serves (`diagnose run --metrics-port`). Leaves:
alerts.jsonl, alert lines on stderr, live metrics in MLflow, live.json (for the
launcher's progress line), a Prometheus endpoint and metrics_port."""
