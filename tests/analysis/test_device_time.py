"""Imported GPU traces judged on device time (issue 20): the two real ranks of
HTA's trace_filter set (ranks 0 and 1 of a 128-rank NCCL job, sampled), as
they are and perturbed (tests/support/kineto_perturb.py)."""

import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.kineto import import_kineto
from tests.support import async_stream_model, kineto_perturb
from tests.support.jobs import fixture_path, load_run

SET = "kineto/hta/trace_filter"
UNMATCHED = kineto_perturb.TRACE_FILTER_UNMATCHED


def _files():
    return [fixture_path(f"{SET}/sampled_rank-{r}.json.gz") for r in (0, 1)]


def _import(tmp_path, traces=None, name="run"):
    if traces is None:
        paths = [str(p) for p in _files()]
    else:
        paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    return import_kineto(paths, str(tmp_path / name))[0]


def _findings(run):
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    return found


def test_positions_that_are_not_one_collective_stay_unmatched(tmp_path):
    run = load_run(_import(tmp_path), expected_warnings=UNMATCHED)
    # every NCCL kernel here is a SendRecv: the ops are the nccl:<op> ranges that launched them
    events = run.events()
    calls = events[events["kind"] == "collective"]
    for rank in (0, 1):
        assert calls[calls["rank"] == rank]["name"].astype(str).value_counts().to_dict() == {
            "all_to_all": 4,
            "all_reduce": 4,
            "all_gather": 2,
        }
    arrivals = run.arrivals()
    instances = arrivals.groupby(["group", "seq"])
    assert len(instances) == 4 and (instances["rank"].nunique() == 2).all()
    # what is left finishes together: one collective each
    dones = run.collectives().groupby(["group", "seq"])["exit_ns"]
    assert ((dones.max() - dones.min()) < 400_000).all()
    assert set(arrivals["expected_members"]) == {128}  # the world: the traces name no group
    # As recorded, rank 1 is the later one at all four (its GPU computes 1.31x
    # as long per step): named as the later of the two seen, a lower bound.
    assert (arrivals["last_rank"] == 1).all()
    (f,) = [f for f in _findings(run) if f["kind"] == "straggler"]
    assert f["ranks"] == [1] and f["metrics"]["wait_is_lower_bound"] == 1.0
    assert f["metrics"]["clock_error_us"] < 100  # the kernel ends agree to tens of microseconds


def test_a_shifted_clock_is_recovered_from_kernel_ends(tmp_path):
    base = load_run(_import(tmp_path, name="base"), expected_warnings=UNMATCHED)
    traces = [kineto_perturb.read(p) for p in _files()]
    kineto_perturb.shift_clock(traces[1], 5000.0)  # rank 1's host clock 5 ms ahead
    run = load_run(_import(tmp_path, traces), expected_warnings=UNMATCHED)
    recovered_ns = run.offsets_ns[1] - base.offsets_ns[1]
    assert abs(recovered_ns - 5_000_000) <= 50_000, recovered_ns
    # the residual is stated, and is what the recovery achieved
    assert 5_000 <= run.offset_errors_ns[1] <= 100_000
    assert abs(run.offsets_ns[1] - 5_000_000) <= run.offset_errors_ns[1]


@pytest.mark.parametrize("slow", [0, 1])
def test_the_stretched_rank_is_named_the_later_of_the_ranks_seen(tmp_path, slow):
    traces = [kineto_perturb.read(p) for p in _files()]
    kineto_perturb.stretch_compute(traces[slow], traces[1 - slow], 2.0)
    run = load_run(_import(tmp_path, traces), expected_warnings=UNMATCHED)
    assert abs(run.offsets_ns[1] - run.offsets_ns[0]) < 100_000  # the kernels still end together
    found = _findings(run)
    stragglers = [f for f in found if f["kind"] == "straggler"]
    assert len(stragglers) == 1, [f["title"] for f in found]
    f = stragglers[0]
    assert f["ranks"] == [slow] and f["stage"] is None and f["callsite"] is None
    assert f["metrics"]["ranks_seen"] == 2 and f["metrics"]["group_size"] == 128
    assert f["metrics"]["wait_is_lower_bound"] == 1.0 and f["metrics"]["device_time"] == 1.0
    assert f["metrics"]["busy_ratio_x"] >= 1.1
    assert "2 ranks seen" in f["title"] and "lower bound" in f["title"] and "unseen rank" in f["title"]
    assert "GPUs' clocks" in f["title"]


def test_async_stream_model_straggler_is_seen_on_the_device_not_on_the_hosts(tmp_path):
    """8 ranks, rank 3's GPU computes 1.5x slower (tests/support/async_stream_model.py)."""
    from collectors.schema import event_row
    from diagnose.importers.run_writer import RunDirWriter, clock_meta

    traces, host = async_stream_model.traces(world=8, steps=8, slow_rank=3, slow_factor=1.5)
    run = load_run(_import(tmp_path, traces))
    arrivals = run.arrivals()
    assert (arrivals["members"] == 8).all() and (arrivals["last_rank"] == 3).all()
    found = _findings(run)
    (f,) = [f for f in found if f["kind"] == "straggler"]
    assert f["ranks"] == [3] and f["severity"] == "critical" and f["stage"] is None and f["callsite"] is None
    assert f["metrics"]["device_time"] == 1.0 and f["metrics"]["wait_is_lower_bound"] == 0.0
    assert f["metrics"]["busy_ratio_x"] == pytest.approx(1.5, rel=0.02)
    assert f["metrics"]["waiting_caused_ms_per_step"] == pytest.approx(30.0, rel=0.02)  # 60 ms of compute, 1.5x

    # The same job as host timestamps show it: every rank calls the all-reduce
    # at the same moment (each resumes when its sync returns), so no straggler.
    writer = RunDirWriter(str(tmp_path / "host"), "kineto", [])
    for rank, rows in enumerate(host):
        events = [
            event_row(
                kind,
                name,
                int(s * 1000),
                int(e * 1000),
                step,
                **(
                    {"group": "0", "group_ranks": ranks, "seq": step}
                    if kind == "collective"
                    else {"detail": "cuda"}
                    if kind == "sync"
                    else {}
                ),
            )
            for kind, name, s, e, step, ranks in rows
        ]
        writer.write_rank(rank, sorted(events, key=lambda r: r[2]), {"world_size": 8, "clock": clock_meta()})
    host_run = load_run(writer.finish())
    host_arrivals = host_run.arrivals()
    assert len(host_arrivals) == 8 * 8 and host_arrivals["wait_ms"].max() < 0.1
    assert not [f for f in _findings(host_run) if f["kind"] == "straggler"]


def test_async_stream_model_exposed_communication_is_measured_on_the_device(tmp_path):
    """4 ranks, no straggler, a 40 ms all-reduce after 60 ms of compute with
    nothing to overlap it: the host is never blocked in communication (it waits
    in cudaStreamSynchronize), the device is, for 40 of ~102 ms."""
    traces, _ = async_stream_model.traces(world=4, steps=8, slow_rank=-1, slow_factor=1.0, transfer_us=40000.0)
    run = load_run(_import(tmp_path, traces))
    assert run.breakdown()["exposed_comm_ms"].max() == 0.0  # what host time says
    found = _findings(run)
    (f,) = [f for f in found if f["kind"] == "exposed_comm"]
    assert f["severity"] == "warning" and f["ranks"] == [0, 1, 2, 3]
    assert f["stage"] is None and f["callsite"] is None and f["metrics"]["device_time"] == 1.0
    assert f["metrics"]["exposed_comm_ms_per_step"] == pytest.approx(40.0, rel=0.01)
    assert f["metrics"]["exposed_comm_frac"] == pytest.approx(40.0 / 102.5, rel=0.03)
    assert not [f for f in found if f["kind"] == "straggler"]


def _model_step_ms(traces) -> float:
    """The job's step as the model built it: the last rank's ProfilerStep, in ms."""
    return max(e["dur"] for t in traces for e in t["traceEvents"] if e["name"] == "ProfilerStep#4") / 1e3


def test_device_lanes_replay_the_steps_and_a_straggler_fix_saves_what_it_would(tmp_path):
    """Issue 23 on GPU traces: the what-if replay's lanes are the GPUs
    (diagnose/analysis/replay/device_graph.py). 4 ranks, rank 2's GPU 2x slower: making
    it as fast as its peers saves what the same job without the slowdown
    measures, although every host launches the all-reduce at the same moment."""
    slow, _ = async_stream_model.traces(world=4, steps=8, slow_rank=2, slow_factor=2.0)
    fixed, _ = async_stream_model.traces(world=4, steps=8, slow_rank=-1, slow_factor=1.0)
    truth_ms = _model_step_ms(slow) - _model_step_ms(fixed)
    assert truth_ms == pytest.approx(60.0, rel=0.01)  # 60 ms of compute, twice as long
    run = load_run(_import(tmp_path, slow))
    (f,) = [f for f in _findings(run) if f["kind"] == "straggler"]
    assert f["ranks"] == [2] and run.step_figures["impact_from_replay"] is True
    assert run.step_figures["replay_max_step_error_frac"] <= 0.05
    assert f["impact_ms_per_step"] == pytest.approx(truth_ms, rel=0.05)
    assert run.step_figures["ideal_step_ms"] == pytest.approx(_model_step_ms(fixed), rel=0.05)


@pytest.mark.parametrize("held_in", ["kineto/hta/trace_filter", "kineto/hta/nccl_parser_config"])
def test_device_lanes_give_back_the_steps_of_the_real_traces(tmp_path, held_in):
    """The real NCCL traces, replayed on their GPUs' lanes with the recorded
    durations, give every steady step back within 5% (a member the set does not
    hold keeps its recorded end), so their impacts are the replay's."""
    import glob

    paths = sorted(glob.glob(str(fixture_path(held_in) / "*.json.gz")))
    run = load_run(
        import_kineto(paths, str(tmp_path / "run"))[0],
        expected_warnings=UNMATCHED if held_in.endswith("trace_filter") else (),
    )
    _findings(run)
    figures = run.step_figures
    assert figures["impact_from_replay"] is True and figures["replay_max_step_error_frac"] <= 0.05, figures
    assert figures["replay_step_ms"] == pytest.approx(figures["measured_step_ms"], rel=0.05)
