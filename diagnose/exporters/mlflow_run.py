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
"""
import logging
import os
import pathlib
import threading

from collectors.part_writer import atomic_write_bytes
from diagnose import rundir
from diagnose.exporters import repeat_offenders

EXPERIMENT = "diagnose"
RUN_ID_FILE = "mlflow_run_id"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
MAX_BATCH = 1000
TAG_TEXT_MAX = 500
_STORE_LOCK = threading.Lock()


def enabled() -> bool:
    return os.environ.get("DIAGNOSE_TRACKING", "on").strip().lower() not in ("0", "off", "false", "no")


def runs_root(run_dir: str) -> str:
    return os.path.dirname(os.path.abspath(run_dir))


def default_uri(root: str) -> str:
    return f"sqlite:///{os.path.abspath(os.path.join(root, DB_NAME))}"


def tracking_uri(run_dir: str | None = None, root: str | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return default_uri(root if root is not None else runs_root(run_dir))


def _prepare_mlflow() -> None:
    # A profiler must not phone home from a training cluster (MLflow 3 sends usage
    # telemetry by default; on an offline node that is a thread retrying for nothing).
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # Creating the store logs alembic migrations at INFO; a user wants findings.
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def client_for(run_dir: str):
    """A client whose store is ready. Creating a sqlite store runs migrations
    for seconds; the live thread and the analysis must not do it at once."""
    _prepare_mlflow()
    from mlflow.tracking import MlflowClient
    uri = tracking_uri(run_dir)
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    db = uri[len("sqlite:///"):]
    os.makedirs(os.path.dirname(db) or ".", exist_ok=True)
    lock_path = os.path.join(os.path.dirname(db), f".{os.path.basename(db)}.lock")
    with _STORE_LOCK, open(lock_path, "a") as lock:
        # Also across processes: the live monitor, the analysis, a second node's launcher.
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        client = MlflowClient(tracking_uri=uri)
        client.get_experiment_by_name(EXPERIMENT)  # creates / migrates the store
    return client


def experiment_id(client, run_dir: str) -> str:
    from mlflow.exceptions import MlflowException
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    location = None
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        # Next to the store, not in whatever directory the user happens to be in.
        location = pathlib.Path(runs_root(run_dir), ARTIFACTS_DIR).as_uri()
    try:
        return client.create_experiment(EXPERIMENT, artifact_location=location)
    except MlflowException:  # created meanwhile by another diagnose process
        return client.get_experiment_by_name(EXPERIMENT).experiment_id


def stored_run_id(run_dir: str) -> str | None:
    try:
        with open(os.path.join(run_dir, RUN_ID_FILE), encoding="utf-8") as f:
            value = f.read().strip()
        return value or None
    except OSError:
        return None


def ensure_run(client, run_dir: str, manifest: dict | None = None) -> str:
    """The MLflow run of this run dir: the one recorded in <run>/mlflow_run_id
    if the store still has it, else a new one (whose id is then recorded)."""
    from mlflow.exceptions import MlflowException
    run_id = stored_run_id(run_dir)
    if run_id:
        try:
            existing = client.get_run(run_id)
            if existing.info.lifecycle_stage != "deleted":
                return run_id
        except MlflowException:
            pass  # another store (MLFLOW_TRACKING_URI changed) or deleted: start a new one
    manifest = manifest if manifest is not None else rundir.read_manifest(run_dir)
    start = manifest.get("start_wall_ns")
    tags = {"diagnose.run_dir": os.path.abspath(run_dir),
            "mlflow.source.name": "diagnose", "mlflow.source.type": "LOCAL"}
    run = client.create_run(experiment_id(client, run_dir),
                            start_time=int(start // 1_000_000) if isinstance(start, int) else None,
                            tags=tags, run_name=_run_name(run_dir, manifest))
    atomic_write_bytes(os.path.join(run_dir, RUN_ID_FILE), (run.info.run_id + "\n").encode())
    return run.info.run_id


def _run_name(run_dir: str, manifest: dict) -> str:
    return str(manifest.get("name") or os.path.basename(os.path.abspath(run_dir)))[:250]


def layout_text(layout) -> str:
    if not layout:
        return "-"
    if isinstance(layout, dict):
        return ",".join(f"{k}={v}" for k, v in layout.items())
    return str(layout)


def manifest_params(manifest: dict) -> dict:
    params = {"command": manifest.get("command") or "", "layout": layout_text(manifest.get("layout"))}
    if manifest.get("launcher_host"):
        params["launcher_host"] = manifest["launcher_host"]
    for key, value in (manifest.get("versions") or {}).items():
        if value:
            params[f"version.{key}"] = value
    return params


def log_params_once(client, run_id: str, params: dict) -> None:
    """Params are immutable in MLflow: log the ones not there yet, keep the rest."""
    from mlflow.entities import Param
    existing = client.get_run(run_id).data.params
    new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=new[i:i + 100])


def log_metrics(client, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), MAX_BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + MAX_BATCH])


def step_metrics(run) -> list:
    """mlflow Metric objects, one per (name, step), stamped with the step's end."""
    from mlflow.entities import Metric

    from diagnose.analysis.tables.step_tables import bubbles, pipeline_blocks, step_summary
    blocks = pipeline_blocks(run.events())
    summary = step_summary(run.breakdown(), run.steps(), bubbles(blocks) if len(blocks) else None)
    if summary.empty:
        return []
    wall0 = run.wall_t0_ns or 0
    names = [c for c in ("step_time_p50_ms", "step_time_max_ms", "data_wait_frac",
                         "exposed_comm_frac", "bubble_frac") if c in summary.columns]
    metrics = []
    for row in summary.itertuples(index=False):
        end = row.end_ns
        timestamp = int((wall0 + (end if end == end else 0)) // 1_000_000)
        for name in names:
            value = getattr(row, name)
            if value == value:  # not NaN
                metrics.append(Metric(name, float(value), timestamp, int(row.step)))
    return metrics


def summary_metrics(run, findings) -> dict:
    from diagnose.analysis.tables import mfu
    from diagnose.analysis.tables.breakdown import PARTS
    from diagnose.analysis.tables.step_tables import bubble_frac, bubbles, pipeline_blocks, steady
    out = {"summary/steps_recorded": float(run.steps()["step"].nunique()) if len(run.steps()) else 0.0,
           "summary/findings": float(len(findings))}
    breakdown = steady(run.breakdown(), run.steady_steps())
    if breakdown is not None and len(breakdown):
        total = breakdown["step_ms"].sum()
        per_step_max = breakdown.groupby("step")["step_ms"].max()
        out.update({
            "summary/step_time_median_ms": float(breakdown["step_ms"].median()),
            "summary/step_time_max_median_ms": float(per_step_max.median()),
            "summary/data_wait_frac": float(breakdown["data_wait_ms"].sum() / total) if total else 0.0,
            "summary/exposed_comm_frac": float(breakdown["exposed_comm_ms"].sum() / total) if total else 0.0,
        })
        # each phase's ms per step (the mean rank's), to chart across runs in MLflow's compare view
        for part in PARTS:
            column = f"{part}_ms"
            if column in breakdown.columns:
                out[f"summary/{part}_ms_per_step"] = float(breakdown[column].mean())
        blocks = steady(pipeline_blocks(run.events()), run.steady_steps())
        if blocks is not None and len(blocks):
            frac = bubble_frac(bubbles(blocks))
            if frac == frac:  # not NaN: some schedule window
                out["summary/bubble_frac"] = frac
    out.update(finding_impacts(findings))
    out.update(mfu.metrics(mfu.summarize(run)))  # mfu/*: only what was measured
    out.update(waterfall_metrics((run.step_figures or {}).get("waterfall")))
    return out


def waterfall_metrics(waterfall: dict | None) -> dict:
    """waterfall/<kind>_frac per finding kind (the largest share of a kind), rest_frac,
    mfu_frac where known: where the step goes (diagnose/analysis/findings/step_waterfall.py)."""
    if not waterfall or waterfall.get("rest_frac") is None:
        return {}
    out = {"waterfall/rest_frac": float(waterfall["rest_frac"])}
    if isinstance(waterfall.get("mfu_frac"), (int, float)):
        out["waterfall/mfu_frac"] = float(waterfall["mfu_frac"])
    for share in waterfall["shares"]:
        key = f"waterfall/{share['kind']}_frac"
        out[key] = max(out.get(key, 0.0), float(share["share_frac"]))
    return out


def finding_impacts(findings: list) -> dict:
    """finding/<kind>_impact_ms_per_step and _gpu_hours_per_day for every kind
    diagnose reports (diagnose/analysis/detectors/finding_kinds.py): the worst finding's, 0
    when the run has none (so a fixed cause charts as 0, not as a missing point)."""
    from diagnose.analysis.detectors import finding_kinds
    out = {f"finding/{kind}_{what}": 0.0 for kind in finding_kinds.names()
           for what in ("impact_ms_per_step", "gpu_hours_per_day")}
    for f in findings:
        for what, value in (("impact_ms_per_step", f.get("impact_ms_per_step")),
                            ("gpu_hours_per_day", (f.get("metrics") or {}).get("gpu_hours_per_day"))):
            key = f"finding/{f.get('kind')}_{what}"
            if key in out and isinstance(value, (int, float)) and value == value:
                out[key] = max(out[key], float(value))
    return out


NOTE_TAG = "mlflow.note.content"  # the run's Description in MLflow's overview
NOTE_MARK = "**diagnose**"        # a note starting so is ours to rewrite; a user's own is kept
TOP_FINDINGS = 3


def overview_note(run, findings: list, summary: dict) -> str:
    """Markdown for the run's Description: layout, world size, step time, top findings."""
    manifest = run.manifest or {}
    step = summary.get("summary/step_time_median_ms")
    lines = [f"{NOTE_MARK}: {run.world_size} ranks, layout {layout_text(manifest.get('layout'))}"
             + (f"; step {step:.1f} ms (median rank, steady steps)" if step is not None else ""), ""]
    serious = [f for f in findings if f.get("severity") != "info"][:TOP_FINDINGS]
    if serious:
        lines.append("Top findings (report.html in Artifacts has the evidence):")
        for i, f in enumerate(serious, 1):
            ranks = ",".join(map(str, f.get("ranks") or [])) or "-"
            lines.append(f"{i}. **{f.get('severity')}** {f.get('kind')} (ranks {ranks}, "
                         f"{float(f.get('impact_ms_per_step') or 0):.1f} ms/step): {f.get('title', '')}")
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
        if kind not in worst or SEVERITY_RANK.get(f.get("severity"), 3) < SEVERITY_RANK.get(worst[kind].get("severity"), 3):
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
        client.log_batch(run_id, tags=items[i:i + 100])


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
        client.set_terminated(run_id, status,
                              end_time=int(end_ns // 1_000_000) if isinstance(end_ns, int) else None)
    return run_id


def experiment_link(root: str, host: str, port: int) -> str:
    """The UI's page of the diagnose experiment in MLflow's model-training view.
    MLflow 3 opens an experiment in its GenAI view unless the URL's
    `workflowType` says otherwise (or the browser stored a choice); MLflow 2
    has one view and ignores the parameter."""
    base = f"http://{host}:{port}/#/experiments"
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_uri(root)
    experiment = None
    if not uri.startswith("sqlite:///") or os.path.exists(uri[len("sqlite:///"):]):
        try:
            _prepare_mlflow()
            from mlflow.tracking import MlflowClient
            experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT)
        except Exception:
            experiment = None
    where = f"/{experiment.experiment_id}" if experiment is not None else ""
    return f"{base}{where}?workflowType=machine_learning"


def ui_command(root: str, port: int, host: str = "127.0.0.1", python: str | None = None) -> list:
    """The MLflow UI over the same store as log_run uses for runs under root."""
    import sys
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_uri(root)
    return [python or sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
            "--artifacts-destination", os.path.abspath(os.path.join(root, ARTIFACTS_DIR)),
            "--host", host, "--port", str(port), "--workers", "1"]

