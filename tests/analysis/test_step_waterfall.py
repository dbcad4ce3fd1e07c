"""Issue 48 item 2: the step as shares that add up to 1 (diagnose/analysis/findings/step_waterfall.py):
MFU, each finding's impact with overlaps between findings counted once (their fixes
replayed together), and a rest no finding explains."""

import pytest

from diagnose.analysis.findings.step_waterfall import step_waterfall


def _finding(kind, impact_ms, ranks=(), stage=None):
    return {"kind": kind, "impact_ms_per_step": impact_ms, "ranks": list(ranks), "stage": stage}


def _total(waterfall):
    return (waterfall["mfu_frac"] or 0.0) + sum(s["share_frac"] for s in waterfall["shares"]) + waterfall["rest_frac"]


def test_findings_that_do_not_overlap_keep_their_impacts():
    waterfall = step_waterfall(
        [_finding("straggler", 20.0, [3]), _finding("input_stall", 10.0)],
        step_ms=100.0,
        joint_saving_ms=30.0,
        mfu_frac=0.4,
    )
    assert [s["share_frac"] for s in waterfall["shares"]] == pytest.approx([0.2, 0.1])
    assert waterfall["rest_frac"] == pytest.approx(0.3) and _total(waterfall) == pytest.approx(1.0)


def test_two_findings_claiming_the_same_time_are_counted_once():
    # a straggler and the stage it slows each save 30 ms; fixed together, 36
    waterfall = step_waterfall(
        [_finding("straggler", 30.0, [5]), _finding("stage_imbalance", 30.0, stage=2)],
        step_ms=100.0,
        joint_saving_ms=36.0,
        mfu_frac=None,
    )
    assert sum(s["share_frac"] for s in waterfall["shares"]) == pytest.approx(0.36)
    assert waterfall["overlap_scale"] == pytest.approx(0.6) and waterfall["rest_frac"] == pytest.approx(0.64)


def test_an_overstated_estimate_never_makes_the_rest_negative():
    waterfall = step_waterfall(
        [_finding("pipeline_bubble", 80.0), _finding("straggler", 40.0, [1])],
        step_ms=100.0,
        joint_saving_ms=None,
        mfu_frac=0.3,
    )
    assert waterfall["rest_frac"] == pytest.approx(0.0) and _total(waterfall) == pytest.approx(1.0)
    assert [s["share_frac"] for s in waterfall["shares"]] == pytest.approx([0.7 * 80 / 120, 0.7 * 40 / 120])


def test_no_finding_leaves_the_step_to_mfu_and_the_rest():
    waterfall = step_waterfall([], step_ms=50.0, joint_saving_ms=None, mfu_frac=None)
    assert waterfall["shares"] == [] and waterfall["rest_frac"] == 1.0


def test_the_showcase_runs_fixes_replayed_together_save_less_than_their_sum(recorded_scenario):
    """The showcase run (a straggler, slow input and a bubble): the straggler's and the
    input stall's fixes, replayed together, save less than each alone added up (the
    straggler also waits for data); the waterfall counts that time once."""
    import json

    out, _ = recorded_scenario("showcase")
    figures = json.loads((out / "analysis" / "step_figures.json").read_text())
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    waterfall = figures["waterfall"]
    assert waterfall["overlap_scale"] < 0.95
    impacts = {f["kind"]: f["impact_ms_per_step"] for f in findings}
    for share in waterfall["shares"]:
        assert share["share_frac"] * waterfall["step_ms"] < impacts[share["kind"]]
    assert _total(waterfall) == pytest.approx(1.0) and waterfall["rest_frac"] > 0
