"""One MLflow run per diagnose run (docs/outputs.md, "Tracking").

Store: `sqlite:///<runs root>/mlflow.db` (runs root = the run dir's parent),
artifacts under `<runs root>/mlartifacts`, unless MLFLOW_TRACKING_URI is set.
Experiment "diagnose". The MLflow run is created live when `diagnose run`
starts the job (diagnose.live.child) and its id kept in `<run>/mlflow_run_id`; the
analysis logs into that same run, and re-analysing a run updates it rather
than adding another:

    params     world_size, layout, command (+ name, host, versions)
    metrics    per step: step_time_p50_ms, step_time_max_ms, data_wait_frac,
               exposed_comm_frac, bubble_frac (pipelines); summary/* over the
               steady steps (each phase's ms per step among them);
               finding/<kind>_impact_ms_per_step and _gpu_hours_per_day for every
               kind (0 when absent); waterfall/<kind>_frac, rest_frac, mfu_frac
               (where the step goes: the report's plotly view of it is in
               report.html); mfu/* (diagnose/analysis/tables/mfu.py: mfu, hfu,
               achieved_tflops_per_rank, peak_tflops, model_gflop_per_step,
               uncounted_kernel_share, each when measured);
               live/* streamed while the job ran
    tags       findings.count, findings.<severity>, finding.<kind> = worst
               severity (+ finding.<kind>.title), diagnose.run_dir; culprit.<kind>
               and repeat_offender.<kind> (diagnose/exporters/repeat_offenders.py);
               the run's Description (mlflow.note.content): layout, world size,
               step time, top findings, repeat offenders (a Description the user
               wrote is kept)
    artifacts  report.html, findings.json, trace.json.gz (+ alerts.jsonl)

Metric timestamps are the steps' wall-clock end times, so logging the same
analysis twice stores nothing new. DIAGNOSE_TRACKING=off turns tracking off.

Here: log_run, the finding tags and the Description; the store, the experiment
and the run of a run dir are in mlflow_store.py, the metrics in mlflow_metrics.py.
"""

import os

from diagnose import rundir
from diagnose.exporters import repeat_offenders
from diagnose.exporters.mlflow_metrics import log_metrics, step_metrics, summary_metrics
from diagnose.exporters.mlflow_store import (
    client_for,
    enabled,
    ensure_run,
    experiment_id,
    layout_text,
    log_params_once,
    manifest_params,
)

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
TAG_TEXT_MAX = 500


NOTE_TAG = "mlflow.note.content"  # the run's Description in MLflow's overview
NOTE_MARK = "**diagnose**"  # a note starting so is ours to rewrite; a user's own is kept
TOP_FINDINGS = 3


def overview_note(run, findings: list, summary: dict) -> str:
    """Markdown for the run's Description: layout, world size, step time, top findings."""
    manifest = run.manifest or {}
    step = summary.get("summary/step_time_median_ms")
    lines = [
        f"{NOTE_MARK}: {run.world_size} ranks, layout {layout_text(manifest.get('layout'))}"
        + (f"; step {step:.1f} ms (median rank, steady steps)" if step is not None else ""),
        "",
    ]
    serious = [f for f in findings if f.get("severity") != "info"][:TOP_FINDINGS]
    if serious:
        lines.append("Top findings (report.html in Artifacts has the evidence):")
        for i, f in enumerate(serious, 1):
            ranks = ",".join(map(str, f.get("ranks") or [])) or "-"
            lines.append(
                f"{i}. **{f.get('severity')}** {f.get('kind')} (ranks {ranks}, "
                f"{float(f.get('impact_ms_per_step') or 0):.1f} ms/step): {f.get('title', '')}"
            )
    else:
        lines.append("No finding above info.")
    return "\n".join(lines)[:5000]


def finding_tags(findings: list) -> dict:
    tags = {"findings.count": str(len(findings))}
    for severity in SEVERITY_RANK:
        tags[f"findings.{severity}"] = str(sum(1 for f in findings if f.get("severity") == severity))
    worst: dict = {}
    for f in findings:
        kind = str(f.get("kind") or "unknown")
        if kind not in worst or SEVERITY_RANK.get(f.get("severity"), 3) < SEVERITY_RANK.get(
            worst[kind].get("severity"), 3
        ):
            worst[kind] = f
    for kind, f in worst.items():
        tags[f"finding.{kind}"] = str(f.get("severity"))
        tags[f"finding.{kind}.title"] = str(f.get("title", ""))[:TAG_TEXT_MAX]
        if f.get("ranks"):
            tags[f"finding.{kind}.ranks"] = ",".join(map(str, f["ranks"]))[:TAG_TEXT_MAX]
    return tags


def _set_tags(client, run_id: str, tags: dict, prune: bool = True) -> None:
    from mlflow.entities import RunTag

    current = client.get_run(run_id).data.tags if prune else {}
    for key in current:  # a finding (or its culprit) the re-analysis no longer makes
        if key.startswith(("finding.", repeat_offenders.TAG, repeat_offenders.LINE_TAG)) and key not in tags:
            client.delete_tag(run_id, key)
    items = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, tags=items[i : i + 100])


def _terminal_status(manifest: dict) -> str | None:
    status = manifest.get("exit_status")
    if status is None:
        return None
    if manifest.get("interrupted") or manifest.get("hang"):
        return "KILLED"
    return "FINISHED" if status == 0 else "FAILED"


def log_run(run, findings) -> str | None:
    """Log a loaded, analysed run to its MLflow run; returns the MLflow run id."""
    if not enabled():
        return None
    from mlflow.entities import Metric

    client = client_for(run.root)
    manifest = run.manifest or {}
    run_id = ensure_run(client, run.root, manifest)
    params = {"world_size": run.world_size, **manifest_params(manifest)}
    log_params_once(client, run_id, params)
    metrics = step_metrics(run)
    end = manifest.get("end_wall_ns") or run.wall_t0_ns or 0
    stamp = int(end // 1_000_000)
    summary = summary_metrics(run, findings)
    metrics += [Metric(k, v, stamp, 0) for k, v in summary.items()]
    log_metrics(client, run_id, metrics)
    culprits, said = repeat_offenders.culprit_tags(run.rank_meta, findings)
    tags = {**finding_tags(findings), **culprits, "diagnose.run_dir": os.path.abspath(run.root)}
    if manifest.get("exit_status") is not None:
        tags["diagnose.exit_status"] = str(manifest["exit_status"])
    _set_tags(client, run_id, tags)
    # the machines blamed before too: asked once this run's culprits are tagged
    repeats = repeat_offenders.repeat_lines(client, experiment_id(client, run.root), culprits, said)
    note = client.get_run(run_id).data.tags.get(NOTE_TAG, "")
    if not note or note.startswith(NOTE_MARK):
        lines = [f"Repeat offender: {line}" for line in repeats.values()]
        repeats[NOTE_TAG] = "\n".join([overview_note(run, findings, summary), *lines])[:5000]
    _set_tags(client, run_id, repeats, prune=False)
    for name in (rundir.REPORT, rundir.FINDINGS, rundir.CHROME_TRACE, rundir.ALERTS):
        path = os.path.join(run.root, name)
        if os.path.isfile(path):
            client.log_artifact(run_id, path)
    status = _terminal_status(manifest)
    if status:
        end_ns = manifest.get("end_wall_ns")
        client.set_terminated(run_id, status, end_time=int(end_ns // 1_000_000) if isinstance(end_ns, int) else None)
    return run_id
