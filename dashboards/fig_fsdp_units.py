"""FSDP2 per unit: the ms per step the training thread was blocked in each
unit's all-gathers and reduce-scatters (exposed) beside the ms they were in
flight while it worked on (overlapped by prefetching), from
diagnose/analysis/tables/fsdp_units.py. Absent for jobs without FSDP2."""

import plotly.graph_objects as go

from dashboards.view_parts import COLORS, LAYOUT, Section, esc

MAX_BARS = 40


def build(run, ctx) -> list:
    table = run.fsdp_unit_comm()
    if table.empty:
        return []
    table = table.head(MAX_BARS)
    labels = [esc(f"{u} · {op}") for u, op in zip(table["unit"], table["op"])]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=labels,
            y=table["exposed_ms_per_step"],
            name="exposed (thread blocked)",
            marker_color=COLORS["exposed_comm"],
            hovertemplate="%{x}<br>exposed %{y:.2f} ms/step<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=labels,
            y=table["overlapped_ms_per_step"],
            name="overlapped (in flight during compute)",
            marker_color=COLORS["comm_async"],
            hovertemplate="%{x}<br>overlapped %{y:.2f} ms/step<extra></extra>",
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(barmode="stack", height=380, yaxis_title="ms per step (median rank)")
    fig.update_xaxes(type="category", tickangle=-30)
    gathers = table[table["op"].str.startswith("all_gather")]
    exposed, overlapped = gathers["exposed_ms_per_step"].sum(), gathers["overlapped_ms_per_step"].sum()
    share = overlapped / (exposed + overlapped) if exposed + overlapped > 0 else 0.0
    description = (
        f"<p>Per FSDP2 unit and collective: time the training thread was blocked in it "
        f"(exposed) and time it was in flight while the thread computed (overlapped). "
        f"All-gathers: {exposed:.1f} ms/step exposed, {overlapped:.1f} overlapped "
        f"({share:.0%} hidden by prefetching). A unit whose all-gather is mostly exposed "
        "is one to prefetch (<code>set_modules_to_forward_prefetch</code>) or to merge into "
        "a coarser <code>fully_shard</code> unit.</p>"
    )
    return [
        Section("fsdp-units", "FSDP2 units: exposed vs overlapped communication", figure=fig, description=description)
    ]
