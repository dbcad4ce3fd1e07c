"""Issue 27: host-device copies on the critical path (detectors/copy_stall.py) from
real GPU traces in tests/data/kineto: the PyTorch profiler tutorial's ResNet-50
(TensorBoard plugin samples: batches of 32 images copied from pageable memory
every step, no pin_memory) yields the copy finding with its time per step; HTA's
TorchRec-style trace, whose copies come from pinned memory and mostly overlap
compute, does not."""

import pytest

from tests.support.jobs import DATA, imported_findings

RESNET = DATA / "kineto" / "tb_plugin_resnet50" / "resnet50_num_workers_0" / "worker0.pt.trace.json.gz"
PINNED = [DATA / "kineto" / "hta" / "trace_filter" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]


def test_pageable_input_copies_are_a_copy_stall_with_their_time_per_step(tmp_path):
    found = [f for f in imported_findings(tmp_path / "resnet", [RESNET]) if f["kind"] == "copy_stall"]
    assert len(found) == 1, found
    f, m = found[0], found[0]["metrics"]
    # 32 x 3 x 224 x 224 fp32 images: 19.3 MB per step, ~2 ms of HtoD with the GPU idle
    assert m["copy_mb_per_step"] == pytest.approx(32 * 3 * 224 * 224 * 4 / 1e6, rel=0.01)
    assert 1.5 < m["exposed_copy_ms_per_step"] <= m["copy_ms_per_step"] < 3.0 and m["pageable_frac"] == 1.0
    assert f["impact_ms_per_step"] == pytest.approx(m["exposed_copy_ms_per_step"], abs=1e-3)
    assert "pin_memory=True" in f["recommendation"] and "ms/step" in f["title"]


def test_pinned_copies_that_overlap_compute_are_not_flagged(tmp_path):
    assert not any(f["kind"] == "copy_stall" for f in imported_findings(tmp_path / "pinned", PINNED))
