"""Issue 27: gradient accumulation that reduces every micro-batch (DDP without
no_sync) is the accumulation_sync finding, naming the user's backward line and
DDP's own fix; the same job with no_sync() (the ddp_run fixture) has none. The
reference trainer's accum_sync scenario is in tests/trainer/test_scenarios.py."""

import json

import pytest

from tests.support.jobs import REPO, run_diagnose, torchrun


def test_ddp_without_no_sync_is_named_with_its_backward_and_the_fix(ddp_run, tmp_path):
    out = tmp_path / "accum"
    run_diagnose(
        [
            "run",
            "--out",
            out,
            "--",
            *torchrun(2, "samples/ddp_mlp.py", "--steps", 12, "--microbatches", 4, "--sync-every-microbatch"),
        ]
    )
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    found = [f for f in findings if f["kind"] == "accumulation_sync"]
    assert len(found) == 1, findings
    f = found[0]
    lines = (REPO / "samples" / "ddp_mlp.py").read_text().splitlines()
    backward_line = 1 + next(i for i, line in enumerate(lines) if "loss.backward()" in line)
    assert f["ranks"] == [0, 1] and f["callsite"] == f"samples/ddp_mlp.py:{backward_line}", f
    assert f["metrics"]["backwards_per_step"] == 4 and f["metrics"]["reduction_rounds_per_step"] == 4
    assert "no_sync()" in f["recommendation"] and "(DDP)" in f["title"]
    # the impact is the what-if saving (findings.json rounds it to 3 decimals, metrics to 4)
    assert f["impact_ms_per_step"] > 0
    assert f["metrics"]["whatif_saving_ms_per_step"] == pytest.approx(f["impact_ms_per_step"], abs=1e-3)
    clean = json.loads((ddp_run / "analysis" / "findings.json").read_text())
    assert not any(f["kind"] == "accumulation_sync" for f in clean), clean
