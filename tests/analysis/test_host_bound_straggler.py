"""Issue 45, item 2: a rank whose host launches late is a straggler even when its
GPU computes as fast as its peers'. One profiled step of 8 ranks (the shape of
HTA's DLRM trace: rank 7 last into the step's collectives, its device compute
equal to its peers'), on the asynchronous-stream model written as Kineto
(tests/support/async_stream_model.py): its NCCL kernels start as soon as they are
launched (the GPU's queue is empty), later than its peers', whose kernels wait.
The kernel rows keep how long each waited after its launch (queued_ns)."""

import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.kineto import import_kineto
from tests.support import async_stream_model, kineto_perturb
from tests.support.jobs import load_run

WORLD = 8


def _run(tmp_path, before_each: tuple, first=("data", 100), step_kernel_us=200):
    """Per step: `first`, then 5 x (a compute kernel, `before_each` on the host,
    an all-reduce), a last kernel and a stream sync."""
    program = (
        [first]
        + [a for _ in range(5) for a in (("kernel", step_kernel_us), before_each, ("all_reduce", 100))]
        + [("kernel", 60), ("sync",)]
    )
    traces = async_stream_model.program_traces(WORLD, 1, program)
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    run = load_run(import_kineto(paths, str(tmp_path / "run"))[0])
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    return run, found


def test_a_rank_whose_host_launches_late_is_a_host_bound_straggler_on_one_step(tmp_path):
    run, found = _run(tmp_path, ("host", {7: 1500}))
    kernels = run.kernels()
    nccl = kernels[kernels["kind"] == "communication"]
    assert (nccl.loc[nccl["rank"] == 7, "queued_ns"] == 0).all()  # ran as soon as launched
    assert (nccl.loc[nccl["rank"] != 7, "queued_ns"] > 100_000).all()  # queued behind compute, then waited
    (f,) = [f for f in found if f["kind"] == "straggler"]
    assert f["ranks"] == [7] and f["metrics"]["cause"] == "host-bound"
    assert "host-bound" in f["title"] and "launches late" in f["title"] and "5 of the 5" in f["title"]
    assert f["metrics"]["compute_ratio_x"] == pytest.approx(1.0, abs=0.01)
    # the others wait ~1.25 ms at each of the 5 all-reduces: the evidence, and the saving
    assert f["metrics"]["waiting_caused_ms_per_step"] == pytest.approx(5 * 1.25, rel=0.05)
    assert f["impact_ms_per_step"] == pytest.approx(f["metrics"]["waiting_caused_ms_per_step"], rel=0.01)
    # the one step, with no step before it, is replayed from its recorded start
    assert f["impact_source"] == "replay" and run.step_figures["replay_max_step_error_frac"] <= 0.05
    assert "profile its host" in f["recommendation"]


def test_every_rank_late_together_is_no_straggler(tmp_path):
    _, found = _run(tmp_path, ("host", 1500))
    assert [f for f in found if f["kind"] == "straggler"] == []


def test_a_rank_late_from_its_own_data_loading_is_an_input_stall_not_a_straggler(tmp_path):
    _, found = _run(tmp_path, ("host", 0), first=("data", {7: 6000, None: 100}))
    assert [f["kind"] for f in found if f["kind"] in ("straggler", "input_stall")] == ["input_stall"]


def test_a_rank_whose_gpu_is_slower_keeps_its_device_cause(tmp_path):
    # rank 7's kernels take 2x as long; its host is on time, so its kernels queue
    program = (
        [("data", 100)]
        + [a for _ in range(5) for a in (("kernel", {7: 400, None: 200}), ("all_reduce", 100))]
        + [("kernel", 60), ("sync",)]
    )
    traces = async_stream_model.program_traces(WORLD, 1, program)
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    run = load_run(import_kineto(paths, str(tmp_path / "run"))[0])
    (f,) = [f for f in detect(run) if f["kind"] == "straggler"]
    assert f["ranks"] == [7] and f["metrics"]["cause"] == "slower work" and "host-bound" not in f["title"]
    assert f["metrics"]["busy_ratio_x"] > 1.5 and "device compute" in f["title"]
