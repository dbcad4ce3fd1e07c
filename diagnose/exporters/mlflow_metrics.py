"""The numbers logged into a run's MLflow run (diagnose/exporters/mlflow_run.py):
per-step metrics stamped with each step's end, and the run's summary/*,
finding/*, waterfall/* and mfu/* metrics."""

MAX_BATCH = 1000


def log_metrics(client, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), MAX_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + MAX_BATCH])


def step_metrics(run) -> list:
    """mlflow Metric objects, one per (name, step), stamped with the step's end."""
    from mlflow.entities import Metric

    from diagnose.analysis.tables.step_tables import bubbles, pipeline_blocks, step_summary

    blocks = pipeline_blocks(run.events())
    summary = step_summary(run.breakdown(), run.steps(), bubbles(blocks) if len(blocks) else None)
    if summary.empty:
        return []
    wall0 = run.wall_t0_ns or 0
    names = [
        c
        for c in ("step_time_p50_ms", "step_time_max_ms", "data_wait_frac", "exposed_comm_frac", "bubble_frac")
        if c in summary.columns
    ]
    metrics = []
    for row in summary.itertuples(index=False):
        end = row.end_ns
        timestamp = int((wall0 + (end if end == end else 0)) // 1_000_000)
        for name in names:
            value = getattr(row, name)
            if value == value:  # not NaN
                metrics.append(Metric(name, float(value), timestamp, int(row.step)))
    return metrics


def summary_metrics(run, findings) -> dict:
    from diagnose.analysis.tables import mfu
    from diagnose.analysis.tables.breakdown import PARTS
    from diagnose.analysis.tables.step_tables import bubble_frac, bubbles, pipeline_blocks, steady

    out = {
        "summary/steps_recorded": float(run.steps()["step"].nunique()) if len(run.steps()) else 0.0,
        "summary/findings": float(len(findings)),
    }
    breakdown = steady(run.breakdown(), run.steady_steps())
    if breakdown is not None and len(breakdown):
        total = breakdown["step_ms"].sum()
        per_step_max = breakdown.groupby("step")["step_ms"].max()
        out.update(
            {
                "summary/step_time_median_ms": float(breakdown["step_ms"].median()),
                "summary/step_time_max_median_ms": float(per_step_max.median()),
                "summary/data_wait_frac": float(breakdown["data_wait_ms"].sum() / total) if total else 0.0,
                "summary/exposed_comm_frac": float(breakdown["exposed_comm_ms"].sum() / total) if total else 0.0,
            }
        )
        # each phase's ms per step (the mean rank's), to chart across runs in MLflow's compare view
        for part in PARTS:
            column = f"{part}_ms"
            if column in breakdown.columns:
                out[f"summary/{part}_ms_per_step"] = float(breakdown[column].mean())
        blocks = steady(pipeline_blocks(run.events()), run.steady_steps())
        if blocks is not None and len(blocks):
            frac = bubble_frac(bubbles(blocks))
            if frac == frac:  # not NaN: some schedule window
                out["summary/bubble_frac"] = frac
    out.update(finding_impacts(findings))
    out.update(mfu.metrics(mfu.summarize(run)))  # mfu/*: only what was measured
    out.update(waterfall_metrics((run.step_figures or {}).get("waterfall")))
    return out


def waterfall_metrics(waterfall: dict | None) -> dict:
    """waterfall/<kind>_frac per finding kind (the largest share of a kind), rest_frac,
    mfu_frac where known: where the step goes (diagnose/analysis/findings/step_waterfall.py)."""
    if not waterfall or waterfall.get("rest_frac") is None:
        return {}
    out = {"waterfall/rest_frac": float(waterfall["rest_frac"])}
    if isinstance(waterfall.get("mfu_frac"), (int, float)):
        out["waterfall/mfu_frac"] = float(waterfall["mfu_frac"])
    for share in waterfall["shares"]:
        key = f"waterfall/{share['kind']}_frac"
        out[key] = max(out.get(key, 0.0), float(share["share_frac"]))
    return out


def finding_impacts(findings: list) -> dict:
    """finding/<kind>_impact_ms_per_step and _gpu_hours_per_day for every kind
    diagnose reports (diagnose/analysis/detectors/finding_kinds.py): the worst finding's, 0
    when the run has none (so a fixed cause charts as 0, not as a missing point)."""
    from diagnose.analysis.detectors import finding_kinds

    out = {
        f"finding/{kind}_{what}": 0.0
        for kind in finding_kinds.names()
        for what in ("impact_ms_per_step", "gpu_hours_per_day")
    }
    for f in findings:
        for what, value in (
            ("impact_ms_per_step", f.get("impact_ms_per_step")),
            ("gpu_hours_per_day", (f.get("metrics") or {}).get("gpu_hours_per_day")),
        ):
            key = f"finding/{f.get('kind')}_{what}"
            if key in out and isinstance(value, (int, float)) and value == value:
                out[key] = max(out[key], float(value))
    return out
