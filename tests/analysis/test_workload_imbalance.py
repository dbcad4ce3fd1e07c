"""Issue 23: `workload_imbalance`, micro-batches of unequal work (variable
sequence lengths) whose slowest rank changes from step to step, told apart
from a persistent straggler and from a clean run."""

import json

import numpy as np
import pytest

from diagnose.analysis.findings.run_detectors import Context, detect
from tests.support.jobs import load_run
from tests.support.synthetic_run import write_synthetic_run


def _planted_length(step, microbatch, dp_rank):
    """The varlen scenario's length factor for a micro-batch, drawn as its trainer did."""
    import torch

    from reference_trainer.faults import Faults, parse_fault
    from reference_trainer.scenarios import SCENARIOS

    argv = SCENARIOS["varlen"].argv
    spec = parse_fault(argv[argv.index("--fault") + 1])
    return Faults([spec], rank=dp_rank, stage=0, device=torch.device("cpu")).length_factor(step, microbatch)


def _serious(findings, kind):
    return [f for f in findings if f["kind"] == kind and f["severity"] != "info"]


def test_varlen_scenario_is_a_workload_imbalance_and_no_straggler(recorded_scenario):
    """The recorded varlen run (shared with test_scenarios): dp4, 4 micro-batches, lengths drawn in 1-7x."""
    out, _ = recorded_scenario("varlen")
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    assert _serious(findings, "straggler") == [], findings
    (found,) = _serious(findings, "workload_imbalance")
    assert found["ranks"] == [0, 1, 2, 3] and found["stage"] is None
    m = found["metrics"]
    # the evidence a user checks, against what the trainer planted (varlen:spread=6,seed=5:
    # each micro-batch 1 + 6u long, u drawn per step, micro-batch and replica): the spread
    # of micro-batch compute is the lengths' spread, and every rank the planted lengths
    # make slowest in some step is measured slowest in some step
    planted = {(s, r): [_planted_length(s, mb, r) for mb in range(4)] for s in range(16) for r in range(4)}
    lengths = np.concatenate([planted[(s, r)] for s in Context(load_run(out)).steady for r in range(4)])
    assert m["own_median_p50_over_p10_x"] == pytest.approx(
        np.percentile(lengths, 50) / np.percentile(lengths, 10), rel=0.25
    )
    planted_slowest = {max(range(4), key=lambda r: sum(planted[(s, r)])) for s in range(2, 16)}
    assert {r for r in range(4) if m[f"rank{r}_slowest_frac"] > 0} >= planted_slowest
    assert sum(m[f"rank{r}_slowest_frac"] for r in range(4)) == pytest.approx(1.0, abs=1e-3)
    assert m["microbatch_p50_ms"] < m["microbatch_p90_ms"] <= m["microbatch_max_ms"]
    # the impact is the what-if replay's saving with equal micro-batches (the
    # detector's own estimate, the equalised wait, is kept), and a real share of the step
    assert found["impact_ms_per_step"] == pytest.approx(m["whatif_saving_ms_per_step"], rel=1e-3)
    assert m["estimate_ms_per_step"] == pytest.approx(m["equalised_wait_ms_per_step"], rel=1e-3)
    run = load_run(out)
    step_ms = float(Context(run).step_ms)
    assert 0.03 * step_ms <= found["impact_ms_per_step"] < step_ms
    assert "token-balanced" in found["recommendation"]


def test_a_persistent_straggler_is_a_straggler_not_a_workload_imbalance(tmp_path):
    run = load_run(write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=20, slow_rank=2, slow_factor=1.6))
    findings = detect(run)
    assert [f["ranks"] for f in _serious(findings, "straggler")] == [[2]], findings
    assert [f for f in findings if f["kind"] == "workload_imbalance"] == [], findings


def test_a_rank_slow_in_a_third_of_the_steps_is_an_intermittent_straggler(tmp_path):
    """Equal micro-batches, rank 1 at 2x in every third step (a periodic stall on its
    host): the straggler path judged on the steps it straggled in, not a workload
    imbalance (lengths do not vary)."""
    run = load_run(
        write_synthetic_run(
            str(tmp_path / "run"), ranks=4, steps=40, slow_rank=1, slow_factor=2.0, slow_steps=set(range(0, 40, 3))
        )
    )
    findings = detect(run)
    (found,) = _serious(findings, "straggler")
    assert found["ranks"] == [1] and "an intermittent straggler" in found["title"], found["title"]
    m = found["metrics"]
    # last in ~half the steps (its third, and a share of the rest by jitter), yet
    # normal on its median step: before, judged as persistent on that median, unnamed
    assert m["persistent"] == 0.0 and m["last_in_steps_frac"] >= 0.2, m
    assert m["busy_ratio_x"] == pytest.approx(2.0, rel=0.1), m  # planted: 2x on the steps it straggled in
    assert [f for f in findings if f["kind"] == "workload_imbalance"] == [], findings


def test_a_clean_run_has_neither(tmp_path):
    run = load_run(write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=20))
    findings = detect(run)
    assert [f for f in findings if f["kind"] in ("straggler", "workload_imbalance")] == [], findings


def test_varlen_fault_draws_lengths_per_microbatch_and_replica():
    import torch

    from reference_trainer.faults import Faults, parse_fault

    spec = parse_fault("varlen:spread=3")
    assert spec.params == {"spread": 3.0, "seed": 0, "tail": 0.0}
    with pytest.raises(ValueError):
        parse_fault("varlen")
    cpu = torch.device("cpu")
    # rank 5 is replica 1 (e.g. its second pipeline stage): the same lengths as rank 1
    a, b = Faults([spec], rank=1, stage=0, device=cpu), Faults([spec], rank=5, stage=1, device=cpu, dp_rank=1)
    other = Faults([spec], rank=2, stage=0, device=cpu)
    draws = [a.length_factor(s, m) for s in range(10) for m in range(4)]
    assert draws == [b.length_factor(s, m) for s in range(10) for m in range(4)]
    assert draws != [other.length_factor(s, m) for s in range(10) for m in range(4)]
    assert 1.0 <= min(draws) and max(draws) <= 4.0 and max(draws) - min(draws) > 1.5
    assert Faults([], rank=1, stage=0, device=cpu).compute_begins() is None
