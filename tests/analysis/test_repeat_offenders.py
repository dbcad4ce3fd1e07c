"""Issue 47, item 5: the host and GPU that keep being the straggler, named across
the runs of one MLflow experiment (a real sqlite store). Three synthetic runs
in one runs root, each with a straggler on rank 5, logged in turn."""

import json

from diagnose.analysis.findings.run_detectors import detect
from diagnose.exporters import mlflow_run, mlflow_store, repeat_offenders
from tests.support.jobs import load_run
from tests.support.synthetic_run import write_synthetic_run

UUID = "GPU-8f6c1d2e-1b7a-4c1e-9a0b-3d5e7f9a1b2c"


def _logged(root, name, start_s, slow_host, slow_uuid):
    """A run whose rank 5 straggles, rank 5 on `slow_host` with GPU `slow_uuid`, logged."""
    out = write_synthetic_run(str(root / name), ranks=8, steps=20, slow_rank=5, slow_factor=1.8, name=name)
    for rank in range(8):
        path = root / name / "traces" / f"rank-{rank:05d}" / "meta.json"
        meta = json.loads(path.read_text())
        host, uuid = (slow_host, slow_uuid) if rank == 5 else (f"node-{rank // 4}", f"GPU-{rank:08d}-aaaa")
        meta.update(host=host, env={"gpu": {"uuid": uuid, "index": rank % 4, "model": "NVIDIA H100"}})
        path.write_text(json.dumps(meta))
    manifest_path = root / name / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["start_wall_ns"] = int(start_s * 1e9)  # the runs' order in the experiment
    manifest_path.write_text(json.dumps(manifest))
    run = load_run(out)
    findings = detect(run)
    assert [f["ranks"] for f in findings if f["kind"] == "straggler"] == [[5]]
    run_id = mlflow_run.log_run(run, findings)
    return mlflow_store.client_for(out).get_run(run_id).data.tags


def test_the_straggler_machine_is_named_on_its_third_run_and_not_before(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DIAGNOSE_TRACKING", "on")
    first = _logged(tmp_path, "r1", 1_000, "node-1", UUID)
    assert first["culprit.straggler"] == f"node-1|{UUID}"
    second = _logged(tmp_path, "r2", 2_000, "node-1", UUID)
    assert not any(k.startswith(repeat_offenders.LINE_TAG) for k in {**first, **second})
    third = _logged(tmp_path, "r3", 3_000, "node-1", UUID)
    line = f"node-1 GPU 1 ({UUID}) was the straggler in 3 of the last 3 runs"
    assert third["repeat_offender.straggler"] == line
    assert f"Repeat offender: {line}" in third[mlflow_run.NOTE_TAG]


def test_no_line_when_the_straggler_was_another_machine(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DIAGNOSE_TRACKING", "on")
    _logged(tmp_path, "r1", 1_000, "node-1", UUID)
    _logged(tmp_path, "r2", 2_000, "node-1", UUID)
    # the same host, another GPU: a different machine to blame
    third = _logged(tmp_path, "r3", 3_000, "node-1", "GPU-0000beef-0000-0000-0000-000000000000")
    assert not any(k.startswith(repeat_offenders.LINE_TAG) for k in third)
    assert "Repeat offender" not in third[mlflow_run.NOTE_TAG]
