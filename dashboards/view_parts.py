"""Shared pieces of the views: escaping, colours, sections, downsampling."""

import html
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.tables.breakdown import PARTS

COLORS = {
    "forward": "#6baed6",
    "backward": "#2171b5",
    "optimizer": "#41ab5d",
    "host_sync": "#9e66ab",
    "pipeline_wait": "#fdd835",
    "exposed_comm": "#e6550d",
    "data_wait": "#fdae6b",
    "other": "#bdbdbd",
    "step": "#eeeeee",
    "phase": "#9ecae1",
    "comm": "#e6550d",
    "comm_async": "#fdd0a2",
    "wait": "#d94801",
    "data": "#fdae6b",
    "sync": "#9e66ab",
    "kernel": "#74c476",
    "mark": "#636363",
    "error": "#cb181d",
    "bubble": "#f0f0f0",
}
SEVERITY_COLORS = {"critical": "#cb181d", "warning": "#f16913", "info": "#6baed6"}

LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=70, r=20, t=40, b=45),
    font=dict(size=12),
    hoverlabel=dict(align="left"),
    legend=dict(orientation="h", yanchor="bottom", y=1.01, xanchor="left", x=0),
)

# Heat maps and per-step series are binned above these sizes (report < 10 MB).
MAX_STEP_COLUMNS = 1000
MAX_SERIES_POINTS = 1500
MAX_LINE_RANKS = 16


def esc(value) -> str:
    """Text from a trace, made safe for HTML and for plotly labels (plotly turns
    the entities back into the characters, so `<script>` shows as text). The
    quote is written `&#34;`: plotly decodes numeric entities and only a few
    named ones (not `&quot;`), HTML reads both."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return html.escape(str(value), quote=True).replace("&quot;", "&#34;")


def kind_html(kind) -> str:
    """A finding's kind as a table cell shows it: its label, its name under it."""
    return f'{esc(finding_kinds.label(kind))}<div class="kind">{esc(kind)}</div>'


def fmt_ms(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value / 1000:.2f} s"
    if abs(value) >= 10:
        return f"{value:.0f} ms"
    return f"{value:.2f} ms"


@dataclass
class Section:
    """One view of the report: an anchor, a title, a plotly figure and notes."""

    anchor: str
    title: str
    figure: object = None  # plotly Figure, or None when html is given
    description: str = ""  # trusted HTML written by the view (escape inputs!)
    html: str = ""  # a non-plotly body (tables)
    notes: list = field(default_factory=list)  # trusted HTML lines under the figure


def rank_label(rank, rank_meta: dict | None = None) -> str:
    return f"rank {int(rank)}"


def step_bins(steps: np.ndarray, max_columns: int = MAX_STEP_COLUMNS) -> tuple[np.ndarray, int]:
    """Map each step to a bin so that there are at most max_columns bins; returns
    (bin index per step, steps per bin)."""
    steps = np.asarray(steps)
    if len(steps) == 0:
        return steps.astype(int), 1
    span = int(steps.max() - steps.min() + 1)
    width = max(1, math.ceil(span / max_columns))
    return ((steps - steps.min()) // width).astype(int), width


def bin_steps(
    frame: pd.DataFrame, value_columns, by=("rank",), how="mean", max_columns: int = MAX_STEP_COLUMNS
) -> tuple[pd.DataFrame, int]:
    """Aggregate a per-step table into at most max_columns step bins; the bin's
    `step` is its first step."""
    if frame.empty:
        return frame, 1
    bins, width = step_bins(frame["step"].to_numpy(), max_columns)
    if width == 1:
        return frame, 1
    first = int(frame["step"].min())
    binned = frame.assign(step=first + bins * width)
    out = binned.groupby([*by, "step"], as_index=False)[list(value_columns)].agg(how)
    return out, width


def downsample_series(x: np.ndarray, y: np.ndarray, max_points: int = MAX_SERIES_POINTS):
    """Bucket means so a time series has at most max_points points."""
    n = len(x)
    if n <= max_points:
        return x, y
    edges = np.linspace(0, n, max_points + 1).astype(int)
    counts = np.diff(edges)
    keep = counts > 0
    xs = np.add.reduceat(x.astype(float), edges[:-1][keep]) / counts[keep]
    ys = np.add.reduceat(np.nan_to_num(y.astype(float)), edges[:-1][keep]) / counts[keep]
    return xs, ys


def compact(values, digits: int = 3) -> np.ndarray:
    """float32 rounded values: plotly sends numpy arrays as base64, half the size."""
    return np.round(np.asarray(values, dtype=float), digits).astype(np.float32)


def part_columns(breakdown: pd.DataFrame) -> list[str]:
    return [p for p in PARTS if f"{p}_ms" in breakdown.columns]
