"""Per-rank timeline over a window of steps (a few steady ones by default): one
band per rank with a lane each for steps, explicit phases, compute, blocking
communication, async communication in flight, data wait, host syncs and GPU
kernels, like Nsight Systems' or Perfetto's process view."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.view_parts import COLORS, LAYOUT, Section, esc, fmt_ms
from diagnose.analysis.detectors import finding_kinds

LANES = ("steps", "phases", "compute", "comm", "in flight", "data", "syncs", "gpu")
CATEGORY_LANE = {
    "step": "steps",
    "phase": "phases",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "comm": "comm",
    "wait": "comm",
    "comm_async": "in flight",
    "data": "data",
    "sync": "syncs",
    "kernel": "gpu",
}
CATEGORY_LABEL = {
    "step": "step",
    "phase": "phase",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "comm": "collective / p2p (blocking)",
    "wait": "Work.wait",
    "comm_async": "async comm in flight",
    "data": "data wait",
    "sync": "host sync",
    "kernel": "GPU kernel",
}
PHASE_COLORS = {
    "forward": COLORS["forward"],
    "backward": COLORS["backward"],
    "optimizer": COLORS["optimizer"],
    "send": COLORS["pipeline_wait"],
    "recv": COLORS["pipeline_wait"],
    "p2p": COLORS["pipeline_wait"],
    "data": COLORS["data_wait"],
    "data_wait": COLORS["data_wait"],
    "grad_sync": COLORS["exposed_comm"],
}
MAX_RANKS = 16
LABEL_MIN_FRAC = 0.015  # of the window's width
LABEL_CHARS = 60
HOVER_NAME_CHARS = 240
MAX_KERNEL_BARS = 2500
MAX_BARS = 6000  # ~1.5 MB of bars and hover text: the timeline is the largest view


def timeline_window(
    steps: pd.DataFrame, steady_steps, findings=(), events=None, window_steps=None, n_steps: int = 3
) -> tuple[int, int, str]:
    """(start_ns, end_ns, description) of the timeline: the steps asked for;
    around the end of the run when it hung or lost a rank; else a few steady
    steps from the middle of the run."""
    end_of_events = int(events["end_ns"].max()) if events is not None and len(events) else 0
    if steps is None or steps.empty:
        start = int(events["start_ns"].min()) if events is not None and len(events) else 0
        return start, end_of_events, "the whole run (no steps recorded)"
    all_steps = sorted(int(s) for s in steps["step"].unique())
    if window_steps is not None:
        first, last = window_steps
        chosen = [s for s in all_steps if first <= s <= last]
        if not chosen:
            raise ValueError(f"no recorded step in {first}-{last} (recorded: {all_steps[0]}-{all_steps[-1]})")
        rows = steps[steps["step"].isin(chosen)]
        return int(rows["start_ns"].min()), int(rows["end_ns"].max()), f"steps {chosen[0]}-{chosen[-1]}"
    if any(finding_kinds.job_stopped(f.get("kind")) for f in findings or ()):  # a hang, a crash
        chosen = all_steps[-2:]
        rows = steps[steps["step"].isin(chosen)]
        end = max(int(rows["end_ns"].max()), end_of_events)
        return int(rows["start_ns"].min()), end, f"the end of the run (steps {chosen[0]}-{chosen[-1]} and after)"
    pool = list(steady_steps) or all_steps
    middle = len(pool) // 2
    chosen = pool[max(0, middle - n_steps // 2) :][:n_steps]
    rows = steps[steps["step"].isin(chosen)]
    return int(rows["start_ns"].min()), int(rows["end_ns"].max()), f"steady steps {chosen[0]}-{chosen[-1]}"


def choose_ranks(ranks: list, findings) -> list:
    """All ranks up to MAX_RANKS; beyond, the ranks findings name plus evenly spaced others."""
    if len(ranks) <= MAX_RANKS:
        return list(ranks)
    named = [r for f in findings or () for r in (f.get("ranks") or []) if r in ranks]
    chosen = list(dict.fromkeys(named))[: MAX_RANKS // 2]
    rest = [r for r in ranks if r not in chosen]
    step = max(1, len(rest) // (MAX_RANKS - len(chosen)))
    chosen += rest[::step][: MAX_RANKS - len(chosen)]
    return sorted(chosen)


def _hover(frame: pd.DataFrame, hosts: dict) -> list:
    out = []
    cols = {c: frame[c].to_numpy() for c in frame.columns}
    for i in range(len(frame)):
        rank = int(cols["rank"][i])
        name = cols["name"][i]
        name = name if len(name) <= HOVER_NAME_CHARS else name[:HOVER_NAME_CHARS] + "..."
        lines = [
            f"<b>{esc(name)}</b> ({esc(cols['kind'][i])})",
            f"rank {rank}" + (f" on {esc(hosts[rank])}" if hosts.get(rank) else ""),
            f"{fmt_ms(cols['dur_ms'][i])}, starts at {cols['x0'][i]:.2f} ms",
        ]
        where = [f"step {int(cols['step'][i])}"]
        if cols["microbatch"][i] >= 0:
            where.append(f"micro-batch {int(cols['microbatch'][i])}")
        if cols["stage"][i] >= 0:
            where.append(f"stage {int(cols['stage'][i])}")
        lines.append(", ".join(where))
        if cols["kind"][i] == "kernel":
            if cols["group"][i]:
                lines.append(f"stream {esc(cols['group'][i])}")
        elif cols["group"][i]:
            lines.append(
                f"group {esc(cols['group'][i])} #{int(cols['seq'][i])}"
                + (f", {int(cols['bytes'][i]):,} B" if cols["bytes"][i] > 0 else "")
            )
        if cols["callsite"][i]:
            lines.append(f"at {esc(cols['callsite'][i])}")
        if cols["detail"][i]:
            lines.append(esc(cols["detail"][i]))
        out.append("<br>".join(lines))
    return out


def _category(events: pd.DataFrame) -> pd.Series:
    kind = events["kind"].astype(str)
    category = kind.where(kind.isin(list(CATEGORY_LANE)), None)
    return category


def timeline_spans(run, t0: int, t1: int, ranks: list) -> pd.DataFrame:
    events = run.events()
    inside = (events["end_ns"] >= t0) & (events["start_ns"] <= t1) & events["rank"].isin(ranks)
    frame = events[inside & ~events["kind"].isin(["collective", "p2p", "done"])].copy()
    frame["category"] = _category(frame)
    frame = frame.dropna(subset=["category"])
    parts = [frame]
    calls = run.collectives()
    if len(calls):
        calls = calls[calls["rank"].isin(ranks) & (calls["issue_ns"] <= t1)]
        exit_ns = calls["exit_ns"].fillna(calls["return_ns"]).astype("int64")
        calls = calls[np.maximum(exit_ns, calls["return_ns"]) >= t0]
        exit_ns = exit_ns.loc[calls.index]
        base = calls.rename(columns={"issue_ns": "start_ns", "return_ns": "end_ns"})
        base = base.assign(kind=calls["kind"])
        blocking = base.assign(category="comm")
        parts.append(blocking)
        async_calls = calls["async_op"].astype(bool) & (exit_ns > calls["return_ns"])
        if async_calls.any():
            flight = base[async_calls].assign(
                start_ns=calls.loc[async_calls, "return_ns"], end_ns=exit_ns[async_calls], category="comm_async"
            )
            parts.append(flight)
    columns = [
        "rank",
        "kind",
        "name",
        "category",
        "start_ns",
        "end_ns",
        "step",
        "microbatch",
        "stage",
        "group",
        "seq",
        "bytes",
        "callsite",
        "detail",
    ]
    spans = pd.concat([p.reindex(columns=columns) for p in parts], ignore_index=True)
    for column in ("kind", "name", "group", "callsite", "detail"):
        spans[column] = spans[column].astype(object).where(spans[column].notna(), "").astype(str)
    for column in ("step", "microbatch", "stage", "seq", "bytes"):
        spans[column] = pd.to_numeric(spans[column], errors="coerce").fillna(-1).astype("int64")
    spans["dur_ms"] = (spans["end_ns"] - spans["start_ns"]) / 1e6
    spans["start_ns"] = spans["start_ns"].clip(lower=t0)
    spans["end_ns"] = spans["end_ns"].clip(upper=t1)
    return spans


def build(run, ctx) -> list:
    steps = run.steps()
    events = run.events()
    if events.empty:
        return []
    try:
        t0, t1, what = timeline_window(steps, ctx.steady, ctx.findings, events, ctx.window_steps)
    except ValueError as exc:
        return [Section("timeline", "Timeline", description=f"<p>{esc(exc)}</p>")]
    ranks = choose_ranks(run.ranks, ctx.findings)
    spans = timeline_spans(run, t0, t1, ranks)
    notes = []
    if len(ranks) < len(run.ranks):
        notes.append(f"{len(ranks)} of {len(run.ranks)} ranks shown (those the findings name, then evenly spaced).")
    kernels = spans["category"] == "kernel"
    if kernels.sum() > MAX_KERNEL_BARS:  # thousands of microsecond kernels: keep the longest
        longest = spans[kernels].nlargest(MAX_KERNEL_BARS, "dur_ms")
        notes.append(
            f"{int(kernels.sum()) - MAX_KERNEL_BARS:,} shortest GPU kernels hidden "
            f"(the {MAX_KERNEL_BARS:,} longest are shown)."
        )
        spans = pd.concat([spans[~kernels], longest])
    keep = spans["category"].isin(["step", "phase"])
    if len(spans) > MAX_BARS:
        rest = spans[~keep].nlargest(max(0, MAX_BARS - int(keep.sum())), "dur_ms")
        hidden = int((~keep).sum()) - len(rest)
        spans = pd.concat([spans[keep], rest])
        notes.append(f"{hidden:,} shortest ranges hidden to keep the report small.")
    lanes = [lane for lane in LANES if lane in set(spans["category"].map(CATEGORY_LANE))]
    if not lanes:
        lanes = ["steps"]
    band = len(lanes) + 0.6
    rank_pos = {rank: i for i, rank in enumerate(ranks)}
    hosts = {r: m.get("host") for r, m in run.rank_meta.items()}
    spans["x0"] = (spans["start_ns"] - t0) / 1e6
    window_ms = max((t1 - t0) / 1e6, 1e-6)
    spans["y"] = [
        rank_pos[int(r)] * band + lanes.index(CATEGORY_LANE[c]) for r, c in zip(spans["rank"], spans["category"])
    ]
    fig = go.Figure()
    for category, label in CATEGORY_LABEL.items():
        sel = spans[spans["category"] == category]
        if sel.empty:
            continue
        width = ((sel["end_ns"] - sel["start_ns"]) / 1e6).clip(lower=0)
        # Labels only where a bar is wide enough to show one (kernel names are long).
        wide = (width >= LABEL_MIN_FRAC * window_ms).to_numpy()
        text = [
            (f"step {s}" if category == "step" else esc(n[:LABEL_CHARS])) if w else ""
            for n, s, w in zip(sel["name"], sel["step"], wide)
        ]
        color = COLORS.get(category, "#999999")
        if category == "phase":  # explicit phases in their category's colour
            color = [PHASE_COLORS.get(n, COLORS["phase"]) for n in sel["name"]]
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=sel["y"].to_numpy(),
                x=np.round(width.to_numpy(), 4),
                base=np.round(sel["x0"].to_numpy(), 4),
                width=0.8,
                name=label,
                marker=dict(
                    color=color,
                    line=dict(
                        width=0 if category == "kernel" else 0.5, color="#ffffff" if category != "step" else "#999999"
                    ),
                ),
                text=text,
                textposition="inside",
                insidetextanchor="start",
                textfont=dict(size=10),
                hoverinfo="text",
                hovertext=_hover(sel, hosts),
            )
        )
    marks = events[
        (events["end_ns"] >= t0)
        & (events["start_ns"] <= t1)
        & events["rank"].isin(ranks)
        & events["kind"].isin(["mark", "error"])
    ]
    if len(marks):
        fig.add_trace(
            go.Scatter(
                x=(marks["start_ns"] - t0) / 1e6,
                y=[rank_pos[int(r)] * band for r in marks["rank"]],
                mode="markers",
                name="mark / error",
                marker=dict(
                    symbol=["x" if k == "error" else "diamond" for k in marks["kind"]],
                    color=[COLORS["error"] if k == "error" else COLORS["mark"] for k in marks["kind"]],
                    size=9,
                ),
                hoverinfo="text",
                hovertext=[
                    f"<b>{esc(n)}</b> ({esc(k)})<br>{esc(d)}"
                    for n, k, d in zip(marks["name"], marks["kind"], marks["detail"])
                ],
            )
        )
    tickvals, ticktext = [], []
    for rank in ranks:
        for i, lane in enumerate(lanes):
            tickvals.append(rank_pos[rank] * band + i)
            ticktext.append(f"rank {rank} · {lane}" if i == 0 else lane)
    fig.update_layout(**LAYOUT)
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        height=min(150 + 17 * len(ranks) * band, 2400),
        uniformtext=dict(minsize=8, mode="hide"),
        xaxis=dict(title=f"ms since the window start ({esc(what)})", zeroline=False),
        yaxis=dict(
            range=[(len(ranks) - 1) * band + len(lanes) - 0.4, -0.6],
            tickvals=tickvals,
            ticktext=ticktext,
            showgrid=False,
            zeroline=False,
            tickfont=dict(size=10),
        ),
    )
    description = (
        f"<p>{esc(what)}, {fmt_ms((t1 - t0) / 1e6)} from {fmt_ms(t0 / 1e6)} into the "
        "run. Hover a range for its name, step, micro-batch, stage, group and callsite; "
        "drag to zoom. <code>diagnose report RUN --steps A-B</code> picks other steps; "
        "<code>diagnose export RUN</code> opens every event in Perfetto.</p>"
    )
    return [Section("timeline", "Timeline per rank", fig, description, notes=notes)]
