"""After a run (or on demand): load, analyze, export, report, track."""

import contextlib
import os
import sys

from diagnose import rundir
from diagnose.analysis.findings.run_detectors import write_analysis
from diagnose.analysis.findings.window_findings import analyze_windows
from diagnose.analysis.load.event_budget import step_windows
from diagnose.analysis.load.loader import load, stderr_warning
from diagnose.exporters.chrome_trace import write_chrome_trace
from diagnose.rundir import storage

PROGRESS_MIN_RANKS = 48  # below this, reading the ranks takes a second or two: no bar


def outputs_enabled() -> bool:
    """DIAGNOSE_OUTPUTS=off: analyses write findings.json and the tables only (no
    merged trace, report or MLflow run), as --no-outputs does; for batch jobs and
    test suites that read the findings alone."""
    return os.environ.get("DIAGNOSE_OUTPUTS", "on").strip().lower() not in ("0", "off", "false", "no")


def analyze_run(run_dirs, outputs: bool = True, warn=None, engine=None, max_events=None, every_step: bool = False):
    """Analyze and write findings.json and the tables; with `outputs`, also the
    merged trace, report.html and the MLflow run. Returns (run, findings).
    engine: where the per-rank pass runs (diagnose.analysis.load.rank_pass_engines);
    max_events: the loader's event budget (diagnose.analysis.load.loader); every_step: a
    run over it is analyzed in windows of steps, one after the other, findings and
    tables only (diagnose.analysis.findings.window_findings)."""
    outputs = outputs and outputs_enabled()
    plan = step_windows(*run_dirs, max_events=max_events) if every_step else None
    if plan is not None:
        windows, message = plan
        (warn or stderr_warning)(message)
        with rank_progress(run_dirs) as on_rank:
            return analyze_windows(run_dirs, windows, warn=warn, on_rank=on_rank, engine=engine)
    with rank_progress(run_dirs) as on_rank:
        run = load(*run_dirs, warn=warn, on_rank=on_rank, engine=engine, max_events=max_events)
    findings = write_analysis(run)
    if outputs and storage.is_url(run.root):
        run.warn(
            "the merged trace, report and MLflow run are made from a local run directory only: "
            "findings.json and the tables are written at the URL"
        )
    elif outputs:
        write_chrome_trace(run, os.path.join(run.root, rundir.CHROME_TRACE))
        for step in _optional_outputs():
            try:
                step(run, findings)
            except Exception as exc:  # a report or tracker failure must not lose the analysis
                run.warn(f"{step.__module__}: {type(exc).__name__}: {exc}")
    return run, findings


@contextlib.contextmanager
def rank_progress(run_dirs):
    """on_rank(done, total) for load(): a bar over the ranks on a terminal (stderr)
    when the run has more than PROGRESS_MIN_RANKS, else nothing."""
    ranks = sum(len(rundir.rank_dirs(d)) for d in run_dirs if storage.isdir(d))
    if ranks <= PROGRESS_MIN_RANKS or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("reading ranks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("ranks", total=ranks)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def analyze_during_hang(run_dir: str) -> None:
    """The hang's diagnosis, printed and written while the job is still hung (the
    launcher's watchdog calls it); redone when the job ends. Never raises: the
    launcher must go on watching."""
    try:
        from diagnose.cli.console import print_findings

        _, findings = analyze_run([run_dir], outputs=False)
        print_findings([f for f in findings if f["kind"] == "hang"] or findings[:3])
    except Exception as exc:
        print(
            f"diagnose: the analysis during the hang failed ({type(exc).__name__}: {exc}); "
            "it is redone when the job ends",
            flush=True,
        )


def print_mfu(run) -> None:
    """MFU per rank (diagnose/analysis/tables/mfu.py), a line or two under the findings."""
    from diagnose.analysis.tables.mfu import summarize

    try:
        lines = summarize(run)["lines"]
    except Exception as exc:  # a figure missing must not lose the findings printed above
        lines = [f"MFU: not computed ({type(exc).__name__}: {exc})"]
    for line in lines:
        print(line, flush=True)


def peak_option(peak_tflops: float | None) -> None:
    """`--peak-tflops`: the peak MFU divides by, for the report and MLflow too (DIAGNOSE_PEAK_TFLOPS)."""
    from diagnose.analysis.tables.gpu_peaks import PEAK_ENV
    from diagnose.errors import UserError

    if peak_tflops is None:
        return
    if not 0 < peak_tflops < float("inf"):
        raise UserError("--peak-tflops must be a positive number of TFLOP/s")
    os.environ[PEAK_ENV] = repr(peak_tflops)


def _optional_outputs():
    steps = []
    try:
        from dashboards.report_page import write_report

        steps.append(lambda run, findings: write_report(run, findings))
    except ImportError:
        pass
    try:
        from diagnose.exporters.mlflow_run import log_run

        steps.append(lambda run, findings: log_run(run, findings))
    except ImportError:
        pass
    return steps


def finish(run_dir: str, status: int, analyze: bool, outputs: bool = True) -> int:
    """What `diagnose run` and `diagnose demo` print once the job is over: the
    analysis (unless told not to), the run directory and its outputs; returns status."""
    from diagnose.cli.console import print_findings, print_step_figures
    from diagnose.rundir import solo_ranks

    # the job is over: no process writes into a folder renamed now
    for note in solo_ranks.name_solo_ranks(run_dir):
        print(f"diagnose: {note}")
    if not rundir.rank_dirs(run_dir):  # nothing to analyze: never "findings: none"
        print(f"diagnose: no rank was recorded: {solo_ranks.why_no_rank(run_dir)}")
        analyze = False
    if analyze:
        run, findings = analyze_run([run_dir], outputs=outputs)
        print_findings(findings)
        print_step_figures(run.step_figures)
        print_mfu(run)
    print(f"diagnose: run directory {run_dir}")
    if analyze:
        for name in ("analysis/findings.json", "trace.json.gz", "report.html"):
            if os.path.exists(os.path.join(run_dir, name)):
                print(f"diagnose:   {name}")
    if os.path.exists(os.path.join(run_dir, "mlflow_run_id")):
        print(f"diagnose:   tracked in MLflow: diagnose ui --runs-root {os.path.dirname(run_dir)}")
    if status:
        print(f"diagnose: the job exited with status {status}")
    return status
