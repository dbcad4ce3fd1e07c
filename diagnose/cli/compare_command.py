"""`diagnose compare RUN_A RUN_B [RUN ...]`: the command body, the terminal tables
and the optional HTML page of what diagnose.analysis.compare.run_compare found changed
between two runs, and diagnose.analysis.compare.run_scaling's table when the runs differ
in world size or layout (always with three or more)."""

import json
import math

from diagnose.analysis.compare.run_compare import compare, finding_key, summarize
from diagnose.analysis.compare.run_scaling import scaling
from diagnose.cli.report_commands import progress_steps
from diagnose.errors import UserError

REGRESSION_EXIT = 3  # --fail-on found a regression (2: misuse, as every command)


def compare_command(
    run_a: str,
    run_b: str,
    html: str | None = None,
    as_json: bool = False,
    more: list | None = None,
    checks: list | None = None,
) -> int:
    runs = [run_a, run_b, *(more or [])]
    if html and len(runs) > 2:
        raise UserError("--html draws two runs; with more, the scaling table is printed (and --json)")
    with progress_steps("compare", len(runs) + 1) as advance:
        result = compare_runs(runs, html=html, progress=advance, checks=checks)
        logged = _track(result, runs)
    # a CI gate: exit 3 (2 is misuse) when a check found a regression
    status = REGRESSION_EXIT if any(v["regression"] for v in result.get("gate", [])) else 0
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return status
    if "a" in result:
        print_comparison(result)
    if result.get("scaling"):
        print_scaling(result["scaling"])
    if html:
        print(f"diagnose: comparison written to {result['html']}")
    if logged:
        print(f"diagnose: comparison logged to the later run's MLflow run {logged} (artifacts compare/)")
    for verdict in result.get("gate", []):
        print(f"{'REGRESSION' if verdict['regression'] else 'ok'}: {verdict['line']}")
    return status


def _track(result: dict, runs: list) -> str | None:
    """Log the comparison to the later run in MLflow (diagnose/exporters/mlflow_compare.py);
    a tracking failure is a warning, the comparison stands."""
    import sys
    import tempfile

    from diagnose.exporters import mlflow_compare

    if not mlflow_compare.tracking.enabled():
        return None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            page = result.get("html")
            if not page and "a" in result:
                from dashboards.compare_page import write_compare

                page = write_compare(result, f"{tmp}/compare.html")
            return mlflow_compare.log_compare(result, runs, page)
    except Exception as exc:
        print(f"diagnose: warning: comparison not logged to MLflow: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def print_scaling(rows: list, out=None) -> None:
    from rich.table import Table
    from rich.text import Text

    from diagnose.cli.console import console

    out = out or console()
    unit = rows[0]["unit"]
    per = "tokens" if unit == "tokens" else "samples" if unit == "samples" else "steps"
    table = Table(title=f"Scaling against the smallest run ({unit})")
    for column in ("run", "world size", "layout", "step", f"{per}/s per rank", "efficiency", "what grew"):
        table.add_column(column, justify="right" if column in ("world size", "step", "efficiency") else "left")
    for row in rows:
        grew = ", ".join(f"{label} +{ms:.1f} ms" for _, label, ms in row["grew"]) or "-"
        rate = row["per_rank_per_s"]
        table.add_row(
            Text(str(row["name"])),
            str(row["world_size"]),
            Text(str(row["layout"])),
            _fmt(row["step_ms"]),
            "-" if rate is None else f"{rate:,.1f}",
            "-" if row["efficiency"] is None else f"{row['efficiency']:.2f}",
            Text(grew),
        )
    out.print(table)


def _fmt(value, unit=" ms") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1f}{unit}"


def _fmt_ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_comparison(result: dict, out=None) -> None:
    from rich.table import Table
    from rich.text import Text

    from diagnose.cli.console import console, kind_text

    out = out or console()
    a, b, st = result["a"], result["b"], result["step_time"]
    out.print(Text(f"A: {a['name']}  ({a['root']})\nB: {b['name']}  ({b['root']})"))
    window = result.get("unit") == "window"  # traces without steps: one window per rank, not a step
    for side, run in (("A", a), ("B", b)):
        if run.get("window_note"):
            out.print(Text(f"{side}, {run['window_note']}"))
    if window:
        out.print(Text("the 'step' figures below are per window, not per training step"))
    table = Table(title="Window span (each rank's first kernel to its last)" if window else "Step time (steady steps)")
    for column in ("", "A", "B", "change", "B/A"):
        table.add_column(column, justify="right" if column else "left")
    delta = st["delta_ms"]
    table.add_row(
        "median over ranks",
        _fmt(st["a_ms"]),
        _fmt(st["b_ms"]),
        "-" if delta is None else f"{delta:+.1f} ms",
        _fmt_ratio(st["ratio"]),
    )
    mean_delta = None if st["mean_a_ms"] is None or st["mean_b_ms"] is None else st["mean_b_ms"] - st["mean_a_ms"]
    table.add_row(
        "mean over ranks",
        _fmt(st["mean_a_ms"]),
        _fmt(st["mean_b_ms"]),
        "-" if mean_delta is None else f"{mean_delta:+.1f} ms",
        _fmt_ratio(st["mean_ratio"]),
    )
    slow_delta = (
        None if st["slowest_a_ms"] is None or st["slowest_b_ms"] is None else st["slowest_b_ms"] - st["slowest_a_ms"]
    )
    table.add_row(
        "slowest rank (median)",
        _fmt(st["slowest_a_ms"]),
        _fmt(st["slowest_b_ms"]),
        "-" if slow_delta is None else f"{slow_delta:+.1f} ms",
        _fmt_ratio(st["slowest_ratio"]),
    )
    out.print(table)
    table = Table(title=f"Breakdown per phase, ms/{'window' if window else 'step'} (steady mean over ranks)")
    for column in ("phase", "A", "B", "change", "B/A"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in result["parts"]:
        table.add_row(
            p["label"], _fmt(p["a_ms"], ""), _fmt(p["b_ms"], ""), f"{p['delta_ms']:+.1f}", _fmt_ratio(p["ratio"])
        )
    out.print(table)
    if result.get("device"):
        print_device(result["device"], "window" if window else "step", out)
    f = result["findings"]
    table = Table(title="Findings (warning and critical)")
    for column in ("", "severity", "kind", "ranks", "finding"):
        table.add_column(column)

    def row(mark, finding, severity=None):
        table.add_row(
            mark,
            severity or finding.get("severity", ""),
            kind_text(finding.get("kind", "")),
            ",".join(map(str, finding.get("ranks") or [])) or "-",
            Text(str(finding.get("title", ""))),
        )

    for finding in f["gained"]:
        row("gained", finding)
    for finding in f["lost"]:
        row("lost", finding)
    for pair in f["changed"]:
        row("changed", pair["b"], pair["change"])
    if not (f["gained"] or f["lost"] or f["changed"]):
        table.add_row("same", "", "", "", Text("no warning or critical finding gained or lost"))
    out.print(table)
    if f["info_gained"] or f["info_lost"]:
        out.print(Text(f"info-level findings: {len(f['info_gained'])} gained, {len(f['info_lost'])} lost"))


def print_device(device: dict, unit: str, out) -> None:
    """run_compare's device figures (diagnose/analysis/compare/device_figures.py): summed over ranks."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"GPU time, ms/{unit} summed over ranks (devices)")
    for column in ("", "A", "B", "change"):
        table.add_column(column, justify="right" if column else "left")
    for row in device["figures"]:
        table.add_row(row["label"], _fmt(row["a_ms"], ""), _fmt(row["b_ms"], ""), f"{row['delta_ms']:+.2f}")
    out.print(table)
    table = Table(title=f"Kernels whose time changed most, ms/{unit} summed over ranks")
    for column in ("kernel", "A", "B", "change"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for row in device["kernels"]:
        table.add_row(Text(row["family"]), _fmt(row["a_ms"], ""), _fmt(row["b_ms"], ""), f"{row['delta_ms']:+.2f}")
    out.print(table)


def compare_runs(runs: list, html: str | None = None, progress=None, checks: list | None = None) -> dict:
    from diagnose.analysis.findings.run_detectors import read_or_analyze
    from diagnose.analysis.load.loader import load

    summaries = []
    for i, run_dir in enumerate(runs):
        if progress:
            progress(f"loading {chr(ord('A') + i) if i < 26 else i}")
        run = load(run_dir)
        summaries.append(summarize(run, read_or_analyze(run)))  # a run never analyzed is analyzed here
    result = compare(*summaries) if len(summaries) == 2 else {}
    if checks:
        from diagnose.analysis.compare.regression_gate import gate

        result["gate"] = gate(summaries[0], summaries[1], checks, finding_key)
    if len(summaries) > 2 or len({(s["world_size"], s["layout"]) for s in summaries}) > 1:
        result["scaling"] = scaling(summaries)
    if progress:
        progress("writing HTML" if html else "tracking")
    if html:
        from dashboards.compare_page import write_compare

        result["html"] = write_compare(result, html)
    return result
