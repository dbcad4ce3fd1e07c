"""hidden_sync, input_stall and pipeline_bubble judged on device time (issue 20)
for runs whose collectives are NCCL kernels, on the asynchronous-stream model
(tests/support/async_stream_model.py): each planted cause is found with the device's
figures, and each control, where the host waits but the device does not, is
not (host time alone would have reported it)."""

import pytest

from dashboards.report_page import render
from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.kineto import import_kineto
from diagnose.importers.run_writer import RunDirWriter, clock_meta
from tests.support import async_stream_model, kineto_perturb
from tests.support.jobs import load_run

WORLD, STEPS = 2, 8


def _kineto_run(tmp_path, program):
    traces = async_stream_model.program_traces(WORLD, STEPS, program)
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    return load_run(import_kineto(paths, str(tmp_path / "run"))[0])


def _findings(run):
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    return found


def _kinds(found):
    return sorted(f["kind"] for f in found)


def _micro_batches(n, *actions):
    return [a for _ in range(n) for a in actions]


TAIL = [("kernel", 10000), ("all_reduce", 3000), ("kernel", 2000), ("sync",)]


def test_a_sync_that_drains_the_queue_costs_the_device_idle_behind_it(tmp_path):
    # per micro-batch: a 5 ms forward, a .item()-style sync, 2 ms of Python:
    # the device idles ~2 ms each time, while the host blocks ~5 ms each time
    run = _kineto_run(tmp_path, [("data", 100), *_micro_batches(4, ("kernel", 5000), ("sync",), ("host", 2000)), *TAIL])
    (f,) = [f for f in _findings(run) if f["kind"] == "hidden_sync"]
    assert f["ranks"] == [0, 1] and f["stage"] is None and f["callsite"] is None
    assert f["severity"] == "critical" and f["metrics"]["device_time"] == 1.0
    assert f["impact_ms_per_step"] == pytest.approx(4 * 2.025, rel=0.02)
    assert f["metrics"]["calls_per_step"] == 5  # the step's own last sync costs ~nothing, and adds nothing
    assert f["metrics"]["blocking_ms_per_step"] > 30  # what host time would have charged
    assert "cudaStreamSynchronize" in f["title"] and "GPUs' clocks" in f["title"]
    assert _kinds(_findings(run)) == ["hidden_sync"]
    # the report says which clock: in its header, and per finding
    html = render(run, [f])
    assert "device work (collective arrivals and waits, compute" in html and "on the GPUs&#x27; clocks" in html
    # impact, then what it is worth a day: that share of the median step, on 2 GPUs, all day
    from diagnose.analysis.findings.run_detectors import Context

    hours = f["metrics"]["gpu_hours_per_day"]
    assert hours == pytest.approx(f["impact_ms_per_step"] / Context(run).step_ms * 24 * 2, rel=1e-3)
    assert f["impact_source"] == "replay"  # the sync removed from the device graph (device_graph.py)
    assert f'<td class="num">{f["impact_ms_per_step"]:.1f}</td><td class="num">{hours:,.1f}</td><td>GPU</td>' in html
    assert 'id="breakdown-device"' in html and "Device time per rank (GPU clocks)" in html
    assert '<a class="evidence" href="#breakdown-device">' in html  # the device view is its evidence


def test_the_device_breakdown_of_a_step_adds_up_to_the_step(tmp_path):
    # 4 x 5 ms forward + 10 + 2 ms of compute kernels and a 3 ms all-reduce with
    # nothing beside it, per step; the rest is idle (~8.1 ms behind the syncs)
    run = _kineto_run(tmp_path, [("data", 100), *_micro_batches(4, ("kernel", 5000), ("sync",), ("host", 2000)), *TAIL])
    device = run.device_step_breakdown()
    steady = device[device["step"].isin(run.steady_steps())]
    assert len(steady) == WORLD * len(run.steady_steps())
    parts = steady[["compute_ms", "exposed_comm_ms", "other_kernel_ms", "idle_ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(steady["step_ms"].to_numpy())
    assert steady["compute_ms"].to_numpy() == pytest.approx(32.0, rel=1e-3)
    assert steady["exposed_comm_ms"].to_numpy() == pytest.approx(3.0, rel=1e-3)
    assert steady["idle_ms"].to_numpy() == pytest.approx(43.225 - 35.0, abs=0.1)


def test_a_sync_with_work_still_queued_costs_nothing(tmp_path):
    # the same syncs and Python, but each waits for the kernel before the latest
    # (an event sync): the latest keeps the device busy while the host works
    run = _kineto_run(
        tmp_path,
        [
            ("data", 100),
            *_micro_batches(4, ("kernel", 5000), ("kernel", 5000), ("event_sync", 1), ("host", 2000)),
            *TAIL,
        ],
    )
    syncs = run.device_idle_behind_syncs()
    event_syncs = syncs[syncs["name"] == "cudaEventSynchronize"]
    assert len(event_syncs) == WORLD * STEPS * 4 and event_syncs["host_ms"].min() > 2.5
    assert event_syncs["device_idle_ms"].max() == 0.0
    assert _kinds(_findings(run)) == []


def test_a_data_wait_with_the_device_idle_is_an_input_stall(tmp_path):
    # the step drains the device (sync), then the host waits 20 ms for data
    run = _kineto_run(tmp_path, [("data", 20000), ("kernel", 30000), ("all_reduce", 3000), ("kernel", 2000), ("sync",)])
    (f,) = _findings(run)
    assert f["kind"] == "input_stall" and f["ranks"] == [0, 1] and f["stage"] is None and f["callsite"] is None
    assert f["metrics"]["device_time"] == 1.0 and f["severity"] == "critical"
    assert f["impact_ms_per_step"] == pytest.approx(20.0, rel=0.01)
    assert f["metrics"]["data_wait_frac"] == pytest.approx(20.0 / 55.0, rel=0.02)
    assert "GPUs' clocks" in f["title"]


def test_a_data_wait_while_the_device_works_through_its_queue_is_not(tmp_path):
    # the host is a step ahead (it waits for the previous step's last kernel,
    # not this one's), so it waits for data while the device computes
    run = _kineto_run(
        tmp_path, [("data", 20000), ("kernel", 30000), ("all_reduce", 3000), ("kernel", 2000), ("event_sync", 2)]
    )
    host = run.breakdown()
    assert (host["data_wait_ms"] / host["step_ms"]).median() > 0.5  # what host time says
    waits = run.device_data_wait()
    assert waits[waits["step"] >= 1]["idle_in_data_wait_ms"].max() < 0.1
    assert _kinds(_findings(run)) == []


def _pipeline_run(tmp_path, microbatches):
    writer = RunDirWriter(str(tmp_path / f"pp{microbatches}"), "kineto", [])
    for rank, rows in enumerate(async_stream_model.pipeline_rows(2, microbatches, steps=6)):
        writer.write_rank(rank, rows, {"world_size": 2, "clock": clock_meta()})
    return load_run(writer.finish())


def test_pipeline_bubble_is_the_device_idle_per_stage(tmp_path):
    # 2 stages x 2 micro-batches: theory and the device both say 1/3 idle;
    # the host's phases cover ~0.2% of the step (they return once queued)
    run = _pipeline_run(tmp_path, 2)
    host = run.breakdown()
    assert ((host["forward_ms"] + host["backward_ms"]) / host["step_ms"]).max() < 0.01
    (f,) = _findings(run)
    assert f["kind"] == "pipeline_bubble" and f["ranks"] == [0, 1] and f["stage"] is None and f["callsite"] is None
    assert f["metrics"]["idlest_stage"] == 0
    assert f["metrics"]["device_time"] == 1.0
    assert f["metrics"]["bubble_frac"] == pytest.approx(1 / 3, abs=0.01)
    assert f["metrics"]["theoretical_bubble_frac"] == pytest.approx(1 / 3, abs=1e-4)
    assert "GPUs' clocks" in f["title"]


def test_enough_micro_batches_leave_no_bubble_on_the_device(tmp_path):
    # 2 x 8: theory 1/9, and so on the device; host phases alone would read
    # ~99% idle, "far above theory"
    run = _pipeline_run(tmp_path, 8)
    arrivals = run.arrivals()
    assert set(arrivals["kind"]) == {"p2p"} and (arrivals["members"] == 2).all()
    assert _kinds(_findings(run)) == []
