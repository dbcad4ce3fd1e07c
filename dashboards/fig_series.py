"""Series over the run: data wait per step, and host / GPU samples over time
(one panel per metric; a line per rank, or median and max when there are many)."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.view_parts import (
    COLORS,
    LAYOUT,
    MAX_LINE_RANKS,
    Section,
    bin_steps,
    compact,
    downsample_series,
    esc,
    fmt_ms,
)

MAX_METRICS = 12


def data_wait(breakdown) -> Section | None:
    if breakdown is None or breakdown.empty or "data_wait_ms" not in breakdown.columns:
        return None
    frame, width = bin_steps(breakdown[["rank", "step", "data_wait_ms", "step_ms"]], ["data_wait_ms", "step_ms"])
    fig = go.Figure()
    ranks = sorted(frame["rank"].unique())
    if len(ranks) <= MAX_LINE_RANKS:
        for rank in ranks:
            sel = frame[frame["rank"] == rank].sort_values("step")
            fig.add_trace(
                go.Scatter(
                    x=sel["step"].to_numpy(),
                    y=compact(sel["data_wait_ms"]),
                    mode="lines",
                    name=f"rank {rank}",
                    line=dict(width=1),
                    hovertemplate=f"rank {rank}<br>step %{{x}}: %{{y:.2f}} ms<extra></extra>",
                )
            )
    else:
        stats = frame.groupby("step")["data_wait_ms"].agg(["median", "max"]).reset_index()
        for column, dash in (("median", "solid"), ("max", "dot")):
            fig.add_trace(
                go.Scatter(
                    x=stats["step"].to_numpy(),
                    y=compact(stats[column]),
                    mode="lines",
                    name=f"{column} across ranks",
                    line=dict(dash=dash, color=COLORS["data_wait"]),
                )
            )
    fig.update_layout(**LAYOUT)
    fig.update_layout(height=340, xaxis_title="step", yaxis_title="data wait, ms per step")
    total = breakdown["step_ms"].sum()
    frac = breakdown["data_wait_ms"].sum() / total if total else 0.0
    description = (
        f"<p>Time the training loop waited for the next batch (inside the DataLoader "
        f"iterator), per step. Over the run: {frac:.1%} of step time, median "
        f"{esc(fmt_ms(breakdown['data_wait_ms'].median()))} per step. A flat high line "
        "is an input pipeline too slow for the model (num_workers, pin_memory, "
        "prefetching); spikes every N steps point at epoch boundaries or I/O.</p>"
    )
    notes = [f"Steps binned by {width} (mean)."] if width > 1 else []
    return Section("data-wait", "Data wait over steps", fig, description, notes=notes)


def samples(frame, t_scale_ns: float = 1e9) -> Section | None:
    if frame is None or frame.empty:
        return None
    frame = frame.dropna(subset=["value"])
    if frame.empty:
        return None
    metrics = sorted(frame["metric"].astype(str).unique())
    shown = metrics[:MAX_METRICS]
    fig = make_subplots(
        rows=len(shown), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=[esc(m) for m in shown]
    )
    ranks = sorted(frame["rank"].unique())
    many = len(ranks) > MAX_LINE_RANKS
    palette = [
        "#1f77b4",
        "#ff7f0e",
        "#2ca02c",
        "#d62728",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
        "#bcbd22",
        "#17becf",
    ]
    metric_col = frame["metric"].astype(str)
    for row, metric in enumerate(shown, start=1):
        sel = frame[metric_col == metric]
        label = esc(metric)
        if many:
            t = (sel["ts_ns"] // int(t_scale_ns)).to_numpy()
            stats = sel.assign(t=t).groupby("t")["value"].agg(["median", "max"]).reset_index()
            for column, dash in (("median", "solid"), ("max", "dot")):
                x, y = downsample_series(stats["t"].to_numpy(float), stats[column].to_numpy(float))
                fig.add_trace(
                    go.Scatter(
                        x=compact(x),
                        y=compact(y),
                        mode="lines",
                        name=f"{column} across ranks",
                        legendgroup=column,
                        showlegend=row == 1,
                        line=dict(dash=dash, color="#444444"),
                        hovertemplate=f"{label} {column}: %{{y:.4g}}<extra></extra>",
                    ),
                    row=row,
                    col=1,
                )
            continue
        for i, rank in enumerate(ranks):
            mine = sel[sel["rank"] == rank].sort_values("ts_ns")
            if mine.empty:
                continue
            x, y = downsample_series(mine["ts_ns"].to_numpy(float) / t_scale_ns, mine["value"].to_numpy(float))
            fig.add_trace(
                go.Scatter(
                    x=compact(x),
                    y=compact(y, 4),
                    mode="lines",
                    name=f"rank {rank}",
                    legendgroup=f"rank {rank}",
                    showlegend=row == 1,
                    line=dict(width=1, color=palette[i % len(palette)]),
                    hovertemplate=f"rank {rank}<br>t=%{{x:.1f}} s<br>{label}: %{{y:.4g}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    fig.update_layout(**LAYOUT)
    fig.update_layout(height=90 + 170 * len(shown))
    fig.update_xaxes(title_text="s since the run's first event", row=len(shown), col=1)
    notes = []
    if len(metrics) > len(shown):
        notes.append(f"{len(metrics) - len(shown)} more metrics not shown: " + esc(", ".join(metrics[len(shown) :])))
    description = (
        "<p>Sampled host and GPU metrics of each rank's process over wall time "
        "(CPU %, resident memory, and GPU utilisation / memory where recorded).</p>"
    )
    return Section("samples", "Host and GPU samples", fig, description, notes=notes)


def build(run, ctx) -> list:
    out = [data_wait(run.breakdown()), samples(run.samples())]
    return [s for s in out if s is not None]
