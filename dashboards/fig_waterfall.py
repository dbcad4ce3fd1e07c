"""Where the step goes: MFU, each finding's share of the step with overlaps
between findings counted once, and the rest no finding explains, adding up to the
whole step (diagnose/analysis/findings/step_waterfall.py). One chart a team lead reads as
"this much of every step is model math, this much each cause, this much unknown"."""

import plotly.graph_objects as go

from dashboards.view_parts import LAYOUT, Section, esc
from diagnose.analysis.detectors import finding_kinds

MFU_COLOR, FINDING_COLOR, REST_COLOR, TOTAL_COLOR = "#41ab5d", "#d6604d", "#bdbdbd", "#636363"


def _label(share: dict) -> str:
    where = finding_kinds.where(share, callsite=False)
    return f"{share['kind']}" + (f" ({where})" if where else "")


def figure(waterfall: dict) -> go.Figure | None:
    """A plotly waterfall of the step in % (None: no waterfall in the step figures)."""
    if not waterfall or waterfall.get("rest_frac") is None:
        return None
    labels, values, colors, hover = [], [], [], []
    if isinstance(waterfall.get("mfu_frac"), (int, float)):
        labels.append("MFU (model FLOPs at peak)")
        values.append(100 * waterfall["mfu_frac"])
        colors.append(MFU_COLOR)
        hover.append("the model's FLOPs per step at the GPU's peak rate, as a share of the step")
    for share in waterfall["shares"]:
        labels.append(esc(_label(share)))
        values.append(100 * share["share_frac"])
        colors.append(FINDING_COLOR)
        hover.append(f"saves {share['impact_ms']:.1f} ms per step on its own")
    labels.append(esc(waterfall["rest_label"]))
    values.append(100 * waterfall["rest_frac"])
    colors.append(REST_COLOR)
    hover.append("the step no finding explains (and, without MFU, the model math itself)")
    fig = go.Figure(
        go.Waterfall(
            orientation="v",
            x=labels + ["step"],
            y=values + [0.0],
            measure=["relative"] * len(values) + ["total"],
            text=[f"{v:.1f}%" for v in values] + ["100%"],
            textposition="outside",
            hovertext=hover + ["the measured step"],
            hovertemplate="%{x}: %{y:.1f}%<br>%{hovertext}<extra></extra>",
            connector={"line": {"color": "#cccccc"}},
            increasing={"marker": {"color": FINDING_COLOR}},
            totals={"marker": {"color": TOTAL_COLOR}},
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        height=380,
        yaxis_title="share of the step, %",
        yaxis_range=[0, 112],
        showlegend=False,
        margin=dict(l=60, r=20, t=30, b=120),
    )
    return fig


def build(run, ctx) -> list:
    figures = run.step_figures or {}
    waterfall = figures.get("waterfall")
    fig = figure(waterfall)
    if fig is None:
        return []
    scale = waterfall.get("overlap_scale")
    description = (
        f"<p>Where a step of {waterfall['step_ms']:.1f} ms goes: "
        + (
            "the model's FLOPs at the GPU's peak (MFU), "
            if waterfall.get("mfu_frac") is not None
            else "(no MFU: no peak known for this device; the model math is in the rest) "
        )
        + "each finding's share, and what no finding explains. Findings can claim the same time (a "
        "straggler and the stage it slows): their fixes are replayed together and the shares scaled so "
        "that time counts once"
        + (f" (here x{scale:.2f})" if isinstance(scale, (int, float)) and scale < 0.995 else "")
        + ". The formula: docs/analysis.md.</p>"
    )
    return [Section("waterfall", "Where the step goes", fig, description)]
