"""`diagnose compare A B [C ...]` into MLflow: the comparison is logged to the
latest of the runs (by start time; the last named when unknown), the one a user
opens to see what changed since its baseline (the other run of a pair; the
smallest world size of a scaling table): the comparison as JSON (and the pair's
page as HTML) under `compare/`, tags naming the baseline, and the step-time
ratio (a pair) or the run's scaling efficiency as metrics.
DIAGNOSE_TRACKING=off turns it off, as for every run."""

import json
import os
import shutil
import tempfile
import time

from diagnose import rundir
from diagnose.exporters import mlflow_store as tracking


def _started(run_dir: str) -> int:
    start = rundir.read_manifest(run_dir).get("start_wall_ns")
    return start if isinstance(start, int) else -1


def later_and_baseline(runs: list, result: dict) -> tuple[str, str]:
    """(later, baseline): the latest started (ties: the last named), and the other
    run of a pair or the scaling table's first (smallest) run."""
    later = max(reversed(runs), key=_started)
    if len(runs) == 2:
        return later, runs[0] if later == runs[1] else runs[1]
    smallest = result["scaling"][0]["root"]
    return later, next((r for r in runs if os.path.abspath(r) == os.path.abspath(smallest)), runs[0])


def log_compare(result: dict, runs: list, html_path: str | None) -> str | None:
    """Log the comparison (and the pair's page, written by the caller) to the latest
    run's MLflow run; returns that run's id."""
    if not tracking.enabled():
        return None
    from mlflow.entities import Metric, RunTag

    later, baseline = later_and_baseline(runs, result)
    client = tracking.client_for(later)
    run_id = tracking.ensure_run(client, later)
    name = os.path.basename(os.path.abspath(baseline)) or "baseline"
    tags = {"diagnose.compare.baseline": os.path.abspath(baseline), "diagnose.compare.baseline_name": name}
    baseline_run_id = tracking.stored_run_id(baseline)
    if baseline_run_id:
        tags["diagnose.compare.baseline_run_id"] = baseline_run_id
    now_ms = int(time.time() * 1000)
    ratio = (result.get("step_time") or {}).get("ratio")
    if later == runs[0] and isinstance(ratio, (int, float)) and ratio:
        ratio = 1.0 / ratio  # the later run's step over its baseline's
    metrics = (
        [Metric("compare/step_time_ratio", float(ratio), now_ms, 0)]
        if isinstance(ratio, (int, float)) and ratio == ratio
        else []
    )
    mine = [
        row
        for row in result.get("scaling") or []
        if os.path.abspath(row["root"]) == os.path.abspath(later) and row["efficiency"] is not None
    ]
    metrics += [Metric("compare/scaling_efficiency", float(mine[0]["efficiency"]), now_ms, 0)] if mine else []
    client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
    with tempfile.TemporaryDirectory() as tmp:
        stem = os.path.join(tmp, f"vs-{name}")
        with open(f"{stem}.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
        client.log_artifact(run_id, f"{stem}.json", artifact_path="compare")
        if html_path:
            shutil.copyfile(html_path, f"{stem}.html")
            client.log_artifact(run_id, f"{stem}.html", artifact_path="compare")
    return run_id
