"""Issue 46: what a fix saves, replayed on a graph of every rank's kernels, streams,
host launches and syncs (diagnose/analysis/replay/device_graph.py), holds against the
fix's own re-run. Each case (tests/support/whatif_sim_cases.py) is an event simulation of
hosts, CUDA stream queues and NCCL rendezvous, run with a fault and again with
only the fault removed; the analysis reads only the faulty run's Kineto export.
"""

import numpy as np
import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.analysis.replay.device_graph import DeviceModel, device_calls
from diagnose.analysis.replay.op_graph import Cycle, OpGraph
from diagnose.importers.kineto import import_kineto
from tests.support import kineto_perturb
from tests.support.jobs import load_run
from tests.support.whatif_sim_cases import CASES

TOLERANCE_FRAC = 0.25  # the acceptance: within 25% of the re-run truth
# the finding that carries each case's fix on a device trace: a non-blocking send
# waited at once shows on the device as the host's stream sync after each exchange
FINDING = {name: case.finding for name, case in CASES.items()} | {"blocking_p2p": "hidden_sync"}
RING_WARNING = "forward links form a ring"


def _analyzed(tmp_path, traces, expected_warnings=()):
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    run = load_run(import_kineto(paths, str(tmp_path / "run"))[0], expected_warnings=expected_warnings)
    return run, detect(run)


def _truth_ms(case, steps) -> float:
    """The fix's saving on these steps, from the simulation's own clock (step s is index s - 1)."""
    faulty, fixed = case.faulty.step_ms(0), case.fixed.step_ms(0)
    return float(np.mean([faulty[s - 1] - fixed[s - 1] for s in steps]))


def _the_finding(found, case_name):
    (finding,) = [f for f in found if f["kind"] == FINDING[case_name]]
    return finding


@pytest.mark.parametrize("name", list(CASES))
def test_each_fix_saves_what_its_rerun_saves(tmp_path, name):
    case = CASES[name]
    run, found = _analyzed(tmp_path, case.faulty(0), [RING_WARNING] if name == "ring3" else ())
    figures = run.step_figures
    assert figures["impact_from_replay"] and figures["replay_max_step_error_frac"] <= 0.01, figures
    finding = _the_finding(found, name)
    assert finding["impact_source"] == "replay"
    if case.ranks:
        assert finding["ranks"] == case.ranks
    if case.stage is not None:
        assert finding["stage"] == case.stage
    truth = _truth_ms(case, run.steady_steps())
    assert abs(finding["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth, (finding["impact_ms_per_step"], truth)


def test_a_slow_replica_holds_every_other_one_at_the_gradient_all_reduce(tmp_path):
    """The issue's 3D job: one replica slowed at its first stage. The healthy replicas
    idle most of the step on their devices (waiting for data and for the all-reduce),
    which a replay counting idle as work would keep: fixing the replica saves half."""
    case = CASES["replica_slow_stage0"]
    run, found = _analyzed(tmp_path, case.faulty(0))
    finding = _the_finding(found, "replica_slow_stage0")
    assert finding["severity"] == "critical"
    assert finding["impact_ms_per_step"] >= 0.4 * run.step_figures["measured_step_ms"]


@pytest.mark.parametrize("drop", [0.5, 1.0])
def test_dependencies_left_out_of_the_trace_are_inferred_back(tmp_path, drop):
    """Half, then all, of the cross-stream wait records removed from the export:
    the replay infers the binding ones from kernel starts and still gives the
    recorded steps and the fix's saving back."""
    case = CASES["replica_slow_stage0"]
    run, found = _analyzed(tmp_path, case.faulty(0, drop_waits_frac=drop))
    figures = run.step_figures
    assert figures["inferred_waits"] > 0 and figures["replay_max_step_error_frac"] <= 0.01, figures
    truth = _truth_ms(case, run.steady_steps())
    assert abs(_the_finding(found, "replica_slow_stage0")["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth


def test_a_kernel_the_host_launched_late_gets_no_inferred_wait(tmp_path):
    """host_sync without its wait records: after each .item() the device idles until
    the host launches again. Those kernels start at their launch, which explains
    them: no inferred edge, however long the gap on their stream."""
    run, _ = _analyzed(tmp_path, CASES["host_sync"].faulty(0, drop_waits_frac=1.0))
    from diagnose.analysis.replay.whatif import WhatIf

    model = WhatIf(run, run.steady_steps(), run.rank_stages(), device=True).model
    prev_end = model.k_end[np.maximum(model.k_prev, 0)]
    long_gap = (model.k_prev >= 0) & (model.k_start - prev_end > 1_000_000)
    launched_late = long_gap & (np.abs(model.k_start - model.k_launch) <= 20_000)
    assert launched_late.sum() >= 8  # every micro-batch after the first, on both ranks
    assert not np.isin(np.flatnonzero(launched_late), model.w_dst).any()


def test_a_cycle_is_named():
    with pytest.raises(Cycle) as raised:
        OpGraph(4, src=[0, 1, 2, 3], dst=[1, 2, 3, 1], weight_ns=[0] * 4, dur_ns=[1] * 4)
    cycle = raised.value.nodes
    assert sorted(cycle) == [1, 2, 3] and all(
        (a, b) in {(1, 2), (2, 3), (3, 1)} for a, b in zip(cycle, cycle[1:] + cycle[:1])
    )


def test_the_graph_replays_the_longest_path_with_delays_and_floors():
    # 0 -> 1 (+2 ns delay) -> 3, 0 -> 2 -> 3; node 2 cannot start before 10
    graph = OpGraph(
        4,
        src=[0, 0, 1, 2],
        dst=[1, 2, 3, 3],
        weight_ns=[2, 0, 0, 0],
        dur_ns=[1, 2, 3, 1],
        floor_ns=[0, -np.inf, 10, -np.inf],
    )
    assert list(graph.replay()) == [1, 5, 13, 14]
    assert list(graph.replay(dur_ns=[1, 20, 3, 1])) == [1, 23, 13, 24]


@pytest.mark.parametrize("trace", ["trace_filter", "nccl_parser_config", "negative_queue_length_values_check"])
def test_real_nccl_traces_are_given_back_by_the_replay(tmp_path, trace):
    """HTA's NCCL traces (tests/data/kineto/hta, real jobs: compute and
    communication overlapped, no wait records): the graph, with the waits it
    infers, replays every steady step as recorded within the 5% gate. The third
    has 75 cudaStreamSynchronize calls whose stream the trace does not say, on a
    rank with six streams: taken as the compute stream's, a 5 us sync "waited"
    for a kernel that ended 184 ms later, and the graph had a cycle."""
    import glob

    from tests.support.jobs import DATA

    paths = sorted(glob.glob(str(DATA / "kineto" / "hta" / trace / "*.json.gz")))
    assert len(paths) >= 1
    # trace_filter is sampled: some of its collectives have no partner (the loader says so)
    sampled = ["left unmatched (a sampled or truncated trace?)"] if trace == "trace_filter" else []
    run = load_run(import_kineto(paths, str(tmp_path / "run"))[0], expected_warnings=sampled)
    detect(run)
    figures = run.step_figures
    assert figures["impact_from_replay"] and figures["replay_max_step_error_frac"] <= 0.05, figures
    assert figures["inferred_waits"] > 0 and figures["recorded_waits"] == 0
    # every collective matched across ranks is a rendezvous in the replay, whatever its
    # kernel is named (trace_filter runs its all-reduces and all-gathers as
    # ncclKernel_SendRecv: 0 of 8 were before, each a fixed span)
    calls = device_calls(run.collectives())
    assert len(DeviceModel(run).calls) == (calls["seq"] >= 0).sum() > 0


def test_a_host_bound_stragglers_fix_is_its_launch_delay_gone(tmp_path):
    """dp4, rank 3's host takes 1.5 ms per launch (its kernels take 0.75): its GPU
    computes as fast as the others' and starves; the others wait at the
    all-reduce. The what-if brings its host work to its peers' (the launch delay
    gone, kernel durations untouched) and saves what the re-run at normal launch
    cost saves."""
    from tests.support import megatron_stream_model as model

    def simulate(**fault):
        return model.simulate(
            pp=1, dp=4, microbatches=4, steps=6, seed=0, jitter_sigma=0.02, record_waits=True, **fault
        )

    faulty, fixed = simulate(launch_us={3: 1500.0}), simulate()
    run, found = _analyzed(tmp_path, faulty.traces)
    (finding,) = [f for f in found if f["kind"] == "straggler"]
    assert finding["ranks"] == [3] and finding["metrics"]["cause"] == "host-bound"
    assert finding["impact_source"] == "replay"
    step_ms = [np.diff(np.max(np.array(sim.step_end_us), axis=0)) / 1000 for sim in (faulty, fixed)]
    truth = float(np.mean([step_ms[0][s - 1] - step_ms[1][s - 1] for s in run.steady_steps()]))
    assert truth > 0.3 * run.step_figures["measured_step_ms"]
    assert abs(finding["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth, (finding["impact_ms_per_step"], truth)
