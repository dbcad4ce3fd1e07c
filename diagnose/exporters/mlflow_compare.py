"""`diagnose compare A B` into MLflow: the comparison is logged to the later of
the two runs (by start time; B when unknown), the one a user opens to see what
changed since its baseline: the comparison as JSON and HTML artifacts under
`compare/`, tags naming the baseline, and the step-time ratio as a metric.
DIAGNOSE_TRACKING=off turns it off, as for every run."""
import json
import os
import shutil
import tempfile
import time

from diagnose import rundir
from diagnose.exporters import mlflow_run as tracking


def _started(run_dir: str) -> int:
    start = rundir.read_manifest(run_dir).get("start_wall_ns")
    return start if isinstance(start, int) else -1


def later_and_baseline(dir_a: str, dir_b: str) -> tuple[str, str]:
    """(later, baseline): B is later unless A's manifest says it started after B."""
    return (dir_a, dir_b) if _started(dir_a) > _started(dir_b) else (dir_b, dir_a)


def log_compare(result: dict, dir_a: str, dir_b: str, html_path: str) -> str | None:
    """Log the comparison (and its page, written by the caller) to the later run's
    MLflow run; returns that run's id."""
    if not tracking.enabled():
        return None
    from mlflow.entities import Metric, RunTag
    later, baseline = later_and_baseline(dir_a, dir_b)
    client = tracking.client_for(later)
    run_id = tracking.ensure_run(client, later)
    name = os.path.basename(os.path.abspath(baseline)) or "baseline"
    tags = {"diagnose.compare.baseline": os.path.abspath(baseline),
            "diagnose.compare.baseline_name": name}
    baseline_run_id = tracking.stored_run_id(baseline)
    if baseline_run_id:
        tags["diagnose.compare.baseline_run_id"] = baseline_run_id
    ratio = (result.get("step_time") or {}).get("ratio")
    if later == dir_a and isinstance(ratio, (int, float)) and ratio:
        ratio = 1.0 / ratio  # the later run's step over its baseline's
    metrics = [Metric("compare/step_time_ratio", float(ratio), int(time.time() * 1000), 0)] \
        if isinstance(ratio, (int, float)) and ratio == ratio else []
    client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
    with tempfile.TemporaryDirectory() as tmp:
        stem = os.path.join(tmp, f"vs-{name}")
        with open(f"{stem}.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
        shutil.copyfile(html_path, f"{stem}.html")
        client.log_artifact(run_id, f"{stem}.json", artifact_path="compare")
        client.log_artifact(run_id, f"{stem}.html", artifact_path="compare")
    return run_id
