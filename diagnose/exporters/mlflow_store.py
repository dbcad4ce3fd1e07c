"""Where diagnose's MLflow runs live (docs/outputs.md, "Tracking"): the store
(`sqlite:///<runs root>/mlflow.db`, artifacts under `<runs root>/mlartifacts`,
unless MLFLOW_TRACKING_URI is set), the "diagnose" experiment, the MLflow run
of a run dir (its id kept in `<run>/mlflow_run_id`) with the job's params, and
the MLflow UI over that store. DIAGNOSE_TRACKING=off turns tracking off.
"""

import logging
import os
import pathlib
import threading

from collectors.part_writer import atomic_write_bytes
from diagnose import rundir

EXPERIMENT = "diagnose"
RUN_ID_FILE = "mlflow_run_id"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
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
    db = uri[len("sqlite:///") :]
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
    tags = {
        "diagnose.run_dir": os.path.abspath(run_dir),
        "mlflow.source.name": "diagnose",
        "mlflow.source.type": "LOCAL",
    }
    run = client.create_run(
        experiment_id(client, run_dir),
        start_time=int(start // 1_000_000) if isinstance(start, int) else None,
        tags=tags,
        run_name=_run_name(run_dir, manifest),
    )
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
        client.log_batch(run_id, params=new[i : i + 100])


def experiment_link(root: str, host: str, port: int) -> str:
    """The UI's page of the diagnose experiment in MLflow's model-training view.
    MLflow 3 opens an experiment in its GenAI view unless the URL's
    `workflowType` says otherwise (or the browser stored a choice); MLflow 2
    has one view and ignores the parameter."""
    base = f"http://{host}:{port}/#/experiments"
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_uri(root)
    experiment = None
    if not uri.startswith("sqlite:///") or os.path.exists(uri[len("sqlite:///") :]):
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
    return [
        python or sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--artifacts-destination",
        os.path.abspath(os.path.join(root, ARTIFACTS_DIR)),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
