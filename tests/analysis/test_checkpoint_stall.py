"""Issue 47, item 4: checkpoint saves as spans, and the finding when they block
training. A 2-rank reference-trainer job saves with torch.save every 3 steps,
rank 1's disk slow (a pause in each write: reference_trainer/checkpointing.py)."""

import json

import pytest

from tests.support.jobs import job_env, load_run, run_diagnose, torchrun

STEPS, EVERY = 12, 3


@pytest.fixture(scope="module")
def saving_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    run_diagnose(
        [
            "run",
            "--out",
            out,
            "--",
            *torchrun(
                2,
                "-m",
                "reference_trainer",
                "--dp",
                "2",
                "--steps",
                STEPS,
                "--layers",
                "2",
                "--d-model",
                "64",
                "--heads",
                "4",
                "--seq-len",
                "64",
                "--micro-batch-size",
                "2",
                "--microbatches",
                "2",
                "--fault",
                f"checkpoint:every={EVERY},mode=torch,slow_rank=1,slow_ms=5",
            ),
        ],
        env=job_env(),
    )
    return out


def test_each_save_is_a_span_with_its_bytes_and_line(saving_run):
    run = load_run(saving_run)
    events = run.events()
    saves = events[events["kind"] == "checkpoint"]
    assert set(saves["name"].astype(str)) == {"torch.save"}
    assert saves.groupby("rank").size().to_dict() == {0: STEPS // EVERY, 1: STEPS // EVERY}
    assert set(saves["detail"].astype(str)) == {"thread=MainThread"}
    assert saves["callsite"].astype(str).str.contains("reference_trainer/checkpointing.py:").all()
    # the model's parameters (fp32), what torch.save was given
    assert saves["bytes"].nunique() == 1 and saves["bytes"].iloc[0] > 100_000
    ms = (saves["end_ns"] - saves["start_ns"]) / 1e6
    assert ms[saves["rank"] == 1].median() > 10 * ms[saves["rank"] == 0].median()  # the slow disk


def test_the_finding_names_the_stall_and_the_slow_disk(saving_run):
    findings = json.loads((saving_run / "analysis" / "findings.json").read_text())
    (f,) = [f for f in findings if f["kind"] == "checkpoint_stall"]
    m = f["metrics"]
    assert f["severity"] in ("warning", "critical") and m["slowest_rank"] == 1 and m["apis"] == "torch.save"
    assert "rank 1's take" in f["title"] and "check rank 1's disk" in f["recommendation"].lower()
    assert "async_save" in f["recommendation"]
    # the impact is the slowest saver's blocked time per steady step
    run = load_run(saving_run)
    events = run.events()
    saves = events[(events["kind"] == "checkpoint") & (events["rank"] == 1) & events["step"].isin(run.steady_steps())]
    blocked_ms = float(((saves["end_ns"] - saves["start_ns"]) / 1e6).sum())
    assert f["impact_ms_per_step"] == pytest.approx(blocked_ms / len(run.steady_steps()), rel=1e-3)
