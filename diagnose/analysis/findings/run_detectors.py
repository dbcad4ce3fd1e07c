"""The analysis step: every detector over a loaded run (`analyze`, the API's
`diagnose.analyze`), and analysis/*.parquet and findings.json written from it
(`write_analysis`, what `diagnose analyze` does)."""

import functools
import importlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

from diagnose import rundir
from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.detectors.finding_record import sort_findings, with_severity
from diagnose.analysis.findings import finding_impacts
from diagnose.analysis.findings.gpu_hours import gpu_hours_per_day
from diagnose.analysis.tables import device_collectives
from diagnose.errors import NotAnalyzed
from diagnose.rundir import storage


class Context:
    """What detectors read: the run and its steady-state tables, computed once."""

    def __init__(self, run):
        self.run = run
        self.steps = run.steps()
        self.steady = run.steady_steps()
        breakdown = run.breakdown()
        self.breakdown = breakdown[breakdown["step"].isin(self.steady)] if len(breakdown) else breakdown
        self.step_ms = float(self.breakdown["step_ms"].median()) if len(self.breakdown) else 0.0
        # Collectives seen on the device (NCCL kernels, or a live run's CUDA events):
        # waits and arrivals are device time. Device idle and overlap need the
        # kernels themselves, so those detectors judge the steady steps kernels cover.
        self.on_device = device_collectives.on_device(run.arrivals())
        self.kernel_steady = device_collectives.kernel_steps(run, self.steady) if self.on_device else []

    @functools.cached_property
    def kernel_covered(self) -> list:
        """The steady steps kernels cover, with or without device collectives (a
        one-GPU trace has none): for detectors that read kernels alone."""
        return self.kernel_steady or device_collectives.kernel_steps(self.run, self.steady)

    def relpath(self, callsite: str) -> str:
        if not callsite:
            return callsite
        path, _, line = callsite.rpartition(":")
        try:
            rel = os.path.relpath(path, self.run.cwd())
        except ValueError:
            rel = path
        return f"{path if rel.startswith('..') else rel}:{line}"


def analyze(run) -> list[dict]:
    """Run every detector over a loaded run: its findings, most severe first, which
    `run.findings` gives from then on. Writes nothing (write_analysis does)."""
    run.analyzed = detect(run)
    return run.analyzed


def read_or_analyze(run) -> list[dict]:
    """The findings of an analyzed run (run.findings), else analyze(run): for the
    commands that show a run whether or not it was analyzed (report, compare)."""
    try:
        return run.findings
    except NotAnalyzed:
        return analyze(run)


def detect(run) -> list[dict]:
    """The findings of every registered kind's detector (finding_kinds.KINDS, in its
    order), their impacts replayed and severities set; run.step_figures the replay's."""
    ctx = Context(run)
    found = []
    for kind in finding_kinds.KINDS:
        try:
            found.extend(importlib.import_module(kind.module).detect(ctx))
        except Exception as exc:  # one broken detector must not hide the others
            run.warn(f"detector {kind.name} failed: {type(exc).__name__}: {exc}")
    try:  # impact by what-if replay; the detectors' estimates stand if it cannot run
        run.step_figures = finding_impacts.apply(ctx, found)
    except Exception as exc:
        run.warn(f"what-if replay failed: {type(exc).__name__}: {exc}")
    for f in found:  # what each is worth per day of this job (gpu_hours.py: the formula)
        worth = gpu_hours_per_day(f.impact_ms_per_step, ctx.step_ms, run.world_size)
        if worth is not None:
            f.metrics["gpu_hours_per_day"] = worth
    return sort_findings([with_severity(f, ctx.step_ms).to_dict() for f in found])


def write_analysis(run) -> list[dict]:
    out = os.path.join(run.root, rundir.ANALYSIS)
    storage.makedirs(out)
    tables = {
        "steps": run.steps(),
        "breakdown": run.breakdown(),
        "collectives": run.collectives(),
        "arrivals": run.arrivals(),
    }
    # Writing Parquet is C++ that releases the GIL: on a second core it costs
    # the analysis nothing (1,024 ranks: 5-7 s of writing hidden behind the detectors).
    with ThreadPoolExecutor(max_workers=1) as pool:
        written = pool.submit(_write_tables, tables, out)
        findings = analyze(run)
        for message in written.result():
            run.warn(message)
    write_json(os.path.join(run.root, rundir.FINDINGS), findings)
    figures = os.path.join(run.root, rundir.STEP_FIGURES)
    if run.step_figures is not None:
        write_json(figures, run.step_figures)
    else:  # an earlier analysis's figures are not this one's
        storage.remove(figures)
    return findings


def write_json(path: str, value) -> None:
    """A JSON file of analysis/, where the run directory is (diagnose.rundir.storage)."""
    storage.write_bytes(path, json.dumps(value, indent=1, default=str).encode())


def _write_tables(tables: dict, out: str) -> list[str]:
    failures = []
    for name, table in tables.items():
        try:
            table.to_parquet(os.path.join(out, f"{name}.parquet"), index=False)
        except Exception as exc:
            failures.append(f"analysis/{name}.parquet not written: {type(exc).__name__}: {exc}")
    return failures
