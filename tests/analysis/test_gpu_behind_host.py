"""A GPU that runs behind its host, on a real trace: TraceLens's MI300 rank 0
(tests/data/kineto/tracelens, an 8-rank RCCL DDP job, 3 profiler steps). The host
finishes a step in 15.9 ms, its GPU in 18.6-19.0; the trace begins with five
NCCL kernels launched before it (no launch in the trace) still running 2-30 ms
into it, and every NCCL kernel is RCCL's ncclDevKernel_Generic, whose name says
no op."""

import numpy as np
import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.analysis.replay.device_graph import DeviceModel
from diagnose.importers.kineto import import_kineto
from diagnose.importers.run_writer import launch_bound_ns
from tests.support.jobs import fixture_path, load_run


@pytest.fixture(scope="module")
def mi300(tmp_path_factory):
    trace = fixture_path("kineto", "tracelens", "mi300_ddp_resnet_rank0.json.gz")
    return load_run(import_kineto([str(trace)], str(tmp_path_factory.mktemp("mi300") / "run"))[0])


def test_a_kernel_launched_before_the_trace_counts_no_later_than_the_next_launch_on_its_stream():
    # stream 1: an unknown launch, then kernels launched at 50 and 90; stream 2: unknown only
    launch = np.array([10, 50, 90, 60, 70])  # an unknown launch reads as its own start
    known = np.array([False, True, True, False, True])
    starts = np.array([10, 100, 120, 60, 130])
    streams = np.array([1, 1, 1, 2, 1])
    # kernel 3 runs on stream 2 alone: nothing bounds it; kernel 0 precedes 50 on its stream
    assert launch_bound_ns(launch, known, starts, streams).tolist() == [10, 50, 90, 60, 70]
    late = np.array([80, 50, 90, 60, 70])  # the same kernel 0 starting at 80, after the launch at 50
    assert launch_bound_ns(late, known, np.array([80, 100, 120, 60, 130]), streams).tolist() == [50, 50, 90, 60, 70]


def test_kernels_launched_before_the_trace_stay_out_of_the_steps_after_it(mi300):
    kernels = mi300.kernels()
    first = int(mi300.steps()["step"].min())
    assert set(kernels.loc[kernels["correlation"] < 0, "step"]) == {first}
    # each steady step's GPU span is the GPU's step (one was 51.2 ms beside 18.6: it held
    # half of the earlier kernels, assigned by their start)
    spans = mi300.device_exposed_comm().set_index("step")["span_ms"].reindex(mi300.steady_steps())
    assert spans.max() / spans.min() < 1.05, spans


def test_generic_nccl_kernels_are_matched_to_their_calls_and_overlap_saves_the_exposed_time(mi300):
    model = DeviceModel(mi300)
    assert model.ok and model.k_matched[model.k_comm].all()  # none was before: the what-if saved 0
    (f,) = [f for f in detect(mi300) if f["kind"] == "exposed_comm"]
    exposed = mi300.device_exposed_comm().set_index("step")["exposed_comm_ms"].reindex(mi300.steady_steps())
    # making every collective free saves at most the time only communication ran, and
    # most of it here (the compute does not wait for anything else)
    assert f["impact_source"] == "replay"
    assert 0.5 * exposed.mean() < f["impact_ms_per_step"] <= exposed.mean() * 1.01, (f, exposed)
