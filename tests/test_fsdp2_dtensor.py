"""Issue 24 (part): today's stacks under `diagnose run`. Collectives issued
through torch.distributed's functional API (DTensor's tensor parallelism) are
recorded as torch.distributed calls are; FSDP2's name the unit they serve.

tests/scripts/dtensor_tp.py: 2 ranks, an MLP split column- then row-parallel
by DTensor, 5 steps on gloo. The row-parallel layer's output is a partial sum
that DTensor all-reduces through funcol.all_reduce, once per forward; the
result is an AsyncCollectiveTensor, waited when the loss first uses it.
"""
import json
import subprocess

from conftest import REPO, job_env, load_run, run_diagnose, torchrun

SCRIPT = "tests/scripts/dtensor_tp.py"


def test_dtensor_all_reduces_are_recorded_matched_and_waited(tmp_path):
    plain, traced = tmp_path / "plain.json", tmp_path / "traced.json"
    subprocess.run(torchrun(2, SCRIPT, plain), cwd=REPO, env=job_env(), check=True, capture_output=True,
                   timeout=300)
    run_diagnose(["run", "--out", tmp_path / "run", "--", *torchrun(2, SCRIPT, traced)])
    assert json.loads(traced.read_text()) == json.loads(plain.read_text())   # the job's numbers unchanged

    run = load_run(tmp_path / "run")
    calls = run.collectives()
    functional = calls[calls["detail"] == "functional"]
    for rank in (0, 1):
        mine = functional[functional["rank"] == rank]
        # one all_reduce per step, issued from the model's forward, on the TP group of both ranks
        assert mine["name"].tolist() == ["all_reduce"] * 5 and mine["step"].tolist() == [0, 1, 2, 3, 4]
        assert set(mine["group_ranks"]) == {"0,1"} and (mine["bytes"] == 16 * 32 * 4).all()
        assert mine["callsite"].str.endswith("dtensor_tp.py:22").all(), mine["callsite"].tolist()
        # async, and waited where the loss first reads the result
        assert mine["async_op"].all() and mine["wait_start_ns"].notna().all()
        assert mine["wait_callsite"].str.endswith("dtensor_tp.py:34").all(), mine["wait_callsite"].tolist()
        assert (mine["wait_start_ns"] >= mine["return_ns"]).all()
    # the two ranks' calls are one instance each: the same (group, seq) on both
    arrivals = run.arrivals()
    mine = arrivals[arrivals["seq"].isin(functional["seq"])]
    assert mine.groupby(["group", "seq"])["rank"].nunique().tolist() == [2] * 5 and (mine["members"] == 2).all()


def test_fsdp2_collectives_name_their_unit(tmp_path):
    """tests/scripts/fsdp2_units.py: 2 ranks, three layers sharded as units of
    their own and the root (the head) as one more. Each all-gather and
    reduce-scatter row names the unit it serves (detail fsdp:<module>): a
    layer gathers twice a step (forward, then again for backward: resharded
    after forward), the root once (kept), and each reduces its gradients once."""
    plain, traced = tmp_path / "plain.json", tmp_path / "traced.json"
    subprocess.run(torchrun(2, "tests/scripts/fsdp2_units.py", plain), cwd=REPO, env=job_env(), check=True,
                   capture_output=True, timeout=300)
    run_diagnose(["run", "--no-analyze", "--out", tmp_path / "run", "--",
                  *torchrun(2, "tests/scripts/fsdp2_units.py", traced)])
    assert json.loads(traced.read_text()) == json.loads(plain.read_text())
    calls = load_run(tmp_path / "run").collectives()
    calls = calls[calls["step"].between(0, 3)]
    for rank in (0, 1):
        mine = calls[calls["rank"] == rank]
        per_step = mine.groupby([mine["name"].str.split("_").str[0], "detail"]).size() / 4
        assert per_step.to_dict() == {
            ("all", "fsdp:<root>"): 1, ("all", "fsdp:layers.0"): 2, ("all", "fsdp:layers.1"): 2,
            ("all", "fsdp:layers.2"): 2, ("reduce", "fsdp:<root>"): 1, ("reduce", "fsdp:layers.0"): 1,
            ("reduce", "fsdp:layers.1"): 1, ("reduce", "fsdp:layers.2"): 1}, per_step
