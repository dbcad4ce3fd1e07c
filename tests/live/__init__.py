"""While the job runs: the live monitor's alerts, metrics, progress, node health and hangs."""
