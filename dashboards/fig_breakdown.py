"""Where the step time goes: per rank (stacked bars, steady-state mean) and over
steps (stacked bars of the mean across ranks, with the slowest rank's step), on
the hosts' clocks; on a run whose collectives are NCCL kernels, also the
device's own view of each rank's step (gpu_tables.device_step_breakdown), on
the GPUs' clocks."""

import plotly.graph_objects as go

from dashboards.view_parts import COLORS, LAYOUT, Section, bin_steps, compact, esc, fmt_ms, part_columns
from diagnose.analysis.tables import device_collectives
from diagnose.analysis.tables.breakdown import PART_LABELS
from diagnose.analysis.tables.gpu_tables import DEVICE_PARTS
from diagnose.analysis.tables.step_tables import steady

HOST_CLOCK_NOTE = (
    "On this GPU run these are the hosts' parts: forward and backward are the time "
    "to queue their kernels, and the device's waiting shows as host syncs. What the "
    "GPUs did is in the next view."
)
DEVICE_LABELS = {
    "compute": "compute kernels",
    "exposed_comm": "communication, no compute",
    "other_kernel": "memory / other kernels",
    "idle": "idle (no kernel)",
}
DEVICE_COLORS = {
    "compute": COLORS["backward"],
    "exposed_comm": COLORS["exposed_comm"],
    "other_kernel": COLORS["kernel"],
    "idle": COLORS["other"],
}


def per_rank(breakdown, steady_steps) -> Section | None:
    table = steady(breakdown, steady_steps)
    if table is None or table.empty:
        return None
    parts = part_columns(table)
    means = table.groupby("rank")[["step_ms", *[f"{p}_ms" for p in parts]]].mean()
    x = [f"rank {r}" for r in means.index]
    fig = go.Figure()
    for part in parts:
        values = means[f"{part}_ms"].to_numpy()
        fig.add_trace(
            go.Bar(
                x=x,
                y=compact(values),
                name=PART_LABELS[part],
                marker_color=COLORS[part],
                hovertemplate=f"%{{x}}<br>{PART_LABELS[part]}: %{{y:.1f}} ms/step<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=compact(means["step_ms"]),
            mode="markers",
            name="step time",
            marker=dict(symbol="line-ew-open", size=18, color="#000000"),
            hovertemplate="%{x}<br>step: %{y:.1f} ms<extra></extra>",
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        barmode="stack", height=380, yaxis_title="ms per step (steady-state mean)", xaxis=dict(type="category")
    )
    first, last = min(steady_steps or table["step"]), max(steady_steps or table["step"])
    description = (
        f"<p>Exclusive parts of each rank's step, averaged over steady steps "
        f"{first}-{last}. A rank with more forward/backward/other than the others "
        "computes slower; the others show the difference as exposed communication "
        "(waiting for it).</p>"
    )
    return Section("breakdown-ranks", "Step-time breakdown per rank", fig, description)


def over_steps(breakdown) -> Section | None:
    if breakdown is None or breakdown.empty:
        return None
    parts = part_columns(breakdown)
    columns = ["step_ms", *[f"{p}_ms" for p in parts]]
    mean = breakdown.groupby("step", as_index=False)[columns].mean()
    slowest = breakdown.groupby("step", as_index=False)["step_ms"].max()
    mean["one"] = 0
    mean, width = bin_steps(mean, columns, by=("one",))
    slowest["one"] = 0
    slowest, _ = bin_steps(slowest, ["step_ms"], by=("one",))
    fig = go.Figure()
    for part in parts:
        fig.add_trace(
            go.Bar(
                x=mean["step"].to_numpy(),
                y=compact(mean[f"{part}_ms"]),
                name=PART_LABELS[part],
                marker_color=COLORS[part],
                marker_line_width=0,
                hovertemplate=f"step %{{x}}<br>{PART_LABELS[part]}: %{{y:.1f}} ms<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=slowest["step"].to_numpy(),
            y=compact(slowest["step_ms"]),
            mode="lines",
            name="slowest rank's step",
            line=dict(color="#000000", width=1),
            hovertemplate="step %{x}<br>slowest: %{y:.1f} ms<extra></extra>",
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        barmode="stack", bargap=0.05, height=380, xaxis_title="step", yaxis_title="ms (mean across ranks)"
    )
    note = [f"Steps binned by {width} (mean) to keep the report small."] if width > 1 else []
    median = breakdown["step_ms"].median()
    description = (
        f"<p>Mean across ranks of each part, per step; the line is the slowest rank's "
        f"step. Median step {esc(fmt_ms(median))}. Warm-up steps are usually slower.</p>"
    )
    return Section("breakdown-steps", "Step-time breakdown over steps", fig, description, notes=note)


def device_per_rank(device, steady_steps) -> Section | None:
    table = steady(device, steady_steps)
    if table is None or table.empty:
        return None
    means = table.groupby("rank")[["step_ms", *[f"{p}_ms" for p in DEVICE_PARTS]]].mean()
    x = [f"rank {r}" for r in means.index]
    fig = go.Figure()
    for part in DEVICE_PARTS:
        fig.add_trace(
            go.Bar(
                x=x,
                y=compact(means[f"{part}_ms"].to_numpy()),
                name=DEVICE_LABELS[part],
                marker_color=DEVICE_COLORS[part],
                hovertemplate=f"%{{x}}<br>{DEVICE_LABELS[part]}: %{{y:.1f}} ms/step<extra></extra>",
            )
        )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        barmode="stack", height=380, yaxis_title="ms per step (steady-state mean)", xaxis=dict(type="category")
    )
    description = (
        "<p>Each rank's step as its GPU spent it, on the GPUs' clocks: the time some "
        "compute kernel ran, communication kernels with no compute beside them (moving "
        "data, or waiting inside NCCL for the last member), other kernels alone, and no "
        "kernel at all. A straggler has the most compute; the ranks waiting for it have "
        "the most communication.</p>"
    )
    return Section("breakdown-device", "Device time per rank (GPU clocks)", fig, description)


def build(run, ctx) -> list:
    breakdown = run.breakdown()
    sections = [s for s in (per_rank(breakdown, ctx.steady), over_steps(breakdown)) if s is not None]
    device = (
        device_per_rank(run.device_step_breakdown(), ctx.steady)
        if device_collectives.on_device(run.arrivals())
        else None
    )
    if device is not None:
        for section in sections:
            section.notes.append(HOST_CLOCK_NOTE)
        sections.append(device)
    return sections
