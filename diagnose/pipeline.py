"""After a run (or on demand): load, analyze, export, report, track."""
import os

from diagnose import rundir
from diagnose.analyze import write_analysis
from diagnose.export_chrome import write_chrome_trace
from diagnose.loader import load


def analyze_run(run_dirs, outputs: bool = True, warn=None):
    """Analyze and write findings.json and the tables; with `outputs`, also the
    merged trace, report.html and the MLflow run. Returns (run, findings)."""
    run = load(*run_dirs, warn=warn)
    findings = write_analysis(run)
    if outputs:
        write_chrome_trace(run, os.path.join(run.root, rundir.CHROME_TRACE))
        for step in _optional_outputs():
            try:
                step(run, findings)
            except Exception as exc:  # a report or tracker failure must not lose the analysis
                run.warn(f"{step.__module__}: {type(exc).__name__}: {exc}")
    return run, findings


def _optional_outputs():
    steps = []
    try:
        from dashboards.report import write_report
        steps.append(lambda run, findings: write_report(run, findings))
    except ImportError:
        pass
    try:
        from diagnose.tracking import log_run
        steps.append(lambda run, findings: log_run(run, findings))
    except ImportError:
        pass
    return steps
