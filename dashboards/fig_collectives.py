"""Collective arrival skew (last arrival - first arrival of the members of each
collective instance) per op and group, as box plots computed here so the report
stays small however many collectives ran; and who arrived last how often."""

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.view_parts import LAYOUT, Section, esc
from diagnose.analysis.tables.step_tables import arrival_skew

MAX_KEYS = 24


def _quantiles(values: np.ndarray) -> dict:
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    low, high = np.percentile(values, [5, 95])
    return dict(q1=q1, median=median, q3=q3, lowerfence=low, upperfence=high, mean=values.mean(), max=values.max())


def build(run, ctx) -> list:
    skew = arrival_skew(run.arrivals())
    if skew.empty:
        return []
    skew = skew.assign(
        key=[f"{n} · group {g}" if "->" not in str(g) else f"{n} {g}" for n, g in zip(skew["name"], skew["group"])]
    )
    p2p = skew["key"].str.contains("->", regex=False)
    skew.loc[p2p, "key"] = "p2p " + skew.loc[p2p, "group"].astype(str)
    totals = skew.groupby("key")["skew_ms"].sum().sort_values(ascending=False)
    if len(totals) > MAX_KEYS:
        keep = set(totals.index[: MAX_KEYS - 1])
        skew.loc[~skew["key"].isin(keep), "key"] = "other groups"
        totals = skew.groupby("key")["skew_ms"].sum().sort_values(ascending=False)
    keys = list(totals.index)
    stats = [_quantiles(skew.loc[skew["key"] == k, "skew_ms"].to_numpy(float)) for k in keys]
    counts = skew.groupby("key").size()
    labels = [esc(k) for k in keys]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        horizontal_spacing=0.12,
        subplot_titles=("arrival skew per op and group (ms)", "times each rank arrived last"),
    )
    fig.add_trace(
        go.Box(
            x=labels,
            q1=[s["q1"] for s in stats],
            median=[s["median"] for s in stats],
            q3=[s["q3"] for s in stats],
            lowerfence=[s["lowerfence"] for s in stats],
            upperfence=[s["upperfence"] for s in stats],
            mean=[s["mean"] for s in stats],
            name="skew",
            marker_color="#e6550d",
            boxpoints=False,
            showlegend=False,
            hovertext=[
                f"{lab}<br>{counts[k]:,} instances, max {s['max']:.2f} ms" for lab, k, s in zip(labels, keys, stats)
            ],
            hoverinfo="text+y",
        ),
        row=1,
        col=1,
    )
    last = skew.groupby("last_rank").size().sort_index()
    fig.add_trace(
        go.Bar(
            x=[f"rank {int(r)}" for r in last.index],
            y=last.to_numpy(),
            marker_color="#cb181d",
            showlegend=False,
            hovertemplate="%{x}: last in %{y} instances<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(height=420, showlegend=False)
    fig.update_xaxes(type="category", tickangle=-30)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="instances", row=1, col=2)
    description = (
        f"<p>{len(skew):,} collective instances with more than one member recorded. "
        "Boxes span the 25th-75th percentile, whiskers the 5th-95th. Large skew "
        "means members reach the collective at different times; the ranks that "
        "are usually last are the ones the others wait for.</p>"
    )
    return [Section("collectives", "Collective arrival skew", fig, description)]
