"""Issue 44: scripts/gpu_check.sh is ready for when a GPU is lent. Here (no GPU) it
must parse, and its preflight must write and compile every job it would run,
find the CLI, and list the issue-44 checks it would make, exit 0."""

import py_compile
import subprocess

from tests.support.jobs import PYTHON, REPO


def test_the_gpu_check_parses_and_its_preflight_lists_every_check():
    for script in ("scripts/gpu_check.sh", "scripts/gpu_check_jobs.sh"):
        proc = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    py_compile.compile(str(REPO / "scripts" / "gpu_check_results.py"), doraise=True)
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--preflight"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": PYTHON},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for job in (
        "gloo_cuda",
        "nccl_calls",
        "sync_count",
        "coalesced",
        "graph",
        "two_devices",
        "nccl_timing",
        "one_rank",
    ):
        assert f"gpu_check: preflight ok   {job}.py compiles" in lines, proc.stdout
    assert "gpu_check: preflight ok   diagnose run answers" in lines
    checks = [line.split()[3] for line in lines if line.startswith("gpu_check: would check")]
    assert checks == ["B1", "B3", "W1", "W7"], proc.stdout
