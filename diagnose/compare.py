"""`diagnose compare RUN_A RUN_B`: what changed from A to B.

Step time (median over ranks and steady steps, and the slowest rank's per-step
median), the breakdown per phase (ms per step, steady-state mean over ranks),
and findings gained, lost and changed. Findings are matched by (kind, ranks,
stage, callsite); only warning and critical ones count as gained or lost (a
clean run may have info-level ones), info-level differences are listed apart.
A finding in both runs has changed when its severity did, or its impact per
step grew or shrank IMPACT_CHANGE times (by 1 ms at least): a straggler that a
busy machine made critical in a clean run and that a real fault made 40x dearer
is not "the same".
"""
import math

from dashboards.common import PARTS, PART_LABELS
from dashboards.tables import steady

ACTIONABLE = ("critical", "warning")
IMPACT_CHANGE = 2.0


def finding_key(f: dict) -> tuple:
    return (f.get("kind"), tuple(sorted(int(r) for r in (f.get("ranks") or []))), f.get("stage"),
            f.get("callsite") or None)


def summarize(run, findings=None) -> dict:
    findings = run.findings if findings is None else findings
    breakdown = steady(run.breakdown(), run.steady_steps())
    out = {"root": run.root, "name": (run.manifest or {}).get("name") or run.root,
           "world_size": run.world_size, "steady_steps": list(run.steady_steps()),
           "findings": list(findings), "step_ms": None, "mean_step_ms": None,
           "slowest_step_ms": None, "parts": {},
           "per_step": []}
    if breakdown is not None and len(breakdown):
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
        out["per_step"] = [(int(s), float(m), float(x)) for s, m, x in
                           zip(per_step["step"], per_step["median"], per_step["max"])]
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
        parts.append({"part": part, "label": PART_LABELS[part], "a_ms": va, "b_ms": vb,
                      "delta_ms": vb - va, "ratio": _ratio(va, vb)})
    fa = {finding_key(f): f for f in a["findings"]}
    fb = {finding_key(f): f for f in b["findings"]}
    act_a = {k: f for k, f in fa.items() if f.get("severity") in ACTIONABLE}
    act_b = {k: f for k, f in fb.items() if f.get("severity") in ACTIONABLE}
    gained = [f for k, f in act_b.items() if k not in act_a]
    lost = [f for k, f in act_a.items() if k not in act_b]
    changed = [{"a": act_a[k], "b": f, "change": change} for k, f in act_b.items()
               if k in act_a and (change := _change(act_a[k], f))]
    info_gained = [f for k, f in fb.items() if k not in fa and f.get("severity") not in ACTIONABLE]
    info_lost = [f for k, f in fa.items() if k not in fb and f.get("severity") not in ACTIONABLE]
    return {
        "a": {k: a[k] for k in ("root", "name", "world_size", "step_ms", "mean_step_ms",
                                "slowest_step_ms")},
        "b": {k: b[k] for k in ("root", "name", "world_size", "step_ms", "mean_step_ms",
                                "slowest_step_ms")},
        "step_time": {"a_ms": a["step_ms"], "b_ms": b["step_ms"],
                      "delta_ms": (b["step_ms"] - a["step_ms"]) if a["step_ms"] is not None and b["step_ms"] is not None else None,
                      "ratio": _ratio(a["step_ms"], b["step_ms"]),
                      "mean_a_ms": a["mean_step_ms"], "mean_b_ms": b["mean_step_ms"],
                      "mean_ratio": _ratio(a["mean_step_ms"], b["mean_step_ms"]),
                      "slowest_a_ms": a["slowest_step_ms"], "slowest_b_ms": b["slowest_step_ms"],
                      "slowest_ratio": _ratio(a["slowest_step_ms"], b["slowest_step_ms"])},
        "parts": parts,
        "findings": {"gained": gained, "lost": lost, "changed": changed,
                     "info_gained": info_gained, "info_lost": info_lost},
        "per_step": {"a": a["per_step"], "b": b["per_step"]},
    }


def _fmt(value, unit=" ms") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1f}{unit}"


def _fmt_ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_comparison(result: dict, out=None) -> None:
    from rich.table import Table
    from rich.text import Text

    from diagnose.present import console
    out = out or console()
    a, b, st = result["a"], result["b"], result["step_time"]
    out.print(Text(f"A: {a['name']}  ({a['root']})\nB: {b['name']}  ({b['root']})"))
    table = Table(title="Step time (steady steps)")
    for column in ("", "A", "B", "change", "B/A"):
        table.add_column(column, justify="right" if column else "left")
    delta = st["delta_ms"]
    table.add_row("median over ranks", _fmt(st["a_ms"]), _fmt(st["b_ms"]),
                  "-" if delta is None else f"{delta:+.1f} ms", _fmt_ratio(st["ratio"]))
    mean_delta = (None if st["mean_a_ms"] is None or st["mean_b_ms"] is None
                  else st["mean_b_ms"] - st["mean_a_ms"])
    table.add_row("mean over ranks", _fmt(st["mean_a_ms"]), _fmt(st["mean_b_ms"]),
                  "-" if mean_delta is None else f"{mean_delta:+.1f} ms", _fmt_ratio(st["mean_ratio"]))
    slow_delta = (None if st["slowest_a_ms"] is None or st["slowest_b_ms"] is None
                  else st["slowest_b_ms"] - st["slowest_a_ms"])
    table.add_row("slowest rank (median)", _fmt(st["slowest_a_ms"]), _fmt(st["slowest_b_ms"]),
                  "-" if slow_delta is None else f"{slow_delta:+.1f} ms",
                  _fmt_ratio(st["slowest_ratio"]))
    out.print(table)
    table = Table(title="Breakdown per phase, ms/step (steady mean over ranks)")
    for column in ("phase", "A", "B", "change", "B/A"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in result["parts"]:
        table.add_row(p["label"], _fmt(p["a_ms"], ""), _fmt(p["b_ms"], ""),
                      f"{p['delta_ms']:+.1f}", _fmt_ratio(p["ratio"]))
    out.print(table)
    f = result["findings"]
    table = Table(title="Findings (warning and critical)")
    for column in ("", "severity", "kind", "ranks", "finding"):
        table.add_column(column)

    def row(mark, finding, severity=None):
        table.add_row(mark, severity or finding.get("severity", ""), finding.get("kind", ""),
                      ",".join(map(str, finding.get("ranks") or [])) or "-",
                      Text(str(finding.get("title", ""))))
    for finding in f["gained"]:
        row("gained", finding)
    for finding in f["lost"]:
        row("lost", finding)
    for pair in f["changed"]:
        row("changed", pair["b"], pair["change"])
    if not (f["gained"] or f["lost"] or f["changed"]):
        table.add_row("same", "", "", "", Text("no warning or critical finding gained or lost"))
    out.print(table)
    if f["info_gained"] or f["info_lost"]:
        out.print(Text(f"info-level findings: {len(f['info_gained'])} gained, "
                       f"{len(f['info_lost'])} lost"))


def compare_runs(dir_a: str, dir_b: str, html: str | None = None, progress=None) -> dict:
    from diagnose.loader import load
    summaries = []
    for i, run_dir in enumerate((dir_a, dir_b)):
        if progress:
            progress(f"loading {'AB'[i]}")
        run = load(run_dir)
        summaries.append(summarize(run))
    result = compare(*summaries)
    if html:
        from dashboards.compare import write_compare
        if progress:
            progress("writing HTML")
        result["html"] = write_compare(result, html)
    return result
