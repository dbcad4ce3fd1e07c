"""Pipeline schedule: stage x time for one step, forward and backward blocks per
micro-batch and the idle gaps between them (the bubbles) in grey; and per stage,
busy time vs bubble over the steady steps (stage imbalance)."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.view_parts import COLORS, LAYOUT, Section, compact, esc, fmt_ms
from diagnose.analysis.tables.step_tables import bubble_frac, bubbles, pipeline_blocks, steady

MAX_ROWS = 16


def _rows(blocks: pd.DataFrame) -> list:
    """(stage, rank) rows: every rank when few, else the lowest rank of each stage."""
    pairs = blocks[["stage", "rank"]].drop_duplicates().sort_values(["stage", "rank"])
    if len(pairs) > MAX_ROWS:
        pairs = pairs.groupby("stage", as_index=False)["rank"].min()
    return [(int(s), int(r)) for s, r in zip(pairs["stage"], pairs["rank"])]


def _gaps(rank_blocks: pd.DataFrame) -> list:
    gaps, covered_to = [], None
    for start, end in zip(rank_blocks["start_ns"], rank_blocks["end_ns"]):
        if covered_to is not None and start > covered_to:
            gaps.append((covered_to, start))
        covered_to = end if covered_to is None else max(covered_to, end)
    return gaps


def schedule(blocks: pd.DataFrame, step: int) -> go.Figure:
    rows = _rows(blocks)
    in_step = blocks[blocks["step"] == step]
    t0 = in_step["start_ns"].min()
    fig = go.Figure()
    labels = [f"stage {s} · rank {r}" for s, r in rows]
    y_of = {row: i for i, row in enumerate(rows)}
    gap_x, gap_base, gap_y, gap_hover = [], [], [], []
    for kind in ("forward", "backward"):
        shown = np.array([(s, r) in y_of for s, r in zip(in_step["stage"], in_step["rank"])], dtype=bool)
        sel = in_step[(in_step["kind"] == kind).to_numpy() & shown]
        if sel.empty:
            continue
        dur = (sel["end_ns"] - sel["start_ns"]) / 1e6
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=[y_of[(s, r)] for s, r in zip(sel["stage"], sel["rank"])],
                x=compact(dur),
                base=compact((sel["start_ns"] - t0) / 1e6),
                width=0.7,
                name=kind,
                marker=dict(color=COLORS[kind], line=dict(width=0.5, color="#ffffff")),
                text=[str(m) if m >= 0 else "" for m in sel["microbatch"]],
                textposition="inside",
                insidetextanchor="middle",
                textfont=dict(size=10),
                hoverinfo="text",
                hovertext=[
                    f"{kind} micro-batch {m}<br>stage {s}, rank {r}<br>{fmt_ms(d)}"
                    for m, s, r, d in zip(sel["microbatch"], sel["stage"], sel["rank"], dur)
                ],
            )
        )
    for stage, rank in rows:
        mine = in_step[in_step["rank"] == rank].sort_values("start_ns")
        for start, end in _gaps(mine):
            gap_base.append((start - t0) / 1e6)
            gap_x.append((end - start) / 1e6)
            gap_y.append(y_of[(stage, rank)])
            gap_hover.append(f"bubble: {fmt_ms((end - start) / 1e6)} idle<br>stage {stage}, rank {rank}")
    if gap_x:
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=gap_y,
                x=compact(gap_x),
                base=compact(gap_base),
                width=0.7,
                name="bubble (idle)",
                marker=dict(
                    color=COLORS["bubble"],
                    line=dict(width=0.5, color="#bbbbbb"),
                    pattern=dict(shape="/", fgcolor="#bbbbbb"),
                ),
                hoverinfo="text",
                hovertext=gap_hover,
            )
        )
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        height=120 + 34 * len(rows),
        uniformtext=dict(minsize=8, mode="hide"),
        xaxis_title=f"ms since step {step} started on the first stage",
        yaxis=dict(
            tickvals=list(range(len(rows))), ticktext=labels, autorange="reversed", showgrid=False, zeroline=False
        ),
    )
    return fig


def per_stage(blocks: pd.DataFrame, steady_steps) -> tuple[go.Figure, pd.DataFrame] | None:
    table = bubbles(steady(blocks, steady_steps))
    if table.empty:
        return None
    kinds = steady(blocks, steady_steps).assign(dur_ms=lambda f: (f["end_ns"] - f["start_ns"]) / 1e6)
    per_step = kinds.groupby(["stage", "rank", "step", "kind"])["dur_ms"].sum().reset_index()
    per_kind = per_step.groupby(["stage", "kind"])["dur_ms"].mean().unstack(fill_value=0.0)
    stage_bubble = table.groupby("stage")[["bubble_ms", "window_ms"]].mean()
    stages = sorted(stage_bubble.index)
    x = [f"stage {s}" for s in stages]
    fig = go.Figure()
    for kind in ("forward", "backward"):
        if kind in per_kind.columns:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=compact(per_kind[kind].reindex(stages).fillna(0)),
                    name=kind,
                    marker_color=COLORS[kind],
                    hovertemplate=f"%{{x}}<br>{kind}: %{{y:.1f}} ms/step<extra></extra>",
                )
            )
    fig.add_trace(
        go.Bar(
            x=x,
            y=compact(stage_bubble["bubble_ms"].reindex(stages)),
            name="bubble",
            marker=dict(color=COLORS["bubble"], line=dict(width=0.5, color="#999999")),
            hovertemplate="%{x}<br>bubble: %{y:.1f} ms/step<extra></extra>",
        )
    )
    fig.update_layout(**LAYOUT)
    fig.update_layout(barmode="stack", height=340, yaxis_title="ms per step (steady mean)", xaxis=dict(type="category"))
    stage_bubble["bubble_frac"] = bubble_frac(table, by="stage")
    return fig, stage_bubble


def build(run, ctx) -> list:
    blocks = pipeline_blocks(run.events())
    if blocks.empty:
        return []
    recorded = set(int(s) for s in blocks["step"].unique())
    candidates = [s for s in (ctx.window_steps or ()) if s in recorded]
    pool = [s for s in ctx.steady if s in recorded] or sorted(recorded)
    step = int(candidates[0] if candidates else pool[len(pool) // 2])
    sections = [
        Section(
            "pipeline",
            f"Pipeline schedule (step {step})",
            schedule(blocks, step),
            "<p>One row per stage (and data-parallel replica); blue blocks are forward (light) and "
            "backward (dark) per micro-batch, numbered; hatched grey gaps are bubbles, where the "
            "stage waits for its neighbours.</p>",
        )
    ]
    stages = per_stage(blocks, ctx.steady)
    if stages is not None:
        fig, stage_bubble = stages
        worst = stage_bubble["bubble_frac"].idxmax()
        sections.append(
            Section(
                "pipeline-stages",
                "Work and bubble per pipeline stage",
                fig,
                "<p>Mean forward, backward and bubble time per steady step of each stage. Unequal "
                "forward+backward is stage imbalance: every other stage waits for the heaviest one. "
                f"Largest bubble: stage {esc(worst)}, "
                f"{stage_bubble.loc[worst, 'bubble_frac']:.0%} of its schedule window.</p>",
            )
        )
    return sections
