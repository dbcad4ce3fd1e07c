"""Issue 4 acceptance: every `diagnose demo` scenario yields its expected finding,
naming the right rank, stage or callsite; clean yields nothing above info. Issue
23: every other finding above info is one the scenario's layout explains (listed
below with the reason) and is ranked below the planted cause. Each scenario's
recorded run (tests/data/runs/<scenario>, scripts/record_test_runs.py) is analyzed
in this process; the `make demo` path (showcase) is also launched live, outputs and
all. The summary table is printed."""

import json

import numpy as np
import pytest

import diagnose
from reference_trainer.scenarios import SCENARIOS
from tests.support.jobs import job_env, run_diagnose

EXPECTED_CALLSITE = {"hidden_sync": "reference_trainer/faults.py", "blocking_p2p": "reference_trainer/p2p.py"}
MATRIX = [name for name in SCENARIOS if name not in ("hang", "crash")]
_BUBBLE_4X8 = "8 micro-batches on 4 stages: the schedule's bubble is 3/11 = 27%, over the 20% gate"
# scenario -> {kind: why its layout gives that finding too}; anything else above info fails
EXPLAINED = {
    "slow_stage": {"pipeline_bubble": _BUBBLE_4X8},
    "pipeline_straggler": {"pipeline_bubble": _BUBBLE_4X8},
    "accum_sync": {
        "exposed_comm": "each micro-batch's all-reduces are waited at the end of its backward, "
        "with nothing left to overlap them: exposed communication, ranked below"
    },
    "showcase": {
        "input_stall": "slow_input:ms=4 is planted as well",
        "pipeline_bubble": "4 micro-batches on 2 stages: the schedule's bubble is 1/5 = 20%",
    },
}
# scenario -> kinds planted besides its expected one
PLANTED_TOO = {"showcase": {"input_stall"}}
_summary = []


def _matches(scenario, finding) -> bool:
    if finding["kind"] != scenario.expected_kind or finding["severity"] == "info":
        return False
    if scenario.expected_stage is not None and finding["stage"] != scenario.expected_stage:
        return False
    if scenario.expected_kind == "straggler" and finding["ranks"] != list(scenario.expected_ranks):
        return False
    site = EXPECTED_CALLSITE.get(scenario.name)
    return site is None or site in (finding["callsite"] or "")


@pytest.fixture(scope="module", autouse=True)
def summary_table():
    yield
    print("\nscenario        expected                    found (warning and above)")
    for name, expected, found in _summary:
        print(f"{name:<15} {expected:<27} {found}")


@pytest.mark.parametrize("name", MATRIX)
def test_demo_scenario_yields_expected_finding(name, recorded_scenario, monkeypatch):
    out, result = recorded_scenario(name)
    assert result.warnings == []
    check_scenario(name, out, result.stdout, monkeypatch)


def test_make_demo_runs_live_and_writes_every_output(tmp_path):
    """`make demo`'s path, live: the showcase scenario launched by `diagnose demo`
    prints its findings and writes the report, merged trace and MLflow run. Its
    slow input (a sleep per sample) is found live; its straggler (2.5x compute on
    rank 2) is checked on the recorded run (S[showcase]): on this 2-core box beside
    the suite's other worker, contention once stretched rank 2's stage peer too
    (1.29x apart) and the live run named no straggler."""
    out = tmp_path / "runs" / "showcase"
    proc = run_diagnose(["demo", "--scenario", "showcase", "--out", out], timeout=600, env=job_env(outputs=True))
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    stalls = [f for f in findings if f["kind"] == "input_stall" and f["severity"] != "info"]
    assert stalls and stalls[0]["ranks"] == [0, 1, 2, 3], findings
    assert "input_stall" in proc.stdout
    check_replay(SCENARIOS["showcase"], out, findings, proc.stdout)
    for name in ("report.html", "trace.json.gz", "mlflow_run_id"):
        assert (out / name).exists(), name
    assert (tmp_path / "runs" / "mlflow.db").exists()
    assert "diagnose:   report.html" in proc.stdout


def check_scenario(name, out, stdout, monkeypatch):
    scenario = SCENARIOS[name]
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    serious = [f for f in findings if f["severity"] != "info"]
    expected = (
        f"{scenario.expected_kind} ranks={list(scenario.expected_ranks)} stage={scenario.expected_stage}"
        if scenario.expected_kind
        else "nothing above info"
    )
    _summary.append(
        (
            name,
            expected,
            ", ".join(f"{f['kind']}[{f['severity']}] ranks={f['ranks']} stage={f['stage']}" for f in serious) or "-",
        )
    )
    if scenario.expected_kind is None:
        assert serious == [], serious
    else:
        planted = [i for i, f in enumerate(serious) if _matches(scenario, f)]
        assert planted, findings
        for f in serious[: planted[0]] + serious[planted[0] + 1 :]:
            assert f["kind"] in EXPLAINED.get(name, {}), f"{name}: unexplained {f['kind']}: {f['title']}"
        # the others rank below the planted cause (findings.json: by severity, then impact),
        # except a second planted cause of comparable cost (showcase's slow input: 32 ms of
        # loading per step against the straggler's ~35 ms, either may come first)
        ahead = [f["kind"] for f in serious[: planted[0]]]
        assert set(ahead) <= PLANTED_TOO.get(name, set()), [
            (f["kind"], f["severity"], f["impact_ms_per_step"]) for f in serious
        ]
    if name == "pipeline_straggler":  # its waits are other stages' receives, yet it costs the step
        assert serious[0]["severity"] == "critical", serious[0]
        check_neighbours_not_named(diagnose.load(out), monkeypatch)
    check_fault_in_trace(name, diagnose.load(out))
    check_replay(scenario, out, findings, stdout)


def check_neighbours_not_named(run, monkeypatch):
    """Rank 5's pipeline neighbours arrive last at their own stages' all-reduces
    (rank 4 causes more waiting than rank 5 in most runs); on 2 cores one of them
    once passed the busy gate (1.41x) and was named instead. With the gate open to
    all of them, the rank named is still the one with the most excess work."""
    from diagnose.analysis.detectors import straggler
    from diagnose.analysis.detectors.straggler_waits import waiting_caused
    from diagnose.analysis.findings.run_detectors import Context

    monkeypatch.setattr(straggler, "busy_gate", lambda columns: 0.0)  # (a CPU run: the host's gate)
    ctx = Context(run)
    caused = waiting_caused(ctx).mean(axis=1)
    found = straggler.detect(ctx)
    assert [f.ranks for f in found] == [[5]], (caused.round(1).to_dict(), [f.title for f in found])


# kinds whose impact is a what-if replay's saving (diagnose/analysis/replay/whatif.py)
WHATIF_KINDS = {
    "straggler",
    "workload_imbalance",
    "stage_imbalance",
    "input_stall",
    "hidden_sync",
    "exposed_comm",
    "pipeline_bubble",
    "accumulation_sync",
}


def check_replay(scenario, out, findings, stdout):
    """Issue 23: the dependency model replays every scenario's steps, pipelined or
    not, within 5% per step, so the planted finding's impact is its what-if saving."""
    figures = json.loads((out / "analysis" / "step_figures.json").read_text())
    assert figures["replay_max_step_error_frac"] <= 0.05, figures
    assert figures["impact_from_replay"] is True
    assert figures["ideal_step_ms"] <= figures["replay_step_ms"] + 1e-6, figures
    # the user sees the ideal step beside the measured one
    assert (
        f"step: measured {figures['measured_step_ms']:.1f} ms" in stdout
        and f"ideal {figures['ideal_step_ms']:.1f} ms" in stdout
    ), stdout[-600:]
    # issue 48: where the step goes adds up: MFU (absent on CPU without a peak), each
    # finding's share with overlaps counted once, and a rest no finding explains
    waterfall = figures["waterfall"]
    shares = [s["share_frac"] for s in waterfall["shares"]]
    assert (waterfall["mfu_frac"] or 0.0) + sum(shares) + waterfall["rest_frac"] == pytest.approx(1.0)
    assert waterfall["rest_frac"] >= 0 and all(share > 0 for share in shares)
    assert {s["kind"] for s in waterfall["shares"]} == {f["kind"] for f in findings if f["impact_ms_per_step"] > 0}
    for f in findings:
        if f["kind"] in WHATIF_KINDS:
            m = f["metrics"]
            assert f["impact_ms_per_step"] == pytest.approx(m["whatif_saving_ms_per_step"], abs=1e-3)
            saving = max(m["replay_step_ms"] - m["whatif_step_ms"], 0.0)
            assert m["whatif_saving_ms_per_step"] == pytest.approx(saving, abs=1e-3)
            # a removed cause only shortens durations, so the step cannot lengthen; equal work per
            # rank moves compute onto the fast ones and can (the saving is then 0)
            if f["kind"] != "workload_imbalance":
                assert m["whatif_step_ms"] < m["replay_step_ms"] + 1e-6, f


def _phase_ms(run, phase_name):
    spans = run.spans()
    spans = spans[(spans["kind"] == "phase") & (spans["name"] == phase_name) & spans["step"].isin(run.steady_steps())]
    return spans.groupby("rank")["dur_ms"].median()


def check_fault_in_trace(name, run):
    """Issue 3: each fault shows its intended effect in the recorded trace."""
    if name == "pipeline_straggler":  # factor 3 on rank 5's compute, 8 ranks on 2 cores
        forward = _phase_ms(run, "forward")
        assert forward[5] >= 1.5 * forward[1], forward  # its stage-1 peer in the other pipeline
    elif name == "straggler":  # factor 3 on rank 2's compute
        # 4 ranks on 2 cores: the others compute two to a core, rank 2 mostly alone
        # while they wait for it, so its phases come out F/2 to F times theirs
        # (measured 1.78-3x here)
        forward = _phase_ms(run, "forward")
        assert forward[2] >= 1.5 * forward.drop(2).median(), forward
    elif name == "slow_stage":  # factor 3 on stage 2
        forward = _phase_ms(run, "forward")
        assert forward[2] >= 2 * forward.drop(2).max(), forward
    elif name == "slow_input":  # 15 ms per sample, 2 samples per micro-batch
        data = run.breakdown()
        assert data[data["step"].isin(run.steady_steps())]["data_wait_ms"].median() >= 2 * 2 * 15 * 0.9
    elif name == "hidden_sync":  # one loss all_reduce per micro-batch (4)
        calls = run.collectives()
        calls = calls[calls["callsite"].str.contains("faults.py") & calls["step"].isin(run.steady_steps())]
        assert set(calls.groupby(["rank", "step"]).size()) == {4}
    elif name == "blocking_p2p":  # every send waited at once
        calls = run.collectives()
        sends = calls[(calls["name"] == "send") & calls["wait_start_ns"].notna()]
        assert (sends["wait_start_ns"] - sends["return_ns"] < 500_000).mean() > 0.9
    elif name == "accum_sync":  # the gradient buckets all-reduced in each of the 4 backwards
        calls = run.collectives()
        calls = calls[calls["callsite"].str.contains("dp.py") & calls["step"].isin(run.steady_steps())]
        per_mb = calls.groupby(["rank", "step", "microbatch"]).size()
        assert set(per_mb.index.get_level_values("microbatch")) == {0, 1, 2, 3}, per_mb
        assert per_mb.nunique() == 1, per_mb  # every bucket, every micro-batch
    elif name == "comm_bound":  # an extra 32 MB all-reduce per step
        calls = run.collectives()
        assert (calls["bytes"] >= 32 * 2**20).any()
    elif name == "varlen":  # micro-batch lengths drawn in 1-7x per (step, micro-batch, rank)
        spans = run.spans()
        spans = spans[
            (spans["kind"] == "phase")
            & spans["name"].isin(["forward", "backward"])
            & spans["step"].isin(run.steady_steps())
        ]
        per_step = spans.groupby(["step", "rank"])["dur_ms"].sum().unstack()
        # the slowest rank changes: at least 3 of the 4 are slowest in some step
        assert per_step.idxmax(axis=1).nunique() >= 3, per_step
    elif name == "bubble":  # AFAB with 2 micro-batches on 4 stages
        assert run.breakdown()["pipeline_wait_ms"].median() > 0
        assert np.isfinite(run.breakdown()["step_ms"]).all()


def test_an_impact_is_the_saving_measured_with_the_fault_removed(recorded_scenario):
    """An input_stall's impact (the what-if's saving) against the step time the same
    job measured with its fault removed: the figure a user acts on holds within 25%
    of what fixing it saved. The pair is bench/whatif_accuracy.py's (dp2, one rank per
    core, an emulated device per rank): with 4 ranks on 2 cores the slept loading
    hands its core to the others, and removing it slows their compute (the matrix's
    slow_input: 63 ms predicted, 94 measured), which no device-per-rank job does."""
    from diagnose.analysis.findings.run_detectors import Context

    slow, _ = recorded_scenario("whatif-slow_input")
    fixed, _ = recorded_scenario("whatif-slow_input-fixed")
    (stall,) = [f for f in json.loads((slow / "analysis" / "findings.json").read_text()) if f["kind"] == "input_stall"]
    measured_ms = float(Context(diagnose.load(slow)).step_ms) - float(Context(diagnose.load(fixed)).step_ms)
    assert measured_ms > 0
    assert stall["impact_ms_per_step"] == pytest.approx(measured_ms, rel=0.25), (
        stall["impact_ms_per_step"],
        measured_ms,
    )


def test_every_recorded_run_is_of_the_current_schema():
    """A change of the run-directory schema (collectors/schema.py) records the runs
    again (scripts/record_test_runs.py): the detectors are tested on what the
    collectors write today."""
    from collectors.schema import SCHEMA_VERSION
    from tests.support.jobs import DATA

    recorded = {p.name: p for p in (DATA / "runs").iterdir()}
    assert set(MATRIX) <= set(recorded), sorted(set(MATRIX) - set(recorded))
    for name, path in recorded.items():
        source = dict(line.split(": ", 1) for line in (path / "SOURCE.txt").read_text().splitlines() if ": " in line)
        assert int(source["schema_version"]) == SCHEMA_VERSION, (name, source["schema_version"])
        for meta in path.glob("traces/rank-*/meta.json"):
            assert json.loads(meta.read_text())["schema_version"] == SCHEMA_VERSION, meta
