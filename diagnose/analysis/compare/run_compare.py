"""What changed from run A to run B (`diagnose compare`; printed and drawn by
diagnose.cli.compare_command and dashboards.compare_page).

Step time (median over ranks and steady steps, and the slowest rank's per-step
median), the breakdown per phase (ms per step, steady-state mean over ranks),
and findings gained, lost and changed. Findings are matched by (kind, ranks,
stage, callsite); only warning and critical ones count as gained or lost (a
clean run may have info-level ones), info-level differences are listed apart.
A finding in both runs has changed when its severity did, or its impact per
step grew or shrank IMPACT_CHANGE times (by 1 ms at least): a straggler that a
busy machine made critical in a clean run and that a real fault made 40x dearer
is not "the same".

Runs with GPU kernels (imported traces) also compare their device figures
(diagnose/analysis/compare/device_figures.py): kernel time, communication, exposed
communication and the kernel families that changed most. A run whose traces
mark no steps is compared per window (diagnose/analysis/tables/trace_windows.py):
`unit` says "window", and its "step time" is the window's span.
"""

from diagnose.analysis.compare.device_figures import compare_figures, device_figures
from diagnose.analysis.tables.breakdown import PART_LABELS, PARTS
from diagnose.analysis.tables.step_tables import steady
from diagnose.analysis.tables.trace_windows import note, window_ranks

ACTIONABLE = ("critical", "warning")
IMPACT_CHANGE = 2.0


def finding_key(f: dict) -> tuple:
    return (
        f.get("kind"),
        tuple(sorted(int(r) for r in (f.get("ranks") or []))),
        f.get("stage"),
        f.get("callsite") or None,
    )


def summarize(run, findings=None) -> dict:
    findings = run.findings if findings is None else findings
    breakdown = steady(run.breakdown(), run.steady_steps())
    windows = window_ranks(run.steps())
    from diagnose.analysis.compare.run_scaling import work_per_step

    layout = (run.manifest or {}).get("layout")
    out = {
        "root": run.root,
        "name": (run.manifest or {}).get("name") or run.root,
        "world_size": run.world_size,
        "steady_steps": list(run.steady_steps()),
        "layout": " x ".join(f"{k}{v}" for k, v in layout.items()) if isinstance(layout, dict) else "-",
        "work": work_per_step(run),
        "findings": list(findings),
        "step_ms": None,
        "mean_step_ms": None,
        "slowest_step_ms": None,
        "parts": {},
        "per_step": [],
        "unit": "window" if windows else "step",
        "window_note": note(windows, len(run.ranks)) if windows else None,
        "device": device_figures(run),
    }
    if breakdown is not None and len(breakdown):
        # per steady step, for the regression gate's bootstrap (regression_gate.py)
        by_step = breakdown.groupby("step")
        out["steady_step_ms"] = [float(v) for v in by_step["step_ms"].median()]
        out["steady_parts"] = {
            part: [float(v) for v in by_step[f"{part}_ms"].mean()]
            for part in PARTS
            if f"{part}_ms" in breakdown.columns
        }
        out["step_ms"] = float(breakdown["step_ms"].median())
        out["mean_step_ms"] = float(breakdown["step_ms"].mean())
        out["slowest_step_ms"] = float(breakdown.groupby("step")["step_ms"].max().median())
        for part in PARTS:
            column = f"{part}_ms"
            if column in breakdown.columns:
                out["parts"][part] = float(breakdown[column].mean())
    full = run.breakdown()
    if full is not None and len(full):
        per_step = full.groupby("step")["step_ms"].agg(["median", "max"]).reset_index()
        out["per_step"] = [
            (int(s), float(m), float(x)) for s, m, x in zip(per_step["step"], per_step["median"], per_step["max"])
        ]
    return out


def _change(fa: dict, fb: dict) -> str | None:
    """How a finding kept from A to B changed, or None if it did not."""
    sa, sb = fa.get("severity"), fb.get("severity")
    ia, ib = (float(f.get("impact_ms_per_step") or 0.0) for f in (fa, fb))
    low, high = sorted((ia, ib))
    impact = high - low >= 1.0 and high >= IMPACT_CHANGE * low
    if sa == sb and not impact:
        return None
    return f"{sa} -> {sb}" + (f", impact {ia:.1f} -> {ib:.1f} ms/step" if impact else "")


def _ratio(a, b):
    if a is None or b is None or not a:
        return None
    return b / a


def compare(a: dict, b: dict) -> dict:
    parts = []
    for part in PARTS:
        va, vb = a["parts"].get(part), b["parts"].get(part)
        if va is None and vb is None:
            continue
        va, vb = va or 0.0, vb or 0.0
        parts.append(
            {
                "part": part,
                "label": PART_LABELS[part],
                "a_ms": va,
                "b_ms": vb,
                "delta_ms": vb - va,
                "ratio": _ratio(va, vb),
            }
        )
    fa = {finding_key(f): f for f in a["findings"]}
    fb = {finding_key(f): f for f in b["findings"]}
    act_a = {k: f for k, f in fa.items() if f.get("severity") in ACTIONABLE}
    act_b = {k: f for k, f in fb.items() if f.get("severity") in ACTIONABLE}
    gained = [f for k, f in act_b.items() if k not in act_a]
    lost = [f for k, f in act_a.items() if k not in act_b]
    changed = [
        {"a": act_a[k], "b": f, "change": change}
        for k, f in act_b.items()
        if k in act_a and (change := _change(act_a[k], f))
    ]
    info_gained = [f for k, f in fb.items() if k not in fa and f.get("severity") not in ACTIONABLE]
    info_lost = [f for k, f in fa.items() if k not in fb and f.get("severity") not in ACTIONABLE]
    return {
        "a": {
            k: a.get(k)
            for k in ("root", "name", "world_size", "step_ms", "mean_step_ms", "slowest_step_ms", "window_note")
        },
        "b": {
            k: b.get(k)
            for k in ("root", "name", "world_size", "step_ms", "mean_step_ms", "slowest_step_ms", "window_note")
        },
        "step_time": {
            "a_ms": a["step_ms"],
            "b_ms": b["step_ms"],
            "delta_ms": (b["step_ms"] - a["step_ms"])
            if a["step_ms"] is not None and b["step_ms"] is not None
            else None,
            "ratio": _ratio(a["step_ms"], b["step_ms"]),
            "mean_a_ms": a["mean_step_ms"],
            "mean_b_ms": b["mean_step_ms"],
            "mean_ratio": _ratio(a["mean_step_ms"], b["mean_step_ms"]),
            "slowest_a_ms": a["slowest_step_ms"],
            "slowest_b_ms": b["slowest_step_ms"],
            "slowest_ratio": _ratio(a["slowest_step_ms"], b["slowest_step_ms"]),
        },
        "parts": parts,
        "unit": "window" if "window" in (a.get("unit"), b.get("unit")) else "step",
        "device": compare_figures(a.get("device"), b.get("device")),
        "findings": {
            "gained": gained,
            "lost": lost,
            "changed": changed,
            "info_gained": info_gained,
            "info_lost": info_lost,
        },
        "per_step": {"a": a["per_step"], "b": b["per_step"]},
    }
