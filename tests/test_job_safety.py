"""Issue 44 B1: instrumentation never breaks or changes the user's job. Coalesced
collectives (Megatron's DDP and distributed optimizer), async and sync, beside
batched point-to-point ops, under `diagnose run` on gloo: the job's results and
exit code are the plain job's, and each coalesced group is one op."""
import json
import subprocess

from conftest import REPO, job_env, load_run, run_diagnose, torchrun

SCRIPT = "tests/scripts/coalesced_job.py"


def test_coalesced_collectives_keep_the_job_and_are_one_op_each(tmp_path):
    plain, traced = tmp_path / "plain.json", tmp_path / "traced.json"
    proc = subprocess.run(torchrun(2, SCRIPT, "--out", plain), cwd=REPO, env=job_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # before the fix: "Illegal to call wait on IllegalWork object", the job dead
    run_diagnose(["run", "--out", tmp_path / "run", "--", *torchrun(2, SCRIPT, "--out", traced)])
    assert json.loads(traced.read_text()) == json.loads(plain.read_text())
    calls = load_run(tmp_path / "run").collectives()
    coalesced = calls[calls["name"] == "all_reduce_coalesced"]
    # per rank and step: the 3 async all-reduces as one op, waited; the 2 sync ones as one
    per_rank = coalesced.groupby("rank")["detail"].apply(list).to_dict()
    assert per_rank == {r: ["3 ops", "2 ops"] * 4 for r in (0, 1)}, per_rank
    assert not (calls["name"] == "all_reduce").any(), calls["name"].unique()
    # one number per coalesced group, the same instance on both ranks
    matched = coalesced.groupby(["group", "seq"])["rank"].nunique()
    assert len(matched) == 8 and (matched == 2).all(), matched
    assert (coalesced["bytes"] == coalesced["detail"].map({"3 ops": (4 + 5 + 6) * 4, "2 ops": 2 * 2 * 4})).all()
