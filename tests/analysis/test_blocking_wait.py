"""Issue 44, W7: TORCH_NCCL_BLOCKING_WAIT turns each Work.wait() of a CUDA run
into a host sync (without it a wait only orders the streams and returns at
once). The rank's environment (meta env.nccl_env) is read: its host wait rows
are then syncs, judged on device time where the run has kernels, else reported
as the host's blocked time with no saving claimed."""

import pytest

from collectors.schema import event_row
from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.run_writer import RunDirWriter, clock_meta
from tests.support.jobs import load_run

MS = 1_000_000
SITE = "train.py:20"


def _run(tmp_path, nccl_env: dict, on_cuda=True, kernels=False):
    """Two ranks, 8 steps of 16 ms: a 5 ms compute kernel, an async all-reduce
    waited at SITE, 3 ms on the device; the host blocks in the wait until the
    all-reduce ends, then spends 1 ms in Python before the next kernel (5 ms)."""
    writer = RunDirWriter(str(tmp_path / "run"), "test", [])
    for rank in (0, 1):
        rows = []
        for step in range(8):
            t = (10 + 16 * step) * MS
            rows.append(event_row("step", "step", t, t + 16 * MS, step))
            common = dict(group="0", group_ranks="0,1", seq=step, async_op=True)
            rows.append(
                event_row(
                    "collective", "all_reduce", t + MS // 10, t + MS // 5, step, nbytes=4096, callsite=SITE, **common
                )
            )
            rows.append(event_row("wait", "all_reduce", t + MS // 5, t + 8 * MS, step, callsite=SITE, **common))
            if on_cuda:
                device = dict(common, detail="gpu:wait")
                rows.append(
                    event_row(
                        "collective", "all_reduce", t + 5 * MS, t + 5 * MS, step, nbytes=4096, callsite=SITE, **device
                    )
                )
                rows.append(event_row("wait", "all_reduce", t + 5 * MS, t + 8 * MS, step, callsite=SITE, **device))
                rows.append(event_row("done", "all_reduce", t + 8 * MS, t + 8 * MS, step, **device))
            if kernels:
                for start, end, name, stream, what in (
                    (0, 5, "gemm_kernel", "7", "compute"),
                    (5, 8, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "20", "communication"),
                    (9, 14, "gemm_kernel", "7", "compute"),
                ):
                    rows.append(
                        event_row("kernel", name, t + start * MS, t + end * MS, step, group=stream, detail=what)
                    )
                rows.append(event_row("phase", "launch", t + 9 * MS, t + 9 * MS + 20_000, step))
        meta = {"world_size": 2, "clock": clock_meta(), "env": {"nccl_env": nccl_env}}
        writer.write_rank(rank, sorted(rows, key=lambda r: r[2]), meta)
    return load_run(writer.finish())


def _hidden_syncs(run):
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    return [f for f in found if f["kind"] == "hidden_sync"]


def test_on_a_live_cuda_run_each_blocking_wait_is_a_host_sync_reported_without_a_claimed_saving(tmp_path):
    (f,) = _hidden_syncs(_run(tmp_path, {"TORCH_NCCL_BLOCKING_WAIT": "1"}))
    assert f["ranks"] == [0, 1] and f["severity"] == "info" and f["impact_ms_per_step"] == 0
    assert f["metrics"]["calls_per_step"] == 1
    assert f["metrics"]["blocking_ms_per_step"] == pytest.approx(7.8)
    assert "TORCH_NCCL_BLOCKING_WAIT" in f["title"] and "--torch-profiler" in f["title"]
    assert f["recommendation"].startswith("Unset TORCH_NCCL_BLOCKING_WAIT")


def test_the_same_waits_without_the_variable_or_on_gloo_are_no_sync(tmp_path):
    assert _hidden_syncs(_run(tmp_path / "unset", {"TORCH_NCCL_BLOCKING_WAIT": "0"})) == []
    # gloo's waits block anyway (they are the communication): the variable changes nothing
    assert _hidden_syncs(_run(tmp_path / "gloo", {"TORCH_NCCL_BLOCKING_WAIT": "1"}, on_cuda=False)) == []


def test_with_kernels_a_blocking_wait_costs_the_device_idle_until_the_host_launches_again(tmp_path):
    # the all-reduce ends at 8 ms, the host returns then and launches at 9 ms: 1 ms
    # of device idle per step, not the host's 7.8 ms in the wait
    (f,) = _hidden_syncs(_run(tmp_path, {"NCCL_BLOCKING_WAIT": "1"}, kernels=True))
    assert f["callsite"] == SITE and f["ranks"] == [0, 1] and f["metrics"]["device_time"] == 1.0
    assert f["impact_ms_per_step"] == pytest.approx(1.0, rel=0.01)
    assert f["metrics"]["blocking_ms_per_step"] == pytest.approx(7.8)
    assert "TORCH_NCCL_BLOCKING_WAIT" in f["title"] and f["recommendation"].startswith("Unset")
    assert _hidden_syncs(_run(tmp_path / "unset", {}, kernels=True)) == []
