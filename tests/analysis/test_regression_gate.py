"""Issue 48, item 4: `diagnose compare BASELINE CANDIDATE --fail-on ...`, a CI gate
that fails only beyond the baseline's own noise (diagnose/analysis/compare/regression_gate.py).
Step series are autocorrelated (AR(1)), as a job's step times are; the gate's
bootstrap is seeded, so each verdict here is deterministic."""

import shutil

import numpy as np
import pytest

from diagnose.analysis.compare import regression_gate
from diagnose.analysis.compare.run_compare import finding_key
from tests.support.jobs import fixture_path, run_diagnose


def _steps(
    seed: int, n: int = 30, mean_ms: float = 100.0, slower: float = 0.0, phi: float = 0.5, noise: float = 0.03
) -> list:
    """An AR(1) step-time series: noise (3% of the step) that lasts a few steps."""
    rng = np.random.default_rng(seed)
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rng.normal(0.0, noise * mean_ms)
        out.append(mean_ms * (1 + slower) + x)
    return out


def _summary(steps, findings=(), parts=None) -> dict:
    return {"steady_step_ms": steps, "findings": list(findings), "steady_parts": parts or {}}


def _verdict(a, b, check="step-time"):
    (v,) = [v for v in regression_gate.gate(a, b, [check], finding_key) if v["check"] == check]
    return v


def test_twenty_pairs_of_the_same_job_never_fail():
    verdicts = [_verdict(_summary(_steps(2 * s)), _summary(_steps(2 * s + 1))) for s in range(20)]
    assert not [v["line"] for v in verdicts if v["regression"]]


def test_a_ten_percent_slowdown_fails_and_a_two_percent_one_is_within_noise():
    slow = _verdict(_summary(_steps(0)), _summary(_steps(1, slower=0.10)))
    assert slow["regression"] and slow["line"].startswith("step-time +1") and "beyond noise" in slow["line"]
    small = _verdict(_summary(_steps(0)), _summary(_steps(1, slower=0.02)))
    assert not small["regression"]
    assert small["line"].endswith(("within noise", "below the minimum effect"))


def test_impact_is_tested_per_part_with_holm():
    base = _summary(_steps(0), parts={"data_wait": _steps(10, mean_ms=5.0), "exposed_comm": _steps(11, mean_ms=8.0)})
    worse = _summary(
        _steps(1),
        findings=[
            {"kind": "input_stall", "severity": "critical", "ranks": [0]},
            {"kind": "exposed_comm", "severity": "warning", "ranks": [0]},
        ],
        parts={"data_wait": _steps(12, mean_ms=25.0), "exposed_comm": _steps(13, mean_ms=8.0)},
    )
    verdicts = {v["part"]: v for v in regression_gate.gate(base, worse, ["impact"], finding_key)}
    assert verdicts["data_wait"]["regression"] and "over 2 parts" in verdicts["data_wait"]["line"]
    assert not verdicts["exposed_comm"]["regression"]


def test_fail_on_takes_regression_or_a_list():
    assert regression_gate.parse_fail_on("regression") == ["step-time", "new-critical", "impact"]
    assert regression_gate.parse_fail_on("new-critical, step-time") == ["new-critical", "step-time"]
    for bad in ("", "speed", "regression,impact"):
        with pytest.raises(ValueError):
            regression_gate.parse_fail_on(bad)


def test_the_cli_fails_a_slow_input_run_against_its_fix_and_passes_the_fix(tmp_path):
    for name in ("whatif-slow_input", "whatif-slow_input-fixed"):
        shutil.copytree(fixture_path("runs", name), tmp_path / name, ignore=shutil.ignore_patterns("SOURCE.txt"))
    fixed, slow = str(tmp_path / "whatif-slow_input-fixed"), str(tmp_path / "whatif-slow_input")
    proc = run_diagnose(["compare", fixed, slow, "--fail-on", "regression"], check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("REGRESSION:", "ok:"))]
    assert lines[0].startswith("REGRESSION: step-time +") and "beyond noise" in lines[0]
    assert any(line.startswith("REGRESSION: new-critical input_stall") for line in lines)
    assert any(line.startswith("REGRESSION: impact data_wait") for line in lines)
    proc = run_diagnose(["compare", slow, fixed, "--fail-on", "step-time,new-critical"], check=False)
    assert proc.returncode == 0 and "REGRESSION" not in proc.stdout
    proc = run_diagnose(["compare", slow, fixed, "--fail-on", "speed"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--fail-on takes" in proc.stderr


def test_the_trainers_slowdown_knob_pauses_its_share_of_the_step_before_the_optimizer(monkeypatch):
    """slowdown:pct=P, the planted regression of bench/regression_gate.py (10% caught, 2% within
    noise, clean pairs 10 of 10 passing: bench/results/2026-12-06-regression-gate.md)."""
    import torch

    from reference_trainer import faults

    assert faults.parse_fault("slowdown:pct=10").params == {"pct": 10.0}
    f = faults.Faults([faults.parse_fault("slowdown:pct=10")], rank=0, stage=0, device=torch.device("cpu"))
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    f.slow_step()  # no step measured yet: nothing to size it by
    for step_s in (0.20, 0.10, 0.30):  # the steps as measured, each with its own pause in it
        f.after_step(0, step_s + (slept[-1] if slept else 0.0))
        f.slow_step()
    assert slept == pytest.approx([0.02, 0.02, 0.02])  # 10% of the median unpaused step (0.20)
