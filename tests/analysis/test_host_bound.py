"""host_bound: every GPU waits for its host (diagnose/analysis/detectors/host_bound.py).

On the asynchronous-stream model (tests/support/async_stream_model.py) the
truth is the model re-run with the host's work gone; on the real traces we hold
(tests/data/kineto), the jobs whose kernels start as soon as they are launched
are named and the GPU-bound ones are not."""

import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.kineto import import_kineto
from tests.support import async_stream_model, kineto_perturb
from tests.support.jobs import fixture_path, load_run

WORLD = 8


def _model(tmp_path, host_us: int):
    """8 ranks, one step: 5 x (a 200 us kernel, `host_us` of host work, an all-reduce)."""
    program = (
        [("data", 100)]
        + [a for _ in range(5) for a in (("kernel", 200), ("host", host_us), ("all_reduce", 100))]
        + [("kernel", 60), ("sync",)]
    )
    traces = async_stream_model.program_traces(WORLD, 1, program)
    tmp_path.mkdir()
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    run = load_run(import_kineto(paths, str(tmp_path / "run"))[0])
    return run, detect(run)


def test_a_job_whose_hosts_launch_late_is_host_bound_and_the_fix_saves_what_a_rerun_saves(tmp_path):
    slow, found = _model(tmp_path / "slow", 1500)
    fast, found_fast = _model(tmp_path / "fast", 0)
    (f,) = [f for f in found if f["kind"] == "host_bound"]
    assert f["ranks"] == list(range(WORLD)) and [g for g in found if g["kind"] == "straggler"] == []
    # per round the GPU idles through the host's 1.5 ms less the 200 us kernel launched
    # before it and the launches around it: ~1.25 ms, 5 times a step
    assert f["metrics"]["launch_bound_idle_ms_per_step"] == pytest.approx(5 * 1.25, rel=0.05)
    truth_ms = slow.step_figures["measured_step_ms"] - fast.step_figures["measured_step_ms"]
    assert f["impact_source"] == "replay" and f["impact_ms_per_step"] == pytest.approx(truth_ms, rel=0.25)
    assert "CUDA graph" in f["recommendation"]
    assert [g for g in found_fast if g["kind"] == "host_bound"] == []


@pytest.mark.parametrize(
    "folder, trace, named",
    [
        ("hta/nccl_parser_config", "nccl_data.json.gz", True),  # 58% of the step
        ("tracelens", "b200_vllm_tp8_rank0.json.gz", True),  # an inference decode window, 67%
        ("tracelens", "mi300_ddp_resnet_rank0.json.gz", False),  # its GPU is the slower: 0%
        ("hta/ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", False),
        ("hta/negative_queue_length_values_check", "rank0.json.gz", False),
        ("tb_plugin_resnet50/resnet50_num_workers_0", "worker0.pt.trace.json.gz", False),  # input_stall's
    ],
)
def test_real_traces_name_the_jobs_whose_gpus_wait_for_their_hosts(tmp_path, folder, trace, named):
    path = fixture_path("kineto", *folder.split("/"), trace)
    run = load_run(import_kineto([str(path)], str(tmp_path / "run"))[0])
    every = detect(run)
    found = [f for f in every if f["kind"] == "host_bound"]
    assert bool(found) == named, found
    if named:
        (f,) = found
        assert f["severity"] == "critical" and f["metrics"]["launch_bound_idle_frac"] > 0.4
        assert f["impact_source"] == "replay" and f["impact_ms_per_step"] > 0
    if "num_workers_0" in folder:
        assert any(f["kind"] == "input_stall" for f in every)
