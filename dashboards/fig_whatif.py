"""What a fix buys: the measured step beside the replayed one, the ideal one, and
per finding the step time with its cause removed (diagnose/analysis/replay/whatif.py).
A bar per figure, so the user reads "fixing this gives that step" off one axis."""

import plotly.graph_objects as go

from dashboards.view_parts import LAYOUT, SEVERITY_COLORS, Section, esc, fmt_ms
from diagnose.analysis.detectors import finding_kinds

STEP_COLORS = {"measured": "#636363", "replayed": "#969696", "ideal": "#41ab5d"}
MAX_FINDINGS = 12


def _finding_label(f: dict) -> str:
    where = finding_kinds.where(f)
    return f"{f.get('kind')}" + (f" ({where})" if where else "")


def bars(figures: dict | None, findings: list) -> list[tuple[str, float, str, str]]:
    """(label HTML, step ms, colour, hover HTML) per bar, top to bottom (plotly reads
    both as HTML: trace strings in them are escaped)."""
    figures = figures or {}
    rows = []
    for key, label, what in (
        ("measured_step_ms", "measured", "median rank's steady step, as recorded"),
        ("replay_step_ms", "replayed", "the dependency model replayed with the recorded durations"),
        ("ideal_step_ms", "ideal", "every rank's compute at most its stage's median"),
    ):
        if isinstance(figures.get(key), (int, float)):
            rows.append((label, float(figures[key]), STEP_COLORS[label], what))
    for f in findings[:MAX_FINDINGS]:
        m = f.get("metrics") or {}
        if not isinstance(m.get("whatif_step_ms"), (int, float)):
            continue
        saving = m.get("whatif_saving_ms_per_step", 0.0)
        entry = finding_kinds.of(f.get("kind"))
        removed = f"<br>the what-if: {esc(entry.whatif)}" if entry and entry.whatif else ""
        rows.append(
            (
                esc(f"without {_finding_label(f)}"),
                float(m["whatif_step_ms"]),
                SEVERITY_COLORS.get(f.get("severity"), "#999999"),
                f"{esc(f.get('title', ''))}{removed}<br>saves {saving:.1f} ms per step",
            )
        )
    return rows


def build(run, ctx) -> list:
    rows = bars(run.step_figures, ctx.findings)
    if not any(label.startswith("without") for label, *_ in rows):
        return []
    labels = [r[0] for r in rows][::-1]  # plotly draws the first bar at the bottom
    fig = go.Figure(
        go.Bar(
            x=[r[1] for r in rows][::-1],
            y=labels,
            orientation="h",
            marker_color=[r[2] for r in rows][::-1],
            text=[f"{r[1]:.1f} ms" for r in rows][::-1],
            textposition="auto",
            hovertext=[r[3] for r in rows][::-1],
            hovertemplate="%{y}: %{x:.1f} ms<br>%{hovertext}<extra></extra>",
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        height=120 + 32 * len(rows), xaxis_title="step time, ms", showlegend=False, margin=dict(l=260, r=20, t=30, b=45)
    )
    figures = run.step_figures or {}
    trusted = figures.get("impact_from_replay")
    error = figures.get("replay_max_step_error_frac")
    description = (
        "<p>The step time with each finding's cause removed, replayed through the run's dependency "
        "model (each rank's order of work, collectives that start when their last member arrives, "
        "sends that meet their receives), beside the measured step and the ideal one. A finding's "
        "impact is the replayed step minus its bar. "
        + (
            f"The replay gives the recorded steps back within {error:.1%}, so impacts are these savings. "
            if trusted and isinstance(error, (int, float))
            else f"The replay does not hold on this run ({esc(figures.get('why', 'its error is over 5%'))}): "
            "impacts are the detectors' own estimates. "
        )
        + "The model, its assumptions and where it is wrong: docs/analysis.md.</p>"
    )
    notes = (
        [
            f"Measured step {esc(fmt_ms(figures['measured_step_ms']))} is the median rank's; the "
            "replayed and what-if steps are the job's (its last rank)."
        ]
        if "measured_step_ms" in figures
        else []
    )
    return [Section("whatif", "What a fix saves (what-if replay)", fig, description, notes=notes)]
