"""A run over the event budget analyzed window by window (`diagnose analyze
--every-step`): its steps cut into windows that fit the budget
(event_budget.windows), each loaded and analyzed alone, one after the other,
so that memory is bounded by one window, and the findings merged.

Merging: the windows' findings of one kind, ranks, stage and callsite are one
finding. Its text and evidence are the window's where it weighed most (its
severity, then its impact); its impact is the run's average saving per step:
each window's impact times its steps, summed over the windows that found it,
over all the windows' steps (a window without it saves nothing there). A cause
not found in every window says in which steps it was (its title, and metrics
`windows_found`, `steps_found_frac`), and its severity is the lesser of its
heaviest window's and the one its average impact gives on the run's median
step; a hang or a crash keeps its own (critical: the job did not end). What
stays per window: the what-if figures (the last window's are written, with its
steps), and the report, merged trace and MLflow run, which are not made.

The tables: analysis/steps.parquet and breakdown.parquet of every step; the
collectives and arrivals one pair of files per window,
analysis/windows/steps-FIRST-LAST/{collectives,arrivals}.parquet (one file for
the run would hold every collective of it at once, or need one schema for
every window: a column of one window may have gaps where another has none).
Times are on the first window's origin (ns since its first event); a window's
rows outside any step (read by every window) are in the first window's only.
"""

import copy
import gc
import os

import pandas as pd

from diagnose import rundir
from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.detectors.finding_record import SEVERITY_ORDER, severity_for, sort_findings
from diagnose.analysis.findings.run_detectors import detect, write_json
from diagnose.analysis.load.loader import load, stderr_warning
from diagnose.analysis.load.rank_pass import in_rank_order
from diagnose.rundir import storage

WINDOWS = "windows"  # under analysis/: a folder per window


def analyze_windows(run_dirs: list, windows: list, warn=None, on_rank=None, engine=None):
    """Analyze the run over `windows` ((first step, last step), in step order);
    write analysis/ and findings.json. Returns (the last window's run, findings)."""
    said, warn = set(), warn or stderr_warning

    def warn_once(message):  # every window reads every rank: its bad parts once
        if message not in said:
            said.add(message)
            warn(message)

    out = os.path.join(rundir.require_run_dir(str(run_dirs[0])), rundir.ANALYSIS)
    for stale in ("collectives.parquet", "arrivals.parquet", WINDOWS):  # an earlier analysis's
        storage.remove(os.path.join(out, stale))
    per_window, step_tables, origin_ns = [], {"steps": [], "breakdown": []}, None
    for index, (first, last) in enumerate(windows):
        run = load(
            *run_dirs,
            warn=warn_once,
            on_rank=on_rank,
            engine=engine,
            window={"from_step": first, "last_step": last, "warmup": index == 0},
        )
        origin_ns = run.t0_ns if origin_ns is None else origin_ns
        shift_ns = run.t0_ns - origin_ns
        per_window.append(((first, last), detect(run)))
        for name in step_tables:
            step_tables[name].append(_shifted(getattr(run, name)(), shift_ns))
        folder = os.path.join(out, WINDOWS, f"steps-{first}-{last}")
        storage.makedirs(folder)
        for name, table in (("collectives", run.collectives()), ("arrivals", run.arrivals())):
            rows = table if index == 0 else table[table["step"] >= 0]
            _shifted(rows, shift_ns).to_parquet(os.path.join(folder, f"{name}.parquet"), index=False)
        if index < len(windows) - 1:
            del run, table, rows  # one window's tables at a time
            gc.collect()
    for name, frames in step_tables.items():  # in rank order, as a whole run's (a rank's windows in step order)
        step_tables[name] = in_rank_order(frames, None, ["rank"])
        step_tables[name].to_parquet(os.path.join(out, f"{name}.parquet"), index=False)
    steps = step_tables["steps"]
    findings = merge(per_window, float(steps["dur_ms"].median()) if len(steps) else 0.0)
    write_json(os.path.join(run.root, rundir.FINDINGS), findings)
    figures = os.path.join(run.root, rundir.STEP_FIGURES)
    if run.step_figures is not None:
        write_json(figures, dict(run.step_figures, window=list(windows[-1])))
    else:
        storage.remove(figures)
    return run, findings


def merge(per_window: list, step_ms: float) -> list[dict]:
    """per_window: [((first step, last step), findings)], every window analyzed, in
    step order; step_ms: the run's median step time. The merged findings, sorted."""
    total = sum(last - first + 1 for (first, last), _ in per_window)
    groups: dict = {}
    for span, findings in per_window:
        for finding in findings:
            key = (finding["kind"], tuple(finding["ranks"]), finding.get("stage"), finding.get("callsite"))
            groups.setdefault(key, []).append((span, finding))
    merged = []
    for found in groups.values():
        _, top = min(
            found,
            key=lambda item: (SEVERITY_ORDER.get(item[1]["severity"], 3), -item[1].get("impact_ms_per_step", 0.0)),
        )
        finding = copy.deepcopy(top)
        impact = sum(f.get("impact_ms_per_step", 0.0) * (b - a + 1) for (a, b), f in found) / max(total, 1)
        finding["impact_ms_per_step"] = round(impact, 3)
        finding["metrics"]["impact_ms_per_step"] = round(impact, 4)
        if len(found) < len(per_window):
            spans = ", ".join(f"{a}-{b}" for (a, b), _ in found)
            finding["title"] += f" (steps {spans} of {per_window[0][0][0]}-{per_window[-1][0][1]})"
            finding["metrics"]["windows_found"] = spans
            finding["metrics"]["steps_found_frac"] = round(sum(b - a + 1 for (a, b), _ in found) / total, 4)
            if not finding_kinds.job_stopped(finding["kind"]) and step_ms > 0:
                by_impact = severity_for(impact / step_ms)
                finding["severity"] = max(finding["severity"], by_impact, key=lambda s: SEVERITY_ORDER.get(s, 3))
        merged.append(finding)
    return sort_findings(merged)


def _shifted(frame: pd.DataFrame, shift_ns: int) -> pd.DataFrame:
    """frame's times (its *_ns columns) moved by shift_ns."""
    if not shift_ns or frame.empty:
        return frame
    return frame.assign(**{c: frame[c] + shift_ns for c in frame.columns if c.endswith("_ns")})
