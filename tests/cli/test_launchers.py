"""Issue 24 (launchers): jobs started by SLURM's srun (a stand-in that sets only
the SLURM variables), Open MPI's mpirun, plain `python`, and processes a script
starts itself are recorded under their true ranks and analyzed; a job diagnose
cannot tell apart gets a clear message, never "findings: none"."""

import importlib.util
import json
import shutil
import socket

import diagnose
from tests.support.jobs import PYTHON, REPO, job_env, run_diagnose

JOB = "tests/scripts/launcher_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out, job: list, **extra):
    """`diagnose run --out OUT -- JOB` on a free MASTER_PORT. The port is free when
    picked and may be taken before the job binds it (bind-then-close): a job that
    failed with EADDRINUSE is launched again on another port (at most 3 tries)."""
    for attempt in range(3):
        if attempt:
            shutil.rmtree(out, ignore_errors=True)
        env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port(), **extra)
        proc = run_diagnose(["run", "--out", out, "--", *job], env=env, check=False)
        if "Address already in use" not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _findings(out):
    return json.loads((out / "analysis" / "findings.json").read_text())


def _check_straggler_job(out, launcher: str):
    """Two ranks under their launcher's numbering, rank 1 slow: the gradient
    all-reduces matched across both ranks and rank 1 named the straggler."""
    run = diagnose.load(out)
    assert sorted(run.rank_meta) == [0, 1]
    assert {m["launcher"] for m in run.rank_meta.values()} == {launcher}
    assert {m["process_group"]["world_size"] for m in run.rank_meta.values()} == {2}
    arrivals = run.arrivals()
    matched = arrivals.groupby(["group", "seq"])["rank"].nunique()
    assert len(matched) >= 10 and (matched == 2).all(), matched
    stragglers = [f for f in _findings(out) if f["kind"] == "straggler" and f["severity"] != "info"]
    assert stragglers and stragglers[0]["ranks"] == [1], _findings(out)


def test_srun_tasks_are_ranks_by_slurm_procid(tmp_path):
    out = tmp_path / "srun"
    _launch(
        out,
        [PYTHON, "tests/scripts/fake_srun.py", "-n", "2", PYTHON, JOB, "env", "--slow-rank", "1", "--slow-ms", "40"],
    )
    _check_straggler_job(out, "slurm")


def test_mpirun_ranks_are_recorded(tmp_path):
    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI's mpirun is not installed (make setup installs openmpi-bin)"
    out = tmp_path / "mpirun"
    _launch(
        out,
        [mpirun, "-np", "2", "--oversubscribe", PYTHON, JOB, "env", "--slow-rank", "1", "--slow-ms", "40"],
        OMPI_ALLOW_RUN_AS_ROOT=1,
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,
        OMPI_MCA_plm="isolated",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
    )
    _check_straggler_job(out, "openmpi")


def test_plain_python_is_a_world_of_one(tmp_path):
    out = tmp_path / "lone"
    proc = _launch(out, [PYTHON, JOB, "lone", "--slow-data-ms", "4"])
    assert "rank 0 of a world of one" in proc.stdout, proc.stdout
    run = diagnose.load(out)
    assert sorted(run.rank_meta) == [0] and run.rank_meta[0]["world_size"] == 1
    assert len(run.steady_steps()) >= 8
    stalls = [f for f in _findings(out) if f["kind"] == "input_stall" and f["severity"] != "info"]
    assert stalls and stalls[0]["ranks"] == [0], _findings(out)


def test_mp_spawn_ranks_are_named_by_their_process_group(tmp_path):
    out = tmp_path / "mpspawn"
    _launch(out, [PYTHON, JOB, "mpspawn", "--slow-rank", "1", "--slow-ms", "40"])
    _check_straggler_job(out, "python")
    # the spawning parent imported torch but neither trained nor created a process group
    assert [p.name.startswith("solo-") for p in (out / "traces").iterdir()].count(True) == 1


def test_processes_without_launcher_or_process_group_get_a_clear_message(tmp_path):
    out = tmp_path / "spawn"
    proc = _launch(out, [PYTHON, JOB, "spawn", "--procs", "2"])
    assert "no rank was recorded: 2 processes trained without a launcher or a process group" in proc.stdout, proc.stdout
    assert "findings" not in proc.stdout.lower() and "Traceback" not in proc.stderr
    assert not (out / "analysis").exists()


def test_launcher_variables_and_launcher_programs():
    spec = importlib.util.spec_from_file_location("bootstrap", REPO / "collectors" / "bootstrap" / "sitecustomize.py")
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)  # no DIAGNOSE_RUN_DIR here: activates nothing
    srun_torchrun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "RANK": "13", "LOCAL_RANK": "1", "WORLD_SIZE": "32"}
    assert boot.launcher_identity(srun_torchrun) == ("torchrun", 13, 1, 32)
    assert boot.launcher_identity({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4"}) == (
        "slurm",
        3,
        1,
        4,
    )
    assert boot.launcher_identity(
        {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"}
    ) == ("openmpi", 5, 1, 8)
    assert boot.launcher_identity({"PMI_RANK": "2", "PMI_SIZE": "4"}) == ("pmi", 2, 0, 4)
    assert boot.launcher_identity({"RANK": "x", "PMI_RANK": "2"}) == ("pmi", 2, 0, 1)
    assert boot.launcher_identity({}) is None
    agents = [
        ["python", "/v/bin/torchrun", "--nproc-per-node", "2", "t.py"],
        ["python", "-m", "torch.distributed.run", "t.py"],
        ["python", "-u", "-mdeepspeed.launcher.launch"],
        ["python", "/v/bin/accelerate", "launch", "t.py"],
        ["python", "-X", "dev", "/v/bin/deepspeed", "t.py"],
    ]
    assert all(boot.program_of(a) in boot.LAUNCHER_PROGRAMS for a in agents)
    assert boot.program_of(["python", "-u", "train.py"]) == "train"
    assert boot.program_of(["python", "-c", "import torch"]) == "-c"
