"""HTML page for `diagnose compare A B --html PATH`: step time and breakdown of
the two runs side by side, findings gained / lost / changed. Self-contained like
the report (plotly.js embedded once)."""

import os

import numpy as np
import plotly.graph_objects as go

from dashboards.plot_embed import figure_html, page_html
from dashboards.report_page import CSS
from dashboards.view_parts import LAYOUT, compact, esc, fmt_ms, kind_html

RUN_COLORS = {"A": "#6baed6", "B": "#e6550d"}


def _step_figure(per_step: dict) -> go.Figure:
    fig = go.Figure()
    for label in ("A", "B"):
        rows = per_step.get(label.lower()) or []
        if not rows:
            continue
        steps, median, slowest = (np.array(c) for c in zip(*rows))
        fig.add_trace(
            go.Scatter(
                x=steps, y=compact(median), mode="lines", name=f"{label} median", line=dict(color=RUN_COLORS[label])
            )
        )
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=compact(slowest),
                mode="lines",
                name=f"{label} slowest rank",
                line=dict(color=RUN_COLORS[label], dash="dot", width=1),
            )
        )
    fig.update_layout(**LAYOUT)
    fig.update_layout(height=360, xaxis_title="step", yaxis_title="step time, ms")
    return fig


def _parts_figure(parts: list) -> go.Figure:
    labels = [p["label"] for p in parts]
    fig = go.Figure()
    for label in ("A", "B"):
        key = f"{label.lower()}_ms"
        fig.add_trace(
            go.Bar(
                x=labels,
                y=compact([p[key] for p in parts]),
                name=label,
                marker_color=RUN_COLORS[label],
                hovertemplate=f"{label} %{{x}}: %{{y:.1f}} ms/step<extra></extra>",
            )
        )
    fig.update_layout(**LAYOUT)
    fig.update_layout(barmode="group", height=360, yaxis_title="ms per step (steady mean)")
    return fig


def _findings_rows(findings: list, mark: str, severity_text=None) -> str:
    rows = []
    for f in findings:
        severity = severity_text(f) if severity_text else esc(f.get("severity"))
        rows.append(
            f"<tr><td>{esc(mark)}</td><td>{severity}</td><td>{kind_html(f.get('kind'))}</td>"
            f"<td>{esc(','.join(map(str, f.get('ranks') or [])) or '-')}</td>"
            f"<td>{esc(f.get('title'))}<div class='rec'>{esc(f.get('recommendation'))}</div>"
            "</td></tr>"
        )
    return "".join(rows)


def render_compare(result: dict) -> str:
    a, b, st = result["a"], result["b"], result["step_time"]
    ratio = st.get("ratio")
    headline = (
        "step time "
        + (f"{ratio:.2f}x" if ratio is not None else "-")
        + f" ({esc(fmt_ms(st.get('a_ms')))} &rarr; {esc(fmt_ms(st.get('b_ms')))})"
    )
    f = result["findings"]
    rows = (
        _findings_rows(f["gained"], "gained")
        + _findings_rows(f["lost"], "lost")
        + "".join(
            _findings_rows([p["b"]], "changed", lambda _f, p=p: esc(p["change"]).replace(" -&gt; ", " &rarr; "))
            for p in f["changed"]
        )
    )
    if not rows:
        rows = "<tr><td colspan='5'>no warning or critical finding gained or lost</td></tr>"
    step_rows = "".join(
        f"<tr><td>{esc(label)}</td><td class='num'>{esc(fmt_ms(va))}</td>"
        f"<td class='num'>{esc(fmt_ms(vb))}</td><td class='num'>"
        f"{'-' if r is None else f'{r:.2f}x'}</td></tr>"
        for label, va, vb, r in (
            ("median over ranks", st["a_ms"], st["b_ms"], st["ratio"]),
            ("mean over ranks", st.get("mean_a_ms"), st.get("mean_b_ms"), st.get("mean_ratio")),
            ("slowest rank", st["slowest_a_ms"], st["slowest_b_ms"], st["slowest_ratio"]),
        )
    )
    part_rows = "".join(
        f"<tr><td>{esc(p['label'])}</td><td class='num'>{p['a_ms']:.1f}</td>"
        f"<td class='num'>{p['b_ms']:.1f}</td><td class='num'>{p['delta_ms']:+.1f}</td></tr>"
        for p in result["parts"]
    )
    figures = [
        ("compare-steps", "Step time over steps", _step_figure(result["per_step"])),
        ("compare-parts", "Breakdown per phase", _parts_figure(result["parts"])),
    ]
    body = [
        f"<h1>diagnose compare: {esc(a['name'])} vs {esc(b['name'])}</h1>",
        f"<p class='meta'>A: <code>{esc(a['root'])}</code> ({esc(a['world_size'])} ranks)<br>"
        f"B: <code>{esc(b['root'])}</code> ({esc(b['world_size'])} ranks)</p>",
        f"<p><b>{headline}</b></p>",
        "<h2 id='findings'>Findings gained and lost</h2><table class='findings'><thead><tr>"
        "<th></th><th>severity</th><th>kind</th><th>ranks</th><th>finding</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>",
        "<h2>Step time (steady steps)</h2><table><thead><tr><th></th><th>A</th><th>B</th>"
        f"<th>B/A</th></tr></thead><tbody>{step_rows}</tbody></table>",
        "<h2>Breakdown per phase, ms/step</h2><table><thead><tr><th>phase</th><th>A</th>"
        f"<th>B</th><th>change</th></tr></thead><tbody>{part_rows}</tbody></table>",
    ]
    for anchor, title, fig in figures:
        body.append(f"<section id='{anchor}'><h2>{esc(title)}</h2>" + figure_html(fig, f"fig-{anchor}") + "</section>")
    return page_html("diagnose compare", CSS, "".join(body))


def write_compare(result: dict, path: str) -> str:
    text = render_compare(result)
    tmp = f"{path}.tmp-{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return os.path.abspath(path)
