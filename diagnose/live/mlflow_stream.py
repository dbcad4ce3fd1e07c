"""The live monitor's MLflow side: a background thread that creates (or finds)
the job's MLflow run and sends queued metrics and tags in one batch per
FLUSH_INTERVAL_S, so that creating a store (seconds on a busy machine) never
delays an alert."""

import threading
import time

from collectors.daemon_thread import start_daemon

FLUSH_INTERVAL_S = 5.0  # batched: a write into the SQLAlchemy store is the live child's largest CPU cost after its polls (bench/results/2026-12-01-live-child.md)


class MlflowStreamer:
    """Background thread: creates (or finds) the run's MLflow run, then sends
    queued metrics and tags in one batch per FLUSH_INTERVAL_S."""

    def __init__(self, run_dir: str, manifest: dict, warn):
        self.run_dir, self.manifest, self.warn = run_dir, manifest, warn
        self.lock = threading.Lock()
        self.metrics: list = []
        self.tags: dict = {}
        self.stop = threading.Event()
        self.run_id = None
        self.failed = False
        self.exit_status = None
        self.thread = start_daemon(self._main, "diagnose-live-mlflow")

    def metric(self, key: str, value: float, step: int) -> None:
        with self.lock:
            self.metrics.append((key, float(value), int(time.time() * 1000), int(step)))

    def tag(self, key: str, value: str) -> None:
        with self.lock:
            self.tags[key] = str(value)[:500]

    def _main(self) -> None:
        try:
            from diagnose.exporters import mlflow_store as tracking

            self.client = tracking.client_for(self.run_dir)
            self.run_id = tracking.ensure_run(self.client, self.run_dir, self.manifest)
            tracking.log_params_once(self.client, self.run_id, tracking.manifest_params(self.manifest))
            with self.lock:  # a short job's close() may have said "done" while the store was made
                self.tags.setdefault("diagnose.live", "running")
            while not self.stop.wait(FLUSH_INTERVAL_S):
                self._flush()
            self._flush()
            if self.exit_status is not None:
                status = "FINISHED" if self.exit_status == 0 else "FAILED"
                self.client.set_terminated(self.run_id, status)
        except Exception as exc:
            self.failed = True
            self.warn(f"live MLflow tracking stopped: {type(exc).__name__}: {exc}")

    def _flush(self) -> None:
        from mlflow.entities import Metric, RunTag

        with self.lock:
            metrics, self.metrics = self.metrics, []
            tags, self.tags = self.tags, {}
        if not metrics and not tags:
            return
        metrics = [Metric(*m) for m in metrics]
        for i in range(0, max(len(metrics), 1), 1000):
            self.client.log_batch(
                self.run_id,
                metrics=metrics[i : i + 1000],
                tags=[RunTag(k, v) for k, v in tags.items()] if i == 0 else [],
            )

    def close(self, exit_status=None, timeout: float = 60.0) -> None:
        self.exit_status = exit_status
        self.tag("diagnose.live", "done")
        self.stop.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.warn(f"live MLflow tracking did not finish within {timeout:.0f} s; left behind")
