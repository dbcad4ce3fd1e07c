"""The findings summary at the top of the report: one row per finding, most
severe first, each linking to the figure that is its evidence."""

from dashboards.view_parts import SEVERITY_COLORS, esc, kind_html
from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.findings.gpu_hours import gpu_hour_cost, worth_line

# Which view proves which kind of finding: its registry entry's evidence
# (diagnose/analysis/detectors/finding_kinds.py), then these; the first one present wins.
FALLBACK = ("breakdown-ranks", "timeline")
# a finding measured on kernels is proved by the device's view, not the host's
DEVICE_EVIDENCE = ("breakdown-device",)


def evidence_anchor(finding: dict, anchors) -> str | None:
    first = DEVICE_EVIDENCE if _clock(finding) == "GPU" else ()
    entry = finding_kinds.of(finding.get("kind"))
    for anchor in (*first, *(entry.evidence if entry else ()), *FALLBACK):
        if anchor in anchors:
            return anchor
    return None


def _metric_text(metrics: dict) -> str:
    parts = []
    for key, value in (metrics or {}).items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{esc(key)}={esc(value)}")
    return ", ".join(parts)


def findings_html(findings: list, anchors, titles: dict) -> str:
    if not findings:
        return (
            '<p class="none">No findings: nothing above noise was detected. '
            "The views below show the run as recorded.</p>"
        )
    worth = worth_line(findings, gpu_hour_cost())
    rows = []
    for i, f in enumerate(findings):
        severity = str(f.get("severity", "info"))
        anchor = evidence_anchor(f, anchors)
        color = SEVERITY_COLORS.get(severity, "#999999")
        ranks = ", ".join(esc(r) for r in (f.get("ranks") or [])) or "-"
        stage = "-" if f.get("stage") is None else esc(f.get("stage"))
        link = f'<a class="evidence" href="#{anchor}">{esc(titles.get(anchor, anchor))} &rarr;</a>' if anchor else ""
        impact = f.get("impact_ms_per_step")
        impact = f"{impact:.1f}" if isinstance(impact, (int, float)) else "-"
        hours = (f.get("metrics") or {}).get("gpu_hours_per_day")
        hours = f"{hours:,.1f}" if isinstance(hours, (int, float)) else "-"
        title = esc(f.get("title", ""))
        title_html = f'<a href="#{anchor}">{title}</a>' if anchor else title
        rows.append(
            f'<tr id="finding-{i}" class="finding sev-{esc(severity)}">'
            f'<td><span class="badge" style="background:{color}">{esc(severity)}</span></td>'
            f"<td>{kind_html(f.get('kind', ''))}</td>"
            f'<td class="title">{title_html}'
            f'<div class="rec">{esc(f.get("recommendation", ""))}</div>'
            f'<div class="metrics">{_metric_text(f.get("metrics"))}</div></td>'
            f'<td class="num">{impact}</td><td class="num">{hours}</td><td>{_clock(f)}</td>'
            f"<td>{ranks}</td><td>{stage}</td>"
            f'<td class="callsite">{esc(f.get("callsite") or "-")}</td><td>{link}</td></tr>'
        )
    return (
        (f'<p class="worth">{esc(worth)}</p>' if worth else "")
        + '<table class="findings"><thead><tr><th>severity</th><th>kind</th><th>finding</th>'
        "<th>impact ms/step</th><th>GPU-h/day</th><th>clock</th><th>ranks</th><th>stage</th><th>callsite</th>"
        "<th>evidence</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _clock(finding: dict) -> str:
    """The clock the finding's figures come from: GPU kernels or the host."""
    return "GPU" if (finding.get("metrics") or {}).get("device_time") == 1.0 else "host"


def evidence_notes(findings: list, anchors) -> dict:
    """anchor -> list of trusted HTML lines naming the findings it proves."""
    notes: dict = {}
    for i, f in enumerate(findings):
        anchor = evidence_anchor(f, anchors)
        if anchor:
            notes.setdefault(anchor, []).append(
                f'Evidence for <a href="#finding-{i}">{esc(f.get("kind"))}: {esc(f.get("title", ""))}</a>'
            )
    return notes
