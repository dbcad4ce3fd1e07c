"""Rank x step heat maps (as MegaScale and SMon use to spot stragglers): time not
spent waiting, waiting suffered at collectives, and waiting caused (each
collective's total wait charged to the rank that arrived last)."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.view_parts import LAYOUT, MAX_STEP_COLUMNS, Section, bin_steps, compact
from diagnose.analysis.tables.breakdown import busy_ms
from diagnose.analysis.tables.step_tables import waits_caused, waits_suffered

MAX_CELLS = 400_000


def heatmap(
    frame: pd.DataFrame, value: str, ranks: list, title: str, colorscale: str, how: str = "mean"
) -> tuple[go.Figure, int]:
    n_ranks = max(len(ranks), 1)
    columns = max(10, min(MAX_STEP_COLUMNS, MAX_CELLS // n_ranks))
    binned, width = bin_steps(frame[["rank", "step", value]], [value], max_columns=columns, how=how)
    steps = np.sort(binned["step"].unique())
    grid = binned.pivot_table(index="rank", columns="step", values=value, aggfunc="sum")
    grid = grid.reindex(index=ranks, columns=steps)
    span = f" (and the next {width - 1})" if width > 1 else ""
    hover = f"rank %{{y}}<br>step %{{x}}{span}<br>{title}: %{{z:.1f}} ms<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=compact(grid.to_numpy(), 2),
            x=steps,
            y=np.asarray(ranks),
            colorscale=colorscale,
            colorbar=dict(title=dict(text="ms", side="right")),
            hovertemplate=hover,
            hoverongaps=False,
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        height=min(160 + 22 * n_ranks, 900),
        xaxis_title="step",
        yaxis=dict(title="rank", autorange="reversed", dtick=1 if n_ranks <= 32 else None),
    )
    return fig, width


def build(run, ctx) -> list:
    ranks = run.ranks
    sections = []
    breakdown = run.breakdown()
    if breakdown is not None and not breakdown.empty:
        frame = breakdown.assign(busy_ms=busy_ms(breakdown))
        fig, width = heatmap(frame, "busy_ms", ranks, "not waiting", "Viridis")
        notes = [f"Steps binned by {width} (mean)."] if width > 1 else []
        sections.append(
            Section(
                "heat-busy",
                "Compute time per rank and step",
                fig,
                "<p>Step time minus data wait, exposed communication, pipeline wait and host syncs "
                "(= forward + "
                "backward + optimizer + uninstrumented code). A straggler is a bright row; a "
                "bright column is a slow step on every rank.</p>",
                notes=notes,
            )
        )
    arrivals = run.arrivals()
    if arrivals is not None and not arrivals.empty:
        suffered = waits_suffered(arrivals)
        fig, width = heatmap(suffered, "wait_ms", ranks, "waited", "Oranges", how="sum")
        notes = [f"Steps binned by {width} (sum)."] if width > 1 else []
        sections.append(
            Section(
                "heat-wait-suffered",
                "Waiting suffered at collectives",
                fig,
                "<p>Per rank and step: the time between this rank's arrival at each collective and "
                "the last member's arrival, summed. The ranks that wait are the ones that are on "
                "time.</p>",
                notes=notes,
            )
        )
        caused = waits_caused(arrivals)
        if not caused.empty:
            fig, width = heatmap(caused, "wait_ms", ranks, "others waited", "Reds", how="sum")
            notes = [f"Steps binned by {width} (sum)."] if width > 1 else []
            sections.append(
                Section(
                    "heat-wait-caused",
                    "Waiting caused (last to arrive)",
                    fig,
                    "<p>Each collective's total waiting, charged to the rank that arrived last: the "
                    "straggler's row lights up.</p>",
                    notes=notes,
                )
            )
    return sections
