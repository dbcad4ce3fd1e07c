"""Issue 46 on a native gloo job: a ring of 3 ranks exchanging with both
neighbours in one batch_isend_irecv per micro-batch (tests/scripts/ring_job.py),
rank 1 at 1.5x the others' emulated device time (tests/data/runs/ring3-gloo), and
the same job without a slow rank (ring3-gloo-fixed; scripts/record_test_runs.py).
The replay of the faulty run must slow the ring down with its slowest member,
not deadlock on the batch's sends and receives, and fixing rank 1 must save what
the fixed run measured. The simulated device case is tests/analysis/test_device_whatif.py's
ring3."""

import json
import statistics

import pytest

from diagnose.analysis.replay.step_replay import job_step_ms
from diagnose.analysis.replay.whatif import WhatIf
from tests.support.jobs import load_run

TOLERANCE_FRAC = 0.25  # the acceptance: within 25% of the re-run
RING_WARNING = "forward links form a ring"  # no pipeline stages in a ring: each rank on its own
SLOW_RANK = 1


def _figures(run_dir) -> dict:
    return json.loads((run_dir / "analysis" / "step_figures.json").read_text())


def _findings(run_dir) -> list:
    return json.loads((run_dir / "analysis" / "findings.json").read_text())


def _job_step_ms(run) -> float:
    """bench/whatif_accuracy.py's measure: the mean over steady steps of the job's
    step, from the previous step's last end (all ranks) to this one's."""
    steps = run.steps()
    ends = {r: dict(zip(g["step"], g["end_ns"])) for r, g in steps.groupby("rank")}
    return statistics.mean(job_step_ms(ends, run.steady_steps()).values())


@pytest.fixture(scope="module")
def ring(recorded_scenario):
    """(faulty run dir, fixed run dir, measured saving ms per step)."""
    slow, fixed = recorded_scenario("ring3-gloo")[0], recorded_scenario("ring3-gloo-fixed")[0]
    saving = _job_step_ms(load_run(slow, expected_warnings=[RING_WARNING])) - _job_step_ms(
        load_run(fixed, expected_warnings=[RING_WARNING])
    )
    assert saving > 0
    return slow, fixed, saving


def test_the_ring_replays_its_recorded_steps(ring):
    """Not a deadlock, not a cycle: each rank's batch of a send and a receive gives
    every recorded steady step back within the 5% gate, with and without the slow rank."""
    for run_dir in ring[:2]:
        figures = _figures(run_dir)
        assert figures["impact_from_replay"] is True, figures
        assert figures["replay_max_step_error_frac"] <= 0.05, figures


def test_fixing_the_slow_rank_in_the_replay_saves_what_the_fixed_run_measured(ring):
    """The straggler what-if itself (rank 1's own work per step down to its peers'
    median), asked of the replay directly: every exchange waits for rank 1, so the
    whole ring runs at its pace and the fix saves its excess on each micro-batch.
    Recorded 2026-12-06: 13.6 ms/step replayed, 15.4 measured (-12%). The shortfall
    is the step's all_reduce, 0.9 ms longer from its last arrival to its first member
    out in the faulty run (2.97 vs 2.07 ms) and kept so by the what-if: at the fixed
    run's length the replay says 15.6. Two more pairs on the same (busy, 2-core) box:
    8.8 vs 9.5 (-7%), 13.8 vs 11.5 (+20%)."""
    slow, _, measured = ring
    run = load_run(slow, expected_warnings=[RING_WARNING])
    whatif = WhatIf(run, run.steady_steps(), run.rank_stages())
    assert whatif.ok
    saving, _ = whatif.straggler(SLOW_RANK)
    assert abs(saving - measured) <= TOLERANCE_FRAC * measured, (saving, measured)


def test_the_straggler_finding_names_the_slow_rank_with_the_replay_s_saving(ring):
    """Ranks 0 and 2 wait for rank 1 at the p2p batches (17.8 and 17.2 ms/step), not at
    the step's all_reduce (the ring is aligned by then: 0.40 ms/step): a ring's waits
    at its exchanges are the straggler's (straggler.py counts them where no pipeline is)."""
    slow, _, measured = ring
    (finding,) = [f for f in _findings(slow) if f["kind"] == "straggler"]
    assert finding["ranks"] == [SLOW_RANK]
    assert finding["impact_source"] == "replay"
    assert abs(finding["impact_ms_per_step"] - measured) <= TOLERANCE_FRAC * measured, (finding, measured)


def test_the_fixed_ring_names_no_straggler(ring):
    _, fixed, _ = ring
    assert [f for f in _findings(fixed) if f["kind"] == "straggler" and f["severity"] != "info"] == []
