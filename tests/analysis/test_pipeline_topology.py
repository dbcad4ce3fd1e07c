"""Pipeline stages and micro-batches inferred from point-to-point traffic
(issue 23, diagnose/analysis/tables/pipeline_topology.py), for jobs that mark no
stage: the reference trainer's pipeline scenarios run with its phases off
(REFERENCE_TRAINER_PHASES=0: no collectors.phase at all; recorded in
tests/data/runs/<scenario>-unmarked) give the findings they give with them;
ambiguous topologies are said, never guessed."""

import json

import pandas as pd
import pytest

from diagnose.analysis.tables import pipeline_topology
from reference_trainer.scenarios import SCENARIOS
from tests.support.jobs import load_run


def _serious(run_dir):
    findings = json.loads((run_dir / "analysis" / "findings.json").read_text())
    # a bubble names all ranks and, as its stage, the worst rank's: which rank idles
    # most is run-to-run noise (CI saw stage 1 marked, 0 unmarked), so not compared
    return {
        (f["kind"], tuple(f["ranks"]), None if f["kind"] == "pipeline_bubble" else f["stage"])
        for f in findings
        if f["severity"] != "info"
    }


@pytest.fixture(scope="module")
def slow_stage_runs(recorded_scenario):
    """(marked: the recorded slow_stage run, shared with test_scenarios; unmarked: the
    same scenario recorded with the trainer's phases off)."""
    return recorded_scenario("slow_stage")[0], recorded_scenario("slow_stage-unmarked")[0]


def test_slow_stage_without_phases_gives_the_same_findings(slow_stage_runs):
    marked, unmarked = slow_stage_runs
    assert load_run(marked).stage_source == "marked"
    run = load_run(unmarked)
    assert run.stage_source == "inferred: 4 stages x 1 pipelines"
    events = run.events()
    assert (events.loc[events["kind"] == "phase"]).empty  # the job marked nothing
    # pp4: rank r is stage r; every forward and backward has its micro-batch, 8 per step
    assert events.groupby("rank")["stage"].unique().map(list).to_dict() == {r: [r] for r in range(4)}
    compute = events[events["kind"].isin(["forward", "backward"]) & (events["step"] >= 0)]
    per_step = compute.groupby(["rank", "step", "kind"], observed=True)["microbatch"].apply(sorted)
    assert all(mbs == list(range(8)) for mbs in per_step), per_step[per_step.map(lambda m: m != list(range(8)))]
    scenario = SCENARIOS["slow_stage"]
    expected = (scenario.expected_kind, scenario.expected_ranks, scenario.expected_stage)
    assert expected in _serious(marked) and _serious(unmarked) == _serious(marked)


def test_bubble_without_phases_is_found_on_inferred_micro_batches(recorded_scenario):
    run_dir, _ = recorded_scenario("bubble-unmarked")
    assert load_run(run_dir).stage_source == "inferred: 4 stages x 1 pipelines"
    (bubble,) = [
        f for f in json.loads((run_dir / "analysis" / "findings.json").read_text()) if f["kind"] == "pipeline_bubble"
    ]
    assert bubble["severity"] != "info" and bubble["ranks"] == [0, 1, 2, 3]
    assert bubble["metrics"]["microbatches"] == 2 and bubble["metrics"]["stages"] == 4


def _sends(links_per_step, steps=3):
    """Send rows: per step, the links (src, dst) in the order their first sends go."""
    rows = []
    for step in range(steps):
        for i, (src, dst) in enumerate(links_per_step):
            t = step * 1_000_000 + i * 1000
            rows.append(
                {
                    "kind": "p2p",
                    "name": "send",
                    "rank": src,
                    "peer": dst,
                    "step": step,
                    "start_ns": t,
                    "end_ns": t + 10,
                    "stage": -1,
                    "microbatch": -1,
                }
            )
            rows.append(
                {
                    "kind": "p2p",
                    "name": "recv",
                    "rank": dst,
                    "peer": src,
                    "step": step,
                    "start_ns": t,
                    "end_ns": t + 10,
                    "stage": -1,
                    "microbatch": -1,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "links, why",
    [
        ([(0, 1), (1, 2), (2, 3), (3, 0), (1, 0)], "ring (an interleaved schedule"),
        ([(0, 1), (0, 2), (1, 0)], "rank 0 has two forward links"),
        ([(0, 1), (1, 2), (3, 4)], "pipelines of unequal length [2, 3]"),
    ],
)
def test_an_ambiguous_topology_is_said_and_not_guessed(links, why):
    events = _sends(links)
    warnings = []
    assert pipeline_topology.stamp_inferred_stages(events, warnings.append) is None
    assert len(warnings) == 1 and why in warnings[0] and (events["stage"] == -1).all()


def test_two_replicas_of_a_two_stage_pipeline():
    """dp2 x pp2: forward links 0->2 and 1->3 (the first sends of each pair),
    gradients back later; two chains of two stages."""
    events = _sends([(0, 2), (1, 3), (2, 0), (3, 1)])
    assert (
        pipeline_topology.stamp_inferred_stages(events, lambda w: pytest.fail(w)) == "inferred: 2 stages x 2 pipelines"
    )
    assert events.groupby("rank")["stage"].first().to_dict() == {0: 0, 1: 0, 2: 1, 3: 1}
