"""`<run>/report.html`: findings first, each linking to the figure that proves
it, then the views. One self-contained file: the text paints first, plotly.js is
embedded once at the end and draws every figure's div (dashboards/plot_embed.py),
nothing is fetched from the network.
Long runs are binned / downsampled by the views (< 10 MB for 8 ranks x 1,000
steps; see bench/report_size.py)."""

import datetime
import os

from dashboards import (
    fig_breakdown,
    fig_collectives,
    fig_fsdp_units,
    fig_heatmaps,
    fig_pipeline,
    fig_series,
    fig_timeline,
    fig_waterfall,
    fig_whatif,
)
from dashboards.fig_findings import evidence_notes, findings_html
from dashboards.plot_embed import figure_html, page_html
from dashboards.view_parts import Section, esc, fmt_ms
from diagnose.analysis.tables import device_collectives, mfu

VIEWS = (
    fig_whatif,
    fig_waterfall,
    fig_breakdown,
    fig_timeline,
    fig_heatmaps,
    fig_pipeline,
    fig_collectives,
    fig_fsdp_units,
    fig_series,
)

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;
 margin:0 auto;max-width:1400px;padding:0 24px 48px;color:#222;background:#fff}
h1{font-size:22px;margin:20px 0 4px} h2{font-size:18px;margin:28px 0 6px;border-top:1px solid #ddd;
 padding-top:16px} .meta{color:#555;font-size:13px;margin:2px 0}
.meta code,.cmd{background:#f4f4f4;padding:1px 4px;border-radius:3px;font-size:12px;word-break:break-all}
table{border-collapse:collapse;font-size:13px;width:100%} th,td{border-bottom:1px solid #e5e5e5;
 padding:6px 8px;text-align:left;vertical-align:top} th{background:#fafafa}
td.num{text-align:right} td.callsite{font-family:monospace;font-size:12px;word-break:break-all}
.badge{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px}
.kind{color:#777;font-size:11px;font-family:monospace} .rec{color:#444;margin-top:3px} .metrics{color:#777;font-size:11px;margin-top:3px;word-break:break-all}
.title a{color:#111;font-weight:600;text-decoration:none} .title a:hover{text-decoration:underline}
a.evidence{white-space:nowrap} nav{font-size:13px;margin:10px 0} nav a{margin-right:12px}
.desc{font-size:13px;color:#444;max-width:1100px} .note{font-size:12px;color:#666;margin:2px 0}
.evidence-for{font-size:13px;background:#fff5eb;border-left:3px solid #f16913;padding:4px 8px;margin:4px 0}
.none{color:#2a7;font-weight:600} details{font-size:12px;color:#666;margin:8px 0}
table.findings{min-width:860px} @media (max-width:900px){body{padding:0 10px 48px}}
.stats td{border:0;padding:2px 12px 2px 0} .stats td:first-child{white-space:nowrap;color:#555} .stats{width:auto}
"""
# (table.findings keeps its columns readable in a narrow frame, MLflow's preview
# pane among them: ~600 px there; the page scrolls sideways instead)


class ReportContext:
    """What the views share: the findings, the steady steps and the timeline window."""

    def __init__(self, run, findings, window_steps=None):
        self.findings = list(findings or [])
        self.steady = list(run.steady_steps())
        self.window_steps = window_steps


def _header(run, findings) -> str:
    m = run.manifest or {}
    name = m.get("name") or os.path.basename(run.root)
    layout = m.get("layout") or {}
    layout_text = " x ".join(f"{k.upper()} {v}" for k, v in layout.items()) if layout else "-"
    hosts = sorted({str(meta.get("host")) for meta in run.rank_meta.values() if meta.get("host")})
    start = m.get("start_wall_ns") or run.wall_t0_ns
    when = datetime.datetime.fromtimestamp(start / 1e9).strftime("%Y-%m-%d %H:%M:%S") if isinstance(start, int) else "-"
    steps = run.steps()
    steady = run.steady_steps()
    breakdown = run.breakdown()
    median = breakdown[breakdown["step"].isin(steady)]["step_ms"].median() if steady and len(breakdown) else None
    status = m.get("exit_status")
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in ("critical", "warning", "info")}
    rows = [
        ("command", f'<span class="cmd">{esc(m.get("command") or "-")}</span>'),
        (
            "ranks",
            f"{run.world_size} on {len(hosts)} host(s): {esc(', '.join(hosts[:8]))}"
            + (" ..." if len(hosts) > 8 else ""),
        ),
        ("layout", esc(layout_text)),
        ("started", esc(when)),
        (
            "exit status",
            esc("-" if status is None else status) + (" (hung: ended by the watchdog)" if m.get("hang") else ""),
        ),
        (
            "steps",
            f"{steps['step'].nunique() if len(steps) else 0} recorded, steady "
            + (f"{steady[0]}-{steady[-1]}" if steady else "-")
            + (f", median step {esc(fmt_ms(median))}" if median is not None else ""),
        ),
        ("MFU", "<br>".join(esc(line) for line in mfu.summarize(run)["lines"])),
        ("clocks", esc(clocks_text(run))),
        ("findings", f"{counts['critical']} critical, {counts['warning']} warning, {counts['info']} info"),
    ]
    table = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<h1>diagnose report: {esc(name)}</h1><table class="stats">{table}</table>'


def clocks_text(run) -> str:
    """Which clock the figures come from, and how well the ranks' clocks agree."""
    errors_us = [run.offset_errors_ns.get(r, 0) / 1e3 for r in run.ranks[1:]]
    aligned = f"ranks aligned to rank 0's clock within {max(errors_us):.0f} us" if errors_us else "one rank"
    if device_collectives.on_device(run.arrivals()):
        return (
            "device work (collective arrivals and waits, compute, exposed communication, device idle) "
            "on the GPUs' clocks, from the NCCL and compute kernels (a live run: CUDA events); host work (steps, phases, data "
            f"loading, host syncs) on the hosts' clocks; {aligned}. Each finding says which it uses."
        )
    return f"host clocks (the work runs on the host: CPU/gloo); {aligned}"


def build_sections(run, ctx, progress=None) -> list:
    sections = []
    for view in VIEWS:
        if progress:
            progress(view.__name__.rsplit(".", 1)[-1].removeprefix("fig_"))
        try:
            sections.extend(view.build(run, ctx))
        except Exception as exc:  # one broken view must not lose the report
            run.warn(f"report view {view.__name__} failed: {type(exc).__name__}: {exc}")
            anchor = view.__name__.rsplit(".", 1)[-1].removeprefix("fig_")
            sections.append(
                Section(
                    f"failed-{anchor}",
                    f"{anchor} (failed)",
                    description=f"<p>This view failed: {esc(type(exc).__name__)}: {esc(exc)}</p>",
                )
            )
    return sections


def _section_html(section: Section, evidence: list) -> str:
    parts = [f'<section id="{esc(section.anchor)}"><h2>{esc(section.title)}</h2>']
    parts += [f'<div class="evidence-for">{line}</div>' for line in evidence]
    if section.description:
        parts.append(f'<div class="desc">{section.description}</div>')
    if section.figure is not None:
        parts.append(figure_html(section.figure, f"fig-{esc(section.anchor)}"))
    if section.html:
        parts.append(section.html)
    parts += [f'<p class="note">{note}</p>' for note in section.notes]
    parts.append("</section>")
    return "".join(parts)


def render(run, findings, window_steps=None, progress=None) -> str:
    ctx = ReportContext(run, findings, window_steps)
    sections = build_sections(run, ctx, progress)
    anchors = {s.anchor for s in sections}
    titles = {s.anchor: s.title for s in sections}
    notes = evidence_notes(ctx.findings, anchors)
    nav = " ".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in sections)
    warnings = ""
    if run.warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in run.warnings[:200])
        warnings = f"<details><summary>{len(run.warnings)} warning(s) while loading</summary><ul>{items}</ul></details>"
    body = [
        _header(run, ctx.findings),
        warnings,
        '<h2 id="findings">Findings</h2>',
        findings_html(ctx.findings, anchors, titles),
        f"<nav>{nav}</nav>",
    ]
    body += [_section_html(s, notes.get(s.anchor, [])) for s in sections]
    if not sections:
        body.append(
            '<p class="desc">No events were recorded in this run, so there is nothing to '
            "draw. Did the job start its ranks under <code>diagnose run</code>?</p>"
        )
    generated = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    body.append(f'<p class="note">Generated by diagnose at {generated}.</p>')
    title = esc((run.manifest or {}).get("name") or os.path.basename(run.root))
    return page_html(f"diagnose: {title}", CSS, "".join(body))


def write_report(run, findings=None, path=None, window_steps=None, progress=None) -> str:
    """Write the report (default `<run>/report.html`) and return its path.
    window_steps=(first, last) sets the timeline's steps; progress(name) is
    called before each view is built."""
    if findings is None:
        findings = run.findings
    path = path or os.path.join(run.root, "report.html")
    text = render(run, findings, window_steps, progress)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
