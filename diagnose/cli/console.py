"""Terminal output: the per-rank breakdown and the findings table (rich)."""

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.findings.gpu_hours import gpu_hour_cost, worth_line
from diagnose.analysis.tables import trace_windows
from diagnose.analysis.tables.breakdown import PART_COLUMNS


def console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=False, width=160)


def print_breakdown(run, out: Console | None = None) -> None:
    out = out or console()
    breakdown = run.breakdown()
    steady = run.steady_steps()
    if breakdown.empty or not steady:
        out.print("no completed steps recorded")
        return
    per_rank = breakdown[breakdown["step"].isin(steady)].groupby("rank")[["step_ms", *PART_COLUMNS]].mean()
    windowed = trace_windows.window_ranks(run.steps())
    title = (
        "Breakdown per window, ms (the trace marks no steps)"
        if windowed
        else f"Steady-state step breakdown, ms/step (steps {steady[0]}-{steady[-1]})"
    )
    table = Table(title=title)
    table.add_column("rank", justify="right")
    for column in ("step_ms", *PART_COLUMNS):
        table.add_column("window" if windowed and column == "step_ms" else column.removesuffix("_ms"), justify="right")
    for rank, row in per_rank.iterrows():
        table.add_row(str(rank), *(f"{row[c]:.1f}" for c in ("step_ms", *PART_COLUMNS)))
    out.print(table)
    if windowed:
        out.print(escape(trace_windows.note(windowed, len(run.ranks))))


def print_findings(findings: list[dict], out: Console | None = None) -> None:
    out = out or console()
    if not findings:
        out.print("findings: none")
        return
    line = worth_line(findings, gpu_hour_cost())
    if line:
        out.print(line, markup=False)
    table = Table(title="Findings (by impact)")
    for column in ("severity", "kind", "impact ms/step", "GPU-h/day", "ranks", "stage", "callsite", "finding"):
        table.add_column(column)
    for f in findings:
        ranks = ",".join(map(str, f.get("ranks") or [])) or "-"
        # finding text is data (an exception's message, a path): never rich markup
        hours = (f.get("metrics") or {}).get("gpu_hours_per_day")
        table.add_row(
            f["severity"],
            kind_text(f["kind"]),
            f"{f.get('impact_ms_per_step', 0):.1f}",
            "-" if hours is None else f"{hours:,.1f}",
            ranks,
            "-" if f.get("stage") is None else str(f["stage"]),
            escape(f.get("callsite") or "-"),
            f"{escape(f['title'])}\n[dim]{escape(f['recommendation'])}[/dim]",
            end_section=True,
        )
    out.print(table, markup=True)


def kind_text(kind) -> str:
    """A finding's kind as the tables show it (rich markup): its name, its label under it."""
    return f"{escape(str(kind))}\n[dim]{escape(finding_kinds.label(kind))}[/dim]"


def print_step_figures(figures: dict | None, out: Console | None = None) -> None:
    """The measured step beside the replayed and ideal ones (diagnose/analysis/replay/whatif.py)."""
    if not figures or figures.get("ideal_step_ms") is None:
        return
    out = out or console()
    window = figures.get("window")  # --every-step: the last window's figures
    recorded = figures.get("recorded_step_ms")
    against = "" if recorded is None else f", as recorded {recorded:.1f} ms"
    if figures.get("replay_lanes") == "device":
        against += " on the GPUs"
    out.print(
        ("" if not window else f"steps {window[0]}-{window[1]}: ")
        + f"step: measured {figures['measured_step_ms']:.1f} ms (median rank), replayed "
        f"{figures['replay_step_ms']:.1f} ms (job{against}), ideal {figures['ideal_step_ms']:.1f} ms "
        "(every rank's compute at most its stage's median); impacts are what-if savings"
        + ("" if figures.get("impact_from_replay") else " where the replay holds: here it does not"),
        markup=False,
    )
