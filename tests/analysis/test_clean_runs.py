"""Clean runs are silent (issue 43): a job with no fault gets no straggler. A false
straggler sends a user to the wrong machine, so the straggler's intermittent path
(judged on the steps a rank was last in) must beat chance and the rank's own other
steps (diagnose/analysis/detectors/straggler.py). bench/clean_silence.py counts
findings over repeated clean launches."""

import json

from diagnose.analysis.detectors import straggler, straggler_causes
from diagnose.analysis.detectors.straggler_waits import waiting_caused
from diagnose.analysis.findings.run_detectors import Context
from tests.support.jobs import fixture_path, load_run


def _serious(findings, kind):
    return [f for f in findings if f["kind"] == kind and f["severity"] != "info"]


def test_a_clean_ddp_run_whose_jitter_was_once_a_straggler_has_none():
    """tests/data/runs/ddp-clean-jitter: 2 ranks, no fault; rank 0 last into 8 of 10
    steady steps' all-reduces (a coin's odds with 2 ranks) and 1.27x busy on its median
    step. The detector before issue 43 named it a persistent straggler at "1.47x": its
    busy time was the median step minus the median waits, taken from different steps."""
    run = load_run(fixture_path("runs", "ddp-clean-jitter"))
    ctx = Context(run)
    caused = waiting_caused(ctx)
    assert (caused.idxmax() == 0).mean() == 0.8  # the premise: rank 0 is last in most steps
    assert straggler.detect(ctx) == []


def test_a_rank_that_shares_its_core_is_a_straggler_from_cpu_contention():
    """tests/data/runs/ddp-cpu-contention: 2 ranks, no fault in the job; rank 1 pinned
    to a core with a busy loop. Its step is 2x rank 0's, all of it waiting for the core
    (Linux run delay): before the run-delay readings it was "a persistent straggler" of
    slower work, and a user sent to its GPU or its data would find nothing."""
    findings = straggler.detect(Context(load_run(fixture_path("runs", "ddp-cpu-contention"))))
    assert [(f.ranks, f.metrics["cause"]) for f in findings] == [([1], "cpu contention")]
    (found,) = findings
    # its own work is its peer's; the wait for a core is the excess
    assert found.metrics["busy_ratio_x"] < straggler_causes.BUSY_RATIO
    assert found.metrics["core_wait_excess_ms"] > found.metrics["waiting_caused_ms_per_step"]
    assert "CPU core" in found.title and "pin each rank" in found.recommendation


def test_the_suites_clean_ddp_run_has_no_slower_rank(ddp_run):
    """The suite's clean 2-rank run: no rank works longer. It runs beside other tests'
    jobs on 2 cores, which once kept rank 1 off a core (1.70x busy, both ranks at 41% of
    a core): a finding then names that, and only that, as the cause."""
    findings = json.loads((ddp_run / "analysis" / "findings.json").read_text())
    for found in _serious(findings, "straggler"):
        assert found["metrics"]["cause"] == "cpu contention", found
        assert found["metrics"]["busy_ratio_x"] < straggler_causes.BUSY_RATIO, found
