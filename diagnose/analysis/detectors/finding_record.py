"""The findings schema (docs/run-directory.md, findings.json), and severity from impact.
The kinds a finding can be: diagnose/analysis/detectors/finding_kinds.py.

Severity follows from the time a fix would save, as a fraction of the median
step: >= 15% critical, >= 3% warning, else info. Fractions, not absolute ms, so
one rule serves a 50 ms CPU step and a 5 s LLM step.
"""

from dataclasses import asdict, dataclass, field

from diagnose.analysis.detectors import finding_kinds

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
CRITICAL_FRAC = 0.15
WARNING_FRAC = 0.03


def severity_for(impact_frac: float) -> str:
    if impact_frac >= CRITICAL_FRAC:
        return "critical"
    if impact_frac >= WARNING_FRAC:
        return "warning"
    return "info"


@dataclass
class Finding:
    kind: str
    title: str
    recommendation: str
    impact_ms_per_step: float = 0.0
    severity: str | None = None  # None: derived from impact by with_severity
    ranks: list = field(default_factory=list)
    stage: int | None = None
    callsite: str | None = None
    metrics: dict = field(default_factory=dict)
    # where impact_ms_per_step comes from: "replay" (diagnose/analysis/replay/whatif.py) or
    # "estimate: <why the replay did not give it>"
    impact_source: str = "estimate"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranks"] = [int(r) for r in self.ranks]
        d["stage"] = None if self.stage is None else int(self.stage)
        d["metrics"] = {k: _number(v) for k, v in self.metrics.items()}
        d["impact_ms_per_step"] = round(float(self.impact_ms_per_step), 3)
        return d


def _number(value):
    if isinstance(value, str):  # text evidence: a group's description, a role, a rank list
        return value[:500]
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return round(value, 4) if value == value else None


def with_severity(finding: Finding, step_ms: float) -> Finding:
    """Set severity from impact unless the detector fixed it (hang, crash)."""
    if finding.severity is None:
        finding.severity = severity_for(finding.impact_ms_per_step / step_ms) if step_ms > 0 else "info"
    finding.metrics.setdefault("impact_ms_per_step", finding.impact_ms_per_step)
    return finding


def sort_findings(findings: list[dict]) -> list[dict]:
    """By severity, then by impact; a job that did not finish (hang, rank_failure:
    finding_kinds' job_stopped) leads, since nothing else matters until it does."""
    return sorted(
        findings,
        key=lambda f: (
            SEVERITY_ORDER.get(f["severity"], 3),
            not finding_kinds.job_stopped(f["kind"]),
            -f.get("impact_ms_per_step", 0.0),
        ),
    )
