"""Issue 48, item 3: each finding's impact as GPU-hours per day of the job
(impact per step / step x 24 h x world size), in money with --gpu-hour-cost;
the CLI summary leads with the biggest; the report and MLflow carry it."""

import json

import pytest

from diagnose.analysis.findings.gpu_hours import gpu_hour_cost, gpu_hours_per_day, worth_line
from diagnose.analysis.findings.run_detectors import Context
from tests.support.jobs import job_env, load_run, run_diagnose
from tests.support.synthetic_run import write_synthetic_run


def test_the_formula_and_the_price():
    # a straggler's 10 ms of a 100 ms step on 1,024 GPUs, all day
    assert gpu_hours_per_day(10.0, 100.0, 1024) == pytest.approx(2457.6)
    assert gpu_hours_per_day(10.0, 0.0, 8) is None and gpu_hours_per_day(float("nan"), 100.0, 8) is None
    assert gpu_hour_cost({"DIAGNOSE_GPU_HOUR_COST": "2.5"}) == 2.5
    for bad in ("", "free", "-1", "0", "inf", "nan"):
        assert gpu_hour_cost({"DIAGNOSE_GPU_HOUR_COST": bad}) is None
    findings = [
        {"kind": "hidden_sync", "ranks": [0, 1], "metrics": {"gpu_hours_per_day": 3.0}},
        {"kind": "straggler", "ranks": [5], "metrics": {"gpu_hours_per_day": 40.0}},
    ]
    assert worth_line(findings, 2.5) == (
        "Worth most: straggler (rank 5), 40.0 GPU-hours/day of this job ($100.00/day at $2.50/GPU-hour)"
    )
    assert worth_line([{"kind": "x", "metrics": {}}]) is None


def test_analyze_prints_writes_and_tracks_gpu_hours(tmp_path):
    out = write_synthetic_run(str(tmp_path / "run"), ranks=8, steps=20, slow_rank=5, slow_factor=1.8)
    env = job_env(outputs=True, DIAGNOSE_TRACKING="on")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = run_diagnose(["analyze", out, "--quiet", "--gpu-hour-cost", "2.5"], env=env)
    findings = json.loads((tmp_path / "run" / "analysis" / "findings.json").read_text())
    (straggler,) = [f for f in findings if f["kind"] == "straggler"]
    hours = straggler["metrics"]["gpu_hours_per_day"]
    # its share of the median steady step, on all 8 GPUs, all day
    step_ms = Context(load_run(out)).step_ms
    assert hours == pytest.approx(straggler["impact_ms_per_step"] / step_ms * 24 * 8, rel=1e-3)
    lines = proc.stdout.splitlines()
    lead = next(line for line in lines if line.startswith("Worth most:"))
    assert (
        lead == f"Worth most: straggler (rank 5), {hours:,.1f} GPU-hours/day of this job "
        f"(${hours * 2.5:,.2f}/day at $2.50/GPU-hour)"
    )
    report = (tmp_path / "run" / "report.html").read_text()
    assert f'<p class="worth">{lead}</p>' in report and "<th>GPU-h/day</th>" in report
    from diagnose.exporters import mlflow_store

    client = mlflow_store.client_for(out)
    (run,) = client.search_runs([mlflow_store.experiment_id(client, out)])
    assert run.data.metrics["finding/straggler_gpu_hours_per_day"] == pytest.approx(hours)
    assert run.data.metrics["finding/fp32_math_gpu_hours_per_day"] == 0.0


def test_a_bad_price_is_one_line(tmp_path):
    out = write_synthetic_run(str(tmp_path / "run"), ranks=2, steps=6)
    proc = run_diagnose(["analyze", out, "--quiet", "--gpu-hour-cost", "-3"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--gpu-hour-cost must be a positive price" in proc.stderr
