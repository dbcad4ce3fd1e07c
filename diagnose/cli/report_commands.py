"""Command bodies for `diagnose report` and `diagnose ui`, and a rich progress
display for the long parts (loading, analysing, building figures) shown only on
a terminal."""

import contextlib
import os
import sys

from diagnose.errors import UserError


@contextlib.contextmanager
def progress_steps(description: str, total: int):
    """Yields advance(label): one call per finished part. A bar on a terminal
    (stderr), nothing otherwise, so logs and tests stay clean."""
    if not sys.stderr.isatty():
        yield lambda label=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)

        def advance(label=None):
            progress.update(task, advance=1, description=f"{description}: {label}" if label else description)

        yield advance


def parse_steps(text: str | None):
    if not text:
        return None
    try:
        first, _, last = text.partition("-")
        first = int(first)
        last = int(last) if last else first
    except ValueError:
        raise UserError(f"--steps {text!r}: expected FIRST-LAST, e.g. 10-12") from None
    if last < first:
        raise UserError(f"--steps {text!r}: the last step is before the first")
    return first, last


def report_command(run_dir: str, out: str | None = None, steps: str | None = None) -> str:
    from dashboards.report_page import VIEWS, write_report
    from diagnose.analysis.findings.run_detectors import read_or_analyze
    from diagnose.analysis.load.loader import load

    window = parse_steps(steps)
    with progress_steps("report", len(VIEWS) + 3) as advance:
        run = load(run_dir)
        advance("loaded")
        if window is not None:
            recorded = run.steps()["step"]
            if not ((recorded >= window[0]) & (recorded <= window[1])).any():
                span = f"{recorded.min()}-{recorded.max()}" if len(recorded) else "none"
                raise UserError(f"--steps {steps}: no such step recorded (recorded: {span})")
        findings = read_or_analyze(run)  # findings.json, or the analysis of a run that has none
        advance("findings")
        try:
            path = write_report(run, findings, path=out, window_steps=window, progress=advance)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        advance("written")
    return path


def ui_command(runs_root: str, port: int, host: str = "127.0.0.1") -> int:
    """Replace this process with the MLflow UI over the tracking store of runs_root."""
    from diagnose.exporters.mlflow_store import experiment_link
    from diagnose.exporters.mlflow_store import ui_command as build

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://", "databricks")):
        print(f"diagnose: runs are tracked on {uri}; open that server's UI")
        return 0
    root = os.path.abspath(runs_root)
    if not uri and not os.path.isdir(root):
        raise UserError(f"runs root {runs_root} does not exist (runs go to runs/ by default; pass --runs-root DIR)")
    if not uri and not os.path.exists(os.path.join(root, "mlflow.db")):
        print(f"diagnose: no tracked runs in {root} yet (no mlflow.db); starting an empty UI", file=sys.stderr)
    command = build(root, port, host)
    env = dict(os.environ)
    # MLflow's job runner (GenAI evaluation jobs) starts a dozen worker processes: not needed here.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    print(
        f"diagnose: MLflow UI on http://{host}:{port} (store {command[command.index('--backend-store-uri') + 1]}); "
        "Ctrl-C stops it",
        flush=True,
    )
    print(f"diagnose: the runs, in MLflow's model-training view: {experiment_link(root, host, port)}", flush=True)
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 0  # not reached
